"""Portable tasks: every task's Dockerfile installs what its build, solution and tests use from its own FROM
image, and the local sandbox's strict mode (RETERM_SANDBOX_STRICT=1: a minimal Debian root like
debian:bookworm-slim, plus the harness's tmux) proves it with oracle 1.0 / null 0.0.

Measured on 2 shared cores: all 34 tasks in strict mode, first builds included (apt-get from the Debian
mirror), took 600 s with `reterm tasks verify tasks -n 2`; the slow test below runs a sample that covers
every extra package the suite installs (git, make, pip/venv, sqlite3, curl/procps, xz-utils), about 2 min.
"""

from __future__ import annotations

import asyncio
import re

import pytest

from reterm.sandbox.build import apt_install_packages
from reterm.tasks import SUITE_DIR, load_task

TASKS = sorted(p.parent.parent for p in SUITE_DIR.glob("*/environment/Dockerfile"))
# each command a solution or verifier runs -> the Debian package that has it (minbase has coreutils, tar,
# gzip, mawk, sed, grep, findutils, dpkg, passwd)
NEEDS = {r"\bgit\b": "git", r"\bsqlite3\b": "sqlite3", r"(^|\s)make(\s|$)": "make", r"\bcurl\b": "curl",
         r"\bpython3 -m venv\b|/\.venv/bin/pip|\bpip install\b": "python3-venv", r"tar -\w*J": "xz-utils"}  # fmt: skip


def _installs(task) -> set[str]:
    pkgs: set[str] = set()
    for line in (task / "environment" / "Dockerfile").read_text().splitlines():
        if line.startswith("RUN "):
            pkgs |= set(apt_install_packages(line[4:]) or [])
    return pkgs


def test_apt_install_lines_are_recognised():
    assert apt_install_packages(
        "apt-get update && apt-get install -y --no-install-recommends python3 git && rm -rf /var/lib/apt/lists/*"
    ) == ["python3", "git"]
    assert apt_install_packages("DEBIAN_FRONTEND=noninteractive apt-get update && apt-get install -y jq") == ["jq"]
    assert apt_install_packages("apt-get update && apt-get install -y jq && curl -o x http://y") is None
    assert apt_install_packages("python3 /tmp/build/make-data.py") is None


@pytest.mark.parametrize("task", TASKS, ids=lambda p: p.name)
def test_every_dockerfile_installs_what_its_task_uses(task):
    text = (task / "environment" / "Dockerfile").read_text()
    assert text.startswith("FROM debian:bookworm-slim\n")
    pkgs = _installs(task)
    assert {"python3", "python3-pytest"} <= pkgs, "the verifiers run python3 -m pytest"
    used = "\n".join(p.read_text(errors="replace") for d in ("solution", "tests") for p in (task / d).rglob("*")
                     if p.is_file())  # fmt: skip
    for pattern, pkg in NEEDS.items():
        if re.search(pattern, used, re.M):
            assert pkg in pkgs, f"{task.name} uses {pattern!r} but its Dockerfile does not install {pkg}"
    assert "jq" not in pkgs or task.name != "replace-missing-jq"  # its missing tool must stay missing


SAMPLE = ["git-merge-conflict", "stale-site-build", "package-python-cli", "sqlite-wal-backup",
          "start-health-service", "extract-release-subset"]  # fmt: skip


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_strict_sandbox_builds_a_sample_from_bare_debian(tmp_path, monkeypatch):
    from reterm.sandbox.base_image import STRICT_ENV, ensure_base
    from reterm.tasks.verify import verify_tasks

    monkeypatch.setenv(STRICT_ENV, "1")
    base = ensure_base()  # debootstrap minbase + tmux (about 45 s the first time, then cached)
    assert not (base.rootfs / "usr" / "bin" / "python3").exists()  # no verifier could run without the install
    covered = set().union(*(_installs(SUITE_DIR / n) for n in SAMPLE))
    assert covered >= {"git", "make", "python3-venv", "sqlite3", "curl", "procps", "xz-utils"}
    loaded = [load_task(SUITE_DIR / n) for n in SAMPLE]
    results = asyncio.run(verify_tasks(loaded, tmp_path, n_concurrent=2, progress=False))
    for r in results:
        assert (r.oracle.reward, r.nop.reward) == (1.0, 0.0), (r.name, r.trials)
        assert not r.shim
