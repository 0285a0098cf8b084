"""The model card's inputs: evaluation ``results.json`` and TRL training recipes.

``results.json`` is written by :mod:`reterm.eval.report` (schema ``reterm-eval/1``); :class:`EvalResults` is the
subset the card reads, validated so that a malformed file fails with the file and field named::

    {
      "schema": "reterm-eval/1",
      "name": str,
      "dataset": {"name": "terminal-bench@2.0", "version": str | null, "split": str | null, "n_tasks": int},
      "harness": {"agent": str, "version": str, "harbor_version": str, "environment": str,
                  "trials_per_task": int, "timeouts_modified": bool, "timeout_overrides": {...}},
      "models": [{"name": str, "agent": str, "policy": str | null, "model": str | null,
                  "pass_at_1": {"mean": float | null, "stderr": float | null,   # fractions in [0, 1]
                                "n_trials": int, "n_tasks": int},
                  "pass_at_k": {"2": float, ...},
                  "infra_faults": {"n": int, ...}, "agent_timeouts": int,
                  "recovery": {category: {"failure_states": int, "recovered": int, "rate": float | null}}}]
    }

Other fields of the file are ignored here. A recipe is a YAML mapping of TRL fields (``SFTConfig`` or
``GRPOConfig`` plus ``ModelConfig`` and script arguments, as ``trl sft|grpo --config`` and
``train/*.py --config`` read them); the card summarises the keys of :data:`SUMMARY_KEYS` and shows the
whole file with secrets (keys naming a token, secret, password or API key) redacted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator

from reterm.json_files import read_validated_json

EVAL_SCHEMA = "reterm-eval/1"


class _Loose(BaseModel):
    model_config = ConfigDict(extra="ignore")


class PassAt1(_Loose):
    mean: float | None = Field(description="mean over tasks of the per-task pass rate, a fraction in [0, 1]")
    stderr: float | None = None
    n_trials: int = Field(ge=0)
    n_tasks: int = Field(ge=0)

    @field_validator("mean", "stderr")
    @classmethod
    def _fraction(cls, v: float | None) -> float | None:
        if v is not None and not 0.0 <= v <= 1.0:
            raise ValueError(f"must be a fraction in [0, 1], got {v} (a percentage?)")
        return v


class RecoveryEntry(_Loose):
    failure_states: int = Field(ge=0)
    recovered: int = Field(ge=0)
    rate: float | None = None


class InfraFaults(_Loose):
    n: int = Field(ge=0)


class ModelResult(_Loose):
    name: str
    agent: str
    policy: str | None = None
    model: str | None = None
    pass_at_1: PassAt1
    pass_at_k: dict[str, float | None] = Field(default_factory=dict)
    infra_faults: InfraFaults = Field(default_factory=lambda: InfraFaults(n=0))
    agent_timeouts: int = 0
    recovery: dict[str, RecoveryEntry] = Field(default_factory=dict)


class EvalDataset(_Loose):
    name: str
    version: str | None = None
    split: str | None = None
    n_tasks: int = Field(ge=0)


class Harness(_Loose):
    agent: str
    version: str = ""
    harbor_version: str = ""
    environment: str = ""
    trials_per_task: int = Field(ge=1)
    timeouts_modified: bool = False
    timeout_overrides: dict[str, Any] = Field(default_factory=dict)


class EvalResults(_Loose):
    """The part of ``reterm-eval/1`` the model card reads (see the module docstring)."""

    schema_: Literal["reterm-eval/1"] = Field(alias="schema")
    name: str
    dataset: EvalDataset
    harness: Harness
    models: list[ModelResult] = Field(min_length=1)

    def find(self, name: str) -> ModelResult:
        """The entry called ``name``; ``KeyError`` listing the names otherwise."""
        for m in self.models:
            if m.name == name:
                return m
        raise KeyError(f"no model named {name!r} in the results (names: {', '.join(m.name for m in self.models)})")


def load_results(path: str | Path) -> EvalResults:
    """Read and validate ``results.json``; ``ValueError``/``FileNotFoundError`` name the file and fields."""
    return read_validated_json(path, EvalResults, "evaluation results", "eval/run.py writes results.json")


# ------------------------------------------------------------------------------------- recipes
GRPO_KEYS = frozenset(
    {"num_generations", "beta", "reward_funcs", "max_completion_length", "num_iterations", "epsilon",
     "generation_batch_size", "use_vllm", "vllm_mode", "reward_weights", "scale_rewards", "loss_type"}
)  # fmt: skip

# (key, label) shown in the recipe summary table, in this order, when present.
SUMMARY_KEYS: tuple[tuple[str, str], ...] = (
    ("model_name_or_path", "initial model"),
    ("dataset_name", "dataset"),
    ("dataset_train_split", "train split"),
    ("use_peft", "LoRA"),
    ("lora_r", "LoRA r"),
    ("lora_alpha", "LoRA alpha"),
    ("lora_dropout", "LoRA dropout"),
    ("lora_target_modules", "LoRA targets"),
    ("learning_rate", "learning rate"),
    ("lr_scheduler_type", "schedule"),
    ("warmup_ratio", "warm-up ratio"),
    ("warmup_steps", "warm-up steps"),
    ("num_train_epochs", "epochs"),
    ("max_steps", "max steps"),
    ("per_device_train_batch_size", "batch per device"),
    ("gradient_accumulation_steps", "gradient accumulation"),
    ("max_length", "max length (tokens)"),
    ("assistant_only_loss", "assistant-only loss"),
    ("completion_only_loss", "completion-only loss"),
    ("num_generations", "group size G"),
    ("max_completion_length", "max completion length"),
    ("beta", "KL beta"),
    ("loss_type", "loss"),
    ("temperature", "sampling temperature"),
    ("bf16", "bf16"),
    ("seed", "seed"),
)
_SECRET_KEY = re.compile(r"(?:^|_)(?:token|secret|password|passwd|api_?key)$", re.IGNORECASE)
"""A key that names a secret: one ending in ``token``, ``secret``, ``password`` or ``api_key`` (``hub_token``,
``wandb_api_key``); settings that merely mention tokens (``max_turn_tokens``, ``max_completion_length``) do not."""
_NOT_SECRET = re.compile(r"^(?:pad|eos|bos|unk|sep|cls|mask)_token$", re.IGNORECASE)  # tokenizer settings


@dataclass
class Recipe:
    """One training stage's recipe.

    Attributes:
        path: the YAML file.
        trainer: ``"grpo"`` when a GRPO-only key (:data:`GRPO_KEYS`) is set or the file name says grpo, else ``"sft"``.
        params: the mapping, secrets redacted.
        text: the file's text, secrets redacted (shown in the card).
        redacted: keys whose values were redacted.
    """

    path: Path
    trainer: str
    params: dict[str, Any]
    text: str
    redacted: list[str] = field(default_factory=list)

    def summary(self) -> list[tuple[str, str]]:
        """``(label, value)`` rows of :data:`SUMMARY_KEYS` present in the recipe."""
        out = []
        for key, label in SUMMARY_KEYS:
            if key in self.params and self.params[key] is not None:
                value = self.params[key]
                out.append((label, ", ".join(map(str, value)) if isinstance(value, list) else str(value)))
        return out


def load_recipe(path: str | Path) -> Recipe:
    """Read a TRL recipe YAML (see the module docstring); secrets are redacted in the result.

    Raises:
        FileNotFoundError: no file.
        ValueError: not YAML, not a mapping, or without ``model_name_or_path``.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: recipe not found")
    text = path.read_text(encoding="utf-8")
    try:
        params = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(params, dict):
        raise ValueError(f"{path}: a recipe must be a YAML mapping of TRL fields")
    if not params.get("model_name_or_path"):
        raise ValueError(f"{path}: the recipe has no model_name_or_path")
    redacted = sorted(k for k, v in params.items() if _SECRET_KEY.search(str(k)) and not _NOT_SECRET.match(str(k))
                      and isinstance(v, str) and v != "")  # fmt: skip
    for key in redacted:
        params[key] = "<redacted>"
        text = re.sub(rf"(?m)^(\s*{re.escape(key)}\s*:).*$", r"\1 <redacted>", text)
    trainer = "grpo" if GRPO_KEYS & set(params) or "grpo" in path.name.lower() else "sft"
    return Recipe(path=path, trainer=trainer, params=params, text=text, redacted=redacted)
