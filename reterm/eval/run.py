"""``python -m eval.run --config eval/configs/NAME.yaml`` (or ``reterm eval ...``): evaluate models through Harbor.

One Harbor job per model entry of the config (built with Harbor's Python API: :class:`harbor.job.Job`
from a :class:`harbor.models.job.config.JobConfig`), all on the same dataset, environment, trials and
timeouts; then the scores (:mod:`reterm.eval.metrics`), recovery analysis (:mod:`reterm.eval.recovery`) and the report
(:mod:`reterm.eval.report`: ``results.json``, ``report.md``, PNGs) in ``output_dir``, with the raw Harbor job
folders kept under ``output_dir/jobs/<model name>/``. A job folder that already exists with the same
config is resumed by Harbor (finished trials are kept), so an interrupted evaluation picks up where it
stopped; ``--report-only`` rebuilds the report from the job folders without running anything.

Config (YAML; relative paths are relative to the current working directory)::

    name: local                          # report title; output_dir defaults to eval/results/<name>
    output_dir: eval/results/local
    dataset:                             # either a Harbor registry dataset ...
      name: terminal-bench@2.0           #   (name@version, or name + version:)
      # ... or a local folder of Harbor tasks, optionally restricted by a split or a task list
      path: tasks
      split: test                        # a key of split_file (default <path>/splits.json)
      task_names: [fix-perms]            # fnmatch patterns; intersected with the split
    environment: {type: local}           # local (this kit's sandbox) | docker | podman | daytona | modal
                                         # | e2b | any Harbor type | module:Class; kwargs: {...}
    trials: 3                            # k trials per task (Harbor n_attempts)
    concurrency: 1                       # trials at once (Harbor n_concurrent_trials)
    timeouts: {}                         # empty = as the tasks define them (the report says so);
                                         # agent_sec, verifier_sec, multiplier override them
    retries: 0                           # Harbor retries of trials that hit an infrastructure fault
    models:
      - {name: base, agent: reterm, policy: smollm2}          # this kit's agent (reterm.agent.harbor)
      - {name: oracle, agent: oracle}                        # Harbor's built-in agents
      - {name: t2-qwen, agent: terminus-2, model: hosted_vllm/qwen, api_base: http://host:8000/v1}
    recovery_from_states:                # optional; see reterm.eval.recovery.RecoveryFromStatesSpec
      records: runs/reterm10k            # ReTerm-10K records (and/or jobs: [Harbor job folders])
      attempts: 1
      max_states: 40

Offline, a registry dataset fails at once (before any job starts) with a message saying how to use a
local copy: ``-p DIR`` on the command line or ``dataset: {path: DIR}``.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import socket
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from reterm.agent.environments import environment_kind, harbor_environment_config, quiet_offline_litellm
from reterm.eval import metrics
from reterm.eval.recovery import RecoveryFromStatesSpec
from reterm.eval.report import markdown, write_report
from reterm.policies import check_policy_spec

RETERM_AGENT = "reterm.agent.harbor:ReTermAgent"


class EvalConfigError(ValueError):
    """A config that cannot be used (names the file and field)."""


class DatasetUnavailableError(RuntimeError):
    """A registry dataset that cannot be reached from this machine (offline)."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DatasetSpec(_Strict):
    """The tasks to evaluate: a Harbor registry dataset (``name``) or a local folder of tasks (``path``)."""

    name: str | None = None
    version: str | None = None
    path: Path | None = None
    split: str | None = None
    split_file: Path | None = None
    task_names: list[str] | None = None
    n_tasks: int | None = Field(default=None, ge=1)
    registry_url: str | None = None

    @model_validator(mode="after")
    def _one_source(self) -> "DatasetSpec":
        if (self.name is None) == (self.path is None):
            raise ValueError("set exactly one of dataset.name (a Harbor registry dataset) and dataset.path")
        if self.name and "@" in self.name:
            if self.version:
                raise ValueError(f"dataset.name {self.name!r} already has a version; drop dataset.version")
            self.name, self.version = self.name.split("@", 1)
        if self.split and self.name:
            raise ValueError("dataset.split needs a local dataset.path with a split file")
        return self

    @property
    def label(self) -> str:
        """``name@version`` for a registry dataset, the folder for a local one."""
        if self.name:
            return f"{self.name}@{self.version}" if self.version else self.name
        return str(self.path)

    def resolved_split_file(self) -> Path | None:
        """``split_file``, else ``<path>/splits.json`` when it exists, else ``None``."""
        if self.split_file is not None:
            return self.split_file
        if self.path is not None and (self.path / "splits.json").exists():
            return self.path / "splits.json"
        return None


class EnvironmentSpec(_Strict):
    """Where trials run: ``local`` (this kit's sandbox), a Harbor environment type, or ``module:Class``."""

    type: str = "local"
    kwargs: dict[str, Any] = Field(default_factory=dict)
    force_build: bool = False

    @field_validator("type")
    @classmethod
    def _known(cls, v: str) -> str:
        from harbor.models.environment_type import EnvironmentType

        try:
            environment_kind(v)
        except ValueError:
            raise ValueError(f"environment.type {v!r}: use local, module:Class, or one of Harbor's types "
                             f"({', '.join(sorted(e.value for e in EnvironmentType))})") from None
        return v


class TimeoutSpec(_Strict):
    """Timeout overrides; all unset (the default) keeps every timeout as the tasks define it."""

    agent_sec: float | None = Field(default=None, gt=0)
    verifier_sec: float | None = Field(default=None, gt=0)
    multiplier: float | None = Field(default=None, gt=0)

    def overrides(self) -> dict[str, float]:
        """The overrides that are set (``{}``: timeouts unmodified)."""
        return {k: v for k, v in self.model_dump().items() if v is not None}


class ModelSpec(_Strict):
    """One agent/model to evaluate.

    ``agent``: ``reterm`` (this kit's harness with ``policy``: ``smollm2``, ``hf:<path>``,
    ``openai:<model>`` with ``api_base``, ``oracle``), a Harbor built-in agent name (``terminus-2`` with
    ``model`` = a litellm model such as ``hosted_vllm/NAME`` and ``api_base``; ``oracle``; ``nop``...),
    or an import path ``module:Class``. ``kwargs`` go to the agent's constructor (Harbor ``--ak``).
    """

    name: str
    agent: str = "reterm"
    policy: str | None = None
    model: str | None = None
    api_base: str | None = None
    kwargs: dict[str, Any] = Field(default_factory=dict)
    env: dict[str, str] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _safe_name(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", v):
            raise ValueError(f"model name {v!r}: use letters, digits, '.', '_' or '-' (it names a job folder)")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> "ModelSpec":
        if self.agent == "reterm" and not self.policy:
            raise ValueError(f"model {self.name!r}: agent 'reterm' needs a policy (smollm2, hf:PATH, openai:MODEL)")
        if self.agent != "reterm" and self.policy:
            raise ValueError(f"model {self.name!r}: policy is only for agent 'reterm' (got agent {self.agent!r})")
        if self.policy:  # a typo fails here, not as one infrastructure fault per trial

            check_policy_spec(self.policy)
        return self

    def agent_config(self) -> "Any":
        """The Harbor :class:`AgentConfig` of this entry."""
        from harbor.models.agent.name import AgentName
        from harbor.models.trial.config import AgentConfig

        kwargs = dict(self.kwargs)
        if self.agent == "reterm":
            kwargs["policy"] = self.policy
            if self.api_base:
                kwargs["base_url"] = self.api_base
            return AgentConfig(import_path=RETERM_AGENT, kwargs=kwargs, env=self.env)
        if self.api_base:
            kwargs.setdefault("api_base", self.api_base)
        if ":" in self.agent:
            return AgentConfig(import_path=self.agent, model_name=self.model, kwargs=kwargs, env=self.env)
        if self.agent not in AgentName.values():
            raise EvalConfigError(f"model {self.name!r}: unknown agent {self.agent!r} "
                                  "(use reterm, a Harbor agent name, or module:Class)")
        return AgentConfig(name=self.agent, model_name=self.model, kwargs=kwargs, env=self.env)


class EvalConfig(_Strict):
    """The whole evaluation (see the module docstring for the YAML layout)."""

    name: str
    output_dir: Path | None = None
    dataset: DatasetSpec
    environment: EnvironmentSpec = Field(default_factory=EnvironmentSpec)
    trials: int = Field(default=3, ge=1)
    concurrency: int = Field(default=1, ge=1)
    timeouts: TimeoutSpec = Field(default_factory=TimeoutSpec)
    retries: int = Field(default=0, ge=0)
    models: list[ModelSpec] = Field(min_length=1)
    recovery_from_states: RecoveryFromStatesSpec | None = None

    @model_validator(mode="after")
    def _unique_models(self) -> "EvalConfig":
        names = [m.name for m in self.models]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"model names must be unique (repeated: {', '.join(sorted(dup))})")
        if self.output_dir is None:
            self.output_dir = Path("eval") / "results" / self.name
        rec = self.recovery_from_states
        if rec is not None:
            for field, listed in (("models", rec.models or []), ("from_models", rec.from_models)):
                unknown = [n for n in listed if n not in names]
                if unknown:
                    raise ValueError(f"recovery_from_states.{field}: {', '.join(unknown)} not among the models")
        return self

    @property
    def jobs_dir(self) -> Path:
        assert self.output_dir is not None
        return self.output_dir / "jobs"


def load_config(path: str | Path) -> EvalConfig:
    """Read and validate an eval config. Raises :class:`EvalConfigError` naming the file and field."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise EvalConfigError(f"{path}: cannot read the eval config ({exc})") from exc
    if not isinstance(data, dict):
        raise EvalConfigError(f"{path}: an eval config is a YAML mapping")
    try:
        return EvalConfig.model_validate(data)
    except ValidationError as exc:
        errors = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(top)'}: {e['msg']}" for e in exc.errors())
        raise EvalConfigError(f"{path}: {errors}") from exc


# ------------------------------------------------------------------------------------- preflight
def _registry_hosts(spec: DatasetSpec) -> list[str]:
    if spec.registry_url:
        return [urlparse(spec.registry_url).hostname or spec.registry_url, "github.com"]
    from harbor.registry.client.harbor.config import HARBOR_SUPABASE_URL

    return [urlparse(HARBOR_SUPABASE_URL).hostname or HARBOR_SUPABASE_URL, "github.com"]


def _reachable(host: str, timeout_s: float = 3.0) -> OSError | None:
    """``None`` when a TCP connection to ``host:443`` opens, else the error."""
    try:
        socket.create_connection((host, 443), timeout=timeout_s).close()
    except OSError as exc:
        return exc
    return None


def check_dataset_reachable(spec: DatasetSpec, timeout_s: float = 3.0) -> None:
    """Fail at once when a registry dataset's hosts (registry + task git hosting) cannot be reached.

    Local datasets pass. Raises :class:`DatasetUnavailableError` with the way to use a local copy.
    """
    if spec.name is None:
        return
    for host in _registry_hosts(spec):
        exc = _reachable(host, timeout_s)
        if exc is not None:
            raise DatasetUnavailableError(
                f"dataset {spec.label!r} comes from the Harbor registry and its tasks from git hosting, "
                f"but {host} cannot be reached from this machine ({exc}); this looks like an offline machine.\n"
                f"Use a local copy instead: on a machine with network run\n"
                f"  harbor download {spec.label} -o DIR\n"
                f"copy DIR here and run with `-p DIR/{spec.name}` (or set `dataset: {{path: DIR/{spec.name}}}` "
                f"in the config). Note: most Terminal-Bench 2 test.sh files download uv and Python at "
                f"verification time, so offline verification also needs those cached in the task images."
            ) from None


def _split_tasks(spec: DatasetSpec) -> list[str] | None:
    if spec.split is None:
        return spec.task_names
    split_file = spec.resolved_split_file()
    if split_file is None:
        raise EvalConfigError(f"dataset.split {spec.split!r} needs dataset.split_file (no {spec.path}/splits.json)")
    import json

    try:
        data = json.loads(Path(split_file).read_text())
    except (OSError, ValueError) as exc:
        raise EvalConfigError(f"{split_file}: cannot read the split file ({exc})") from exc
    tasks = data.get(spec.split)
    if not isinstance(tasks, list) or not tasks:
        raise EvalConfigError(f"{split_file}: no task list under split {spec.split!r} "
                              f"(keys: {', '.join(k for k in data if isinstance(data[k], list))})")
    if spec.task_names:
        from fnmatch import fnmatch

        tasks = [t for t in tasks if any(fnmatch(t, p) for p in spec.task_names)]
        if not tasks:
            raise EvalConfigError(f"dataset.task_names {spec.task_names} match no task of split {spec.split!r}")
    return tasks


def harbor_dataset(spec: DatasetSpec) -> "Any":
    """The Harbor :class:`DatasetConfig` of a dataset spec (split resolved to a task list)."""
    from harbor.models.job.config import DatasetConfig

    if spec.path is not None:
        if not spec.path.is_dir():
            raise EvalConfigError(f"dataset.path {spec.path}: no such folder of tasks")
        return DatasetConfig(path=spec.path, task_names=_split_tasks(spec), n_tasks=spec.n_tasks)
    return DatasetConfig(name=spec.name, version=spec.version, task_names=spec.task_names,
                         n_tasks=spec.n_tasks, registry_url=spec.registry_url)


def harbor_environment(spec: EnvironmentSpec) -> "Any":
    """The Harbor :class:`EnvironmentConfig` of ``spec``
    (:func:`reterm.agent.environments.harbor_environment_config`)."""
    return harbor_environment_config(spec.type, spec.kwargs, spec.force_build)


def job_config(cfg: EvalConfig, model: ModelSpec) -> "Any":
    """The Harbor :class:`JobConfig` for one model: k attempts per task, the shared dataset/env/timeouts."""
    from harbor.models.job.config import JobConfig, RetryConfig
    from harbor.models.trial.config import VerifierConfig

    agent = model.agent_config()
    if cfg.timeouts.agent_sec is not None:
        agent.override_timeout_sec = cfg.timeouts.agent_sec
    return JobConfig(
        job_name=model.name,
        jobs_dir=cfg.jobs_dir,
        n_attempts=cfg.trials,
        n_concurrent_trials=cfg.concurrency,
        timeout_multiplier=cfg.timeouts.multiplier or 1.0,
        retry=RetryConfig(max_retries=cfg.retries),
        environment=harbor_environment(cfg.environment),
        verifier=VerifierConfig(override_timeout_sec=cfg.timeouts.verifier_sec),
        agents=[agent],
        datasets=[harbor_dataset(cfg.dataset)],
    )


async def _run_job(config: Any) -> None:
    from harbor.job import Job

    job = await Job.create(config)
    await job.run()


def run_model(cfg: EvalConfig, model: ModelSpec) -> Path:
    """Run (or resume) the Harbor job of one model; returns its job folder.

    Raises :class:`EvalConfigError` when the folder holds a job with a different config.
    """
    config = job_config(cfg, model)
    try:
        asyncio.run(_run_job(config))
    except FileExistsError as exc:
        raise EvalConfigError(
            f"{cfg.jobs_dir / model.name}: holds a job run with a different config; move it away or "
            f"change output_dir ({exc})") from exc
    return cfg.jobs_dir / model.name


async def _resolve_tasks(cfg: EvalConfig) -> list[str]:
    """The names of the tasks the jobs will run (Harbor's own resolution of the dataset)."""
    configs = await harbor_dataset(cfg.dataset).get_task_configs()
    return sorted(c.get_task_id().get_name().split("/")[-1] for c in configs)


# ---------------------------------------------------------------------------------------- report
def _versions() -> tuple[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    try:
        kit = version("reterm")
    except PackageNotFoundError:
        kit = "unknown"
    return kit, version("harbor")


def build_results(cfg: EvalConfig, tasks: list[str]) -> dict[str, Any]:
    """Score every model's job folder and assemble the ``results.json`` dict (:mod:`reterm.eval.report`)."""
    from reterm.eval import recovery

    task_info = metrics.load_task_info(cfg.dataset.resolved_split_file()) if cfg.dataset.path else {}
    kit_version, harbor_version = _versions()
    models = []
    for m in cfg.models:
        job_dir = cfg.jobs_dir / m.name
        job = metrics.load_job(job_dir)
        block = metrics.summarize(job.trials, job.incomplete, task_info)
        models.append({
            "name": m.name,
            "agent": m.agent,
            "policy": m.policy,
            "model": m.model,
            "agent_kwargs": {k: v for k, v in m.agent_config().kwargs.items() if k != "policy"},
            "job_dir": str(job_dir.relative_to(cfg.output_dir)) if job_dir.is_relative_to(cfg.output_dir) else str(job_dir),
            **block,
            "recovery": recovery.recovery_in_trials(job.trials),
            "recovery_from_states": None,
        })
    if cfg.recovery_from_states:
        recovery.add_recovery_from_states(cfg, models)
    overrides = cfg.timeouts.overrides()
    agents = [m.agent for m in cfg.models]
    return {
        "name": cfg.name,
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "dataset": {
            "name": cfg.dataset.name or Path(cfg.dataset.path or ".").name,
            "version": cfg.dataset.version,
            "path": str(cfg.dataset.path) if cfg.dataset.path else None,
            "split": cfg.dataset.split,
            "n_tasks": len(tasks),
            "tasks": tasks,
        },
        "harness": {
            "agent": "reterm" if "reterm" in agents else agents[0],
            "version": kit_version,
            "harbor_version": harbor_version,
            "environment": cfg.environment.type,
            "trials_per_task": cfg.trials,
            "timeouts_modified": bool(overrides),
            "timeout_overrides": overrides,
        },
        "models": models,
    }


def _summary_table(results: dict[str, Any]) -> str:
    return markdown(results)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m eval.run`` and ``reterm eval``. Returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="reterm eval",
        description="Evaluate models through Harbor: Pass@1 ± stderr, pass@k, recovery rates per error "
                    "category; writes results.json, report.md and PNG plots (see reterm/eval/run.py).")
    parser.add_argument("--config", "-c", required=True, help="eval config YAML (eval/configs/*.yaml)")
    parser.add_argument("-p", "--path", type=Path, help="use this local dataset folder instead of the config's dataset")
    parser.add_argument("--output", "-o", type=Path, help="output folder (default: the config's output_dir)")
    parser.add_argument("--models", help="comma-separated subset of the config's model names")
    parser.add_argument("--trials", "-k", type=int, help="override trials per task")
    parser.add_argument("--report-only", action="store_true", help="rebuild the report from existing job folders")
    args = parser.parse_args(argv)
    try:
        cfg = load_config(args.config)
        if args.path is not None:
            cfg.dataset = DatasetSpec(path=args.path, split=cfg.dataset.split if cfg.dataset.path else None,
                                      split_file=cfg.dataset.split_file, task_names=cfg.dataset.task_names)
        if args.output is not None:
            cfg.output_dir = args.output
        if args.trials is not None:
            cfg.trials = args.trials
        if args.models:
            wanted = [n.strip() for n in args.models.split(",") if n.strip()]
            unknown = set(wanted) - {m.name for m in cfg.models}
            if unknown:
                raise EvalConfigError(f"--models: {', '.join(sorted(unknown))} not in {args.config}")
            cfg.models = [m for m in cfg.models if m.name in wanted]
        if args.report_only:  # no network, no task resolution: the tasks are those the jobs ran
            tasks = sorted({t.task for m in cfg.models for t in metrics.load_job(cfg.jobs_dir / m.name).trials})
        else:
            check_dataset_reachable(cfg.dataset)
            quiet_offline_litellm()
            tasks = asyncio.run(_resolve_tasks(cfg))
            for m in cfg.models:
                print(f"== {m.name}: {m.agent}{' ' + m.policy if m.policy else ''} on {cfg.dataset.label} "
                      f"({len(tasks)} tasks x {cfg.trials} trials, env {cfg.environment.type})", flush=True)
                run_model(cfg, m)
        results = build_results(cfg, tasks)
    except (EvalConfigError, DatasetUnavailableError, FileNotFoundError, ValueError) as exc:
        print(f"reterm eval: {exc}", file=sys.stderr)
        return 2

    paths = write_report(results, cfg.output_dir)
    print(_summary_table(results))
    print("\n".join(f"{k}: {v}" for k, v in paths.items()))
    # a model none of whose trials was scored measured nothing: every trial was an infrastructure fault
    # (sandbox, verifier or harness); say so and exit non-zero instead of reporting an empty score
    unscored = [m["name"] for m in results["models"]
                if m["n_trials_total"] and not m["pass_at_1"]["n_trials"]]  # fmt: skip
    if unscored:
        print(f"reterm eval: no trial of {', '.join(unscored)} was scored: every one was an infrastructure "
              f"fault (see infra_faults in {paths.get('results', 'results.json')})", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
