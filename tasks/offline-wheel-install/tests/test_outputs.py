"""Outcome checks: a venv at /app/.venv with tinytable 1.2.0, the report runs, system Python untouched."""
import subprocess
from pathlib import Path

VENV_PY = "/app/.venv/bin/python"
EXPECTED = """item      | quantity | price
----------+----------+------
bolt M4   |     1200 |  0.05
nut M4    |      950 |  0.03
washer    |     3000 |  0.01
bracket L |       42 |  2.50
"""


def test_is_a_virtual_environment():
    assert Path("/app/.venv/pyvenv.cfg").is_file()
    out = subprocess.run([VENV_PY, "-c", "import sys; print(sys.prefix != sys.base_prefix)"],
                         capture_output=True, text=True, cwd="/")
    assert out.stdout.strip() == "True", out.stderr


def test_pinned_version_installed():
    out = subprocess.run([VENV_PY, "-c", "import tinytable; print(tinytable.__version__)"],
                         capture_output=True, text=True, cwd="/")
    assert out.stdout.strip() == "1.2.0", out.stderr


def test_report_runs():
    out = subprocess.run([VENV_PY, "/app/render.py", "/app/data/inventory.csv"],
                         capture_output=True, text=True, cwd="/")
    assert out.returncode == 0, out.stderr
    assert out.stdout == EXPECTED


def test_system_python_untouched():
    out = subprocess.run(["/usr/bin/python3", "-c", "import tinytable"], capture_output=True, text=True, cwd="/")
    assert out.returncode != 0, "tinytable must not be installed into the system Python"
