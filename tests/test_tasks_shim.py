"""The offline verifier shim's pieces, run for real on this machine (the end-to-end run inside the local
sandbox is in test_tasks_e2e.py)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from reterm.tasks.shim import (
    SHIM_SOURCE,
    SHIM_TARGET,
    needs_shim,
    shim_covered,
    shim_dir,
    shim_reasons,
    shim_trial_settings,
)

FIXTURES = Path(__file__).parent / "fixtures" / "dialects"
SUITE = Path(__file__).resolve().parents[1] / "tasks"
BIN = SHIM_SOURCE / "bin"


@pytest.fixture()
def env(tmp_path):
    """A PATH with the shim first and this interpreter's folder (it has pytest) as `python3`."""
    pybin = tmp_path / "pybin"
    pybin.mkdir()
    (pybin / "python3").write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")
    (pybin / "python3").chmod(0o755)
    home = tmp_path / "home"
    home.mkdir()
    return {
        "PATH": f"{BIN}:{pybin}:/usr/bin:/bin",
        "HOME": str(home),
        "RETERM_SHIM_MISSING_LOG": str(tmp_path / "missing.txt"),
        "PYTHONDONTWRITEBYTECODE": "1",
    }


def test_detects_tasks_that_need_it():
    reasons = shim_reasons(FIXTURES / "tb2-hello")
    assert reasons == ["downloads uv's installer", "runs uvx", "runs apt-get (offline: no mirror)"]
    assert needs_shim(FIXTURES / "tb2-hello") and shim_covered(FIXTURES / "tb2-hello")
    assert not needs_shim(FIXTURES / "termigen-csv-sum")
    assert [p.name for p in SUITE.iterdir() if p.is_dir() and needs_shim(p)] == []


def test_not_covered_when_test_sh_is_not_bash(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test.sh").write_text("#!/bin/sh\nuvx pytest /tests\n")
    assert needs_shim(tmp_path) and not shim_covered(tmp_path)


def test_trial_settings(tmp_path, monkeypatch):
    monkeypatch.setenv("RETERM_CACHE", str(tmp_path))
    mounts, verifier_env = shim_trial_settings()
    assert mounts == [{"type": "bind", "source": str(shim_dir()), "target": SHIM_TARGET, "read_only": True}]
    assert verifier_env == {"BASH_ENV": "/opt/reterm-shim/activate.sh"}
    copy = Path(mounts[0]["source"])
    assert copy.is_relative_to(tmp_path) and os.access(copy / "bin" / "uv", os.X_OK)
    assert (copy / "bin" / "apt").is_symlink()


def test_curl_serves_the_uv_installer_and_installer_links_uv(env):
    out = subprocess.run(["bash", "-c", "curl -LsSf https://astral.sh/uv/0.9.5/install.sh | sh && "
                                        "source $HOME/.local/bin/env && command -v uv && uv --version"],
                         env=env, capture_output=True, text=True, timeout=30)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [f"{env['HOME']}/.local/bin/uv", "uv 0.0.0 (reterm offline shim)"]
    assert (Path(env["HOME"]) / ".cargo" / "env").is_file()


def test_curl_passes_other_urls_to_the_real_curl(env):
    out = subprocess.run(["curl", "-sS", "--max-time", "2", "http://127.0.0.1:9/"], env=env,
                         capture_output=True, text=True, timeout=30)  # fmt: skip
    assert out.returncode == 7 and "Failed to connect" in out.stderr  # the real curl's error


def _write_tests(tmp_path, passing: bool) -> Path:
    t = tmp_path / f"test_{'ok' if passing else 'bad'}.py"
    t.write_text(f"def test_a():\n    assert {passing}\n\ndef test_b():\n    pass\n")
    return t


@pytest.mark.parametrize("passing", [True, False])
def test_uvx_runs_pytest_with_ctrf(env, tmp_path, passing):
    tests = _write_tests(tmp_path, passing)
    ctrf = tmp_path / "logs" / "ctrf.json"
    cmd = ["uvx", "-p", "3.13", "-w", "pytest==8.4.1", "-w", "pytest-json-ctrf==0.3.5",
           "pytest", "--ctrf", str(ctrf), str(tests), "-rA", "-p", "no:cacheprovider"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert (out.returncode == 0) is passing, out.stdout + out.stderr
    summary = json.loads(ctrf.read_text())["results"]["summary"]
    assert (summary["tests"], summary["passed"], summary["failed"]) == ((2, 2, 0) if passing else (2, 1, 1))
    assert not Path(env["RETERM_SHIM_MISSING_LOG"]).exists()


def test_uv_venv_pip_init_add_run(env, tmp_path):
    # the pytest-in-a-venv part needs the sandbox's system pytest: see test_tasks_e2e.py
    script = ("uv venv .tbench-testing && source .tbench-testing/bin/activate && "
              "uv pip install pytest==8.4.1 && uv init && uv add pytest && "
              "uv run python -c 'import sys; print(sys.prefix)'")
    out = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip() == str(tmp_path / ".tbench-testing")
    cfg = (tmp_path / ".tbench-testing" / "pyvenv.cfg").read_text()
    assert "include-system-site-packages = true" in cfg
    assert 'name = "' in (tmp_path / "pyproject.toml").read_text()


def test_missing_package_is_reported_not_invented(env, tmp_path):
    out = subprocess.run(["uv", "pip", "install", "surely-not-installed-pkg==1.0"], env=env,
                         capture_output=True, text=True, timeout=60, cwd=tmp_path)  # fmt: skip
    assert out.returncode == 1
    assert "not installed and could not be installed (no network, or not on the index): surely-not-installed-pkg" in out.stderr
    assert Path(env["RETERM_SHIM_MISSING_LOG"]).read_text() == "python:surely-not-installed-pkg\n"


def test_uvx_options_that_take_a_value_are_not_the_command(env, tmp_path):
    """`uvx --index-strategy unsafe-best-match ... pytest` runs pytest, not `unsafe-best-match`."""
    tests = _write_tests(tmp_path, True)
    cmd = ["uvx", "--index-strategy", "unsafe-best-match", "--extra-index-url", "https://download.pytorch.org/whl/cpu",
           "-p", "3.13", "-w", "pytest==8.4.1", "pytest", str(tests), "-q", "-p", "no:cacheprovider"]  # fmt: skip
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "2 passed" in out.stdout and "unsafe-best-match" not in out.stderr


def _activated(env, tmp_path):
    """``env`` with BASH_ENV naming the shim's activate.sh, its /opt/reterm-shim paths pointing at the source."""
    act = tmp_path / "activate.sh"
    act.write_text((SHIM_SOURCE / "activate.sh").read_text().replace("/opt/reterm-shim", str(SHIM_SOURCE)))
    return {**env, "BASH_ENV": str(act)}


@pytest.mark.parametrize("passing", [True, False])
def test_plain_pip_install_then_python_m_pytest_ctrf_offline(env, tmp_path, passing):
    """A Terminal-Bench 2.0 test.sh without uv: `pip install pytest==8.4.1 pytest-json-ctrf==0.3.5`, then
    `python -m pytest --ctrf ...`. Offline the pip shim succeeds with the sandbox's pytest and the shim's
    CTRF plugin gives --ctrf, so pytest's own result decides."""
    tests = _write_tests(tmp_path, passing)
    ctrf = tmp_path / "logs" / "ctrf.json"
    script = (f"pip install pytest==8.4.1 pytest-json-ctrf==0.3.5 --break-system-packages || exit 9\n"
              f"python3 -m pytest --ctrf {ctrf} {tests} -rA -p no:cacheprovider\n")  # fmt: skip
    (tmp_path / "test.sh").write_text(script)
    out = subprocess.run(["bash", str(tmp_path / "test.sh")], env=_activated(env, tmp_path), capture_output=True,
                         text=True, timeout=120, cwd=tmp_path)  # fmt: skip
    assert out.returncode == (0 if passing else 1), out.stdout + out.stderr
    summary = json.loads(ctrf.read_text())["results"]["summary"]
    assert (summary["passed"], summary["failed"]) == ((2, 0) if passing else (1, 1))
    assert not Path(env["RETERM_SHIM_MISSING_LOG"]).exists()


def test_plain_pip_install_of_a_missing_package_is_reported(env, tmp_path):
    out = subprocess.run(["bash", "-c", "pip3 install pytest==8.4.1 surely-not-installed-pkg==1.0"],
                         env=_activated(env, tmp_path), capture_output=True, text=True, timeout=60, cwd=tmp_path)  # fmt: skip
    assert out.returncode == 1, out.stdout + out.stderr
    assert Path(env["RETERM_SHIM_MISSING_LOG"]).read_text() == "python:surely-not-installed-pkg\n"


def test_ctrf_plugin_stands_aside_when_the_real_one_is_installed(env, tmp_path):
    """With a network the pip shim installs the real pytest-json-ctrf (distribution ``pytest-json-ctrf``, module
    ``ctrf.main`` on the ``pytest11`` entry point, as in its 0.3.5 wheel): the shim's plugin, loaded through
    PYTEST_PLUGINS, must not add a second --ctrf (pytest's parser would fail)."""
    site = tmp_path / "site"
    (site / "ctrf").mkdir(parents=True)
    (site / "ctrf" / "__init__.py").write_text("")
    (site / "ctrf" / "main.py").write_text(
        "import json\n"
        "def pytest_addoption(parser):\n    parser.addoption('--ctrf', action='store', default=None)\n"
        "def pytest_sessionfinish(session):\n"
        "    p = session.config.getoption('--ctrf')\n"
        "    if p:\n        json.dump({'results': {'tool': {'name': 'real'}}}, open(p, 'w'))\n"
    )  # fmt: skip
    dist = site / "pytest_json_ctrf-0.3.5.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: pytest-json-ctrf\nVersion: 0.3.5\n")
    (dist / "entry_points.txt").write_text("[pytest11]\nctrf = ctrf.main\n")
    tests = _write_tests(tmp_path, True)
    ctrf = tmp_path / "ctrf.json"
    run_env = {**_activated(env, tmp_path), "PYTHONPATH": str(site)}
    script = f"python3 -m pytest --ctrf {ctrf} {tests} -q -p no:cacheprovider\n"
    out = subprocess.run(["bash", "-c", script], env=run_env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert json.loads(ctrf.read_text())["results"]["tool"]["name"] == "real"
