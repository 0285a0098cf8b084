"""Stage 2: the attempt-level failure states of the failed rollouts (the release's protocol).

Each failed attempt is one failure state, made by :func:`reterm.recovery.attempts.attempt_end_state` (the
function the drills pipeline and the drills evaluation use): the whole attempt as history, the versioned
feedback message on its last step, ``level=Level.ATTEMPT``; its records get ``target_attempt_index = 2`` and
train from the first assistant turn after the feedback message. Its category is the one
:func:`reterm.recovery.localise_many` gives the attempt's first consequential failing step (rules, or rules
and ``failures.judge``), else the task's declared category.

Only agent failures are mined: trajectories whose outcome is an infrastructure fault were already set
apart by the rollout stage; a trial that broke its sandbox (docs/SCORING.md) is a scored failure, but its
state cannot be rebuilt for a recovery attempt. Identical states (same id: the same attempt content, e.g. two
identical greedy episodes) are kept once. ``failures.select`` and ``max_states_per_trajectory`` pick the
step whose category labels the attempt (one state per attempt whatever they say).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reterm.data.config import FailuresConfig
from reterm.policies import load_policy
from reterm.recovery import Classifier, LLMJudge, localise_many
from reterm.recovery.attempts import Attempt, attempt_end_state
from reterm.recovery.state import State
from reterm.trajectory import Trajectory


def make_classifier(cfg: FailuresConfig) -> Classifier:
    """Rules only, or rules + an LLM judge through any policy spec (``failures.judge``)."""
    if not cfg.judge:
        return Classifier()

    return Classifier(judge=LLMJudge(load_policy(cfg.judge, **cfg.judge_kwargs)))


@dataclass
class MinedStates:
    """The failure states chosen from the failed rollouts, and how the failed trials fared."""

    states: list[State] = field(default_factory=list)
    failed_trials: int = 0
    unexplained: int = 0  # failed trials without a failing step (labelled with the task's category)
    duplicates: int = 0
    broken_sandboxes: int = 0  # failed because the agent broke its sandbox: nothing to recover in
    step_labels: Counter = field(default_factory=Counter)

    def summary(self) -> dict[str, Any]:
        return {
            "failed_trials": self.failed_trials,
            "states": len(self.states),
            "unexplained_trials": self.unexplained,
            "duplicate_states": self.duplicates,
            "broken_sandbox_trials": self.broken_sandboxes,
            "per_category": dict(sorted(Counter(s.category for s in self.states).items())),
            "step_labels": dict(sorted(self.step_labels.items())),
        }


def mine_states(failed: list[Trajectory], cfg: FailuresConfig, task_dirs: dict[str, Path]) -> MinedStates:
    """One attempt-level failure state per failed trajectory (one batched classifier call for the categories).

    Args:
        failed: trajectories with outcome ``FAILURE`` and ``metadata["rollout_id"]`` set.
        cfg: the step-selection mode whose first state labels the attempt, optional judge.
        task_dirs: task id -> task folder (the declared category of an attempt without a failing step).

    Returns:
        :class:`MinedStates`, states (``level=Level.ATTEMPT``) sorted by (task, id).

    Raises:
        KeyError: a trajectory's task is not in ``task_dirs``.
    """
    out = MinedStates(failed_trials=len(failed))
    kept = [t for t in failed if not t.metadata.get("broken_by_agent") and t.steps]
    out.broken_sandboxes = sum(1 for t in failed if t.metadata.get("broken_by_agent"))
    out.unexplained = sum(1 for t in failed if not t.steps and not t.metadata.get("broken_by_agent"))
    seen: set[str] = set()
    for traj, result in zip(kept, localise_many(kept, make_classifier(cfg))):
        out.step_labels.update(label for label in result.step_labels if label)
        chosen = result.select(cfg.select, cfg.max_states_per_trajectory)
        state = attempt_end_state(Attempt(task_dirs[traj.task_id], traj))
        if chosen:
            state.category = chosen[0].category
        else:
            out.unexplained += 1
        if state.id in seen:
            out.duplicates += 1
            continue
        seen.add(state.id)
        out.states.append(state)
    out.states.sort(key=lambda s: (s.task_id, s.id))
    return out
