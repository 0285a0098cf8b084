"""Outcome checks: a fresh venv installs /app/greet offline; metadata, console script, package data."""
import hashlib
import subprocess

CLI_SHA = "442a976d8bf15603a12410e38733f051ab6e0238a7bd1e893acc9e5edcfdb488"


def run(args, **kw):
    return subprocess.run(args, capture_output=True, text=True, timeout=180, **kw)


def test_code_unchanged():
    with open("/app/greet/greet/cli.py", "rb") as fh:
        assert hashlib.sha256(fh.read()).hexdigest() == CLI_SHA


def test_offline_install(tmp_path):
    venv = tmp_path / "venv"
    # --without-pip: the system pip is visible through --system-site-packages and installs into the venv
    assert run(["python3", "-m", "venv", "--without-pip", "--system-site-packages", str(venv)]).returncode == 0
    out = run([f"{venv}/bin/python", "-m", "pip", "install", "--no-build-isolation", "--no-index", "/app/greet"], cwd=str(tmp_path))
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    out = run([f"{venv}/bin/greet", "--name", "Ada"], cwd="/")
    assert out.returncode == 0 and out.stdout == "Hello, Ada!\n", out.stderr
    out = run([f"{venv}/bin/python", "-m", "pip", "show", "greet-cli"])
    assert "Version: 0.3.0" in out.stdout, out.stdout
    meta = run([f"{venv}/bin/python", "-c",
                "import importlib.metadata as m, importlib.resources as r;"
                "d = m.metadata('greet-cli'); print(d['Requires-Python']);"
                "print(r.files('greet').joinpath('phrases.txt').read_text().split()[1])"], cwd="/")
    assert meta.stdout.split() == [">=3.9", "Bonjour"], meta.stdout + meta.stderr
