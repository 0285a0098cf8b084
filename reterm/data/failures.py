"""Stage 2: failure states of the failed rollouts, localised and classified by :mod:`reterm.recovery`.

Only agent failures are mined: trajectories whose outcome is an infrastructure fault were already set
apart by the rollout stage, and :func:`reterm.recovery.localise` never turns an infrastructure step into a
failure state. Each failed trajectory contributes the states chosen by ``failures.select``
(:meth:`reterm.recovery.LocalisationResult.select`: by default the first consequential failure, as the
paper recovers from). Identical states (same id: the same trajectory content, step and category, e.g.
two identical greedy episodes) are kept once.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from reterm.data.config import FailuresConfig
from reterm.policies import load_policy
from reterm.recovery import Classifier, FailureState, LLMJudge, localise_many
from reterm.trajectory import Trajectory


def make_classifier(cfg: FailuresConfig) -> Classifier:
    """Rules only, or rules + an LLM judge through any policy spec (``failures.judge``)."""
    if not cfg.judge:
        return Classifier()

    return Classifier(judge=LLMJudge(load_policy(cfg.judge, **cfg.judge_kwargs)))


@dataclass
class MinedStates:
    """The failure states chosen from the failed rollouts, and how the failed trials fared."""

    states: list[FailureState] = field(default_factory=list)
    failed_trials: int = 0
    unexplained: int = 0  # failed trials without any failure state (e.g. out of turns while working)
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


def mine_states(failed: list[Trajectory], cfg: FailuresConfig) -> MinedStates:
    """Localise the failed trajectories (one batched classifier call) and select their failure states.

    Args:
        failed: trajectories with outcome ``FAILURE`` and ``metadata["trajectory_id"]`` set.
        cfg: selection mode, per-trajectory cap, optional judge.

    Returns:
        :class:`MinedStates`, states sorted by (task, id).
    """
    out = MinedStates(failed_trials=len(failed))
    # a trial that broke its sandbox (docs/SCORING.md) is a scored failure, but its state cannot be
    # forked into a recovery attempt: the sandbox no longer runs commands or the verifier
    kept = [t for t in failed if not t.metadata.get("broken_by_agent")]
    out.broken_sandboxes = len(failed) - len(kept)
    failed = kept
    seen: set[str] = set()
    for result in localise_many(failed, make_classifier(cfg)):
        out.step_labels.update(label for label in result.step_labels if label)
        chosen = result.select(cfg.select, cfg.max_states_per_trajectory)
        if not chosen:
            out.unexplained += 1
        for state in chosen:
            if state.id in seen:
                out.duplicates += 1
                continue
            seen.add(state.id)
            out.states.append(state)
    out.states.sort(key=lambda s: (s.task_id, s.id))
    return out
