"""Outcome checks: make builds the page from a clean tree, make clean removes it, sources untouched."""
import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

RENDER_SHA = "38e02f76536962fd5a46eb28df07bad913fe4667dbfcf40aa5b79da2569e1933"
INDEX_SHA = "3f82b23b31cefcfef810173eb3d926595d167fbc6bb7bcb9753af8417b4cd2a1"


def _sha(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def test_sources_unchanged():
    assert _sha("/app/tools/render.py") == RENDER_SHA
    assert _sha("/app/src/index.md") == INDEX_SHA


def test_make_builds_from_clean(tmp_path):
    work = tmp_path / "app"
    shutil.copytree("/app", work, symlinks=True)
    shutil.rmtree(work / "build", ignore_errors=True)
    out = subprocess.run(["make"], cwd=work, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    sys.path.insert(0, "/app/tools")
    import render
    expected = render.render(Path("/app/src/index.md").read_text())
    assert (work / "build/index.html").read_text() == expected
    out = subprocess.run(["make", "clean"], cwd=work, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert not (work / "build").exists()
