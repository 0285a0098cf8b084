"""Helpers for the local-sandbox tests: the fixture task, a host-state guard, clean-up checks."""

from __future__ import annotations

import asyncio
import hashlib
import os
import socket
from pathlib import Path

from reterm.sandbox.base_image import find_base
from reterm.sandbox.box import live_boxes
from reterm.sandbox.paths import sub

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
HELLO_TASK = HERE / "fixtures" / "tasks" / "hello-file"


def run(coro):
    """Run a coroutine to completion (the suite does not use pytest-asyncio)."""
    return asyncio.run(coro)


def _sha(path: str | Path) -> str | None:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


def _mounts() -> list[str]:
    return [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]


def host_state(sentinel_dir: Path) -> dict:
    """What a hostile command must not change on the host (compared before/after)."""
    base = find_base()
    state = {
        "shadow": _sha("/etc/shadow"),
        "passwd": _sha("/etc/passwd"),
        "hosts": _sha("/etc/hosts"),
        "hostname": socket.gethostname(),
        "core_pattern": Path("/proc/sys/kernel/core_pattern").read_text(),
        "repo_readme": _sha(REPO / "pyproject.toml"),
        "sentinel": {p.name: _sha(p) for p in sorted(sentinel_dir.iterdir())},
        "cache_mounts": [m for m in _mounts() if str(sub("run")) in m or "reterm" in m],
    }
    if base is not None:
        state["base_passwd"] = _sha(base.rootfs / "etc/passwd")
        state["base_bash"] = _sha(base.rootfs / "bin/bash")
        state["base_entries"] = sorted(p.name for p in base.rootfs.iterdir())
    return state


def run_dirs_of(pid: int) -> list[Path]:
    """Run folders of sandboxes owned by process ``pid`` (other processes may share the cache)."""
    import json

    out = []
    for d in sub("run").iterdir():
        try:
            if json.loads((d / "state.json").read_text()).get("owner_pid") == pid:
                out.append(d)
        except (OSError, ValueError):
            if not (d / "state.json").exists():
                out.append(d)  # no state yet: unknown owner, counts as left behind
    return out


def processes_mentioning(text: str) -> list[int]:
    """Pids whose command line contains ``text`` (other than this process)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            if text.encode() in (d / "cmdline").read_bytes():
                out.append(int(d.name))
        except OSError:
            continue
    return out


def assert_box_cleaned(box_id: str, cgroup_dirs: list[Path], rundir: Path) -> None:
    """A stopped sandbox left no folder, cgroup, mount or process behind."""
    assert not rundir.exists(), f"run folder {rundir} left behind"
    for d in cgroup_dirs:
        assert not d.exists(), f"cgroup {d} left behind"
    assert not [m for m in _mounts() if box_id in m], "mounts left behind"
    assert processes_mentioning(str(rundir)) == [], "processes left behind"
    assert box_id not in {b.id for b in live_boxes()}
