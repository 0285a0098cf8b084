"""Outcome checks: build/ is current, and the Makefile's dependencies work (checked in a copy of /app)."""
import os
import shutil
import subprocess
import time

PAGES = ("index", "about", "contact")


def make(cwd):
    out = subprocess.run(["make"], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def render(app, name):
    return subprocess.run(["python3", f"{app}/tools/render.py", f"{app}/templates/base.html",
                           f"{app}/pages/{name}.md"], capture_output=True, text=True, check=True).stdout


def test_build_is_current():
    for name in PAGES:
        with open(f"/app/build/{name}.html") as fh:
            assert fh.read() == render("/app", name), name


def _settle(app):
    """Sources 100 s old, outputs 50 s old: everything up to date, with room for a newer change."""
    now = time.time()
    for sub in ("pages", "templates", "tools"):
        for f in os.listdir(f"{app}/{sub}"):
            os.utime(f"{app}/{sub}/{f}", (now - 100, now - 100))
    for f in os.listdir(f"{app}/build"):
        os.utime(f"{app}/build/{f}", (now - 50, now - 50))


def _touch(path):
    now = time.time()
    os.utime(path, (now - 10, now - 10))


def test_dependencies(tmp_path):
    app = str(tmp_path / "app")
    shutil.copytree("/app", app, symlinks=True)
    make(app)
    _settle(app)
    assert "render.py" not in make(app), "make rebuilt pages that were up to date"
    with open(f"{app}/templates/base.html", "a") as fh:
        fh.write("<!-- marker-1 -->\n")
    _settle(app)
    _touch(f"{app}/templates/base.html")
    assert make(app).count("render.py") == len(PAGES)
    for name in PAGES:
        with open(f"{app}/build/{name}.html") as fh:
            assert "marker-1" in fh.read(), name
    assert "render.py" not in make(app), "second make rebuilt something"
    _settle(app)
    _touch(f"{app}/tools/render.py")
    assert make(app).count("render.py") == len(PAGES)
    _settle(app)
    _touch(f"{app}/pages/about.md")
    out = make(app)
    assert out.count("render.py") == 1 and "about.md" in out, out
