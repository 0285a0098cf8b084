"""Group rollouts of ReTerm-GRPO: G recovery attempts forked from each failure state, all in lock-step.

For a batch of groups (a :class:`reterm.training.failure_pool.PoolState` and a number of attempts each):

1. **Rebuild each state's environment once.** Its history's bash commands are typed again into the
   harness's terminal (:func:`reterm.recovery.materialize.type_history`, the commands' own timeouts), so files *and* shell state (cwd, exported variables) are those the agent left; every
   replayed exit status is compared with the recorded one and a difference is a *divergence* (the
   group is dropped and counted; the state is not used again). On the local sandbox the result is
   snapshotted and cached (:class:`reterm.training.failure_pool.SnapshotCache`, passed to
   :func:`reterm.recovery.materialize.materialize` as ``cache``); an online state starts from its parent's
   cached snapshot (``parent``) and replays only the commands after it. Processes are not
   part of a snapshot: a state left inside an interactive program continues at a fresh
   shell prompt with the same cwd and variables.
2. **Fork.** Snapshot path: G forks of that snapshot (G sandboxes with the state's files, started
   concurrently; the same ``materialize`` call). Replay path (any Harbor environment: docker, daytona, ...): G fresh
   environments, each replayed (:func:`reterm.recovery.materialize.materialize`, ``method="replay"``); a
   group with any diverged replay is dropped.
3. **Attempts.** One :func:`reterm.agent.episode.run_episodes` call over every attempt of every group:
   one ``policy.generate`` per turn for all live attempts, their commands run concurrently, each
   episode continues the state's history (the prompt), then the task's verifier scores it. A new
   terminal session in each fork restores the shell state the replay left.
4. **Tear-down.** Every environment started here is stopped in a ``finally``; snapshots belong to the
   cache (released when evicted or closed).

Rewards: the verifier's reward; infrastructure faults (:attr:`reterm.trajectory.Outcome.is_infra_fault`)
and dropped groups carry no reward (``None``) and zero loss weight (``mask_reason``).

Written for this kit: Harbor has no fork, TRL's tool loop no environments with state.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reterm.agent.environments import make_environment
from reterm.agent.episode import EpisodeSpec, run_episodes
from reterm.agent.protocol import DEFAULT_COMMAND_TIMEOUT_S
from reterm.generation import MAX_CONSECUTIVE_PARSE_ERRORS
from reterm.policies.base import EndpointError
from reterm.recovery.materialize import materialize
from reterm.rewards import training_reward
from reterm.sandbox.paths import pid_alive, proc_start_time
from reterm.sandbox.snapshot import list_snapshots
from reterm.training.failure_pool import PoolState, SnapshotCache
from reterm.training.grpo_policy import AttemptTokens, TokenTrajectoryPolicy
from reterm.trajectory import Outcome, Trajectory

logger = logging.getLogger(__name__)


@dataclass
class RolloutSettings:
    """How attempts run (the fields of :class:`reterm.training.grpo_config.ReTermGRPOConfig` of the same names).

    ``fork_method``: ``snapshot`` (local sandbox) or ``replay``; ``environment``: ``local``, a Harbor
    environment type or ``module:Class``.
    """

    max_turns: int = 30
    command_timeout_s: float | None = None
    time_budget_s: float | None = None
    max_consecutive_parse_errors: int | None = MAX_CONSECUTIVE_PARSE_ERRORS
    unsubmitted_reward_scale: float = 1.0
    environment: str = "local"
    fork_method: str = "snapshot"


@dataclass
class Attempt:
    """One recovery attempt: its trajectory, tokens, reward (``None``: no signal) and why it carries no
    loss (``mask_reason``: ``infra_fault``, ``dropped:<kind>``, ``zero_variance``; ``None``: trained on)."""

    state_id: str
    group: int
    index: int
    environment_id: str = ""
    trajectory: Trajectory | None = None
    tokens: AttemptTokens | None = None
    reward: float | None = None
    outcome: str = Outcome.PENDING.value
    mask_reason: str | None = None

    @property
    def scored(self) -> bool:
        return self.reward is not None

    @property
    def turns(self) -> int:
        t = self.trajectory
        return 0 if t is None else len(t.steps) - t.prefix_len


@dataclass
class GroupRollout:
    """The attempts of one group and how its environments were made (seconds: ``rebuild_s`` for the
    state's environment, ``fork_s`` for the G environments; ``snapshot_id`` on the snapshot path)."""

    state: PoolState
    group: int
    attempts: list[Attempt] = field(default_factory=list)
    dropped: str | None = None  # "diverged: ...", "sandbox: ..."
    rebuild_s: float = 0.0
    fork_s: float = 0.0
    snapshot_id: str | None = None
    cached: bool = False

    @property
    def rewards(self) -> list[float]:
        return [a.reward for a in self.attempts if a.reward is not None]

    @property
    def zero_variance(self) -> bool:
        """True for a group whose scored rewards are all equal (no gradient; needs 2+ scored attempts to tell)."""
        r = self.rewards
        return self.dropped is None and len(r) >= 1 and max(r) == min(r)


def _owner() -> dict[str, Any]:
    import os

    return {"grpo_owner_pid": os.getpid(), "grpo_owner_start": proc_start_time(os.getpid())}


def release_orphaned_snapshots() -> int:
    """Release the failure-state snapshots of GRPO runs whose process is gone (killed before it could
    release its cache); the sandbox deletes them once no fork uses them. Returns how many."""

    n = 0
    for snap in list_snapshots():
        extra = snap.meta.get("extra") or {}
        pid = extra.get("grpo_owner_pid")
        if pid and not snap.released and not pid_alive(pid, extra.get("grpo_owner_start")):
            snap.release()
            n += 1
    return n


class RolloutEngine:
    """Runs groups of attempts (see the module docstring).

    Args:
        settings: :class:`RolloutSettings`.
        cache: snapshots of rebuilt states (snapshot path); default a fresh cache of 16.
        lookup: ``state_id -> PoolState | None`` (finds an online state's parent).
    """

    def __init__(self, settings: RolloutSettings, *, cache: SnapshotCache | None = None,
                 lookup: Callable[[str], PoolState | None] | None = None) -> None:  # fmt: skip
        if settings.fork_method not in ("snapshot", "replay"):
            raise ValueError(f"fork_method: {settings.fork_method!r} (use snapshot or replay)")
        if settings.fork_method == "snapshot" and settings.environment != "local":
            raise ValueError("the snapshot fork needs the local sandbox (environment 'local'); use fork_method replay")
        self.settings = settings
        self.cache = cache if cache is not None else SnapshotCache()
        self.lookup = lookup or (lambda _id: None)
        self._trial_dirs: dict[int, Path] = {}  # trial folders this engine made for non-local environments
        if settings.fork_method == "snapshot":
            released = release_orphaned_snapshots()
            if released:
                logger.info("released %d failure-state snapshots of GRPO runs that ended without cleaning up", released)

    # ------------------------------------------------------------------------ environments
    def _new_environment(self, task_dir: str, trial_dir: Path | None = None):
        if self.settings.environment == "local":
            from reterm.sandbox.local import LocalEnvironment

            return LocalEnvironment.for_task(task_dir)
        import tempfile

        from harbor.models.task.task import Task

        trial = trial_dir or Path(tempfile.mkdtemp(prefix="reterm-grpo-trial-"))
        env = make_environment(self.settings.environment, Task(task_dir), trial)
        self._trial_dirs[id(env)] = trial
        return env

    async def _stop(self, env: Any) -> None:
        """Stop an environment and remove the trial folder made for it (never raises)."""
        import shutil

        try:
            await env.stop(delete=True)
        except Exception as exc:  # a failed stop must not hide the rollout's result
            logger.warning("stopping %s failed: %s", getattr(env, "session_id", env), exc)
        finally:
            trial = self._trial_dirs.pop(id(env), None)
            if trial is not None:
                shutil.rmtree(trial, ignore_errors=True)

    async def _fork(self, group: GroupRollout, n: int) -> list[Any]:
        """``n`` started environments in the group's state (the caller stops them). Sets ``group.dropped``
        (and returns ``[]``) when the state cannot be rebuilt."""
        state = group.state
        t0 = time.monotonic()
        if self.settings.fork_method == "snapshot":
            # the state's snapshot from the cache, or made once (from its parent's cached snapshot when it has one)
            parent = self.lookup(state.parent_id) if state.parent_id else None
            try:
                made = await materialize(state.state, n, lambda tag: self._new_environment(state.task_dir),
                                         method="snapshot", cache=self.cache,
                                         parent=parent.state if parent is not None else None,
                                         snapshot_extra={"state_id": state.state_id, **_owner()},
                                         default_timeout=self.settings.command_timeout_s or DEFAULT_COMMAND_TIMEOUT_S,
                                         stop_environment=self._stop)  # fmt: skip
            except Exception as exc:  # the sandbox failed while rebuilding or forking: an infrastructure fault
                group.dropped = f"sandbox: {type(exc).__name__}: {exc}"
                group.rebuild_s = time.monotonic() - t0
                return []
            group.rebuild_s, group.cached, group.fork_s = made.rebuild_s, made.cached, made.fork_s
            group.snapshot_id = made.snapshot_id or None
            if made.diverged:
                group.dropped = f"diverged: {made.detail}"
                return []
            return made.environments

        # replay path (materialize, method replay): n fresh environments, each replayed; any divergence drops
        # the group (its advantages need all n attempts)
        try:
            made = await materialize(state.state, n,
                                     lambda tag: self._new_environment(state.task_dir), method="replay",
                                     default_timeout=self.settings.command_timeout_s or DEFAULT_COMMAND_TIMEOUT_S,
                                     stop_environment=self._stop)  # fmt: skip
        except Exception as exc:
            group.fork_s = time.monotonic() - t0
            group.dropped = f"sandbox: {type(exc).__name__}: {exc}"
            return []
        group.fork_s = time.monotonic() - t0
        if made.diverged:
            await made.stop()
            group.dropped = f"diverged: {made.detail}"
            return []
        for s in made.sessions:  # the attempts open their own terminal (the shell state is restored from the hook)
            if s is not None:
                await s.close()
        return made.environments

    # ------------------------------------------------------------------------------- groups
    async def run(self, policy: TokenTrajectoryPolicy, groups: Sequence[tuple[PoolState, int, int]]) -> list[GroupRollout]:
        """Run every group's attempts; returns one :class:`GroupRollout` per group, in order.

        Args:
            policy: the token-recording policy (reset here).
            groups: ``(state, number of attempts, group index)`` per group.

        Raises:
            Exception: the policy's generation backend failed with anything but
                :class:`reterm.policies.base.EndpointError` (a bug or out-of-memory in the trainer, never an
                environment fault; an ``EndpointError``, a model server down, is an infrastructure fault of
                the attempts); every environment is stopped first.
        """
        policy.reset()
        out = [GroupRollout(state=s, group=g) for s, _, g in groups]
        envs_per_group: list[list[Any]] = [[] for _ in groups]
        self.cache.pin(s.state_id for s, _, _ in groups)
        try:
            forked = await asyncio.gather(*(self._fork(gr, n) for gr, (_, n, _) in zip(out, groups)),
                                          return_exceptions=True)  # fmt: skip
            for k, res in enumerate(forked):
                if isinstance(res, BaseException):
                    if not isinstance(res, Exception):
                        raise res
                    out[k].dropped = f"sandbox: {type(res).__name__}: {res}"
                else:
                    envs_per_group[k] = res
            specs, where = [], []
            for k, (gr, envs) in enumerate(zip(out, envs_per_group)):
                for i, env in enumerate(envs):
                    specs.append(EpisodeSpec(env, gr.state.task_dir, history=gr.state.history,
                                             instruction=gr.state.instruction,
                                             metadata={"state_id": gr.state.state_id, "group": gr.group, "attempt": i,
                                                       "failure_category": gr.state.category,
                                                       "state_source": gr.state.state_source.value,
                                                       "pool_origin": gr.state.source}))  # fmt: skip
                    where.append((k, i, getattr(env, "session_id", "")))
            trajs: list[Trajectory] = []
            if specs:
                s = self.settings
                trajs = await run_episodes(
                    policy, specs, max_turns=s.max_turns, time_budget_s=s.time_budget_s,
                    command_timeout_s=s.command_timeout_s, max_consecutive_parse_errors=s.max_consecutive_parse_errors,
                )  # fmt: skip
            bugs = [e for e in policy.errors if not isinstance(e, EndpointError)]
            if bugs:  # our own generation failed (a bug, out of memory): not an environment fault
                raise bugs[0]
            tokens = policy.tokens_for(trajs)
            for (k, i, env_id), traj, tok in zip(where, trajs, tokens):
                a = Attempt(state_id=out[k].state.state_id, group=out[k].group, index=i, environment_id=env_id,
                            trajectory=traj, tokens=tok, outcome=traj.outcome.value)  # fmt: skip
                if traj.outcome.is_infra_fault:
                    a.mask_reason = "infra_fault"
                elif traj.reward is not None:
                    a.reward = training_reward(traj.reward, traj.stop_reason == "submitted",
                                               self.settings.unsubmitted_reward_scale)
                out[k].attempts.append(a)
            for k, (gr, (state, n, _)) in enumerate(zip(out, groups)):
                if gr.dropped is not None:
                    prompt = policy.prompt_ids(state.prompt)
                    gr.attempts = [Attempt(state_id=state.state_id, group=gr.group, index=i,
                                           tokens=AttemptTokens(prompt, [policy.end_of_turn], [0], None),
                                           outcome=Outcome.SANDBOX_ERROR.value,
                                           mask_reason=f"dropped:{gr.dropped.split(':', 1)[0]}") for i in range(n)]  # fmt: skip
        finally:
            everything = [e for envs in envs_per_group for e in envs]
            await asyncio.gather(*(self._stop(e) for e in everything))
            self.cache.unpin()
        return out
