"""ReTerm-GRPO (and the standard-GRPO baseline) with TRL, from the SFT checkpoint.

``mode: reterm``: each group is one failure state of the agent (seeded from the SFT dataset's failure
prefixes, refreshed online from the policy's own failed attempts); its G completions are multi-turn
recovery attempts, each in its own fork of the environment at that state, scored by the task's verifier.
``mode: standard``: the same trainer, tasks, G, turns, token budgets and steps, but every group starts at
the task's start (the paper's baseline). See :mod:`reterm.training.grpo_trainer`.

Usage (recipes are YAML files of ``GRPOScriptArguments`` + ``ReTermGRPOConfig`` + TRL ``ModelConfig``
fields; command-line flags override the recipe)::

    python train/sft.py  --config train/recipes/smollm2-135m/sft.yaml            # the SFT checkpoint first
    python train/grpo.py --config train/recipes/smollm2-135m/grpo.yaml           # CPU, minutes
    python train/grpo.py --config train/recipes/smollm2-135m/grpo_standard.yaml  # the baseline
    accelerate launch --config_file train/accelerate_configs/zero3.yaml \\
        train/grpo.py --config train/recipes/qwen3.5-9b/grpo.yaml                 # GPUs, vLLM colocate
    python train/grpo.py --config train/recipes/qwen3.5-9b/grpo.yaml --check     # CPU, one step

``--check`` runs a recipe's code path on the tiny Qwen3.5 for one step (:mod:`reterm.training.check` plus
the overrides below: the seed fixture ``tests/fixtures/grpo_seed``, the local sandbox, G=2, short turns,
transformers generation).

Outputs in ``output_dir``: the checkpoint (LoRA adapter or full weights + tokenizer; loads in the harness
as ``hf:<output_dir>``), ``merged/`` (with ``merge_adapter: true``), ``curves.csv``/``curves.png``,
``recovery.md`` (recovery rate per error category over the run), ``rollouts/`` (every attempt's
trajectory), ``recipe.yaml``, ``command.json``, ``versions.json``, ``training_summary.json``. A rerun with
the same ``output_dir`` resumes from the last checkpoint (the online failure states included).
"""

from __future__ import annotations

import fnmatch
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trl import ModelConfig, ScriptArguments, TrlParser

from reterm.precision import resolve_training_bf16
from reterm.recovery.state import Source
from reterm.training.check import as_cli_args, check_overrides
from reterm.training.failure_pool import FailurePool, PoolState, seed_states_from_records, task_start_states
from reterm.training.grpo_config import ReTermGRPOConfig
from reterm.training.grpo_outputs import recovery_table, totals_from_rollouts, write_grpo_curves
from reterm.training.models import (
    hub_id_of,
    load_model,
    load_tokenizer,
    lora_config,
    require_model_and_dataset,
    resolve_model_name_or_path,
)
from reterm.training.outputs import package_versions, write_run_files, write_training_summary
from reterm.training.sft_data import load_records

REPO = Path(__file__).resolve().parents[1]
CHECK_DATASET = REPO / "tests" / "fixtures" / "grpo_seed"
CHECK_TASK_DIRS = ["tasks", "tests/fixtures/tasks"]
SEED_FAILURE_SOURCES = (Source.OWN.value, Source.INJECTED.value)  # a record's failure_source, task starts aside


@dataclass
class GRPOScriptArguments(ScriptArguments):
    """Script arguments on top of TRL's (``dataset_name``: a ReTerm-10K folder or Hub id whose records'
    failure prefixes seed the pool; ``dataset_train_split``)."""

    max_train_samples: int | None = field(default=None, metadata={"help": "Use only the first N records."})
    standard_tasks: list[str] | None = field(
        default=None,
        metadata={"help": "Standard mode: task ids to train on (default: the tasks of the dataset's usable records)."},
    )
    seed_tasks: str | None = field(
        default=None,
        metadata={"help": "Only the records of tasks whose id matches this shell pattern seed the pool (e.g. "
                          "'multi-*': the two-stage train drills); standard mode then starts from those tasks too, "
                          "so both arms train on the same tasks."},
    )
    seed_failure_sources: list[str] | None = field(
        default=None,
        metadata={"help": "Only records whose failure_source is one of these seed the pool: 'own' (a policy's own "
                          "failed attempt, mined or from the data stage) and/or 'injected' (a scripted or perturbed "
                          "one); default: both. ReTerm mode only: standard mode starts from the tasks' starts."},
    )
    merge_adapter: bool = field(
        default=False, metadata={"help": "After a LoRA run, also write a merged full checkpoint to output_dir/merged."}
    )
    check: bool = field(
        default=False, metadata={"help": "Code-path check: tiny Qwen3.5, CPU, one step (reterm.training.check)."}
    )
    check_dataset: str | None = field(default=None, metadata={"help": "Dataset for --check (default: grpo_seed)."})


def make_parser() -> TrlParser:
    return TrlParser((GRPOScriptArguments, ReTermGRPOConfig, ModelConfig))


def grpo_check_overrides(training_args: ReTermGRPOConfig, model_args: ModelConfig) -> dict[str, Any]:
    """``--check`` overrides: :func:`reterm.training.check.check_overrides` plus GRPO's (G=2, two short turns,
    transformers generation, the local sandbox, no activation checkpointing)."""
    out = check_overrides(training_args, model_args)
    out.update({
        "num_generations": 2, "max_turns": 2, "max_turn_tokens": 16, "max_completion_length": 96,
        "use_vllm": False, "environment": "local", "fork_method": "auto", "gradient_checkpointing": False,
        "dynamic_sampling": "none", "max_state_prompt_tokens": 4096, "save_strategy": "no",
    })  # fmt: skip
    return out


def _check_flag(argv: list[str]) -> bool | None:
    """``--check`` / ``--check true|false`` / ``--check=...`` on the command line, or ``None`` if absent (then
    the recipe's ``check`` field decides)."""
    for i, arg in enumerate(argv):
        if arg == "--check":
            nxt = argv[i + 1] if i + 1 < len(argv) else ""
            return nxt.lower() not in ("false", "0", "no")
        if arg.startswith("--check="):
            return arg.split("=", 1)[1].lower() not in ("false", "0", "no")
    return None


def parse_args(argv: list[str]) -> tuple[GRPOScriptArguments, ReTermGRPOConfig, ModelConfig, list[str]]:
    """Parse a recipe (``--config``) plus command-line overrides; apply the ``--check`` overrides.

    Returns ``(script_args, training_args, model_args, effective_argv)``.
    """
    flag = _check_flag(argv)
    if flag is not True:
        script_args, training_args, model_args = make_parser().parse_args_and_config(argv)
        if flag is False or not script_args.check:
            return script_args, training_args, model_args, argv
    # a GPU recipe does not validate on a CPU (bf16): read it with the CPU settings first
    cpu = ["--bf16", "False", "--fp16", "False", "--tf32", "False", "--use_cpu", "True", "--use_vllm", "False"]
    script_args, training_args, model_args = make_parser().parse_args_and_config(list(argv) + cpu)
    overrides = grpo_check_overrides(training_args, model_args)
    overrides["dataset_name"] = script_args.check_dataset or str(CHECK_DATASET)
    overrides["max_train_samples"] = 2  # the fixture's first records: the fast hello-file states
    extra = as_cli_args({k: v for k, v in overrides.items() if v is not None})
    extra += ["--task_dirs", *CHECK_TASK_DIRS]
    extra += ["--seed_tasks", ""]  # the recipe's task filter names its own dataset's tasks, not the fixture's
    print(f"[grpo --check] overrides: {' '.join(extra)}", file=sys.stderr)
    argv = list(argv) + extra
    script_args, training_args, model_args = make_parser().parse_args_and_config(argv)
    script_args.dataset_config = None
    return script_args, training_args, model_args, argv


def _recipe_path(argv: list[str]) -> str | None:
    return argv[argv.index("--config") + 1] if "--config" in argv else None


def build_pool(script_args: GRPOScriptArguments, args: ReTermGRPOConfig, tokenizer: Any) -> FailurePool:
    """The failure-state pool of a run (seed states, or task starts in standard mode).

    Raises:
        ValueError: no usable record (the message gives the skip counts), or a bad ``standard_tasks``.
    """
    records = load_records(script_args.dataset_name, script_args.dataset_train_split, script_args.dataset_config)
    if script_args.max_train_samples is not None:
        records = records.select(range(min(script_args.max_train_samples, len(records))))
    if script_args.seed_tasks:
        pattern = script_args.seed_tasks
        records = records.filter(lambda r: fnmatch.fnmatchcase(r["task_id"] or "", pattern))
        if not len(records):
            raise ValueError(f"{script_args.dataset_name}: no record of a task matching seed_tasks={pattern!r}")
    if script_args.seed_failure_sources and args.mode == "reterm":
        wanted = set(script_args.seed_failure_sources)
        if unknown := wanted - set(SEED_FAILURE_SOURCES):
            raise ValueError(f"seed_failure_sources: {sorted(unknown)} not among {SEED_FAILURE_SOURCES}")
        before = len(records)
        records = records.filter(lambda r: r["failure_source"] in wanted)
        print(f"[grpo] seed_failure_sources={sorted(wanted)}: {len(records)} of {before} records", file=sys.stderr)
        if not len(records):
            raise ValueError(f"{script_args.dataset_name}: no record with failure_source in {sorted(wanted)}")
    seeds, skipped = seed_states_from_records(records, args.task_dirs)
    print(f"[grpo] {len(seeds)} failure states from {len(records)} records of {script_args.dataset_name}"
          + (f"; skipped {dict(skipped)}" if skipped else ""), file=sys.stderr)  # fmt: skip
    if not seeds:
        raise ValueError(
            f"{script_args.dataset_name}: no record has a failure state on a task found in task_dirs "
            f"{args.task_dirs} (skipped: {dict(skipped)}); GRPO forks attempts from real task environments"
        )
    states = seeds
    if args.mode == "standard":
        states = task_start_states(script_args.standard_tasks or sorted({s.task_id for s in seeds}), args.task_dirs)
        print(f"[grpo] standard mode: {len(states)} tasks: {', '.join(s.task_id for s in states)}", file=sys.stderr)
    from reterm.agent.protocol import TOOLS
    from reterm.policies.transformers_policy import template_messages
    from reterm.training.likelihood import training_chat_template

    template = training_chat_template(tokenizer)
    kwargs = args.chat_template_kwargs or {}

    def prompt_tokens(state: PoolState) -> int:
        ids = tokenizer.apply_chat_template(template_messages(state.prompt), tools=TOOLS, chat_template=template,
                                            add_generation_prompt=True, tokenize=True, return_dict=False, **kwargs)  # fmt: skip
        return len(ids)

    return FailurePool(
        states, online_fraction=args.online_state_fraction if args.mode == "reterm" else 0.0,
        max_online=args.max_online_states, seed=args.seed, prompt_tokens=prompt_tokens,
        max_prompt_tokens=args.max_state_prompt_tokens, skip_equal_after=args.skip_equal_after,
        skip_equal_explore=args.skip_equal_explore,
    )  # fmt: skip


def _public_base(name: str, resolved: str) -> tuple[str, str]:
    """``(hub_id, note)`` of the model GRPO started from, for the model card: the SFT run's public base
    (``base_model_hub_id`` of its ``training_summary.json``, next to the checkpoint or one folder up, for
    ``.../sft/merged``) with a note naming the SFT checkpoint, else :func:`hub_id_of`. ``hub_id`` is a
    plain Hub id or name (``reterm.cards.model`` reads it as the card's ``base_model``), never a path."""
    import json

    for folder in (Path(resolved), Path(resolved).parent):
        summary = folder / "training_summary.json"
        if summary.is_file():
            try:
                hub = json.loads(summary.read_text()).get("base_model_hub_id")
            except (OSError, ValueError):
                hub = None
            if hub:
                return hub, f"after the SFT cold start ({'/'.join(Path(name).parts[-2:])})"
    return hub_id_of(name)


def build_summary(script_args, args: ReTermGRPOConfig, model_args, trainer, pool: FailurePool, resolved: str) -> dict[str, Any]:
    """The model card's inputs (``training_summary.json``)."""
    logs = [e for e in trainer.state.log_history if "reward" in e]
    end = next((e for e in reversed(trainer.state.log_history) if "train_runtime" in e), {})
    peft = lora_config(model_args)
    t = trainer.totals
    rollouts = Path(args.output_dir) / "rollouts"
    if args.save_rollouts and rollouts.is_dir():  # survives resumes: every round's attempts are on disk
        t = totals_from_rollouts(rollouts, args.mode)
    hub_id, base_note = _public_base(model_args.model_name_or_path, resolved)
    return {
        "base_model": model_args.model_name_or_path,
        "base_model_hub_id": hub_id,
        "base_model_note": base_note,
        "dataset": Path(script_args.dataset_name).name if Path(script_args.dataset_name).is_dir() else script_args.dataset_name,
        "method": "ReTerm-GRPO (TRL GRPOTrainer subclass)" if args.mode == "reterm" else "standard GRPO (baseline)",
        "mode": args.mode,
        "finetuning": "LoRA" if peft is not None else "full",
        "pool": {"seed_states": len(pool.seeds), "online_states": len(pool.online), "counts": dict(pool.counts)},
        "hyperparameters": {
            k: getattr(args, k) for k in ("learning_rate", "num_generations", "per_device_train_batch_size",
                                          "gradient_accumulation_steps", "max_steps", "max_turns", "max_turn_tokens",
                                          "max_completion_length", "temperature", "beta", "loss_type", "scale_rewards",
                                          "online_state_fraction", "online_states_from", "pool_refresh_steps", "dynamic_sampling",
                                          "skip_equal_after", "unsubmitted_reward_scale", "merged_generation", "seed")
        } | {"world_size": args.world_size},
        "steps": trainer.state.global_step,
        "generation_copy_syncs": None if trainer.generation_copy is None else trainer.generation_copy.syncs,
        "train_runtime_s": end.get("train_runtime"),
        "first_reward": logs[0]["reward"] if logs else None,
        "final_reward": logs[-1]["reward"] if logs else None,
        "attempts": int(t["attempts"]), "scored_attempts": int(t["scored"]), "passed_attempts": int(t["passed"]),
        "submitted_attempts": int(t["submitted"]),
        "infra_fault_attempts": int(t["infra"]),
        "dropped_groups": {k[len("dropped_"):]: int(v) for k, v in t.items() if k.startswith("dropped_")},
        "zero_variance_groups": int(t["zero_variance_groups"]), "groups": int(t["groups"]),
        "recovery_by_category": {k.split("/", 1)[1]: {"attempts": int(v), "recovered": int(t.get(f"cat_passed/{k.split('/', 1)[1]}", 0))}
                                 for k, v in t.items() if k.startswith("cat_attempts/")},
        "check_run": bool(script_args.check),
        "versions": {k: v for k, v in package_versions().items() if k in ("torch", "transformers", "trl", "peft", "harbor")},
        "_totals": t,
    }  # fmt: skip


def _finished(checkpoint: str, max_steps: int) -> bool:
    """True when ``checkpoint`` is at or past ``max_steps`` (its ``trainer_state.json``)."""
    import json

    try:
        step = json.loads((Path(checkpoint) / "trainer_state.json").read_text()).get("global_step", 0)
    except (OSError, ValueError):
        return False
    return max_steps > 0 and step >= max_steps


def step_diagnostics(log_history: list[dict[str, Any]]) -> dict[str, Any]:
    """Whether the optimiser had something to follow, per logged step: the gradient norm (before clipping) and the
    advantages' mean absolute value and non-zero share (``reterm/advantage_*``, averaged over each step's
    micro-batches), each as ``{"mean", "max", "n"}`` over the steps that logged it."""
    out: dict[str, Any] = {}
    for key, name in (("grad_norm", "grad_norm"), ("reterm/advantage_abs_mean", "advantage_abs_mean"),
                      ("reterm/advantage_nonzero_share", "advantage_nonzero_share")):  # fmt: skip
        vals = [float(e[key]) for e in log_history if isinstance(e.get(key), (int, float)) and e[key] == e[key]]
        out[name] = {"mean": sum(vals) / len(vals), "max": max(vals), "n": len(vals)} if vals else None
    return out


def _kl_to_start(trainer: Any, tokenizer: Any, args: ReTermGRPOConfig, max_attempts: int = 16) -> dict[str, Any] | None:
    """KL(trained || start) per assistant token on the run's last ``max_attempts`` attempts
    (:func:`reterm.training.drift.kl_to_start`); ``None`` without a LoRA adapter or saved rollouts."""
    from reterm.agent.protocol import TOOLS
    from reterm.training.drift import kl_to_start, last_attempts
    from reterm.training.likelihood import training_chat_template

    if not hasattr(trainer.model, "disable_adapter") or not args.save_rollouts:
        return None
    trajectories = last_attempts(Path(args.output_dir) / "rollouts", max_attempts)
    if not trajectories:
        return None
    kl = kl_to_start(trainer.model, tokenizer, trajectories, tools=TOOLS, chat_template=training_chat_template(tokenizer),
                     chat_template_kwargs=args.chat_template_kwargs, bf16=bool(args.bf16))  # fmt: skip
    print(f"[grpo] KL to the start on the last {kl['attempts']} attempts ({kl['tokens']} assistant tokens): "
          f"k3 {kl['kl_k3']:.4g}, k1 {kl['kl_k1']:.4g} nats/token", file=sys.stderr)
    return kl


def main(argv: list[str] | None = None) -> int:
    """Train; returns 0. Raises ``ValueError`` naming the field for a recipe without model or dataset."""
    from transformers.trainer_utils import get_last_checkpoint

    from reterm.training.grpo_trainer import ReTermGRPOTrainer

    argv = list(sys.argv[1:] if argv is None else argv)
    script_args, args, model_args, argv = parse_args(argv)
    require_model_and_dataset(model_args, script_args)
    precision = resolve_training_bf16(args)  # a CPU recipe's bf16 only where the CPU has it
    if precision:
        print(f"[grpo] {precision}", file=sys.stderr)
    resolved = resolve_model_name_or_path(model_args.model_name_or_path)
    if ("/" in resolved or resolved.startswith(".")) and not Path(resolved).exists():
        raise FileNotFoundError(
            f"model_name_or_path: {resolved} does not exist. ReTerm-GRPO starts from the SFT checkpoint: run "
            "`python train/sft.py --config train/recipes/smollm2-135m/sft.yaml` first (or pass --model_name_or_path)"
        )
    if Path(resolved).is_dir():  # the adapter's base_model_name_or_path must not depend on the working directory
        resolved = str(Path(resolved).resolve())
    tokenizer = load_tokenizer(resolved, model_args.model_revision, args.trust_remote_code)
    pool = build_pool(script_args, args, tokenizer)
    model = load_model(resolved, model_args, args.trust_remote_code, **(args.model_init_kwargs or {}))
    trainer = ReTermGRPOTrainer(model, args, pool, processing_class=tokenizer, peft_config=lora_config(model_args))
    out = Path(args.output_dir)
    if trainer.accelerator.is_main_process:
        write_run_files(out, _recipe_path(argv), [sys.argv[0], *argv])

    resume = args.resume_from_checkpoint
    if resume is None and out.is_dir():
        resume = get_last_checkpoint(str(out))
    if resume:
        print(f"[grpo] resuming from {resume}" + (" (with its online failure states)" if trainer.load_pool_state(resume)
                                                   else ""), file=sys.stderr)  # fmt: skip
    try:
        if resume and _finished(resume, args.max_steps):
            # the run reached max_steps before it could write its outputs: only load the final checkpoint
            # (transformers' resume would train one more step before it checks max_steps)
            from transformers import TrainerState

            trainer._load_from_checkpoint(resume)
            trainer.state = TrainerState.load_from_json(str(Path(resume) / "trainer_state.json"))
        else:
            trainer.train(resume_from_checkpoint=resume)
        trainer.save_model(str(out))
    finally:
        trainer.close()

    if trainer.accelerator.is_main_process:
        summary = build_summary(script_args, args, model_args, trainer, pool, resolved)
        totals = summary.pop("_totals")
        summary["kl_to_start"] = _kl_to_start(trainer, tokenizer, args)
        summary["diagnostics"] = step_diagnostics(trainer.state.log_history)
        write_training_summary(out, summary)
        title = f"{summary['method']}: {summary['base_model']} on {summary['dataset']}"
        write_grpo_curves(trainer.state.log_history, out, title=title)
        (out / "recovery.md").write_text(f"# Recovery rate per error category ({args.mode})\n\n"
                                         f"{recovery_table(totals)}\n")  # fmt: skip
        print(f"[grpo] {args.mode}: {summary['steps']} steps, reward {summary['first_reward']} -> "
              f"{summary['final_reward']}, attempts {summary['attempts']} (passed {summary['passed_attempts']}, "
              f"infrastructure faults {summary['infra_fault_attempts']}), zero-variance groups "
              f"{summary['zero_variance_groups']}/{summary['groups']}")  # fmt: skip
        print(recovery_table(totals))
        if script_args.merge_adapter and summary["finetuning"] == "LoRA":
            from reterm.training.merge import merge_adapter

            # the base is the checkpoint GRPO started from (the SFT model), not training_summary's public name
            merged = merge_adapter(out, out / "merged", base_model=resolved, dtype=model_args.dtype)
            print(f"[grpo] merged checkpoint: {merged}")
        thinking = (args.chat_template_kwargs or {}).get("enable_thinking")
        if thinking is not None:  # the recipe's one thinking setting, in the saved template
            from reterm.training.thinking import pin_saved_template

            for folder in (out, out / "merged"):
                if folder.is_dir():
                    print(f"[grpo] enable_thinking={thinking} pinned in {pin_saved_template(folder, bool(thinking))}")
        print(f"[grpo] saved to {out}")
    trainer.accelerator.wait_for_everyone()
    return 0


if __name__ == "__main__":
    sys.exit(main())
