"""Remove what crashed earlier runs of the local sandbox left behind.

A sandbox whose owner process was SIGKILLed dies with it (``--die-with-parent``, pid namespace),
and its mounts vanish with its private mount namespace; left are its run folder, empty cgroups,
leases on snapshots and half-built layers. :func:`sweep` removes those whose owner is gone. It runs
once per process when the first sandbox starts, and as ``reterm sandbox sweep``.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

from reterm.sandbox.cgroups import Cgroups, find_leftover_cgroups
from reterm.sandbox.paths import pid_alive, rmtree_writable, sub
from reterm.sandbox.snapshot import collect, list_snapshots

logger = logging.getLogger(__name__)
_swept_once = False
_once_lock = threading.Lock()


def _host_mounts_under(root: Path) -> list[str]:
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        mp = line.split()[4].replace("\\040", " ")
        if mp == str(root) or mp.startswith(str(root) + "/"):
            out.append(mp)
    return sorted(out, key=len, reverse=True)


def live_sandbox_states() -> list[dict]:
    """``state.json`` of every sandbox whose owner process is alive (any process on this host)."""
    out = []
    for d in sub("run").iterdir():
        try:
            st = json.loads((d / "state.json").read_text())
        except (OSError, ValueError):
            continue
        if pid_alive(st.get("owner_pid"), st.get("owner_start")):
            out.append(st)
    return out


def sweep(*, snapshots: bool = False, log=None) -> dict[str, int]:
    """Remove leftovers of dead sandboxes; returns counts per kind.

    Args:
        snapshots: also delete every snapshot no live sandbox uses (default: only released ones).
        log: callable for one-line messages (default: the module logger at INFO).
    """
    log = log or logger.info
    counts = {"sandboxes": 0, "processes": 0, "cgroups": 0, "mounts": 0, "snapshots": 0, "layers": 0}
    run_root = sub("run")
    live_ids = set()
    for d in sorted(run_root.iterdir()):
        try:
            st = json.loads((d / "state.json").read_text())
        except (OSError, ValueError):
            st = None
        if st and pid_alive(st.get("owner_pid"), st.get("owner_start")):
            live_ids.add(d.name)
            continue
        try:
            if st is None and time.time() - d.stat().st_mtime < 60:
                continue  # being created right now
        except FileNotFoundError:
            continue  # stopped (and removed) by its owner meanwhile
        if st:
            hp, hs = st.get("holder_pid"), st.get("holder_start")
            if hp and pid_alive(hp, hs):
                os.kill(hp, signal.SIGKILL)
                counts["processes"] += 1
            if st.get("cgroups"):
                cg = Cgroups.from_json(st["cgroups"])
                n = len(cg.procs())
                cg.kill_all()
                cg.remove()
                counts["processes"] += n
                counts["cgroups"] += 1
        for mp in _host_mounts_under(d):
            subprocess.run(["umount", "-l", mp], capture_output=True)
            counts["mounts"] += 1
        rmtree_writable(d)
        counts["sandboxes"] += 1
    for cg_dir in find_leftover_cgroups("reterm-"):
        # named reterm-<owner pid>-<sandbox id>: only the dead owners' ones (other caches may be live)
        parts = cg_dir.name.split("-")
        if len(parts) != 3 or not parts[1].isdigit() or parts[2] in live_ids or pid_alive(int(parts[1])):
            continue
        cg = Cgroups(1, {"x": cg_dir})
        counts["processes"] += len(cg.procs())
        cg.kill_all()
        cg.remove()
        counts["cgroups"] += 1
    # snapshots: drop stale leases, delete released (or, with snapshots=True, unused) ones
    for snap in list_snapshots():
        if snapshots and not snap.released:
            (snap.path / "released").touch()
        if collect(snap.path):
            counts["snapshots"] += 1
    for d in sub("snapshots").iterdir():  # a snapshot whose copy was interrupted (no meta.json)
        try:
            stale = not (d / "meta.json").exists() and time.time() - d.stat().st_mtime > 600
        except FileNotFoundError:
            continue  # collected by another process meanwhile
        if stale:
            rmtree_writable(d)
            counts["snapshots"] += 1
    # half-built layers and bases whose builder is gone (its lock is free)
    for kind, prefix in (("layers", "layer-"), ("base", "base-")):
        for d in sub(kind).glob(".tmp-*"):
            key = d.name.split("-")[1]
            lock = sub("locks") / f"{prefix}{key}.lock"
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue
            finally:
                os.close(fd)
            rmtree_writable(d)
            counts["layers"] += 1
    # layers replaced by a forced rebuild, once no live sandbox uses them
    used = {low for st in live_sandbox_states() for low in st.get("lowers", [])}
    for d in sub("trash").iterdir():
        if not any(u.startswith(str(d)) for u in used):
            rmtree_writable(d)
            counts["layers"] += 1
    if any(counts.values()):
        log("sandbox sweep removed " + ", ".join(f"{v} {k}" for k, v in counts.items() if v))
    return counts


def sweep_once() -> None:
    """Run :func:`sweep` the first time a sandbox starts in this process (errors are logged only)."""
    global _swept_once
    with _once_lock:
        if _swept_once:
            return
        _swept_once = True
    try:
        sweep()
    except Exception:  # noqa: BLE001 - a failed clean-up must not stop a run
        logger.exception("sandbox sweep failed")
