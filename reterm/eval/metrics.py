"""Scores of Harbor job folders: Pass@1 ± stderr, pass@k, a per-task table, infrastructure faults apart.

Input: Harbor job folders (``JOB/<trial>/result.json``, a :class:`harbor.models.trial.result.TrialResult`;
``JOB/<trial>/agent/`` holds the agent's logs and trajectory). Every trial is classified into one
:class:`reterm.trajectory.Outcome` by :func:`classify_trial`; only agent outcomes (``SUCCESS``/``FAILURE``)
enter the scores, infrastructure faults are counted and reported apart.

The classification rules (which Harbor exceptions are infrastructure faults, agent timeouts, what counts
as a pass) are those of :mod:`reterm.agent.trial_outcome`.

Estimators
----------
With ``T`` tasks that have at least one scored trial, ``n_t`` scored trials and ``c_t`` passes of task
``t``, and ``p_t = c_t / n_t``:

* Pass@1 = ``(1/T) Σ_t p_t`` (per-task pass rate, then the mean over tasks; equal to the mean over
  trials when every task has the same number of trials).
* stderr = ``sqrt(Σ_t p_t (1 - p_t) / (n_t - 1)) / T``: the standard error of that mean over the
  randomness of the trials, tasks held fixed (``p_t (1-p_t) / (n_t - 1)`` is the unbiased estimate of
  ``Var(p_t)`` for Bernoulli trials). It is the estimator of the Terminal-Bench leaderboard query cited
  above; it is undefined (``None``) when a task has fewer than 2 scored trials, which is why reports
  need k >= 2 trials (Terminal-Bench reports use >= 3, leaderboard submissions 5).
* pass@k = ``(1/T_k) Σ_t [1 - C(n_t - c_t, k) / C(n_t, k)]`` over the ``T_k`` tasks with ``n_t >= k``:
  the unbiased estimator of Chen et al. 2021 ("Evaluating Large Language Models Trained on Code",
  eq. 1), the same one Harbor's ``harbor.utils.pass_at_k`` uses; pass@1 of this estimator is Pass@1.

Own code because Harbor's job statistics score unknown exceptions and have no standard error.
"""

from __future__ import annotations

import json
import math
import sys
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

from harbor.models.trial.result import TrialResult

# the trial rules live with the trial outcome (reterm.agent.trial_outcome), re-exported here
from reterm.agent.trial_outcome import (  # noqa: F401
    TrialScore,
    broken_by_agent,
    classify_trial,
    network_fault,
    reward_of,
    score_trial,
    task_name,
)


@dataclass
class JobTrials:
    """The classified trials of one or more job folders, plus trial folders that never finished."""

    trials: list[TrialScore] = field(default_factory=list)
    incomplete: list[str] = field(default_factory=list)  # trial folders without result.json


def load_job(job_dirs: str | Path | Iterable[str | Path]) -> JobTrials:
    """Read and classify every trial of one or more Harbor job folders.

    A trial folder is a sub-folder holding ``result.json``; sub-folders without one, or with one that is
    not complete JSON (a killed job), are listed in ``incomplete`` (counted as infrastructure faults) and
    scored nowhere. Raises ``FileNotFoundError`` for a missing job folder and ``ValueError`` naming the file
    for a ``result.json`` that is JSON but not a Harbor trial result.
    """
    dirs = [job_dirs] if isinstance(job_dirs, (str, Path)) else list(job_dirs)
    out = JobTrials()
    for job_dir in map(Path, dirs):
        if not job_dir.is_dir():
            raise FileNotFoundError(f"{job_dir}: no such Harbor job folder")
        for trial_dir in sorted(p for p in job_dir.iterdir() if p.is_dir() and not p.name.startswith(".")):
            path = trial_dir / "result.json"
            if not path.exists():
                if (trial_dir / "config.json").exists():
                    out.incomplete.append(str(trial_dir))
                continue
            text = path.read_text(errors="replace")
            try:
                json.loads(text)
            except ValueError:  # torn by a kill while Harbor wrote it: the trial did not complete
                print(f"warning: {path} is not complete JSON; the trial is counted as incomplete", file=sys.stderr)
                out.incomplete.append(str(trial_dir))
                continue
            try:
                result = TrialResult.model_validate_json(text)
            except Exception as exc:  # pydantic.ValidationError
                raise ValueError(f"{path}: not a Harbor trial result ({exc})") from exc
            out.trials.append(score_trial(result, trial_dir))
    return out


# ------------------------------------------------------------------------------------ estimators
def pass_at_k(n: int, c: int, k: int) -> float:
    """Chen et al. 2021 unbiased pass@k of one task: ``1 - C(n-c, k) / C(n, k)``.

    ``n`` scored trials, ``c`` passes, ``1 <= k <= n``. Raises ``ValueError`` otherwise.
    """
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


@dataclass
class PassAt1:
    """Pass@1 over tasks: ``mean`` ± ``stderr`` (``None`` when a task has < 2 trials), counts."""

    mean: float | None
    stderr: float | None
    n_trials: int
    n_tasks: int


def pass_at_1(counts: dict[str, tuple[int, int]]) -> PassAt1:
    """Pass@1 and its standard error from ``{task: (n_scored_trials, n_passed)}``.

    Tasks with no scored trial are left out of the denominator. Formulas: module docstring.
    """
    counts = {t: nc for t, nc in counts.items() if nc[0] > 0}
    if not counts:
        return PassAt1(None, None, 0, 0)
    rates = {t: c / n for t, (n, c) in counts.items()}
    mean = sum(rates.values()) / len(rates)
    stderr = None
    if all(n >= 2 for n, _ in counts.values()):
        var = sum(rates[t] * (1 - rates[t]) / (n - 1) for t, (n, _) in counts.items())
        stderr = math.sqrt(var) / len(rates)
    return PassAt1(mean, stderr, sum(n for n, _ in counts.values()), len(rates))


def pass_at_ks(counts: dict[str, tuple[int, int]], ks: Iterable[int] | None = None) -> dict[int, float]:
    """Mean pass@k over tasks with at least ``k`` scored trials, for each ``k`` in ``ks``.

    Default ``ks``: ``1..min_t n_t`` (every task contributes to every k).
    """
    counts = {t: nc for t, nc in counts.items() if nc[0] > 0}
    if not counts:
        return {}
    if ks is None:
        ks = range(1, min(n for n, _ in counts.values()) + 1)
    out = {}
    for k in ks:
        eligible = [(n, c) for n, c in counts.values() if n >= k]
        if eligible:
            out[k] = sum(pass_at_k(n, c, k) for n, c in eligible) / len(eligible)
    return out


# --------------------------------------------------------------------------------------- summary
def task_counts(trials: Iterable[TrialScore]) -> dict[str, tuple[int, int]]:
    """``{task: (n_scored_trials, n_passed)}`` for every task seen (tasks with faults only get (0, 0))."""
    out: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for t in trials:
        row = out[t.task]
        if t.scored:
            row[0] += 1
            row[1] += int(t.passed)
    return {task: (n, c) for task, (n, c) in sorted(out.items())}


def summarize(trials: list[TrialScore], incomplete: list[str] | None = None,
              task_info: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """The score block of one model: the shape of ``results.json`` ``models[i]`` minus names/recovery.

    Returns ``{"pass_at_1": {mean, stderr, n_trials, n_tasks}, "pass_at_k": {k: value},
    "per_task": {task: {n_trials, n_passed, pass_rate, n_infra_faults, n_agent_timeouts, categories,
    difficulty}}, "infra_faults": {n, by_outcome, by_exception, trials: [...]}, "agent_timeouts": n,
    "broken_by_agent": n (agent failures: the agent broke its sandbox), "n_trials_total": n}``.
    ``task_info`` (``tasks/splits.json``'s ``tasks``) adds categories/difficulty.
    """
    counts = task_counts(trials)
    p1 = pass_at_1(counts)
    faults = [t for t in trials if not t.scored]
    per_task: dict[str, dict[str, Any]] = {}
    for task, (n, c) in counts.items():
        info = (task_info or {}).get(task, {})
        per_task[task] = {
            "n_trials": n,
            "n_passed": c,
            "pass_rate": c / n if n else None,
            "n_infra_faults": sum(1 for t in faults if t.task == task),
            "n_agent_timeouts": sum(1 for t in trials if t.task == task and t.agent_timed_out and t.scored),
            "categories": list(info.get("categories", [])),
            "difficulty": info.get("difficulty"),
        }
    return {
        "pass_at_1": asdict(p1),
        "pass_at_k": {str(k): v for k, v in pass_at_ks(counts).items()},
        "per_task": per_task,
        "infra_faults": {
            "n": len(faults) + len(incomplete or []),
            "by_outcome": dict(Counter(t.outcome.value for t in faults)),
            "by_exception": dict(Counter(t.exception_type or "no reward" for t in faults)),
            "incomplete_trials": len(incomplete or []),
            "trials": [
                {"task": t.task, "trial": t.trial, "outcome": t.outcome.value,
                 "exception": t.exception_type, "message": t.exception_message}
                for t in faults
            ],
        },
        "agent_timeouts": sum(1 for t in trials if t.agent_timed_out and t.scored),
        "broken_by_agent": sum(1 for t in trials if t.broken_by_agent and t.scored),
        "n_trials_total": len(trials) + len(incomplete or []),
    }


def load_task_info(split_file: str | Path | None) -> dict[str, dict[str, Any]]:
    """``{task: {categories, difficulty}}`` from a ``tasks/splits.json`` (``{}`` when ``split_file`` is None).

    Raises ``ValueError`` naming the file when it is not JSON with a ``tasks`` mapping.
    """
    if split_file is None:
        return {}
    path = Path(split_file)
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: cannot read the split file ({exc})") from exc
    tasks = data.get("tasks", {})
    if not isinstance(tasks, dict):
        raise ValueError(f"{path}: field 'tasks' must map task names to {{categories, difficulty}}")
    return tasks
