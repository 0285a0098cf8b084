"""Rebuild a failure state: ``materialize(state, n, make_environment)`` gives n independent environments in it.

The one rebuild of the kit (data stage, eval's recovery from recorded states; see docs/ARCHITECTURE.md).
Methods (``method``, the same names everywhere):

- **snapshot**: the state carries a local-sandbox snapshot (``snapshot``: the attempt-level protocol
  snapshots the end of a failed attempt, :mod:`reterm.recovery.attempts`): ``n`` forks of it. Files only
  (the release's protocol): a fork restarts from the snapshot's files.
- **fork** (the local sandbox, :class:`reterm.sandbox.local.LocalEnvironment`): one fresh environment of the
  task, the history's commands typed into the kit's terminal (:class:`reterm.agent.terminal.TerminalSession`,
  so ``cd``, exports, REPLs and key presses behave as they did for the agent) with their recorded timeouts,
  then ``snapshot`` + ``fork(n)``. **Running-process rule**: a fork carries files, not processes, so when
  the typed history left processes running (a server started in the background; :func:`user_processes`)
  every environment is rebuilt by replay instead (``detail`` says so).
- **replay** (any Harbor environment, e.g. docker or a cloud sandbox): every environment is its own fresh
  one with the history typed in (the ``n`` rebuilds run concurrently; cost grows with the history, where a
  fork's does not: ``bench/sandbox_fork.py`` measures both through this function).
- **auto**: snapshot when the state has one, else fork when the environment can fork, else replay.
- **a snapshot cache** (``cache``, GRPO's :class:`reterm.training.failure_pool.SnapshotCache`; local sandbox): the
  state's snapshot comes from the cache, or is made once (concurrent callers of one state wait for the same
  build) and put there: typed from the cached snapshot of ``parent`` when the state's messages begin with the
  parent's (only the commands after the parent's are typed, in a shell with the parent's cwd and variables),
  else from the task's start; then ``n`` forks of it.

**Divergence check**: a rebuild *diverged* when a typed command's exit status or time-out differs from the
recorded step (a command that depends on time, randomness or a process that is gone). A diverged rebuild is
dropped and counted (:attr:`Materialized.diverged`), never handed out, so it is never scored; when the one
rebuild a fork starts from diverges, the whole state is dropped (``diverged = n``).

Faults of the environment while rebuilding (start, exec) propagate after everything started is stopped:
they are infrastructure faults, the caller's to record apart.

Own code: Harbor has no snapshot, fork or replay of an environment.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from reterm.agent.protocol import DEFAULT_COMMAND_TIMEOUT_S
from reterm.agent.terminal import TerminalSession
from reterm.recovery.state import State, canonical_messages
from reterm.trajectory import Step

logger = logging.getLogger(__name__)

METHODS = ("auto", "snapshot", "fork", "replay")

MakeEnvironment = Callable[[str], Any]
"""``make_environment(tag)`` returns a new, not yet started Harbor environment of the state's task."""


class Diverged(Exception):
    """A typed history did not reproduce the recorded exit statuses (the message says which command)."""


@dataclass
class Materialized:
    """The environments :func:`materialize` made (started; :meth:`stop` stops them).

    Attributes:
        environments: at most ``n`` environments in the state (fewer when rebuilds diverged).
        sessions: per environment, the terminal the history was typed into (``None`` for forks: the
            harness opens a new one, since processes are not forked).
        method: ``snapshot`` | ``fork`` | ``replay`` (what was done; ``""`` when nothing was made).
        diverged: rebuilds dropped because they diverged (never handed out, never scored).
        detail: why the method changed or what diverged ("" when nothing to say).
        snapshot_id, cached: with a snapshot cache, the snapshot forked from and whether it was there already.
        rebuild_s, fork_s: seconds spent getting the state's snapshot and forking it (snapshot cache only).
    """

    environments: list[Any] = field(default_factory=list)
    sessions: list[TerminalSession | None] = field(default_factory=list)
    method: str = ""
    diverged: int = 0
    detail: str = ""
    snapshot_id: str = ""
    cached: bool = False
    rebuild_s: float = 0.0
    fork_s: float = 0.0
    stop_environment: Callable[[Any], Awaitable[None]] | None = None

    async def stop(self) -> None:
        """Stop every environment (errors ignored)."""
        await asyncio.gather(*(_stop(e, self.stop_environment) for e in self.environments), return_exceptions=True)
        self.environments, self.sessions = [], []


async def _stop(env: Any, stop: Callable[[Any], Awaitable[None]] | None) -> None:
    if stop is not None:
        await stop(env)
        return
    try:
        await env.stop(delete=True)
    except Exception:
        pass


def can_fork(environment: Any) -> bool:
    """True for environments with a snapshot fork (the local sandbox); others are rebuilt by replay."""
    return callable(getattr(environment, "fork", None)) and callable(getattr(environment, "snapshot", None))


async def type_history(session: TerminalSession, history: Sequence[Step], default_timeout: float,
                       timeouts: Sequence[float | None] = ()) -> None:  # fmt: skip
    """Type the bash commands of ``history`` (a state's steps, or the part after a parent state's) into
    ``session`` with their recorded timeouts (``timeouts``, one per bash command, e.g. ``State.replay_timeouts``;
    else each step's ``action.timeout``; ``None``: ``default_timeout``, seconds).

    Raises:
        Diverged: a command's exit status or time-out differs from the recorded step (message says which).
    """
    steps = [s for s in history if s.command]
    timeouts = list(timeouts)
    timeouts += [s.action.timeout if s.action else None for s in steps[len(timeouts):]]
    for i, (step, timeout) in enumerate(zip(steps, timeouts)):
        result = await session.run(step.command or "", timeout=timeout or default_timeout)
        status = None if result.timed_out else result.exit_status
        if result.timed_out != step.timed_out or status != step.exit_status:
            raise Diverged(f"command {i} `{(step.command or '')[:80]}`: recorded exit {step.exit_status}"
                           f"{' (timed out)' if step.timed_out else ''}, replay exit {status}"
                           f"{' (timed out)' if result.timed_out else ''}")  # fmt: skip


async def user_processes(environment: Any) -> list[str]:
    """Processes the agent's commands left running in a local sandbox (not the sandbox's init, the
    terminal's tmux server or its shell, nor ``exec``'d commands, which run outside any session)."""
    r = await environment.exec("ps -eo sid=,comm=,args=", timeout_sec=30)
    out = []
    for line in (r.stdout or "").splitlines():
        parts = line.split(None, 2)
        if len(parts) < 2 or parts[0] == "0":
            continue
        comm, args = parts[1], parts[2] if len(parts) > 2 else ""
        if comm.startswith("tmux") or ("--rcfile" in args and ".reterm" in args):
            continue
        out.append(args or comm)
    return out


async def _rebuild(make_environment: MakeEnvironment, state: State, tag: str, default_timeout: float,
                   stop: Callable[[Any], Awaitable[None]] | None) -> tuple[Any, TerminalSession]:  # fmt: skip
    env = make_environment(tag)
    if asyncio.iscoroutine(env):
        env = await env
    try:
        await env.start(force_build=False)
        session = await TerminalSession.start(env)
        await type_history(session, state.history, default_timeout, state.replay_timeouts)
    except BaseException:
        await _stop(env, stop)
        raise
    return env, session


async def _cached_snapshot(state: State, make_environment: MakeEnvironment, cache: Any, parent: State | None,
                           default_timeout: float, stop: Callable[[Any], Awaitable[None]] | None,
                           extra: dict[str, Any] | None) -> tuple[Any, bool]:  # fmt: skip
    """``(snapshot of state, whether it was cached)``: from ``cache``, else built once (see :func:`materialize`).

    Raises:
        Diverged: a typed command ended differently than recorded (callers waiting on the same build too).
        Exception: faults of the environment while rebuilding, after clean-up.
    """
    from reterm.sandbox.local import LocalEnvironment

    snap = cache.get(state.id)
    if snap is not None:
        return snap, True
    building = getattr(cache, "building", None)
    building = building if building is not None else {}
    fut = building.get(state.id)
    if fut is not None:  # another caller is building it
        return await asyncio.shield(fut), True
    fut = asyncio.get_running_loop().create_future()
    building[state.id] = fut
    env = None
    try:
        steps, timeouts, restore = list(state.history), list(state.replay_timeouts), None
        parent_snap = cache.get(parent.id) if parent is not None else None
        if parent_snap is not None and canonical_messages(state.messages[: len(parent.messages)]) == canonical_messages(
                parent.messages):  # fmt: skip
            cache.pin([parent.id])
            (env,) = await LocalEnvironment.from_snapshot(parent_snap, 1)
            restore = await TerminalSession.saved_state(env)
            steps, timeouts = steps[len(parent.history):], []  # each step's own timeout
        else:
            env = make_environment("rebuild")
            if asyncio.iscoroutine(env):
                env = await env
            await env.start(force_build=False)
        if any(s.command for s in steps):
            session = await TerminalSession.start(env, restore=restore)
            try:
                await type_history(session, steps, default_timeout, timeouts)
            finally:
                with contextlib.suppress(Exception):
                    await session.close()
        snap = await env.snapshot(extra=dict(extra or {}))
        cache.put(state.id, snap)
        fut.set_result(snap)
        return snap, False
    except Exception as exc:
        fut.set_exception(exc)
        fut.exception()  # retrieved: callers waiting on it re-raise it themselves
        raise
    except BaseException:
        fut.cancel()
        raise
    finally:
        building.pop(state.id, None)
        if env is not None:
            await _stop(env, stop)


async def materialize(
    state: State,
    n: int,
    make_environment: MakeEnvironment | None,
    *,
    method: str = "auto",
    snapshot: Any = None,
    cache: Any = None,
    parent: State | None = None,
    snapshot_extra: dict[str, Any] | None = None,
    fork_kwargs: dict[str, Any] | None = None,
    default_timeout: float = DEFAULT_COMMAND_TIMEOUT_S,
    stop_environment: Callable[[Any], Awaitable[None]] | None = None,
) -> Materialized:
    """``n`` independent started environments in ``state`` (rules in the module docstring).

    Args:
        state: the failure state: its ``history`` (steps with commands and recorded exit statuses),
            ``replay_timeouts`` and ``snapshot``.
        n: how many environments (>= 1).
        make_environment: ``make_environment(tag)`` -> a new, not started environment of the state's task
            (may be ``None`` with a snapshot).
        method: one of :data:`METHODS`.
        snapshot: a local-sandbox snapshot of the state (default ``state.snapshot`` when it has one).
        cache: a snapshot cache (``get(state_id)``, ``put(state_id, snapshot)``, ``pin(state_ids)``, optional
            ``building`` dict): the state's snapshot is taken from it or made once and put there (method
            ``auto`` or ``snapshot``; local sandbox).
        parent: with ``cache``, a state this one continues (a GRPO online state's parent): its cached snapshot
            is the start of the rebuild when the state's messages begin with the parent's.
        snapshot_extra: with ``cache``, metadata stored with a snapshot made here.
        fork_kwargs: passed to ``LocalEnvironment.from_snapshot`` for the forks (e.g. ``persistent_env``).
        default_timeout: seconds, for typed commands recorded without a timeout.
        stop_environment: how to stop an environment (default ``env.stop(delete=True)``, errors ignored).

    Returns:
        A :class:`Materialized`; ``environments`` is empty when every rebuild diverged.

    Raises:
        TypeError: ``state`` is not a :class:`State`.
        ValueError: ``n < 1``, an unknown ``method``, ``snapshot`` without one, ``fork`` on an environment
            without a snapshot fork, or no ``make_environment`` when one is needed.
        Exception: faults of the environment while rebuilding (infrastructure faults), after clean-up.
    """
    if not isinstance(state, State):
        raise TypeError(f"materialize: expected a reterm.recovery.state.State, got {type(state).__name__}")
    if n < 1:
        raise ValueError(f"materialize: n must be >= 1, got {n}")
    if method not in METHODS:
        raise ValueError(f"materialize: method {method!r} is not one of {METHODS}")
    snapshot = snapshot if snapshot is not None else state.snapshot
    out = Materialized(stop_environment=stop_environment)
    if cache is not None and snapshot is None:
        if method not in ("auto", "snapshot"):
            raise ValueError(f"materialize: a snapshot cache needs method 'auto' or 'snapshot', not {method!r}")
        if make_environment is None:
            raise ValueError("materialize: no make_environment to rebuild the state with")
        from reterm.sandbox.local import LocalEnvironment

        t0 = time.monotonic()
        out.method = "snapshot"
        try:
            snap, out.cached = await _cached_snapshot(state, make_environment, cache, parent, default_timeout,
                                                      stop_environment, snapshot_extra)  # fmt: skip
        except Diverged as exc:
            out.diverged, out.detail, out.rebuild_s = n, str(exc), time.monotonic() - t0
            return out
        out.rebuild_s, out.snapshot_id = time.monotonic() - t0, snap.id
        t1 = time.monotonic()
        out.environments = list(await LocalEnvironment.from_snapshot(snap, n, **(fork_kwargs or {})))
        out.sessions, out.fork_s = [None] * n, time.monotonic() - t1
        return out
    if method == "snapshot" or (method == "auto" and snapshot is not None):
        if snapshot is None:
            raise ValueError(f"materialize: method 'snapshot' but failure state {state.id} has none")
        from reterm.sandbox.local import LocalEnvironment

        out.environments = list(await LocalEnvironment.from_snapshot(snapshot, n, **(fork_kwargs or {})))
        out.sessions, out.method = [None] * n, "snapshot"
        return out
    if make_environment is None:
        raise ValueError("materialize: no make_environment to rebuild the state with")
    try:
        if method in ("auto", "fork"):
            try:
                env, session = await _rebuild(make_environment, state, "rebuild", default_timeout, stop_environment)
            except Diverged as exc:
                out.diverged, out.detail, out.method = n, str(exc), "fork" if method == "fork" else ""
                return out
            if not can_fork(env):
                if method == "fork":
                    await _stop(env, stop_environment)
                    raise ValueError(f"materialize: method 'fork' but {type(env).__name__} has no snapshot fork")
                out.environments, out.sessions, method = [env], [session], "replay"
            else:
                running = await user_processes(env)
                if running:  # a fork would lose them: every environment is rebuilt by replay
                    out.detail = f"history left processes running ({', '.join(running[:3])}): rebuilt by replay"
                    out.environments, out.sessions, method = [env], [session], "replay"
                else:
                    await session.close()
                    try:
                        forks = await env.fork(n)
                    finally:
                        await _stop(env, stop_environment)
                    out.environments, out.sessions, out.method = list(forks), [None] * n, "fork"
                    return out
        out.method = "replay"
        todo = n - len(out.environments)
        tags = [f"replay{len(out.environments) + i}" for i in range(todo)]
        made = await asyncio.gather(*(_rebuild(make_environment, state, t, default_timeout, stop_environment)
                                      for t in tags), return_exceptions=True)  # fmt: skip
        faults = [r for r in made if isinstance(r, BaseException) and not isinstance(r, Diverged)]
        for r in made:
            if isinstance(r, Diverged):
                out.diverged += 1
                out.detail = str(r)
            elif not isinstance(r, BaseException):
                out.environments.append(r[0])
                out.sessions.append(r[1])
        if faults:
            raise faults[0]
        return out
    except BaseException:
        await out.stop()
        raise
