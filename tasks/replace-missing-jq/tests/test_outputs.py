"""Outcome checks: summary.sh runs without jq and matches jq's output on new inputs."""
import json
import os
import subprocess
import tempfile

SCRIPT = "/app/scripts/summary.sh"


def _run(doc):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as fh:
        json.dump(doc, fh)
    try:
        return subprocess.run([SCRIPT, fh.name], capture_output=True, text=True, cwd="/", timeout=20)
    finally:
        os.unlink(fh.name)


def test_example_file():
    out = subprocess.run([SCRIPT, "/app/services.json"], capture_output=True, text=True, cwd="/", timeout=20)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "api\t8080\nauth\t8443\n"


def test_other_file_byte_order_and_enabled_values():
    doc = {"services": [
        {"name": "zeta", "port": 1, "enabled": True},
        {"name": "Beta", "port": 2, "enabled": True},
        {"name": "alpha", "port": 3, "enabled": True},
        {"name": "gamma", "port": 4, "enabled": "true"},
        {"name": "delta", "port": 5, "enabled": 1},
        {"name": "eps", "port": 6, "enabled": None},
        {"name": "web front", "port": 7, "enabled": True},
    ]}
    out = _run(doc)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "Beta\t2\nalpha\t3\nweb front\t7\nzeta\t1\n"


def test_no_enabled_services():
    out = _run({"services": [{"name": "a", "port": 1, "enabled": False}]})
    assert out.returncode == 0, out.stderr
    assert out.stdout == ""
