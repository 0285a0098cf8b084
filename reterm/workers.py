"""Generation split over processes: run command lines side by side, each in its own process with its share of
the cores, and stop them together.

Why processes and not threads: on a CPU, a process's second OpenMP thread buys a decoding step little (1.13x on
2 AVX2 cores), while two single-thread processes generate 1.33-1.35x the rows a second of one two-thread process
(``bench/decode.py``, docs/REPRODUCING.md), and a process also leaves its cores idle while it waits for the
sandboxes between turns (the drills evaluation in two processes: 1.22x, ``bench/eval_workers.py``). The stages
that generate split their work into independent parts (a model each, or chunks of tasks that the workers take
one at a time, :class:`Claims`) and run them here; each part writes its own results or appends whole lines to a
shared journal under a lock (:func:`append_lines`), and the parent reads them when all are done.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

PARENT_ENV = "RETERM_WORKER_PARENT"
"""Set by :func:`run_workers` in each worker's environment: the parent's process id."""

_ROOT = str(Path(__file__).resolve().parents[1])
"""The checkout whose ``reterm/`` this is (put first on a worker's ``PYTHONPATH``)."""


def threads_per_worker(workers: int) -> int:
    """OpenMP threads each of ``workers`` processes gets: the CPUs divided among them, at least 1."""
    return max(1, (os.cpu_count() or 1) // max(1, workers))


def follow_parent() -> None:
    """In a worker: stop (SIGTERM, whose handler exits through every ``finally``, so snapshots are released) when
    the process that started it dies, even by ``kill -9`` (Linux ``PR_SET_PDEATHSIG``), so that a re-run never
    finds an orphan still writing the same journal. Does nothing outside a worker (no :data:`PARENT_ENV`)."""
    parent = os.environ.get(PARENT_ENV)
    if not parent:
        return

    def stop(*_: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: a second one would cut the cleanup short
        sys.exit(128 + signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if str(os.getppid()) != parent:  # it died before the line above
        sys.exit(128 + signal.SIGTERM)


def run_workers(commands: list[tuple[str, list[str]]], workers: int, *,
                say: Callable[[str], None] = print, what: str = "") -> dict[str, int]:  # fmt: skip
    """Run ``commands`` (``(label, argv)`` pairs, ``argv`` without the interpreter: ``["-m", "reterm.x", ...]``)
    with this Python, at most ``workers`` at a time, in order, each with :func:`threads_per_worker` OpenMP threads
    (unless ``OMP_NUM_THREADS`` is set), this checkout first on ``PYTHONPATH`` and :data:`PARENT_ENV` set (so a
    worker calls :func:`follow_parent`). Their output goes to this process's stdout and stderr, line by line;
    ``say`` gets one line on the start (the labels; with ``what``, e.g. ``"models"``, their count) and one per
    failed worker.

    Returns:
        ``{label: exit code}`` of every worker that ended with a non-zero code (empty: all succeeded). On an
        exception (Ctrl-C included) the running workers are stopped (SIGTERM: they release their snapshots on the
        way out; SIGKILL after 30 s) before it propagates.
    """
    workers = max(1, min(workers, len(commands)))  # the processes that run at once share the cores
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(threads_per_worker(workers)))
    env["PYTHONPATH"] = os.pathsep.join([_ROOT, *filter(None, [env.get("PYTHONPATH")])])
    env[PARENT_ENV] = str(os.getpid())
    pending, running, failed = list(commands), {}, {}
    say(f"{workers} worker processes of {env['OMP_NUM_THREADS']} threads" + (f" for {len(commands)} {what}" if what else "")
        + f": {[label for label, _ in commands]}")  # fmt: skip
    try:
        while pending or running:
            while pending and len(running) < workers:
                label, argv = pending.pop(0)
                running[label] = subprocess.Popen([sys.executable, *argv], env=env)
            time.sleep(0.5)
            for label, proc in list(running.items()):
                if proc.poll() is not None:
                    del running[label]
                    if proc.returncode:
                        failed[label] = proc.returncode
                        how = f"was killed by signal {-proc.returncode}" if proc.returncode < 0 else \
                            f"exited with code {proc.returncode} (its output is above)"
                        say(f"{label}: its worker {how}")
    except BaseException:
        for proc in running.values():
            proc.terminate()
        for proc in running.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        raise
    return failed


def append_lines(path: Path, lines: list[str]) -> None:
    """Append whole lines to ``path`` under an exclusive lock (``flock``), then fsync: processes that share a
    journal never interleave their lines, and a killed one leaves every line it finished, never half of one."""
    if not lines:
        return
    with open(path, "a") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            f.write("".join(line + "\n" for line in lines))
            f.flush()
            os.fsync(f.fileno())
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


class Claims:
    """The chunks of a job that its worker processes take one at a time: a chunk is a file in ``folder``, made with
    ``O_EXCL``, so exactly one process gets each, and a process that finishes a chunk early takes the next one
    (chunks of generation differ in length). The parent calls :meth:`reset` before it starts the workers: a
    claim left by a killed run names a chunk that its journal may not hold."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)

    def take(self, name: str) -> bool:
        """Claim chunk ``name`` (a file name); True for the one process that got it."""
        try:
            fd = os.open(self.folder / name, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return False
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        return True

    @staticmethod
    def reset(folder: Path) -> None:
        """Remove every claim in ``folder`` (before a new set of workers starts)."""
        shutil.rmtree(folder, ignore_errors=True)


def parse_worker(text: str) -> tuple[int, int]:
    """``"I/N"`` -> ``(I, N)``: worker I of N (0-based).

    Raises:
        ValueError: not two integers with ``0 <= I < N`` (the text named).
    """
    i, sep, n = text.partition("/")
    try:
        idx, total = int(i), int(n)
    except ValueError:
        idx, total = -1, 0
    if not sep or not 0 <= idx < total:
        raise ValueError(f"--worker {text!r}: expected I/N with 0 <= I < N")
    return idx, total
