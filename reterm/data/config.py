"""The typed config of a ReTerm-10K build (``pipeline/configs/*.yaml``).

One YAML file describes a whole run: which tasks, which policy is rolled out and how, how failure
states are chosen, who writes the recovery attempts, the error-injection source, the filters and the
dataset's identity. Every field has a default, so a recipe names only what it changes;
``pipeline/configs/smoke.yaml`` is the embedded default. Unknown keys are errors (a misspelt key would
otherwise be silently ignored), and errors name the file and the field.

Relative paths (``tasks.path``, ``filters.decontamination.terminal_bench``) are resolved against the
current directory first and then against the repository root, so recipes run from anywhere.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

REPO_ROOT = Path(__file__).resolve().parents[2]  # the checkout: configs and tasks are relative to it
DEFAULT_CONFIG = REPO_ROOT / "pipeline" / "configs" / "smoke.yaml"

# In the order perturbations are drawn per task (round robin): the kinds that apply to few steps first.
INJECTION_KINDS = ("bug_in_file", "removed_dependency", "foreground_hang", "wrong_flag", "wrong_path",
                   "misspelt_command")  # fmt: skip


class ConfigError(ValueError):
    """A config that cannot be used; the message names the file and the field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TasksConfig(_Strict):
    """The tasks rolled out. Only the ``split`` (never the evaluation split) is used.

    Args:
        path: folder of Harbor task folders (``tasks`` = this kit's suite).
        split: key of the split file whose tasks are used (``train``).
        eval_split: the evaluation split of the same file; its tasks are refused and used for
            decontamination.
        split_file: default ``<path>/splits.json``.
        names: optional fnmatch patterns restricting the split's tasks.
        max_tasks: use the first N tasks (sorted by name) after the patterns.
    """

    path: Path = Path("tasks")
    split: str = "train"
    eval_split: str | None = "test"
    split_file: Path | None = None
    names: list[str] | None = None
    max_tasks: int | None = Field(default=None, ge=1)


class EnvironmentConfig(_Strict):
    """Where episodes run: ``local`` (this kit's sandbox, with snapshot/fork), a Harbor environment type
    (``docker``, ``daytona``, ``modal``, ``e2b``, ...) or ``module:Class``. ``kwargs`` go to its constructor."""

    type: str = "local"
    kwargs: dict[str, Any] = Field(default_factory=dict)


class RolloutConfig(_Strict):
    """Stage 1: the policy on the train tasks, as one Harbor job.

    Args:
        policy: a :func:`reterm.policies.load_policy` spec (``smollm2``, ``hf:PATH``, ``openai:MODEL``,
            ``oracle``) or ``scripted`` (``scripts`` below; for tests and demonstrations).
        policy_kwargs: constructor arguments of the policy (sampling, ``base_url``...).
        scripts: for ``policy: scripted``: task id -> bash commands typed in order, then submit.
        attempts: k episodes per task (Harbor ``n_attempts``).
        concurrency: trials at once (Harbor ``n_concurrent_trials``).
        max_turns: turns per episode.
        command_timeout: a command's timeout when the model gives none (seconds).
        agent_timeout: override of the tasks' agent timeout (seconds); ``None`` keeps the tasks'.
        retries: Harbor retries of a trial that ended in an infrastructure fault (Harbor's
            ``RetryConfig``; agent failures are never retried).
        environment: where the trials run.
    """

    policy: str = "smollm2"
    policy_kwargs: dict[str, Any] = Field(default_factory=dict)
    scripts: dict[str, list[str]] | None = None
    attempts: int = Field(default=2, ge=1)
    concurrency: int = Field(default=1, ge=1)
    max_turns: int = Field(default=6, ge=1)
    command_timeout: float = Field(default=15.0, gt=0)
    agent_timeout: float | None = Field(default=None, gt=0)
    retries: int = Field(default=1, ge=0)
    environment: EnvironmentConfig = Field(default_factory=EnvironmentConfig)

    @model_validator(mode="after")
    def _scripts(self) -> "RolloutConfig":
        if self.policy == "scripted" and not self.scripts:
            raise ValueError("policy 'scripted' needs scripts: {task_id: [commands]}")
        return self


class FailuresConfig(_Strict):
    """Stage 2: which failure states of a failed trial are used (:meth:`LocalisationResult.select`).

    ``judge``: optional policy spec of an LLM judge for the steps the rules are unsure of
    (:class:`reterm.recovery.LLMJudge`); ``None`` = rules only.
    """

    select: Literal["first", "consequential", "all"] = "first"
    max_states_per_trajectory: int | None = Field(default=1, ge=1)
    judge: str | None = None
    judge_kwargs: dict[str, Any] = Field(default_factory=dict)


class InjectionConfig(_Strict):
    """Error injection: perturb one step of a successful trajectory, run it for real, keep it if it fails.

    Args:
        enabled: run the stage.
        sources: successful trajectories to perturb: ``reference`` (the task's solution run through the
            harness by the scripted oracle) and/or ``rollouts`` (the policy's own successes).
        kinds: perturbations to use (see :mod:`reterm.data.inject`).
        per_task: perturbations tried per task (spread over the kinds, seeded).
        command_timeout: timeout of every command of an injected run (seconds).
    """

    enabled: bool = True
    sources: list[Literal["reference", "rollouts"]] = Field(default_factory=lambda: ["reference", "rollouts"])
    kinds: list[str] = Field(default_factory=lambda: list(INJECTION_KINDS))
    per_task: int = Field(default=3, ge=0)
    command_timeout: float = Field(default=10.0, gt=0)

    @model_validator(mode="after")
    def _kinds(self) -> "InjectionConfig":
        bad = [k for k in self.kinds if k not in INJECTION_KINDS]
        if bad:
            raise ValueError(f"unknown injection kind(s) {bad}; known: {list(INJECTION_KINDS)}")
        return self


class RecoveryConfig(_Strict):
    """Stage 3-4: recovery attempts forked from each failure state, then the verifier.

    Args:
        policy: ``oracle-guided`` (offline teacher: a diagnosis from the observed error and its category,
            then the task's reference solution, :mod:`reterm.data.teacher`), ``self`` (the rollout policy),
            or any :func:`reterm.policies.load_policy` spec (``openai:MODEL`` for a teacher endpoint).
        policy_kwargs: constructor arguments of that policy.
        attempts: N recovery attempts per failure state.
        max_turns: turns each attempt may generate after the failure prefix.
        command_timeout: a command's timeout when the model gives none (seconds).
        rebuild: ``auto`` (snapshot + fork on the local sandbox, replay on other environments),
            ``fork`` or ``replay`` (each attempt replays the prefix in its own fresh environment).
        concurrency: failure states worked on at once.
        max_states: cap on failure states (own first, then injected; in id order).
        environment: where attempts run (default: the rollout's environment).
        records_per_state: verified recoveries turned into records per failure state (fewest turns first).
    """

    policy: str = "oracle-guided"
    policy_kwargs: dict[str, Any] = Field(default_factory=dict)
    attempts: int = Field(default=2, ge=1)
    max_turns: int = Field(default=20, ge=1)
    command_timeout: float = Field(default=30.0, gt=0)
    rebuild: Literal["auto", "fork", "replay"] = "auto"
    concurrency: int = Field(default=1, ge=1)
    max_states: int | None = Field(default=None, ge=1)
    environment: EnvironmentConfig | None = None
    records_per_state: int = Field(default=1, ge=1)


class DecontaminationConfig(_Strict):
    """Decontamination against the evaluation tasks.

    Args:
        eval_split: also check the task suite's evaluation split (``tasks.eval_split``).
        terminal_bench: paths to local copies of Terminal-Bench 2.0/2.1 (folders of Harbor tasks);
            their task names and instructions are checked.
        ngram: word n-gram length of the overlap test.
        threshold: share of a record's instruction n-grams (or of its commands' n-grams) found in one
            evaluation task above which the record is removed.
    """

    eval_split: bool = True
    terminal_bench: list[Path] = Field(default_factory=list)
    ngram: int = Field(default=8, ge=1)
    threshold: float = Field(default=0.5, gt=0, le=1)


class FiltersConfig(_Strict):
    """Stage 5: quality filters, duplicate removal and decontamination (each counted in the report).

    Args:
        max_recovery_turns: recoveries with more turns are dropped.
        max_chars: records whose messages hold more characters in all are dropped.
        max_repeats: a recovery that runs the same command more than this many times is dropped.
        allow_parse_errors: keep recoveries with turns the harness could not parse.
        drop_restarts: drop recoveries that merely restart from scratch (re-run the prefix's own commands
            from its first one).
        near_duplicate_threshold: Jaccard similarity of command shingles (MinHash estimate, checked
            exactly) at or above which a record is a near-duplicate of an earlier one.
        replay_check: replay every record's prefix and recovery in a fresh sandbox and run the verifier;
            drop records that do not reach reward 1.0 again (counted with the quality filter).
    """

    max_recovery_turns: int = Field(default=30, ge=1)
    max_chars: int = Field(default=120_000, ge=1)
    max_repeats: int = Field(default=3, ge=1)
    allow_parse_errors: bool = False
    drop_restarts: bool = True
    near_duplicate_threshold: float = Field(default=0.9, gt=0, le=1)
    replay_check: bool = True
    decontamination: DecontaminationConfig = Field(default_factory=DecontaminationConfig)


class DatasetConfig(_Strict):
    """Identity of the published dataset (``stats.json`` and the card)."""

    name: str = "ReTerm-10K"
    version: str = "0.1.0"
    license: str = "apache-2.0"
    source_name: str = "ReTerm task suite"
    source_url: str | None = None
    citation: str | None = None
    # records of this many train-split tasks go to a held-out `test` split of the dataset (whole tasks, so
    # no failure state of a held-out task is trained on); SFT's held-out likelihood check reads it
    # (train/recipes/*/sft.yaml `dataset_test_split: test`). 0 = a `train` split only. Not the suite's
    # test split (tasks/splits.json), which the pipeline never touches.
    held_out_tasks: int = Field(default=0, ge=0)


class PipelineConfig(_Strict):
    """A whole build (see the module docstring and ``pipeline/configs/smoke.yaml``).

    ``seed`` seeds the choice of perturbations and the sampling of each failure state's attempts;
    ``sandbox_concurrency`` is how many scripted sandbox runs (reference and injected runs, replay checks)
    run at once.
    """

    name: str = "smoke"
    seed: int = 0
    sandbox_concurrency: int = Field(default=2, ge=1, description="scripted sandbox runs at once (reference and "
                                     "injected runs, replay checks)")
    tasks: TasksConfig = Field(default_factory=TasksConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    failures: FailuresConfig = Field(default_factory=FailuresConfig)
    injection: InjectionConfig = Field(default_factory=InjectionConfig)
    recovery: RecoveryConfig = Field(default_factory=RecoveryConfig)
    filters: FiltersConfig = Field(default_factory=FiltersConfig)
    dataset: DatasetConfig = Field(default_factory=DatasetConfig)

    @property
    def recovery_environment(self) -> EnvironmentConfig:
        return self.recovery.environment or self.rollout.environment

    def resolved(self) -> dict[str, Any]:
        """The config as plain JSON data (paths as given), for ``config.json`` and ``stats.json``."""
        return self.model_dump(mode="json")

    def fingerprint(self) -> str:
        """16 hex chars identifying the config (a resumed run must have the same)."""
        blob = json.dumps(self.resolved(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


def resolve_path(path: Path) -> Path:
    """``path`` as given if it exists relative to the current directory (or is absolute), else
    relative to the repository root."""
    if path.is_absolute() or path.exists():
        return path.resolve()
    candidate = REPO_ROOT / path
    return candidate.resolve() if candidate.exists() else path


def _format_errors(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or '(top level)'}: {e['msg']}" for e in exc.errors())


def load_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> PipelineConfig:
    """Read and validate a pipeline config (default: ``pipeline/configs/smoke.yaml``).

    Args:
        path: the YAML file.
        overrides: ``{"rollout.attempts": 1, ...}``: dotted keys set after reading (CLI ``--set``).

    Raises:
        ConfigError: unreadable YAML, unknown or invalid fields (file and field named).
    """
    path = Path(path) if path is not None else DEFAULT_CONFIG
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: cannot read the pipeline config ({exc})") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a pipeline config is a YAML mapping")
    for key, value in (overrides or {}).items():
        node = data
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {key}: {part} is not a mapping in {path}")
        node[parts[-1]] = value
    try:
        return PipelineConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{path}: {_format_errors(exc)}") from None
