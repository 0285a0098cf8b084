"""Where the local sandbox keeps its files, and a cross-process lock.

Layout under ``${RETERM_CACHE:-$HOME/.cache/reterm}/sandbox``::

    base/<key>/rootfs        Debian base root filesystem (debootstrap), read-only lower layer
    base/<key>.json          its recipe (suite, include list, mirror, build time)
    layers/<key>/root        a task's build layer (from environment/Dockerfile), read-only lower layer
    layers/<key>/meta.json   ENV / USER / WORKDIR / SHELL the Dockerfile left behind
    snapshots/<id>/files     a frozen writable layer (``LocalEnvironment.snapshot()``)
    snapshots/<id>/meta.json how to start a sandbox from it
    snapshots/<id>/leases/   one file per sandbox that uses it as a lower layer
    run/<id>/                one running sandbox (state.json + mount point); removed at stop
    locks/                   flock files (builds of the same key wait for each other)
    trash/                   layers replaced by a forced rebuild, removed by the sweep when unused
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path


def cache_root() -> Path:
    """The sandbox cache folder: ``${RETERM_CACHE:-$HOME/.cache/reterm}/sandbox`` (created)."""
    root = Path(os.environ.get("RETERM_CACHE") or Path.home() / ".cache" / "reterm") / "sandbox"
    root.mkdir(parents=True, exist_ok=True)
    return root


def sub(name: str) -> Path:
    """A sub-folder of :func:`cache_root` (``base``, ``layers``, ``snapshots``, ``run``, ...), created."""
    path = cache_root() / name
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextlib.contextmanager
def file_lock(name: str, *, wait_message: str | None = None, log=None) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``locks/<name>.lock`` for the duration of the block.

    Several processes may start the same build at once; the first one builds, the others wait here
    and then find the finished result. ``wait_message`` is logged (through ``log``, a callable taking
    a string) once when the lock is busy.
    """
    path = sub("locks") / f"{name}.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if wait_message and log:
                log(wait_message)
            t0 = time.monotonic()
            fcntl.flock(fd, fcntl.LOCK_EX)
            if log:
                log(f"lock {name} acquired after {time.monotonic() - t0:.1f} s")
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def pid_alive(pid: int | None, start_time: int | None = None) -> bool:
    """True when process ``pid`` exists (and, if given, started at ``start_time`` clock ticks).

    ``start_time`` is field 22 of ``/proc/PID/stat``; it guards against a recycled pid.
    """
    if not pid:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return False
    if start_time is None:
        return True
    return proc_start_time(pid, stat) == start_time


def proc_start_time(pid: int, stat: str | None = None) -> int | None:
    """Start time of ``pid`` in clock ticks since boot (``/proc/PID/stat`` field 22), or None."""
    try:
        stat = stat if stat is not None else Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: split after the last ')'
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[19])


def rmtree_writable(path: Path) -> None:
    """``shutil.rmtree(path, ignore_errors=True)`` that also removes folders left without read, write
    or search permission, which stop a non-root owner (overlayfs leaves its ``work/work`` folder with
    mode 000; an agent may ``chmod 000`` a folder that a snapshot then copies). As root the first
    pass removes everything."""
    for _ in range(3):
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.lexists(path):
            return
        for dirpath, dirnames, _ in os.walk(path):  # give the owner back its permissions, then retry
            for d in [dirpath, *(os.path.join(dirpath, n) for n in dirnames)]:
                if not os.path.islink(d):
                    with contextlib.suppress(OSError):
                        os.chmod(d, 0o700)
