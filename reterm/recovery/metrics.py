"""Recovery metrics per error category, for the evaluation, the GRPO logs and the dataset report.

Two measurements (the recovery analysis of an evaluation's own trials, and the recovery evaluation from
recorded failure states):

- :func:`in_trial_recovery` - over ordinary trials: for each error category, how many failure states the
  agent hit (:func:`reterm.recovery.localise.localise`) and how many of those were in trials the
  verifier still passed. ``recovery_rate = recovered / failure_states``.
- :func:`attempt_recovery` - over recovery attempts started from recorded failure states (as in
  Recovery-Bench: fork or replay the state, let the agent continue, verify): per category the attempts,
  the successes (``success_rate = successes / attempts``), and the distinct states with at least one
  successful attempt (``state_recovery_rate``).

Infrastructure faults (``Outcome.is_infra_fault``) are never counted as successes or failures: they are
excluded and counted apart (``infra_faults``), as are unscored trials (verifier not run). Rates come
with the binomial standard error ``sqrt(p (1 - p) / n)``. Results are plain dataclasses
(:func:`dataclasses.asdict` gives JSON for ``results.json``) with a ``to_markdown()`` table.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable

from reterm.recovery.localise import LocalisationResult, SelectMode, localise_many
from reterm.recovery.state import State
from reterm.recovery.taxonomy import FAILURE_CATEGORIES, parse_category
from reterm.trajectory import Outcome, Trajectory


def _rate(k: int, n: int) -> float | None:
    return k / n if n else None


def _stderr(k: int, n: int) -> float | None:
    if not n:
        return None
    p = k / n
    return math.sqrt(p * (1 - p) / n)


def _fmt(x: float | None, se: float | None = None) -> str:
    if x is None:
        return "-"
    return f"{x:.2f}" if se is None else f"{x:.2f} ± {se:.2f}"


def markdown_table(headers: list[str], rows: list[list[Any]]) -> str:
    """A GitHub-flavoured markdown table; the first column left-aligned, the others right-aligned."""
    align = ["---"] + ["---:"] * (len(headers) - 1)
    lines = ["| " + " | ".join(headers) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


# ---------------------------------------------------------------------------- in-trial recovery
@dataclass
class CategoryRecovery:
    """One category's failure states in scored trials and how many of those trials still passed."""

    category: str
    failure_states: int = 0
    recovered: int = 0

    @property
    def recovery_rate(self) -> float | None:
        """``recovered / failure_states`` (``None`` without failure states)."""
        return _rate(self.recovered, self.failure_states)

    @property
    def stderr(self) -> float | None:
        """Binomial standard error of :attr:`recovery_rate`."""
        return _stderr(self.recovered, self.failure_states)


@dataclass
class InTrialRecovery:
    """Per-category in-trial recovery over a set of trials.

    ``trajectories``/``passed`` count scored trials; ``infra_faults`` (infrastructure-fault outcomes) and
    ``unscored`` (verifier not run) trials are excluded from every rate; ``infra_steps`` counts steps
    tagged as infrastructure faults inside scored trials. ``scope`` says which failure states were
    counted (``first``: one per trial, ``consequential`` or ``all``).
    """

    categories: dict[str, CategoryRecovery] = field(
        default_factory=lambda: {c.value: CategoryRecovery(c.value) for c in FAILURE_CATEGORIES}
    )
    trajectories: int = 0
    passed: int = 0
    infra_faults: int = 0
    unscored: int = 0
    infra_steps: int = 0
    scope: str = "all"

    @property
    def failure_states(self) -> int:
        return sum(c.failure_states for c in self.categories.values())

    @property
    def recovered(self) -> int:
        return sum(c.recovered for c in self.categories.values())

    @property
    def recovery_rate(self) -> float | None:
        """Over all categories: ``recovered / failure_states``."""
        return _rate(self.recovered, self.failure_states)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (categories with their rates, totals)."""
        out = asdict(self)
        for name, cat in self.categories.items():
            out["categories"][name].update(recovery_rate=cat.recovery_rate, stderr=cat.stderr)
        out.update(failure_states=self.failure_states, recovered=self.recovered, recovery_rate=self.recovery_rate)
        return out

    def to_markdown(self) -> str:
        """Table: category | failure states | trial passed | recovery rate ± stderr, then totals."""
        rows = [[c.category, c.failure_states, c.recovered, _fmt(c.recovery_rate, c.stderr)]
                for c in self.categories.values()]
        rows.append(["**all**", self.failure_states, self.recovered,
                     _fmt(self.recovery_rate, _stderr(self.recovered, self.failure_states))])
        table = markdown_table(["category", "failure states", "trial passed", "recovery rate"], rows)
        note = (f"{self.trajectories} scored trials ({self.passed} passed), failure states counted: {self.scope}; "
                f"excluded: {self.infra_faults} infrastructure faults, {self.unscored} unscored; "
                f"{self.infra_steps} steps tagged as infrastructure faults.")
        return f"{table}\n\n{note}"


def in_trial_recovery(items: Iterable[Trajectory | LocalisationResult], *, scope: SelectMode = "all",
                      classifier=None) -> InTrialRecovery:
    """Per-category in-trial recovery rates.

    Args:
        items: trajectories (localised here with ``classifier``, rules only by default) or results of
            :func:`~reterm.recovery.localise.localise`, mixed freely.
        scope: which failure states of a trial count: ``"all"`` (default), ``"consequential"`` or
            ``"first"`` (the primary state only: one per trial).
        classifier: used for the trajectories among ``items``.

    Returns:
        :class:`InTrialRecovery`. A failure state counts as recovered when its trial's outcome is
        ``SUCCESS``. Infrastructure-fault and unscored trials are excluded and counted apart.
    """
    items = list(items)
    trajectories = [x for x in items if isinstance(x, Trajectory)]
    localised = iter(localise_many(trajectories, classifier) if trajectories else [])
    results = [next(localised) if isinstance(x, Trajectory) else x for x in items]
    report = InTrialRecovery(scope=scope)
    for res in results:
        if res.outcome.is_infra_fault:
            report.infra_faults += 1
            continue
        if not res.scored:
            report.unscored += 1
            continue
        report.trajectories += 1
        passed = res.outcome is Outcome.SUCCESS
        report.passed += int(passed)
        report.infra_steps += len(res.infra_steps)
        for state in res.select(scope):
            cat = report.categories.setdefault(state.category, CategoryRecovery(state.category))
            cat.failure_states += 1
            cat.recovered += int(passed)
    return report


# ------------------------------------------------------------------ recovery from recorded states
@dataclass
class RecoveryAttempt:
    """One recovery attempt started from a recorded failure state, as the metrics need it.

    ``state_id`` (:attr:`reterm.recovery.state.State.id`) groups attempts of the same state; ``category`` is the state's
    category id; ``outcome`` the attempt's trial outcome (infra faults are excluded from rates).
    """

    state_id: str
    category: str
    outcome: Outcome

    @classmethod
    def from_trajectory(cls, state: State, attempt: Trajectory) -> "RecoveryAttempt":
        """From the failure state an attempt started at and the attempt's trajectory."""
        return cls(state_id=state.id, category=state.category, outcome=attempt.outcome)


@dataclass
class CategoryAttempts:
    """One category's recovery attempts from recorded failure states.

    ``states``: distinct failure states with at least one scored attempt; ``states_recovered``: those
    with at least one successful attempt; ``attempts``/``successes``: scored attempts and passes;
    ``infra_faults``: attempts excluded as infrastructure faults; ``unscored``: attempts never verified.
    """

    category: str
    states: int = 0
    states_recovered: int = 0
    attempts: int = 0
    successes: int = 0
    infra_faults: int = 0
    unscored: int = 0

    @property
    def success_rate(self) -> float | None:
        """``successes / attempts``: the recovery rate of one attempt (Recovery-Bench's measure)."""
        return _rate(self.successes, self.attempts)

    @property
    def stderr(self) -> float | None:
        return _stderr(self.successes, self.attempts)

    @property
    def state_recovery_rate(self) -> float | None:
        """``states_recovered / states``: share of states recovered by at least one attempt."""
        return _rate(self.states_recovered, self.states)


@dataclass
class AttemptRecovery:
    """Per-category results of recovery attempts from recorded failure states."""

    categories: dict[str, CategoryAttempts] = field(
        default_factory=lambda: {c.value: CategoryAttempts(c.value) for c in FAILURE_CATEGORIES}
    )

    def _total(self, name: str) -> int:
        return sum(getattr(c, name) for c in self.categories.values())

    @property
    def attempts(self) -> int:
        return self._total("attempts")

    @property
    def successes(self) -> int:
        return self._total("successes")

    @property
    def infra_faults(self) -> int:
        return self._total("infra_faults")

    @property
    def success_rate(self) -> float | None:
        return _rate(self.successes, self.attempts)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict with per-category rates and totals."""
        out = asdict(self)
        for name, cat in self.categories.items():
            out["categories"][name].update(success_rate=cat.success_rate, stderr=cat.stderr,
                                           state_recovery_rate=cat.state_recovery_rate)
        out.update(attempts=self.attempts, successes=self.successes, infra_faults=self.infra_faults,
                   success_rate=self.success_rate)
        return out

    def to_markdown(self) -> str:
        """Table: category | states | states recovered | attempts | successes | success rate ± stderr | infra."""
        rows = [[c.category, c.states, c.states_recovered, c.attempts, c.successes,
                 _fmt(c.success_rate, c.stderr), c.infra_faults] for c in self.categories.values()]
        rows.append(["**all**", self._total("states"), self._total("states_recovered"), self.attempts,
                     self.successes, _fmt(self.success_rate, _stderr(self.successes, self.attempts)), self.infra_faults])
        return markdown_table(["category", "states", "states recovered", "attempts", "successes",
                               "success rate", "infra faults (excluded)"], rows)


def attempt_recovery(attempts: Iterable[RecoveryAttempt | tuple[State, Trajectory]]) -> AttemptRecovery:
    """Per-category recovery from recorded failure states.

    Args:
        attempts: :class:`RecoveryAttempt` objects or ``(failure state, attempt trajectory)`` pairs.

    Returns:
        :class:`AttemptRecovery`. Attempts with an infrastructure-fault outcome count only in
        ``infra_faults``; unverified ones (``PENDING``) only in ``unscored``.
        Raises ``ValueError`` for an attempt whose category is not a failure category.
    """
    report = AttemptRecovery()
    seen: dict[tuple[str, str], bool] = {}
    for item in attempts:
        a = RecoveryAttempt.from_trajectory(*item) if isinstance(item, tuple) else item
        category = parse_category(a.category)
        if not category.is_failure:
            raise ValueError(f"recovery attempt of state {a.state_id!r}: {a.category!r} is not a failure category")
        cat = report.categories.setdefault(category.value, CategoryAttempts(category.value))
        if a.outcome.is_infra_fault:
            cat.infra_faults += 1
            continue
        if a.outcome not in (Outcome.SUCCESS, Outcome.FAILURE):
            cat.unscored += 1
            continue
        cat.attempts += 1
        success = a.outcome is Outcome.SUCCESS
        cat.successes += int(success)
        key = (category.value, a.state_id)
        if key not in seen:
            cat.states += 1
            seen[key] = False
        if success and not seen[key]:
            cat.states_recovered += 1
            seen[key] = True
    return report
