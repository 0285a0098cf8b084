"""Outcome checks: a working venv at /app/.venv with an editable install of inventory; system untouched."""
import os
import subprocess

VENV_PY = "/app/.venv/bin/python"


def run(args, **kw):
    return subprocess.run(args, capture_output=True, text=True, timeout=120, **kw)


def test_venv_python_works():
    out = run([VENV_PY, "-c", "import sys; print(sys.prefix, sys.prefix != sys.base_prefix)"], cwd="/")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["/app/.venv", "True"]


def test_project_tests_pass():
    out = run([VENV_PY, "-m", "pytest", "-q", "-p", "no:cacheprovider", "/app/tests"], cwd="/")
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-1000:]


def test_editable_install(tmp_path):
    out = run([VENV_PY, "-c", "import inventory; print(inventory.__file__)"], cwd="/")
    assert out.returncode == 0, out.stderr
    assert os.path.realpath(out.stdout.strip()) == "/app/src/inventory/__init__.py"
    out = run([VENV_PY, "-m", "pip", "show", "inventory"], cwd="/")
    assert out.returncode == 0 and "Version: 0.4.0" in out.stdout, out.stdout + out.stderr
    # an edit of the source is visible without reinstalling
    path = "/app/src/inventory/__init__.py"
    with open(path) as fh:
        original = fh.read()
    try:
        with open(path, "a") as fh:
            fh.write("\nEDIT_MARKER = 42\n")
        out = run([VENV_PY, "-c", "import inventory; print(inventory.EDIT_MARKER)"], cwd=str(tmp_path))
        assert out.stdout.strip() == "42", out.stderr
    finally:
        with open(path, "w") as fh:
            fh.write(original)


def test_system_python_untouched():
    out = run(["/usr/bin/python3", "-c", "import inventory"], cwd="/")
    assert out.returncode != 0
