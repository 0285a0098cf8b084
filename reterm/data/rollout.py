"""Stage 1: roll out the policy on the train tasks as one Harbor job, and read the trajectories back.

The job is built with Harbor's Python API (:class:`harbor.job.Job` from a
:class:`harbor.models.job.config.JobConfig`): ``n_attempts`` = k episodes per task,
``n_concurrent_trials`` = n, agent :class:`reterm.agent.harbor.ReTermAgent` (the kit's one harness),
environment ``reterm.sandbox.local:LocalEnvironment`` here or a Harbor cloud environment in the 10K
recipe. The job folder lives in the build's working folder; Harbor resumes it after an interruption
(trials without ``result.json`` are removed and run again), so a killed build loses at most the trials
that were running. Trajectories come back from the trial folders with
:func:`reterm.agent.atif.trajectories_from_job` and get a content-hash id (``metadata["rollout_id"]``)
that failure-state and record ids build on.

``policy: scripted`` runs :class:`ScriptedReTermAgent`, the same harness with a
:class:`reterm.policies.scripted.ScriptedPolicy` per task (tests and demonstrations: deterministic
failures without a model).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harbor.environments.base import BaseEnvironment

from reterm.agent.atif import trajectory_from_trial
from reterm.agent.environments import quiet_offline_litellm
from reterm.agent.harbor import ReTermAgent
from reterm.data.config import PipelineConfig
from reterm.data.environments import harbor_environment_config
from reterm.data.tasks import TaskInfo
from reterm.policies.scripted import ScriptedPolicy
from reterm.trajectory import Outcome, Trajectory

logger = logging.getLogger(__name__)

RETERM_AGENT = "reterm.agent.harbor:ReTermAgent"
SCRIPTED_AGENT = "reterm.data.rollout:ScriptedReTermAgent"
JOB_NAME = "rollout"


class ScriptedReTermAgent(ReTermAgent):
    """:class:`ReTermAgent` whose policy types a fixed command list per task, then submits.

    Args:
        scripts: task id -> commands (a JSON string is accepted, as Harbor's ``--ak`` passes strings).
        **kwargs: as :class:`ReTermAgent` (``max_turns``, ``command_timeout``...).
    """

    def __init__(self, logs_dir: Path, model_name: str | None = None, *, scripts: dict[str, list[str]] | str,
                 **kwargs: Any) -> None:  # fmt: skip
        kwargs.pop("policy", None)
        super().__init__(logs_dir, model_name, policy="scripted", **kwargs)
        self.scripts = json.loads(scripts) if isinstance(scripts, str) else dict(scripts)

    async def setup(self, environment: BaseEnvironment) -> None:
        task = self._task(environment)
        task_id = task.paths.task_dir.name
        if task_id not in self.scripts:
            raise ValueError(f"ScriptedReTermAgent: no script for task {task_id!r} (scripts: {sorted(self.scripts)})")
        self.policy = ScriptedPolicy(self.scripts[task_id], name="scripted")


def rollout_id(traj: Trajectory) -> str:
    """16 hex chars of a sha256 over what an episode did (task, policy, every step's text, command,
    observation, exit status, time-out; reward and outcome). Equal episodes share it; timings are left out."""
    steps = [[s.model_text, s.command, s.parse_error, s.observation, s.exit_status, s.timed_out] for s in traj.steps]
    blob = json.dumps([traj.task_id, traj.policy, traj.prefix_len, steps, traj.reward, traj.outcome.value],
                      ensure_ascii=False)  # fmt: skip
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def with_id(traj: Trajectory) -> Trajectory:
    """``traj`` with ``metadata["rollout_id"]`` set (read by :func:`reterm.recovery.localise` as a failure state's
    ``origin_id``; not a state id: the dataset's ``trajectory_id`` column is the state's id)."""
    traj.metadata["rollout_id"] = rollout_id(traj)
    return traj


def job_config(cfg: PipelineConfig, tasks: list[TaskInfo], jobs_dir: Path) -> Any:
    """The Harbor :class:`JobConfig` of the rollout (k attempts per task, concurrency n)."""
    from harbor.models.job.config import DatasetConfig, JobConfig, RetryConfig
    from harbor.models.trial.config import AgentConfig

    r = cfg.rollout
    kwargs: dict[str, Any] = {"max_turns": r.max_turns, "command_timeout": r.command_timeout}
    if r.policy == "scripted":
        kwargs["scripts"] = {t.id: r.scripts[t.id] for t in tasks if r.scripts and t.id in r.scripts}
        missing = [t.id for t in tasks if t.id not in kwargs["scripts"]]
        if missing:
            raise ValueError(f"rollout.scripts: no script for task(s) {missing}")
        agent = AgentConfig(import_path=SCRIPTED_AGENT, kwargs=kwargs)
    else:
        kwargs["policy"] = r.policy
        if r.policy_kwargs:
            kwargs["policy_kwargs"] = dict(r.policy_kwargs)
        agent = AgentConfig(import_path=RETERM_AGENT, kwargs=kwargs)
    if r.agent_timeout is not None:
        agent.override_timeout_sec = r.agent_timeout
    roots = {t.path.parent for t in tasks}
    if len(roots) != 1:
        raise ValueError(f"tasks come from several folders: {sorted(map(str, roots))}")
    return JobConfig(
        job_name=JOB_NAME,
        jobs_dir=jobs_dir,
        n_attempts=r.attempts,
        n_concurrent_trials=r.concurrency,
        retry=RetryConfig(max_retries=r.retries),
        environment=harbor_environment_config(r.environment),
        agents=[agent],
        datasets=[DatasetConfig(path=next(iter(roots)), task_names=[t.id for t in tasks])],
    )


def _job_folder_usable(job_dir: Path) -> bool:
    """False when a kill left Harbor's own job files half-written (Harbor writes them non-atomically)."""
    for name in ("config.json", "lock.json", "result.json"):
        p = job_dir / name
        if p.exists():
            try:
                json.loads(p.read_text())
            except ValueError:
                return False
    return True


async def _run_job(config: Any) -> None:
    from harbor.job import Job

    job = await Job.create(config)
    await job.run()


def run_rollouts(cfg: PipelineConfig, tasks: list[TaskInfo], jobs_dir: Path) -> Path:
    """Run (or resume) the rollout job; returns its folder.

    A job folder whose Harbor files were cut by a kill is discarded and run again (its trials cannot be
    matched to the config any more, and keeping them would duplicate episodes).
    """

    job_dir = jobs_dir / JOB_NAME
    if job_dir.exists() and not _job_folder_usable(job_dir):
        logger.warning("%s: Harbor's job files were cut by an interruption; running the rollout job again", job_dir)
        shutil.rmtree(job_dir)
    quiet_offline_litellm()
    warm_policy(cfg)
    asyncio.run(_run_job(job_config(cfg, tasks, jobs_dir)))
    return job_dir


def warm_policy(cfg: PipelineConfig) -> None:
    """Load the rollout policy into :class:`ReTermAgent`'s per-process policy cache before the job starts.

    Concurrent trials would otherwise each load the model in their ``setup`` at the same moment, and
    transformers' loading is not thread-safe (two concurrent loads of SmolLM2 failed here with "Cannot
    copy out of meta tensor"). The cache key is the agent's own (spec + kwargs), so the trials reuse it.
    """
    from reterm.agent import harbor as agent_module

    r = cfg.rollout
    if r.policy in ("scripted", "oracle"):  # built per task in the agent's setup
        return
    agent_module._load_policy(r.policy, dict(r.policy_kwargs))


class RolloutFault(RuntimeError):
    """No rollout trial could be scored: every one ended in an infrastructure fault."""


def _trial_exception(trial: Path) -> str:
    try:
        info = json.loads((trial / "result.json").read_text()).get("exception_info") or {}
    except (OSError, ValueError):
        return "unreadable result.json"
    return f"{info.get('exception_type', '?')}: {str(info.get('exception_message', ''))[:300]}" if info else "no trajectory"


def check_rollouts(job_dir: Path, rollouts: "Rollouts") -> None:
    """Raise :class:`RolloutFault` when no trial was scored and some ended in infrastructure faults.

    Those trials' folders are removed first, so running the same command again retries them (Harbor
    resumes the job and runs the trials that have no folder).
    """
    if rollouts.scored or not (rollouts.infra_faults or rollouts.missing):
        return
    first = rollouts.missing[0] if rollouts.missing else f"{rollouts.infra_faults[0].outcome.value}: {rollouts.infra_faults[0].error}"
    names = [m.split(":", 1)[0] for m in rollouts.missing] + [
        Path(t.metadata.get("trial_dir", "")).name for t in rollouts.infra_faults]
    for name in names:
        if name and (job_dir / name).is_dir():
            shutil.rmtree(job_dir / name)
    (job_dir / "result.json").unlink(missing_ok=True)
    raise RolloutFault(f"all {len(names)} rollout trials ended in infrastructure faults (first: {first}); "
                       "fix the cause and run the same command again to retry them")


@dataclass
class Rollouts:
    """The episodes of the rollout job, sorted by (task, trajectory id).

    ``infra_faults`` holds the trials lost to infrastructure faults (never scored, never mined),
    ``missing`` the trial folders without a readable trajectory (counted as infrastructure faults).
    """

    trajectories: list[Trajectory] = field(default_factory=list)
    infra_faults: list[Trajectory] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)

    @property
    def scored(self) -> list[Trajectory]:
        return [t for t in self.trajectories if t.outcome in (Outcome.SUCCESS, Outcome.FAILURE)]

    @property
    def failed(self) -> list[Trajectory]:
        return [t for t in self.trajectories if t.outcome is Outcome.FAILURE]

    @property
    def succeeded(self) -> list[Trajectory]:
        return [t for t in self.trajectories if t.outcome is Outcome.SUCCESS]

    def summary(self) -> dict[str, Any]:
        """Counts: episodes, outcomes, turns, turns the parser rejected, trials that ran no command."""
        steps = [s for t in self.trajectories for s in t.steps[t.prefix_len :]]
        return {
            "episodes": len(self.trajectories) + len(self.infra_faults) + len(self.missing),
            "scored": len(self.scored),
            "succeeded": len(self.succeeded),
            "failed": len(self.failed),
            "infra_faults": len(self.infra_faults) + len(self.missing),
            "pending": len(self.trajectories) - len(self.scored),
            "turns": len(steps),
            "parse_error_turns": sum(1 for s in steps if s.action is None),
            "trials_without_commands": sum(1 for t in self.trajectories if not any(s.command for s in t.steps)),
        }


def load_rollouts(job_dir: Path, allowed_tasks: set[str] | None = None) -> Rollouts:
    """Read every trial of the rollout job (see :class:`Rollouts`).

    Raises:
        ValueError: a trial ran a task outside ``allowed_tasks`` (e.g. the evaluation split).
    """

    out = Rollouts()
    trials = sorted(p for p in job_dir.iterdir() if p.is_dir() and not p.name.startswith(".")) if job_dir.is_dir() else []
    for trial in trials:
        if not (trial / "result.json").is_file():
            continue  # still running when the build was killed; Harbor runs it again on resume
        try:
            traj = trajectory_from_trial(trial)
        except (FileNotFoundError, ValueError):
            out.missing.append(f"{trial.name}: {_trial_exception(trial)}")
            continue
        if allowed_tasks is not None and traj.task_id not in allowed_tasks:
            raise ValueError(f"{trial}: trial of task {traj.task_id!r}, which is not in the build's task set")
        with_id(traj)
        (out.infra_faults if traj.outcome.is_infra_fault else out.trajectories).append(traj)
    key = lambda t: (t.task_id, t.metadata["rollout_id"])  # noqa: E731
    out.trajectories.sort(key=key)
    out.infra_faults.sort(key=key)
    return out
