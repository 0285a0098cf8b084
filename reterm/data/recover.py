"""Stages 3-4: fork N recovery attempts at each failure state, run them through the harness, verify them.

Rebuilding a failure state (the environment as the failing agent left it):

- **fork** (the local sandbox): a fresh :class:`reterm.sandbox.local.LocalEnvironment` of the task, the
  prefix's commands typed into the kit's terminal (:class:`reterm.agent.terminal.TerminalSession`, so
  ``cd``, exports, REPLs and key presses behave as they did for the agent) with their recorded timeouts,
  then ``snapshot`` + ``fork(N)``. A fork carries files, not processes, so when the replayed prefix left
  processes running (a server started in the background) every attempt is rebuilt by replay instead.
- **replay** (any Harbor environment, e.g. a cloud sandbox in the 10K recipe): each attempt gets its own
  fresh environment with the prefix typed in.

A replay *diverged* when a command's exit status or time-out differs from the recorded one (a command
that depends on time, randomness or a process that is gone): such a rebuild is dropped and counted
(``diverged``), never used. Faults of the sandbox while rebuilding are infrastructure faults.

The attempts then run in lock-step through :func:`reterm.agent.episode.run_episodes` with
``history`` = the failure prefix, so their messages are exactly what the model sees at training and
evaluation time, and the task's verifier runs on each (``verify=True``). Every attempt is kept in the
stage's unit file: the verified ones become records, the failed ones the failed-attempts file.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reterm.agent.episode import EpisodeSpec, run_episodes
from reterm.agent.terminal import TerminalSession
from reterm.data.config import EnvironmentConfig, RecoveryConfig
from reterm.data.environments import can_fork, make_environment, stop_quietly
from reterm.recovery import FailureState
from reterm.trajectory import Trajectory

logger = logging.getLogger(__name__)


@dataclass
class WorkItem:
    """A failure state to recover from, with where it came from.

    ``instruction`` is the instruction the failing episode was shown (the prefix's user message);
    ``source`` is ``own`` or ``injected``; ``default_timeout`` is the command timeout the failing episode
    used for commands without one (applied on replay).
    """

    state: FailureState
    instruction: str
    source: str
    source_policy: str
    default_timeout: float
    injection: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"state": self.state.model_dump(mode="json"), "instruction": self.instruction, "source": self.source,
                "source_policy": self.source_policy, "default_timeout": self.default_timeout,
                "injection": self.injection}  # fmt: skip

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "WorkItem":
        return cls(state=FailureState.model_validate(data["state"]), instruction=data["instruction"],
                   source=data["source"], source_policy=data["source_policy"],
                   default_timeout=data["default_timeout"], injection=data.get("injection", ""))  # fmt: skip


class Diverged(Exception):
    """A replayed prefix did not reproduce the recorded exit statuses."""


async def replay_prefix(session: TerminalSession, state: FailureState, default_timeout: float) -> None:
    """Type the prefix's commands into ``session`` with their recorded timeouts.

    Raises:
        Diverged: a command's exit status or time-out differs from the recorded step (message says which).
    """
    steps = [s for s in state.history if s.command]
    timeouts = list(state.replay_timeouts) + [None] * (len(steps) - len(state.replay_timeouts))
    for i, (step, timeout) in enumerate(zip(steps, timeouts)):
        result = await session.run(step.command or "", timeout=timeout or default_timeout)
        status = None if result.timed_out else result.exit_status
        if result.timed_out != step.timed_out or status != step.exit_status:
            raise Diverged(f"command {i} ({(step.command or '')[:60]!r}): recorded exit {step.exit_status}"
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


async def _rebuild_one(spec: EnvironmentConfig, task_dir: Path, item: WorkItem, tag: str) -> tuple[Any, TerminalSession]:
    env = make_environment(spec, task_dir, tag)
    try:
        await env.start(force_build=False)
        session = await TerminalSession.start(env)
        await replay_prefix(session, item.state, item.default_timeout)
    except BaseException:
        await stop_quietly(env)
        raise
    return env, session


async def run_attempts(item: WorkItem, policy: Any, cfg: RecoveryConfig, spec: EnvironmentConfig,
                       task_dir: Path) -> dict[str, Any]:  # fmt: skip
    """Rebuild ``item``'s failure state, run ``cfg.attempts`` recovery attempts from it and verify them.

    Returns the unit record ``{"state_id", "status", "rebuild", "detail", "diverged_attempts",
    "attempts": [trajectory JSON...]}``; ``status`` is ``ok``, ``diverged`` (no usable rebuild) or
    ``infra`` (the sandbox failed while rebuilding). Never raises for sandbox or policy faults.
    """
    n = cfg.attempts
    out: dict[str, Any] = {"state_id": item.state.id, "status": "ok", "rebuild": "", "detail": "",
                           "diverged_attempts": 0, "attempts": []}  # fmt: skip
    envs: list[Any] = []
    sessions: list[TerminalSession | None] = []
    try:
        mode = cfg.rebuild
        if mode in ("auto", "fork"):
            try:
                env, session = await _rebuild_one(spec, task_dir, item, "rebuild")
            except Diverged as exc:
                out.update(status="diverged", rebuild="fork", detail=str(exc), diverged_attempts=n)
                return out
            envs.append(env)
            if not can_fork(env):
                if mode == "fork":
                    raise ValueError(f"recovery.rebuild 'fork': environment {spec.type!r} has no snapshot fork")
                envs, sessions, mode = [env], [session], "replay"
            else:
                running = await user_processes(env)
                if running:  # a fork would lose them: rebuild every attempt by replay
                    out["detail"] = f"prefix left processes running ({', '.join(running[:3])}): rebuilt by replay"
                    envs, sessions, mode = [env], [session], "replay"
                else:
                    await session.close()
                    forks = await env.fork(n)
                    await stop_quietly(env)
                    envs, sessions, mode = forks, [None] * n, "fork"
        if mode == "replay":
            while len(envs) < n:
                try:
                    env, session = await _rebuild_one(spec, task_dir, item, f"replay{len(envs)}")
                except Diverged as exc:
                    out["diverged_attempts"] += 1
                    out["detail"] = str(exc)
                    if out["diverged_attempts"] >= n:
                        break
                    continue
                envs.append(env)
                sessions.append(session)
            if not envs:
                out.update(status="diverged", rebuild="replay")
                return out
        out["rebuild"] = mode
    except Exception as exc:  # the sandbox failed while rebuilding: an infrastructure fault
        logger.warning("failure state %s: rebuilding failed: %s", item.state.id, exc)
        out.update(status="infra", detail=f"{type(exc).__name__}: {exc}"[:500])
        for e in envs:
            await stop_quietly(e)
        return out
    try:
        specs = [
            EpisodeSpec(e, task_dir, history=item.state.history, session=s, instruction=item.instruction,
                        metadata={"failure_state": item.state.id, "attempt": i})  # fmt: skip
            for i, (e, s) in enumerate(zip(envs, sessions))
        ]
        trajs = await run_episodes(policy, specs, max_turns=cfg.max_turns, command_timeout_s=cfg.command_timeout,
                                   verify=True)  # fmt: skip
        out["attempts"] = [_compact(t) for t in trajs]
    finally:
        for e in envs:
            await stop_quietly(e)
    return out


def _compact(traj: Trajectory) -> dict[str, Any]:
    """Trajectory JSON without token ids and logprobs (not needed downstream, large)."""
    for s in traj.steps:
        s.extra.pop("completion_token_ids", None)
        s.extra.pop("logprobs", None)
    return traj.model_dump(mode="json")


def state_seed(seed: int, state_id: str) -> int:
    """The sampling seed of one failure state's attempts (stable across runs and resumes)."""
    return int(hashlib.sha256(f"{seed}:{state_id}".encode()).hexdigest()[:8], 16)


def reseed(policy: Any, seed: int) -> None:
    """Seed a local model's sampling before a failure state (endpoints get their seed per request)."""
    if hasattr(policy, "model"):
        import torch

        torch.manual_seed(seed)


async def recover_all(items: list[WorkItem], policy: Any, cfg: RecoveryConfig, spec: EnvironmentConfig,
                  tasks: dict[str, Path], done: Any, seed: int, progress: Any = None) -> None:  # fmt: skip
    """Run :func:`run_attempts` for every item, ``cfg.concurrency`` at a time, calling
    ``done(item, unit)`` as each finishes (the caller writes the unit atomically)."""
    sem = asyncio.Semaphore(cfg.concurrency)

    async def one(item: WorkItem) -> None:
        async with sem:
            if cfg.concurrency == 1:
                reseed(policy, state_seed(seed, item.state.id))
            unit = await run_attempts(item, policy, cfg, spec, tasks[item.state.task_id])
            done(item, unit)
            if progress is not None:
                progress.update(1)

    await asyncio.gather(*(one(i) for i in items))
