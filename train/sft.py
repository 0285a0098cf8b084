"""SFT cold start on ReTerm-10K with TRL's SFTTrainer (the step before ReTerm-GRPO).

Each ReTerm-10K record is split at its failure state into a conversational prompt/completion pair
(:mod:`reterm.training.sft_data`); with ``assistant_only_loss: true`` and ``completion_only_loss: true``
only the recovery's assistant turns carry loss (tool observations never do), and
``completion_only_loss: false`` trains on every assistant turn instead. The chat template renders the
same system/tool block as the agent harness at inference (``tools`` are passed per row).

Usage (recipes are YAML files of ``SFTScriptArguments`` + TRL ``SFTConfig`` + TRL ``ModelConfig``
fields; command-line flags override the recipe)::

    python train/sft.py --config train/recipes/smollm2-135m/sft.yaml            # CPU, minutes
    accelerate launch --config_file train/accelerate_configs/zero3.yaml \\
        train/sft.py --config train/recipes/qwen3.5-9b/sft.yaml                  # 8 GPUs
    python train/sft.py --config train/recipes/qwen3.5-9b/sft.yaml --check      # CPU, tiny Qwen3.5, 1 step

``--check`` runs the recipe's code path on the tiny Qwen3.5 with GPU-only options off for one step
(:mod:`reterm.training.check`); the dataset becomes the test fixture ``tests/fixtures/reterm10k_mini``
unless ``--check_dataset`` names another.

Outputs in ``output_dir``: the checkpoint (a LoRA adapter or full weights, tokenizer and chat template),
``merged/`` (LoRA folded into a full checkpoint when ``merge_adapter: true``), ``curves.csv`` and
``curves.png`` (loss and mean token accuracy, train and held-out), ``recipe.yaml`` (exact copy),
``command.json``, ``versions.json`` and ``training_summary.json`` (the model card's inputs). A rerun with
the same ``output_dir`` resumes from the last checkpoint.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trl import ModelConfig, ScriptArguments, SFTConfig, SFTTrainer, TrlParser

from reterm.precision import resolve_training_bf16
from reterm.training.check import as_cli_args, check_overrides
from reterm.training.lean import lean_fused_lm_head
from reterm.training.likelihood import training_chat_template
from reterm.training.models import (
    hub_id_of,
    load_model,
    load_tokenizer,
    lora_config,
    require_model_and_dataset,
    resolve_model_name_or_path,
)
from reterm.training.outputs import package_versions, write_curves, write_run_files, write_training_summary
from reterm.training.sft_data import load_records, to_sft_dataset

REPO = Path(__file__).resolve().parents[1]
FIXTURE_DATASET = REPO / "tests" / "fixtures" / "reterm10k_mini"
KEY_PACKAGES = ("torch", "transformers", "trl", "peft", "datasets")


@dataclass
class SFTScriptArguments(ScriptArguments):
    """Script arguments on top of TRL's (``dataset_name``, ``dataset_config``, ``dataset_train_split``,
    ``dataset_test_split``).

    ``dataset_test_split`` is the held-out split: evaluated before training (``eval_on_start``) and after,
    so the summary reports the base and the SFT model's NLL per recovery token. A dataset without that
    split trains without held-out evaluation.
    """

    max_train_samples: int | None = field(default=None, metadata={"help": "Use only the first N training records."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Use only the first N held-out records."})
    enable_thinking: bool | None = field(
        default=None,
        metadata={"help": "Qwen3.5 chat template flag (records carry no reasoning_content; see the 9B recipe)."},
    )
    merge_adapter: bool = field(
        default=False, metadata={"help": "After a LoRA run, also write a merged full checkpoint to output_dir/merged."}
    )
    check: bool = field(
        default=False,
        metadata={"help": "Code-path check: tiny Qwen3.5, CPU, one step, GPU-only options off "
                          "(reterm.training.check)."},
    )
    check_dataset: str | None = field(
        default=None,
        metadata={"help": "Dataset for --check (default: the repository's tests/fixtures/reterm10k_mini)."},
    )


def make_parser() -> TrlParser:
    return TrlParser((SFTScriptArguments, SFTConfig, ModelConfig))


def _wants_check(argv: list[str]) -> bool:
    """``--check`` on the command line (or ``check: true`` in the recipe), found before parsing: the
    recipe's GPU-only values (``bf16: true``) would fail to parse on a CPU."""
    import yaml

    for i, arg in enumerate(argv):
        if arg == "--check":
            nxt = argv[i + 1] if i + 1 < len(argv) else ""
            return nxt.lower() not in ("false", "0", "no")
        if arg.startswith("--check="):
            return arg.split("=", 1)[1].lower() not in ("false", "0", "no")
    if "--config" in argv:
        with open(argv[argv.index("--config") + 1]) as fh:
            return bool((yaml.safe_load(fh) or {}).get("check", False))
    return False


def parse_args(argv: list[str]) -> tuple[SFTScriptArguments, SFTConfig, ModelConfig, list[str]]:
    """Parse a recipe (``--config``) plus command-line overrides; apply ``--check`` overrides.

    Returns:
        ``(script_args, training_args, model_args, effective_argv)``; ``effective_argv`` includes the
        ``--check`` overrides (recorded in ``command.json``).
    """
    if not _wants_check(argv):
        script_args, training_args, model_args = make_parser().parse_args_and_config(argv)
        return script_args, training_args, model_args, argv
    # Pass 1 with the CPU-safe overrides (to read output_dir and the field names), pass 2 with all of them.
    cpu_safe = ["--use_cpu", "True", "--bf16", "False", "--fp16", "False", "--tf32", "False"]
    script_args, training_args, model_args = make_parser().parse_args_and_config(argv + cpu_safe)
    overrides = check_overrides(training_args, model_args)
    dataset = script_args.check_dataset or (str(FIXTURE_DATASET) if FIXTURE_DATASET.is_dir() else None)
    if dataset:
        overrides["dataset_name"] = dataset
    overrides["max_train_samples"] = 4
    overrides["max_eval_samples"] = 2
    extra = as_cli_args(overrides)
    print(f"[sft --check] overrides: {' '.join(extra)}", file=sys.stderr)
    argv = list(argv) + extra
    script_args, training_args, model_args = make_parser().parse_args_and_config(argv)
    if dataset:
        script_args.dataset_config = None  # the recipe's config name belongs to its own dataset
    training_args.dataset_num_proc = None  # no worker processes for a handful of records
    return script_args, training_args, model_args, argv


def _recipe_path(argv: list[str]) -> str | None:
    return argv[argv.index("--config") + 1] if "--config" in argv else None


def _template_name(tokenizer, template: str | None) -> str:
    """A readable name for the template SFT trains with (a TRL training template's file name, or the
    tokenizer's own)."""
    import trl

    if template is None:
        from reterm.policies.smollm2 import chat_template as chatml_tools

        if tokenizer.chat_template == chatml_tools():
            return "reterm/agent/templates/chatml_tools.jinja"
        return "the tokenizer's chat template (has {% generation %} markers)"
    for path in sorted((Path(trl.__file__).parent / "chat_templates").glob("*_training.jinja")):
        if path.read_text(encoding="utf-8") == template:
            return f"trl/chat_templates/{path.name}"
    return "TRL training template"


def _dataset_label(name: str) -> str:
    """The dataset's name for the summary: a Hub id as is, a local folder by its folder name."""
    path = Path(name).expanduser()
    return path.resolve().name if path.is_dir() else name


def _heldout(log_history: list[dict[str, Any]]) -> dict[str, Any] | None:
    evals = [e for e in log_history if "eval_loss" in e]
    if not evals:
        return None
    first, last = evals[0], evals[-1]
    out: dict[str, Any] = {
        "metric": "mean NLL per recovery token (nats), reference recoveries of the held-out split",
        "final_nll_per_token": last["eval_loss"],
        "final_mean_token_accuracy": last.get("eval_mean_token_accuracy"),
    }
    if first.get("step", None) == 0:
        out["base_nll_per_token"] = first["eval_loss"]
        out["base_mean_token_accuracy"] = first.get("eval_mean_token_accuracy")
        out["likelihood_improved"] = last["eval_loss"] < first["eval_loss"]
    return out


def build_summary(script_args, training_args, model_args, trainer, n_train: int, n_eval: int, template_name: str,
                  chat_template_kwargs: dict[str, Any] | None) -> dict[str, Any]:
    """The model card's inputs (``training_summary.json``)."""
    state = trainer.state
    train_logs = [e for e in state.log_history if "loss" in e and "step" in e]
    end = next((e for e in reversed(state.log_history) if "train_loss" in e), {})
    peft = lora_config(model_args)
    world = training_args.world_size
    hyper = {
        "learning_rate": training_args.learning_rate,
        "lr_scheduler_type": str(getattr(training_args.lr_scheduler_type, "value", training_args.lr_scheduler_type)),
        "warmup_steps": training_args.warmup_steps,
        "weight_decay": training_args.weight_decay,
        "optim": str(getattr(training_args.optim, "value", training_args.optim)),
        "num_train_epochs": training_args.num_train_epochs,
        "max_steps": training_args.max_steps,
        "per_device_train_batch_size": training_args.per_device_train_batch_size,
        "gradient_accumulation_steps": training_args.gradient_accumulation_steps,
        "world_size": world,
        "effective_batch_size": (
            training_args.per_device_train_batch_size * training_args.gradient_accumulation_steps * world
        ),
        "max_length": training_args.max_length,
        "packing": training_args.packing,
        "bf16": training_args.bf16,
        "activation_checkpointing": training_args.gradient_checkpointing,  # the field 5.20 and 5.24 both have
        "dtype": model_args.dtype,
        "seed": training_args.seed,
    }
    hub_id, base_note = hub_id_of(model_args.model_name_or_path)
    splits = {script_args.dataset_train_split: n_train}
    if n_eval:
        splits[script_args.dataset_test_split] = n_eval
    return {
        "base_model": model_args.model_name_or_path,
        "base_model_hub_id": hub_id,
        "base_model_note": base_note,
        "dataset": _dataset_label(script_args.dataset_name),
        "dataset_splits": splits,
        "method": "SFT (TRL SFTTrainer)",
        "finetuning": "LoRA" if peft is not None else "full",
        "lora": None if peft is None else {
            "r": peft.r, "alpha": peft.lora_alpha, "dropout": peft.lora_dropout,
            "target_modules": (
                peft.target_modules if isinstance(peft.target_modules, str) else sorted(peft.target_modules)
            ),
        },
        "loss_on": "recovery assistant turns" if trainer.completion_only_loss else "all assistant turns",
        "assistant_only_loss": training_args.assistant_only_loss,
        "chat_template": template_name,
        "chat_template_kwargs": chat_template_kwargs or {},
        "hyperparameters": hyper,
        "steps": state.global_step,
        "epochs": state.epoch,
        "train_runtime_s": end.get("train_runtime"),
        "first_loss": train_logs[0]["loss"] if train_logs else None,
        "final_loss": train_logs[-1]["loss"] if train_logs else None,
        "train_loss": end.get("train_loss"),
        "final_mean_token_accuracy": train_logs[-1].get("mean_token_accuracy") if train_logs else None,
        "heldout": _heldout(state.log_history),
        "check_run": bool(script_args.check),
        "versions": {k: v for k, v in package_versions().items() if k in KEY_PACKAGES},
    }


def main(argv: list[str] | None = None) -> int:
    """Train; returns 0. Raises ``ValueError`` naming the field for a recipe without model or dataset."""
    from transformers.trainer_utils import IntervalStrategy, get_last_checkpoint

    argv = list(sys.argv[1:] if argv is None else argv)
    script_args, training_args, model_args, argv = parse_args(argv)
    require_model_and_dataset(model_args, script_args)
    precision = resolve_training_bf16(training_args)  # a CPU recipe's bf16 only where the CPU has it
    if precision:
        print(f"[sft] {precision}", file=sys.stderr)
    if script_args.dataset_streaming:
        raise ValueError("dataset_streaming is not supported by train/sft.py")

    resolved = resolve_model_name_or_path(model_args.model_name_or_path)
    tokenizer = load_tokenizer(resolved, model_args.model_revision, training_args.trust_remote_code)
    template_kwargs = None if script_args.enable_thinking is None else {"enable_thinking": script_args.enable_thinking}

    num_proc = training_args.dataset_num_proc
    train_ds = to_sft_dataset(
        load_records(script_args.dataset_name, script_args.dataset_train_split, script_args.dataset_config),
        template_kwargs, script_args.max_train_samples, num_proc,
    )
    eval_ds = None
    if script_args.dataset_test_split:
        try:
            heldout = load_records(script_args.dataset_name, script_args.dataset_test_split, script_args.dataset_config)
        except ValueError as exc:
            if "no split" not in str(exc):
                raise
            print(f"[sft] {exc}; training without held-out evaluation", file=sys.stderr)
        else:
            eval_ds = to_sft_dataset(heldout, template_kwargs, script_args.max_eval_samples, num_proc)
    if eval_ds is None:
        training_args.eval_strategy = IntervalStrategy.NO
        training_args.eval_on_start = False

    model = load_model(resolved, model_args, training_args.trust_remote_code, **(training_args.model_init_kwargs or {}))
    lean_fused_lm_head()  # CPUs: the loss's log-probabilities only where the loss is, in small tiles
    trainer = SFTTrainer(
        model=model,
        args=training_args,
        train_dataset=train_ds,
        eval_dataset=eval_ds,
        processing_class=tokenizer,
        peft_config=lora_config(model_args),
    )
    out = Path(training_args.output_dir)
    if trainer.accelerator.is_main_process:
        write_run_files(out, _recipe_path(argv), [sys.argv[0], *argv])

    resume = training_args.resume_from_checkpoint
    if resume is None and out.is_dir():
        resume = get_last_checkpoint(str(out))
        if resume:
            print(f"[sft] resuming from {resume}", file=sys.stderr)
    trainer.train(resume_from_checkpoint=resume)
    if eval_ds is not None and not any(e.get("step") == trainer.state.global_step and "eval_loss" in e
                                       for e in trainer.state.log_history):
        trainer.evaluate()
    trainer.save_model(str(out))

    if trainer.accelerator.is_main_process:
        summary = build_summary(
            script_args, training_args, model_args, trainer, len(train_ds), len(eval_ds) if eval_ds is not None else 0,
            _template_name(tokenizer, training_chat_template(tokenizer)), template_kwargs,
        )
        write_training_summary(out, summary)
        write_curves(trainer.state.log_history, out, title=f"SFT {summary['base_model']} on {summary['dataset']}")
        print(f"[sft] steps {summary['steps']}, loss {summary['first_loss']} -> {summary['final_loss']}")
        held = summary["heldout"]
        if held and "base_nll_per_token" in held:
            print(
                f"[sft] held-out recovery NLL/token: base {held['base_nll_per_token']:.4f} -> "
                f"SFT {held['final_nll_per_token']:.4f} (perplexity {math.exp(held['base_nll_per_token']):.2f} -> "
                f"{math.exp(held['final_nll_per_token']):.2f})"
            )
        if script_args.merge_adapter and summary["finetuning"] == "LoRA":
            from reterm.training.merge import merge_adapter

            merged = merge_adapter(out, out / "merged", dtype=model_args.dtype)
            print(f"[sft] merged checkpoint: {merged}")
        if script_args.enable_thinking is not None:  # the recipe's one thinking setting, in the saved template
            from reterm.training.thinking import pin_saved_template

            for folder in (out, out / "merged"):
                if folder.is_dir():
                    print(f"[sft] enable_thinking={script_args.enable_thinking} pinned in "
                          f"{pin_saved_template(folder, script_args.enable_thinking)}")
        print(f"[sft] saved to {out}")
    trainer.accelerator.wait_for_everyone()
    trainer.end()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except ValueError as exc:  # a recipe field TRL does not know: say so without a traceback
        if "Unknown arguments" not in str(exc):
            raise
        print(f"sft.py: {_recipe_path(sys.argv[1:]) or 'command line'}: {exc}", file=sys.stderr)
        sys.exit(2)
