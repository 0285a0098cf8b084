"""Stages 3-4: fork N recovery attempts at each failure state, run them through the harness, verify them.

Rebuilding a failure state (the environment as the failing agent left it) is
:func:`reterm.recovery.materialize.materialize` (``recovery.rebuild``: ``auto`` | ``fork`` | ``replay``): snapshot +
fork on the local sandbox, replay on any other Harbor environment, the divergence check (a diverged rebuild is
dropped and counted, ``diverged``, never used) and the running-process rule (a prefix that left processes
running is rebuilt by replay for every attempt). Faults of the sandbox while rebuilding are infrastructure
faults.

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
from reterm.agent.protocol import SYSTEM_PROMPT
from reterm.data.config import EnvironmentConfig, RecoveryConfig
from reterm.data.environments import make_environment, stop_quietly
from reterm.recovery.materialize import materialize
from reterm.recovery.state import State, from_localiser_json
from reterm.trajectory import Trajectory

logger = logging.getLogger(__name__)


@dataclass
class WorkItem:
    """A failure state to recover from, with where it came from.

    ``state`` is a :class:`reterm.recovery.state.State`; ``instruction`` is the instruction the failing episode was shown (the
    prefix's user message); ``source`` is ``own`` or ``injected`` (the state's :class:`Source`);
    ``default_timeout`` is the command timeout the failing episode used for commands without one (applied on
    replay).

    Raises:
        ValueError: a ``State`` whose source is not ``source``.
    """

    state: State
    instruction: str
    source: str
    source_policy: str
    default_timeout: float
    injection: str = ""

    def __post_init__(self) -> None:
        if self.state.source != self.source:
            raise ValueError(f"failure state {self.state.id}: source {self.state.source.value!r}, "
                             f"work item says {self.source!r}")

    def to_json(self) -> dict[str, Any]:
        return {"state": self.state.to_json(), "instruction": self.instruction, "source": self.source,
                "source_policy": self.source_policy, "default_timeout": self.default_timeout,
                "injection": self.injection}  # fmt: skip

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "WorkItem":
        """The item :meth:`to_json` wrote (its state read by :func:`read_state`: journals written before the
        localiser made ``State`` objects still load).

        Raises:
            ValueError: the state's JSON is in neither layout (named, with the state's id).
        """
        return cls(state=read_state(data["state"], data["instruction"], data["source"]), instruction=data["instruction"],
                   source=data["source"], source_policy=data["source_policy"],
                   default_timeout=data["default_timeout"], injection=data.get("injection", ""))  # fmt: skip



def read_state(data: dict[str, Any], instruction: str, source: str) -> State:
    """A journal's state: :meth:`State.from_json`, or, for the localiser's older layout (journals written before
    it made ``State`` objects: no ``messages``), :func:`reterm.recovery.state.from_localiser_json` with the
    history shown after the kit's system prompt and ``instruction`` (what the pipeline converted it with then).

    Raises:
        ValueError: neither layout (named, with the state's id).
    """
    if "messages" not in data and "history_len" in data:
        head = Trajectory(task_id=data.get("task_id", ""), instruction=instruction, system_prompt=SYSTEM_PROMPT)
        return from_localiser_json(data, head, source)
    return State.from_json(data)

async def run_attempts(item: WorkItem, policy: Any, cfg: RecoveryConfig, spec: EnvironmentConfig,
                       task_dir: Path) -> dict[str, Any]:  # fmt: skip
    """Rebuild ``item``'s failure state (:func:`reterm.recovery.materialize.materialize`, method
    ``cfg.rebuild``), run ``cfg.attempts`` recovery attempts from it and verify them.

    Returns the unit record ``{"state_id", "status", "rebuild", "detail", "diverged_attempts",
    "attempts": [trajectory JSON...]}``; ``status`` is ``ok``, ``diverged`` (no usable rebuild) or
    ``infra`` (the sandbox failed while rebuilding). Never raises for sandbox or policy faults.
    """
    n = cfg.attempts
    out: dict[str, Any] = {"state_id": item.state.id, "status": "ok", "rebuild": "", "detail": "",
                           "diverged_attempts": 0, "attempts": []}  # fmt: skip
    try:
        made = await materialize(item.state, n, lambda tag: make_environment(spec, task_dir, tag), method=cfg.rebuild,
                                 default_timeout=item.default_timeout, stop_environment=stop_quietly)  # fmt: skip
    except Exception as exc:  # the sandbox failed while rebuilding: an infrastructure fault
        logger.warning("failure state %s: rebuilding failed: %s", item.state.id, exc)
        out.update(status="infra", detail=f"{type(exc).__name__}: {exc}"[:500])
        return out
    out.update(rebuild=made.method, detail=made.detail, diverged_attempts=made.diverged)
    if not made.environments:
        out["status"] = "diverged"
        return out
    try:
        specs = [
            EpisodeSpec(e, task_dir, history=item.state.history, session=s, instruction=item.instruction,
                        metadata={"failure_state": item.state.id, "attempt": i})  # fmt: skip
            for i, (e, s) in enumerate(zip(made.environments, made.sessions))
        ]
        trajs = await run_episodes(policy, specs, max_turns=cfg.max_turns, command_timeout_s=cfg.command_timeout,
                                   verify=True)  # fmt: skip
        out["attempts"] = [_compact(t) for t in trajs]
    finally:
        await made.stop()
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
