"""Attempt-level failure states (the release's protocol): snapshot at the end of a failed attempt, recover
from a fork of it.

The authors' protocol (Recovery-Bench, ReTerm-10K's ``target_attempt_index = 2``): an attempt ends (the
agent submits, or runs out of turns or parse errors); the sandbox's files are snapshotted **before** the
verifier runs; the verifier then runs in the original sandbox. A failed attempt's snapshot is its failure
state. A recovery attempt starts from a fork of that snapshot with the whole first attempt in its context and
one feedback message (:func:`reterm.agent.protocol.feedback_message`, versioned; it does not reveal the
tests; a chain drill's adds the parts done and left) carried by the attempt's last step (``step.extra["feedback"]``, rendered by
:func:`reterm.agent.protocol.step_messages`).

The failure state is one :class:`reterm.recovery.state.State` with ``level=Level.ATTEMPT``,
``history`` = the whole attempt (feedback on its last step), ``localisation.snapshot_id`` = the local sandbox
snapshot; its ``category`` is the localiser's (the first consequential failing step), or the task's declared
category when the localiser finds no failing step (e.g. only parse errors).

Used by the drills data builder (:mod:`reterm.data.drills`), the drills evaluation (:mod:`reterm.eval.drills`) and the
failure-state pool of ReTerm-GRPO. Runs on the local sandbox (:class:`reterm.sandbox.local.LocalEnvironment`),
the only environment here that snapshots; elsewhere a state is rebuilt by replaying ``replay_commands``.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reterm.agent.episode import EpisodeSpec, load_task, run_episodes, run_verifier
from reterm.agent.protocol import FEEDBACK_MESSAGE, feedback_message
from reterm.recovery.localise import localise
from reterm.recovery.materialize import materialize
from reterm.recovery.state import Level, Localisation, Source, State, history_messages, state_id
from reterm.recovery.taxonomy import parse_category
from reterm.trajectory import Outcome, Step, Trajectory


@dataclass
class Attempt:
    """One finished attempt.

    Attributes:
        task_dir: the task folder.
        trajectory: the attempt (reward and outcome set by the verifier, or an infrastructure fault).
        snapshot: the sandbox's files at the end of the attempt, before the verifier ran (a
            :class:`reterm.sandbox.snapshots.Snapshot`), kept only for failed attempts when asked; the
            caller releases it (:func:`release`).
    """

    task_dir: Path
    trajectory: Trajectory
    snapshot: Any = None

    @property
    def failed(self) -> bool:
        """The verifier scored the attempt and it did not pass (infrastructure faults are not failures)."""
        return self.trajectory.outcome is Outcome.FAILURE


def failed_checks(attempt: Attempt) -> int | None:
    """How many verifier checks the attempt failed: the lines of its verifier output tail
    (``trajectory.metadata["verifier_output_tail"]``, written by :func:`reterm.agent.episode.run_verifier`) that
    start with ``FAIL:`` (the kit's drill verifiers print one per failed check; ``tests/test.sh`` of
    :func:`reterm.drills.generate.test_script`). ``None`` when there is no tail (unknown progress)."""
    tail = attempt.trajectory.metadata.get("verifier_output_tail")
    if not isinstance(tail, str) or not tail.strip():
        return None
    return sum(line.lstrip().startswith("FAIL:") for line in tail.splitlines())


def most_progress(attempts: Sequence[Attempt]) -> Attempt | None:
    """The failed attempt of ``attempts`` that got furthest: the failure state a recovery group forks from.

    Rule (the ReTerm recipe forks where the agent got furthest: a recovery from there has the least left to do,
    while a degenerate attempt, one that submitted at once or produced only parse errors, wastes the group):

    1. candidates are the failed attempts (:attr:`Attempt.failed`) with at least one step; infrastructure faults
       and passed attempts never are;
    2. most progress = fewest failed verifier checks (:func:`failed_checks`); an attempt without a verifier
       output tail counts as worst (its progress is unknown);
    3. ties: more agent commands that exited 0 (a parsed action with ``exit_status == 0``), then fewer parse
       errors, then the earliest attempt (so the choice is deterministic).

    Returns ``None`` when no attempt is a candidate.
    """

    def key(item: tuple[int, Attempt]) -> tuple[float, int, int, int]:
        i, a = item
        steps = a.trajectory.steps
        n_fail = failed_checks(a)
        ok = sum(s.action is not None and s.exit_status == 0 for s in steps)
        parse_errors = sum(s.parse_error is not None for s in steps)
        return (float("inf") if n_fail is None else n_fail, -ok, parse_errors, i)

    candidates = [(i, a) for i, a in enumerate(attempts) if a.failed and a.trajectory.steps]
    return min(candidates, key=key)[1] if candidates else None


def task_category(task_dir: str | Path) -> str:
    """The first of the task's declared ``[metadata] error_categories`` (``other`` when none)."""
    task = load_task(Path(task_dir))
    cats = list((task.config.metadata or {}).get("error_categories") or [])
    return parse_category(cats[0]).value if cats else "other"


def with_feedback(steps: Sequence[Step], feedback: str = FEEDBACK_MESSAGE) -> list[Step]:
    """Copies of an attempt's steps, marked as history, the last one carrying ``feedback``.

    Raises:
        ValueError: ``steps`` is empty (an attempt that took no step has no failure state to recover from).
    """
    if not steps:
        raise ValueError("an attempt without steps cannot be continued by a recovery attempt")
    out = [s.model_copy(deep=True, update={"from_history": True}) for s in steps]
    out[-1].extra["feedback"] = feedback
    return out


def attempt_end_state(attempt: Attempt, source: str = Source.OWN, *, context_steps: int | None = None) -> State:
    """The attempt-level :class:`State` of a failed attempt (``level=Level.ATTEMPT``).

    Its history is the whole attempt (or its last ``context_steps`` steps) with the feedback message on the last
    step, shown after the attempt's system prompt and instruction (so its id is the one the dataset, the GRPO pool
    and the eval give it);
    ``step`` is the last step's index; ``category``, ``command``, ``output``, ``exit_status`` and ``evidence``
    are those of the attempt's first consequential failing step (:func:`reterm.recovery.localise.localise`),
    else the task's declared category and the last step's. :attr:`State.localisation` holds the label's
    confidence and source (``localiser``, or ``task`` when no failing step was found), ``primary=True``,
    ``trial_passed=False``, the rollout id and the kept snapshot's id.

    Args:
        attempt: a failed attempt.
        source: the state's :class:`reterm.recovery.state.Source` (``own``; ``injected`` for a scripted mistake).
        context_steps: keep only the attempt's last ``context_steps`` steps in the history (``None``: all). The
            sandbox state is the whole attempt's either way (its snapshot), but ``replay_commands`` are the kept
            steps' commands (the prefix's, as every record's), so such a state is rebuilt from its snapshot only.
            An ablation of the release's protocol (the whole first attempt in context), for a model that re-types
            its history's commands; at 135M on four-stage chains it recovered as often (docs/EXPERIMENTS.md).
            ``category``, ``command``, ``output``, ``evidence`` and the localisation still describe the whole
            attempt (their step may lie before the kept ones); kept steps keep their ``Step.index``, while
            ``step`` indexes the shortened history.

    Raises:
        ValueError: the attempt did not fail (passed, or an infrastructure fault) or took no step, or
            ``context_steps`` is below 1.
    """
    traj = attempt.trajectory
    if not attempt.failed:
        raise ValueError(f"task {traj.task_id}: attempt outcome {traj.outcome.value} is not a failure")
    if context_steps is not None and context_steps < 1:
        raise ValueError(f"context_steps must be at least 1 (the step that carries the feedback), got {context_steps}")
    kept = traj.steps if context_steps is None else traj.steps[-context_steps:]
    history = with_feedback(kept, feedback_message(traj.metadata.get("verifier_output_tail"), traj.instruction))
    primary = localise(traj).primary
    category = primary.category if primary is not None else task_category(attempt.task_dir)
    commands = [s.action.command or "" for s in history if s.action is not None and s.action.tool == "bash"]
    timeouts = [s.action.timeout for s in history if s.action is not None and s.action.tool == "bash"]
    last = history[-1]
    messages = history_messages(traj, history)
    loc = Localisation(confidence=primary.localisation.confidence if primary else 0.5,
                       source="localiser" if primary else "task", trial_passed=False, primary=True,
                       origin_id=str(traj.metadata.get("rollout_id", "")),
                       snapshot_id=attempt.snapshot.id if attempt.snapshot is not None else None)  # fmt: skip
    return State(
        id=state_id(traj.task_id, messages), task_id=traj.task_id, messages=messages, category=category,
        source=source, level=Level.ATTEMPT, history=history, replay_commands=commands, replay_timeouts=timeouts,
        step=len(history) - 1, command=(primary.command if primary else last.command) or "",
        output=(primary.output if primary else last.observation) or "",
        exit_status=primary.exit_status if primary else last.exit_status, evidence=primary.evidence if primary else "",
        localisation=loc,
    )  # fmt: skip


async def _start(task_dir: Path, state: State | None = None, snapshot: Any = None) -> Any:
    from reterm.sandbox.local import LocalEnvironment

    if snapshot is not None:  # the state's snapshot, forked (the one rebuild: reterm.recovery.materialize)
        made = await materialize(state, 1, None, method="snapshot", snapshot=snapshot)
        return made.environments[0]
    env = LocalEnvironment.for_task(task_dir)
    await env.start(force_build=False)
    return env


async def run_attempts(
    policy: Any,
    task_dirs: Sequence[str | Path],
    *,
    states: Sequence[State | None] | None = None,
    snapshots: Sequence[Any] | None = None,
    max_turns: int = 4,
    command_timeout_s: float = 15.0,
    max_consecutive_parse_errors: int | None = 2,
    keep_failed_snapshots: bool = False,
    on_step: Any = None,
) -> list[Attempt]:
    """Run one attempt per task folder in lock-step (one ``policy.generate`` call per turn), then verify.

    Each attempt starts in a fresh sandbox of its task, or, with ``states``/``snapshots``, as a recovery
    attempt: in a fork of the snapshot with the state's history (the failed attempt plus feedback) as
    context. At the end the sandbox is snapshotted when ``keep_failed_snapshots`` (before the verifier, so
    the snapshot holds exactly the files the attempt left), then the task's verifier scores the attempt.
    Snapshots of attempts that did not fail are released at once.

    Args:
        policy: a :class:`reterm.policies.base.Policy`.
        task_dirs: one task folder per attempt.
        states: per attempt, the failure state to recover from (``None``: start at the task's start).
        snapshots: per attempt with a state, its snapshot (a ``Snapshot`` or its id/folder).
        max_turns: turns generated per attempt.
        command_timeout_s: a command's default timeout, seconds.
        max_consecutive_parse_errors: an attempt stops after this many parse errors in a row.
        keep_failed_snapshots: keep the end-of-attempt snapshot of failed attempts (their failure states).
        on_step: passed to :func:`reterm.agent.episode.run_episodes`.

    Returns:
        One :class:`Attempt` per task folder, in order. Sandbox start faults become infrastructure-fault
        trajectories (never failures); nothing raises for a fault of the policy or a sandbox.
    """
    n = len(task_dirs)
    states = list(states) if states is not None else [None] * n
    snapshots = list(snapshots) if snapshots is not None else [None] * n
    if len(states) != n or len(snapshots) != n:
        raise ValueError(f"run_attempts: {n} task folders but {len(states)} states and {len(snapshots)} snapshots")
    dirs = [Path(d) for d in task_dirs]
    started = await asyncio.gather(*(_start(d, st, s) for d, st, s in zip(dirs, states, snapshots)),
                             return_exceptions=True)
    live = [i for i, e in enumerate(started) if not isinstance(e, BaseException)]
    results: list[Attempt | None] = [None] * n
    for i, e in enumerate(started):
        if isinstance(e, BaseException):  # the sandbox never started: not the agent's doing
            task = load_task(dirs[i])
            t = Trajectory(task_id=str(task.name), instruction=task.instruction, system_prompt="",
                           outcome=Outcome.SANDBOX_ERROR, error=f"{type(e).__name__}: {e}"[:500])
            results[i] = Attempt(dirs[i], t)
    try:
        specs = [EpisodeSpec(started[i], dirs[i], history=(states[i].history if states[i] is not None else None))
                 for i in live]  # fmt: skip
        trajs = await run_episodes(policy, specs, max_turns=max_turns, command_timeout_s=command_timeout_s,
                                   max_consecutive_parse_errors=max_consecutive_parse_errors, verify=False,
                                   on_step=on_step)  # fmt: skip

        async def finish(i: int, traj: Trajectory) -> None:
            env = started[i]
            snap = None
            # an attempt that broke its sandbox is already scored (docs/SCORING.md): no verifier, and no
            # failure state to recover from
            if not traj.outcome.is_infra_fault and not traj.metadata.get("broken_by_agent"):
                if keep_failed_snapshots:
                    snap = await env.snapshot()
                with tempfile.TemporaryDirectory(prefix="reterm-verify-") as tmp:
                    await run_verifier(env, dirs[i], traj, trial_dir=tmp)
            if snap is not None and traj.outcome is not Outcome.FAILURE:
                snap.release()
                snap = None
            results[i] = Attempt(dirs[i], traj, snap)

        await asyncio.gather(*(finish(i, t) for i, t in zip(live, trajs)))
    finally:
        await asyncio.gather(*(started[i].stop(delete=True) for i in live), return_exceptions=True)
    return [r for r in results if r is not None]


def release(attempts: Sequence[Attempt]) -> None:
    """Release the snapshots the attempts hold (their failure states can no longer be forked)."""
    for a in attempts:
        if a.snapshot is not None:
            a.snapshot.release()
            a.snapshot = None
