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
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

PARENT_ENV = "RETERM_WORKER_PARENT"
"""Set by :func:`run_workers` in each worker's environment: the parent's process id."""

WORKERS_ENV = "RETERM_GEN_WORKERS"
"""The default of the generating stages' ``--workers`` (:func:`default_workers`). An environment variable, not an
option on run_all's command lines, because the number of processes changes how fast a stage runs, not what it
computes: a changed command line would make ``train/stages.py`` run a completed stage again."""

_ROOT = str(Path(__file__).resolve().parents[1])
"""The checkout whose ``reterm/`` this is (put first on a worker's ``PYTHONPATH``)."""


STOP_GRACE_S = float(os.environ.get("RETERM_WORKER_STOP_GRACE_S", "20"))
"""Seconds a worker told to stop (SIGTERM) has for its cleanup before it exits without waiting for a generation
call still running in a thread (:func:`follow_parent`; the parent kills it after 30)."""


def default_workers() -> int:
    """``--workers``'s default: :data:`WORKERS_ENV` when set, else 1.

    Raises:
        ValueError: the variable is set to something other than a whole number >= 1 (its value named).
    """
    raw = os.environ.get(WORKERS_ENV, "").strip()
    if not raw:
        return 1
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"{WORKERS_ENV}={raw!r}: expected a whole number of processes, 1 or more")
    return int(raw)


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity, which a container's cpuset limits), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def threads_per_worker(workers: int) -> int:
    """OpenMP threads each of ``workers`` processes gets: the usable CPUs divided among them, at least 1."""
    return max(1, usable_cpus() // max(1, workers))


def reseed(seed: int, chunk: str | int) -> None:
    """Seed torch's generator for one chunk of a stage's work: ``seed`` mixed with the chunk's name or index, so
    a chunk samples the same whichever worker runs it, and in whatever order (up to the float differences
    between thread counts). Does nothing where torch was never imported (no local model samples)."""
    if "torch" not in sys.modules:
        return
    mixed = zlib.crc32(f"{seed}\0{chunk}".encode())
    sys.modules["torch"].manual_seed(mixed)


def follow_parent() -> None:
    """In a worker: stop (SIGTERM, whose handler exits through every ``finally``, so snapshots are released) when
    the process that started it dies, even by ``kill -9`` (Linux ``PR_SET_PDEATHSIG``), so that a re-run never
    finds an orphan still writing the same journal; :data:`STOP_GRACE_S` after SIGTERM it ends even while a
    generation call runs on in a thread. SIGINT (a Ctrl-C reaches the whole process group) is ignored:
    the parent stops its workers with SIGTERM, and a second signal would cut their cleanup short. Does nothing
    outside a worker (no :data:`PARENT_ENV`)."""
    parent = os.environ.get(PARENT_ENV)
    if not parent:
        return

    def stop(*_: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: a second one would cut the cleanup short
        # asyncio.run cancels the tasks (their ``finally`` blocks release the snapshots), then waits for its
        # executor threads, and a batched generation call in one of them cannot be interrupted (minutes on a CPU):
        # after the grace period the process ends without waiting for it
        timer = threading.Timer(STOP_GRACE_S, os._exit, args=(128 + signal.SIGTERM,))
        timer.daemon = True
        timer.start()
        sys.exit(128 + signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if str(os.getppid()) != parent:  # it died before the line above
        sys.exit(128 + signal.SIGTERM)


def without_options(argv: list[str], *options: str) -> list[str]:
    """``argv`` without ``OPTION VALUE`` / ``OPTION=VALUE`` for each of ``options`` (a parser built with
    ``allow_abbrev=False``, so that no abbreviation slips past)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in options:
            skip = True
        elif not arg.startswith(tuple(f"{o}=" for o in options)):
            out.append(arg)
    return out


def resolve_workers(workers: int | None, worker: str | None) -> tuple[int, tuple[int, int] | None]:
    """A stage's ``--workers`` (``None``: :func:`default_workers`) and ``--worker I/N`` values -> ``(N processes,
    (I, N) or None)``; in a worker process (``--worker`` given) also :func:`follow_parent`.

    Raises:
        ValueError: ``--workers`` below 1, a bad :data:`WORKERS_ENV` or a bad ``--worker`` (the value named).
    """
    n = default_workers() if workers is None else workers
    if n < 1:
        raise ValueError(f"--workers {n}: expected 1 or more")
    me = parse_worker(worker) if worker is not None else None
    if me is not None:
        follow_parent()
    return n, me


def run_chunk_workers(module: str, argv: list[str], workers: int, claims: Path, *,
                      say: Callable[[str], None] = print) -> dict[str, int]:  # fmt: skip
    """Start ``workers`` processes of ``python -m module`` with this command line (``argv``, its ``--workers`` and
    ``--worker`` replaced by ``--workers 1 --worker I/N``) after removing the claims in ``claims``
    (:meth:`Claims.reset`): each takes the chunks no other has claimed. Returns :func:`run_workers`'s failures."""
    Claims.reset(claims)
    base = ["-m", module, *without_options(argv, "--workers", "--worker"), "--workers", "1"]
    return run_workers([(f"worker {i}/{workers}", [*base, "--worker", f"{i}/{workers}"]) for i in range(workers)],
                       workers, say=say)  # fmt: skip


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
        way out; SIGKILL to those still running 30 s later) before it propagates.
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
        deadline = time.monotonic() + 30
        for proc in running.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
        raise
    return failed


def append_lines(path: Path, lines: list[str]) -> None:
    """Append lines to ``path`` under an exclusive lock (``flock``), then fsync: processes that share a journal
    never interleave their lines. A process killed while writing (or a full disk) can leave part of its last
    line; the next append starts on a new line, so that fragment spoils only itself (:func:`read_lines` skips
    it)."""
    if not lines:
        return
    with open(path, "ab+") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            end = f.seek(0, os.SEEK_END)
            torn = False
            if end:
                f.seek(end - 1)
                torn = f.read(1) != b"\n"
            f.write((b"\n" if torn else b"") + "".join(line + "\n" for line in lines).encode())
            f.flush()
            os.fsync(f.fileno())
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def read_lines(path: Path) -> tuple[list[Any], int]:
    """The JSON values of a journal's lines, read under a shared lock (so no append is half-way), and how many
    lines could not be parsed (a fragment left by a killed writer; :func:`append_lines`). A missing file is
    ``([], 0)``."""
    if not Path(path).exists():
        return [], 0
    with open(path, "rb") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_SH)
        try:
            data = f.read()
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)
    out, bad = [], 0
    for line in data.decode(errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            bad += 1
    return out, bad


class Claims:
    """The chunks of a job that its worker processes take one at a time: a chunk is a file in ``folder``, made with
    ``O_EXCL``, so exactly one process gets each, and a process that finishes a chunk early takes the next one
    (chunks of generation differ in length). The parent calls :meth:`reset` before it starts the workers: a
    claim left by a killed run names a chunk that its journal may not hold."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)

    def take(self, name: str) -> bool:
        """Claim chunk ``name`` (any text: the file is named by its hash, and holds the name); True for the one
        process that got it."""
        path = self.folder / hashlib.sha256(name.encode()).hexdigest()[:32]
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return False
        os.write(fd, f"{os.getpid()} {name}\n".encode())
        os.close(fd)
        return True

    @staticmethod
    def reset(folder: Path) -> None:
        """Remove every claim in ``folder`` (before a new set of workers starts).

        Raises:
            OSError: a claim could not be removed (a stale claim would keep its chunk from running).
        """
        if Path(folder).exists():
            shutil.rmtree(folder)


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
