"""Recovery measurements of the evaluation, per error category (:mod:`reterm.recovery.taxonomy`).

1. **Recovery within trials** (:func:`recovery_in_trials`): over the scored trials of a Harbor job, the
   failure states the agent hit (:func:`reterm.recovery.localise.localise`, every state of a trial) and
   how many of them were in trials the verifier still passed:
   ``rate = recovered / failure_states`` (:func:`reterm.recovery.metrics.in_trial_recovery`).
   Trajectories come from the trial folders (:func:`reterm.agent.atif.trajectory_from_trial`: this kit's
   agent, or any agent writing ATIF such as Terminus-2); trials without a trajectory (Harbor's oracle)
   and infrastructure faults add nothing.
2. **Recovery from recorded failure states** (:func:`recover_from_states`, as in Recovery-Bench): start
   the agent from stored failure states (ReTerm-10K records, or the failure states localised in the
   failed trials of earlier Harbor jobs), let it continue, verify. The state is rebuilt by
   :func:`reterm.recovery.materialize.materialize` on fresh local sandboxes of the task
   (:class:`reterm.sandbox.local.LocalEnvironment`; other Harbor environments are not wired here): its
   commands typed into the kit's terminal, with the divergence check (a diverged rebuild is dropped,
   counted in ``diverged`` and never scored), then forked for several attempts (replayed per attempt when
   the history left processes running). The conversation so far is the state's history
   (``run_episodes(..., history=prefix)``), so the agent sees exactly what the failing agent saw.
   Per category: ``rate = successes / attempts`` (the recovery rate of one attempt, Recovery-Bench's
   measure; :func:`reterm.recovery.metrics.attempt_recovery`), plus the share of states recovered by at
   least one attempt. Only this kit's agent can start from a history (Harbor's Terminus-2 cannot).

Both give ``{category: {"failure_states", "recovered", "rate", ...}}`` blocks for ``results.json``
(:mod:`reterm.eval.report`). Infrastructure faults are never successes or failures: they are counted apart.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, Iterable

from pydantic import BaseModel, ConfigDict, Field, model_validator

from reterm.agent.atif import trajectories_from_job, trajectory_from_trial
from reterm.agent.episode import EpisodeSpec, run_episodes
from reterm.agent.protocol import DEFAULT_COMMAND_TIMEOUT_S
from reterm.eval.metrics import TrialScore
from reterm.policies import load_policy
from reterm.recovery.localise import localise_many
from reterm.recovery.materialize import materialize
from reterm.recovery.metrics import attempt_recovery, in_trial_recovery
from reterm.recovery.state import State
from reterm.recovery.taxonomy import parse_category
from reterm.trajectory import Outcome, Trajectory


def recovery_in_trials(trials: Iterable[TrialScore], scope: str = "all") -> dict[str, dict[str, Any]]:
    """Per-category recovery within the scored trials of a job (see the module docstring).

    Returns ``{category: {"failure_states": int, "recovered": int, "rate": float, "stderr": float}}`` for
    the categories with at least one failure state (empty when no trial has a trajectory).
    """

    trajectories = []
    for t in trials:
        if not t.scored:
            continue
        try:
            trajectories.append(trajectory_from_trial(t.trial_dir))
        except FileNotFoundError:  # agents that write no trajectory (Harbor's oracle, nop)
            continue
    if not trajectories:
        return {}
    report = in_trial_recovery(trajectories, scope=scope)  # type: ignore[arg-type]
    return {
        name: {"failure_states": c.failure_states, "recovered": c.recovered, "rate": c.recovery_rate,
               "stderr": c.stderr}
        for name, c in report.categories.items()
        if c.failure_states
    }


# ------------------------------------------------------------------ recovery from recorded states
class RecoveryFromStatesSpec(BaseModel):
    """``recovery_from_states:`` of an eval config.

    Args:
        records: ReTerm-10K records (:data:`reterm.record_features.FEATURES`): a dataset folder
            (``datasets.load_dataset``), a ``.parquet`` or a ``.jsonl`` file. Each record's failure
            state is its prefix ``messages[:train_from_message_index]`` and its ``replay_commands``.
        jobs: Harbor job folders; the primary failure state of each failed trial
            (:func:`reterm.recovery.localise.localise`) becomes a state to recover from.
        from_models: names of this config's models whose job folders (just run) give states the same
            way: the agents' own failure states, as ReTerm-GRPO trains on.
        tasks_path: the task folders (default: the eval dataset's ``path``).
        max_states: use at most this many states (taken round-robin over categories, in a stable order).
        attempts: recovery attempts per state (forks of the rebuilt sandbox when > 1).
        max_turns: turns each attempt may generate after the prefix.
        models: names of the config's models to evaluate (default: every model with agent ``reterm``;
            only this kit's agent can start from a history).
    """

    model_config = ConfigDict(extra="forbid")

    records: Path | None = None
    jobs: list[Path] = Field(default_factory=list)
    from_models: list[str] = Field(default_factory=list)
    tasks_path: Path | None = None
    max_states: int | None = Field(default=None, ge=1)
    attempts: int = Field(default=1, ge=1)
    max_turns: int = Field(default=10, ge=1)
    models: list[str] | None = None

    @model_validator(mode="after")
    def _some_source(self) -> "RecoveryFromStatesSpec":
        if self.records is None and not self.jobs and not self.from_models:
            raise ValueError("recovery_from_states needs records (a ReTerm-10K dataset), jobs (Harbor job folders) "
                             "or from_models (models of this config)")
        return self


def _read_records(path: Path) -> list[dict[str, Any]]:
    """Rows of a ReTerm-10K dataset folder / parquet / jsonl. Raises ``ValueError`` naming the path."""
    try:
        if path.suffix == ".jsonl":
            return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        from datasets import load_dataset

        if path.suffix == ".parquet":
            ds = load_dataset("parquet", data_files=str(path), split="train")
        else:
            ds = load_dataset(str(path), split="train")
        return list(ds)
    except Exception as exc:
        raise ValueError(f"{path}: cannot read ReTerm-10K records ({exc})") from exc


def states_from_records(path: str | Path) -> list[State]:
    """:class:`reterm.recovery.state.State` objects from ReTerm-10K records.

    The state is :meth:`reterm.recovery.state.State.from_record` (its id is the content-derived
    :func:`reterm.recovery.state.state_id`, the same the dataset's ``trajectory_id`` and the GRPO pool's
    ``state_id`` give it; history ``messages[:train_from_message_index]``); the record's ``failure_step``,
    ``failure_command`` and ``failure_output`` are the state's ``step``, ``command`` and ``output``.
    Raises ``ValueError`` naming the file and record id for a record whose prefix cannot be read.
    """

    path = Path(path)
    states = []
    for i, row in enumerate(_read_records(path)):
        rid = row.get("id") or f"#{i}"
        try:
            st = State.from_record({**row, "id": rid})
            st.replay_commands = list(row.get("replay_commands") or st.replay_commands)
            st.replay_timeouts = [None] * len(st.replay_commands)
            st.category = row["failure_category"]
            st.step = int(row.get("failure_step", len(st.history) - 1))
            st.command, st.output = row.get("failure_command") or "", row.get("failure_output") or ""
            states.append(st)
        except (KeyError, ValueError, TypeError) as exc:
            raise ValueError(f"{path}: record {rid}: not a usable failure state ({exc})") from exc
    return states


def states_from_jobs(job_dirs: Iterable[str | Path]) -> list[State]:
    """The primary failure state of every failed trial in Harbor job folders (rules-only localisation)."""

    failed = [t for d in job_dirs for t in trajectories_from_job(d) if t.outcome is Outcome.FAILURE]
    return [r.primary for r in localise_many(failed) if r.primary is not None]


def select_states(states: list[Any], max_states: int | None) -> list[Any]:
    """At most ``max_states`` states, round-robin over categories (sorted), each category in id order."""
    by_cat: dict[str, list[Any]] = {}
    for s in sorted(states, key=lambda s: s.id):
        by_cat.setdefault(s.category, []).append(s)
    out: list[Any] = []
    queues = [by_cat[c] for c in sorted(by_cat)]
    while queues and (max_states is None or len(out) < max_states):
        for q in list(queues):
            if not q:
                queues.remove(q)
                continue
            if max_states is not None and len(out) >= max_states:
                break
            out.append(q.pop(0))
    return out


async def _attempts_from_state(policy: Any, state: Any, task_dir: Path, attempts: int, max_turns: int,
                               attempt_dirs: list[Path], **episode_kwargs: Any) -> list[Any]:
    """Rebuild ``state`` (:func:`reterm.recovery.materialize.materialize` on fresh local sandboxes of the task:
    the history typed into the kit's terminal, then forked; replay per attempt when it left processes
    running) and run ``attempts`` recovery attempts from it.

    A rebuild that diverged is never run nor scored: its attempt is a ``PENDING`` trajectory (unscored) with
    ``metadata["diverged"]`` and the reason in ``error``. A fault while rebuilding makes every attempt a
    ``SANDBOX_ERROR`` trajectory (an infrastructure fault, excluded from the rates).
    """
    from reterm.sandbox.local import LocalEnvironment

    def lost(outcome: Outcome, error: str, **metadata: Any) -> Trajectory:
        return Trajectory(task_id=state.task_id, instruction="", system_prompt="", outcome=outcome, error=error,
                          metadata={"failure_state": state.id, "failure_category": state.category, **metadata})

    try:
        made = await materialize(state, attempts, lambda tag: LocalEnvironment.for_task(task_dir),
                                 default_timeout=float(episode_kwargs.get("command_timeout_s") or DEFAULT_COMMAND_TIMEOUT_S))
    except Exception as exc:  # the rebuild failed: a sandbox fault, not the agent's
        return [lost(Outcome.SANDBOX_ERROR, f"rebuilding the failure state failed: {exc}") for _ in range(attempts)]
    try:
        specs = [EpisodeSpec(e, task_dir, history=state.history, session=s)
                 for e, s in zip(made.environments, made.sessions)]  # fmt: skip
        for spec in specs:
            spec.metadata.update(failure_state=state.id, failure_category=state.category, rebuild=made.method)
        trajs = await run_episodes(policy, specs, max_turns=max_turns, verify=True,
                                   trial_dirs=[str(d) for d in attempt_dirs[: len(specs)]],
                                   **episode_kwargs) if specs else []  # fmt: skip
    finally:
        await made.stop()
    return list(trajs) + [lost(Outcome.PENDING, f"rebuild diverged: {made.detail}", diverged=True)
                          for _ in range(attempts - len(trajs))]  # fmt: skip


def recover_from_states(policy: Any, states: list[Any], tasks_path: str | Path, out_dir: str | Path, *,
                        attempts: int = 1, max_turns: int = 10, **episode_kwargs: Any) -> dict[str, dict[str, Any]]:
    """Run recovery attempts of ``policy`` from each failure state; per-category rates for ``results.json``.

    ``episode_kwargs`` go to :func:`reterm.agent.episode.run_episodes` (``command_timeout_s``,
    ``max_consecutive_parse_errors``, ``time_budget_s``).

    Attempt trajectories are written to ``out_dir/<state id>__<attempt>.json`` (this kit's trajectory
    JSON, with the verifier's files in ``out_dir/<state id>__<attempt>/``); a rerun loads finished
    attempts instead of running them again (resume).

    Returns ``{category: {"failure_states", "attempts", "recovered", "rate", "states_recovered",
    "state_recovery_rate", "infra_faults", "diverged"}}`` (``recovered``/``rate``: passing attempts / scored
    attempts; ``diverged``: attempts dropped because their rebuild diverged, never scored; categories without
    states are left out). Raises ``FileNotFoundError`` naming a missing task folder.
    """
    from tqdm import tqdm

    def report_category(category: str) -> str:
        return parse_category(category).value

    tasks_path, out_dir = Path(tasks_path), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    pairs = []
    for state in tqdm(states, desc=f"recovery attempts ({getattr(policy, 'name', 'policy')})", unit="state"):
        task_dir = tasks_path / state.task_id
        if not (task_dir / "task.toml").is_file():
            raise FileNotFoundError(f"{task_dir}: task of failure state {state.id} not found under {tasks_path}")
        files = [out_dir / f"{state.id}__{i}.json" for i in range(attempts)]
        if all(f.is_file() for f in files):
            trajs = [Trajectory.load(f) for f in files]
        else:
            dirs = [f.with_suffix("") for f in files]
            trajs = asyncio.run(_attempts_from_state(policy, state, task_dir, attempts, max_turns, dirs,
                                                     **episode_kwargs))
            for traj, f in zip(trajs, files):
                traj.save(f)
        pairs += [(state, t) for t in trajs]
    report = attempt_recovery(pairs)
    diverged: dict[str, int] = {}
    for state, t in pairs:
        if t.metadata.get("diverged"):
            name = report_category(state.category)
            diverged[name] = diverged.get(name, 0) + 1
    return {
        name: {"failure_states": c.states, "attempts": c.attempts, "recovered": c.successes,
               "rate": c.success_rate, "stderr": c.stderr, "states_recovered": c.states_recovered,
               "state_recovery_rate": c.state_recovery_rate, "infra_faults": c.infra_faults,
               "diverged": diverged.get(name, 0)}
        for name, c in report.categories.items()
        if c.states or c.infra_faults or diverged.get(name)
    }


def add_recovery_from_states(cfg: Any, models: list[dict[str, Any]]) -> None:
    """Fill ``recovery_from_states`` of the ``results.json`` model entries from ``cfg.recovery_from_states``.

    Raises ``ValueError`` naming the field for a model that is not this kit's agent or not in the config.
    """

    spec: RecoveryFromStatesSpec = cfg.recovery_from_states
    by_name = {m.name: m for m in cfg.models}  # the models of this run (``--models`` may select some)
    names = spec.models if spec.models is not None else [m.name for m in cfg.models if m.agent == "reterm"]
    names = [n for n in names if n in by_name]
    for n in names:
        if by_name[n].agent != "reterm":
            raise ValueError(f"recovery_from_states.models: {n!r} uses agent {by_name[n].agent!r}; only this kit's "
                             "agent (reterm) can start from a failure state's history")
    job_dirs = [*spec.jobs]
    for n in spec.from_models:
        job_dir = Path(cfg.jobs_dir) / n
        if not job_dir.is_dir():
            raise FileNotFoundError(f"recovery_from_states.from_models: no job folder {job_dir} for model {n!r} "
                                    "(run that model first)")
        job_dirs.append(job_dir)
    if not names:
        return
    states = states_from_records(spec.records) if spec.records else []
    states += states_from_jobs(job_dirs)
    states = select_states(states, spec.max_states)
    tasks_path = spec.tasks_path or cfg.dataset.path
    if tasks_path is None:
        raise ValueError("recovery_from_states.tasks_path is needed when the dataset is not a local path")
    for entry in models:
        if entry["name"] not in names:
            continue
        m = by_name[entry["name"]]
        kwargs, episode_kwargs = _policy_and_episode_kwargs(m)
        if m.policy == "oracle":
            kwargs["tasks"] = sorted({str(Path(tasks_path) / s.task_id) for s in states})
        policy = load_policy(m.policy, **kwargs)
        entry["recovery_from_states"] = recover_from_states(
            policy, states, tasks_path, Path(cfg.output_dir) / "recovery_from_states" / m.name,
            attempts=spec.attempts, max_turns=spec.max_turns, **episode_kwargs)


def _policy_and_episode_kwargs(model: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The settings of a model entry as :class:`reterm.agent.harbor.ReTermAgent` reads them (``kwargs``:
    ``policy_kwargs``, ``command_timeout``, ``max_consecutive_parse_errors``; ``api_base``), split into
    :func:`reterm.policies.load_policy` and :func:`reterm.agent.episode.run_episodes` arguments, so a
    recovery attempt runs with the same policy settings as the model's trials. ``max_turns`` and the
    time budget of the trials do not apply: ``recovery_from_states.max_turns`` bounds an attempt.

    Raises ``ValueError`` when ``policy_kwargs`` is not a JSON object.
    """
    agent = dict(model.kwargs)
    policy_kwargs = agent.get("policy_kwargs") or {}
    if isinstance(policy_kwargs, str):
        policy_kwargs = json.loads(policy_kwargs)
    if not isinstance(policy_kwargs, dict):
        raise ValueError(f"model {model.name!r}: kwargs.policy_kwargs must be a JSON object, got {policy_kwargs!r}")
    kwargs = dict(policy_kwargs)
    if model.api_base:
        kwargs["base_url"] = model.api_base
    episode: dict[str, Any] = {}
    if agent.get("command_timeout") not in (None, ""):
        episode["command_timeout_s"] = float(agent["command_timeout"])
    if agent.get("max_consecutive_parse_errors") not in (None, ""):
        episode["max_consecutive_parse_errors"] = int(agent["max_consecutive_parse_errors"])
    return kwargs, episode
