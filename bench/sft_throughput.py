"""Benchmark of SFT: the kit's SFT (TRL's SFTTrainer as ``train/sft.py`` builds it from a recipe) against a bare
torch forward and backward loop over the same batches.

Each side runs in its own process (so that each peak memory is its own): the recipe's model (LoRA as in the
recipe), dataset, collator and batch size; ``--steps`` optimiser steps after one warm-up step.

- ``sft``: ``SFTTrainer.train()`` (its loss: TRL's chunked log-probabilities, only where the loss is).
- ``bare``: the same trainer's model and training batches, ``loss = model(**batch).loss`` (transformers'
  own loss over the full logits), ``loss.backward()``, ``AdamW.step()`` every ``gradient_accumulation_steps``.

Prints tokens/s (every token of a batch, prompt included, counts) and peak resident memory (``ru_maxrss``:
model, optimiser and activations included) of each, then one JSON line with ``sft_over_bare`` (target >= 0.67)
and ``sft_peak_gb`` (target <= 3).

With ``--processes 2`` it times the ``sft`` side as one process with every thread against ``torchrun`` data
parallelism (2 processes of ``cpus / 2`` threads each, gloo; the same per-process batch and accumulation, so each
optimiser step sees twice the records): on a small model most of a step is element-wise work, type casts and CPU
attention kernels that two threads share poorly, so processes can use the cores better than threads. Tokens
are summed over the processes, peak memory too (each process holds its own model and activations).

With ``--compare-omp`` it times the ``sft`` side instead under ``OMP_WAIT_POLICY=PASSIVE`` and ``ACTIVE``, in
alternation (``--repeats`` pairs), and prints both tokens/s and their ratio: the policy decides whether torch's
OpenMP threads sleep or spin between parallel regions (passive is right beside sandboxes and generation, where a
spinning thread steals the core a command needs; run_all gives its SFT stage, which runs no sandbox, ``ACTIVE``).

Usage: ``python bench/sft_throughput.py [--config train/recipes/smollm2-135m/sft.yaml] [--dataset DIR] [--steps 4]
[--compare-omp [--repeats 2] | --processes 2]``
(``--dataset``: default the repository's small recovery fixture, so that it runs from a fresh clone; the
recipe's own dataset is the embedded run's ``runs/smollm2-135m/data``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _sft_module():
    spec = importlib.util.spec_from_file_location("reterm_train_sft", REPO / "train" / "sft.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def build_trainer(config: str, dataset: str, steps: int, out: str):
    """The recipe's SFTTrainer as train/sft.py builds it (no evaluation, no saving)."""
    from trl import SFTTrainer

    from reterm.training.models import load_model, load_tokenizer, lora_config, resolve_model_name_or_path
    from reterm.training.sft_data import load_records, to_sft_dataset

    sft = _sft_module()
    script_args, training_args, model_args, _ = sft.parse_args([
        "--config", config, "--dataset_name", dataset, "--output_dir", out, "--max_steps", str(steps + 1), "--eval_strategy", "no",
        "--eval_on_start", "False", "--save_strategy", "no", "--report_to", "none", "--logging_steps", "1000",
    ])  # fmt: skip
    sft.lean_fused_lm_head()  # as train/sft.py does before building its trainer
    resolved = resolve_model_name_or_path(model_args.model_name_or_path)
    tokenizer = load_tokenizer(resolved, model_args.model_revision, training_args.trust_remote_code)
    template_kwargs = None if script_args.enable_thinking is None else {"enable_thinking": script_args.enable_thinking}
    train_ds = to_sft_dataset(load_records(script_args.dataset_name, script_args.dataset_train_split,
                                           script_args.dataset_config), template_kwargs, None, None)  # fmt: skip
    model = load_model(resolved, model_args, training_args.trust_remote_code, **(training_args.model_init_kwargs or {}))
    return SFTTrainer(model=model, args=training_args, train_dataset=train_ds, processing_class=tokenizer,
                      peft_config=lora_config(model_args))  # fmt: skip


def run_side(side: str, config: str, dataset: str, steps: int) -> dict:
    import torch
    from transformers import TrainerCallback

    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as out:
        trainer = build_trainer(config, dataset, steps, out)
        accum = trainer.args.gradient_accumulation_steps
        tokens, timed = [0], {"t0": None, "t1": None}
        if side == "sft":
            inner = trainer.compute_loss

            def counting(model, inputs, *a, **k):
                if timed["t0"] is not None:
                    tokens[0] += int(inputs["attention_mask"].sum()) if "attention_mask" in inputs else inputs["input_ids"].numel()
                return inner(model, inputs, *a, **k)

            trainer.compute_loss = counting

            class Clock(TrainerCallback):
                def on_step_end(self, args, state, control, **kw):
                    if state.global_step == 1:
                        timed["t0"] = time.perf_counter()
                    timed["t1"] = time.perf_counter()

            trainer.add_callback(Clock())
            trainer.train()
        else:
            model = trainer.model
            model.train()
            opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=trainer.args.learning_rate)
            batches = iter(trainer.get_train_dataloader())
            for step in range(steps + 1):
                if step == 1:
                    timed["t0"] = time.perf_counter()
                for _ in range(accum):
                    batch = next(batches)
                    inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "labels") if k in batch}
                    if step >= 1:
                        tokens[0] += int(inputs["attention_mask"].sum()) if "attention_mask" in inputs else inputs["input_ids"].numel()
                    (model(**inputs).loss / accum).backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
            timed["t1"] = time.perf_counter()
    seconds = timed["t1"] - timed["t0"]
    peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2
    return {"side": side, "tokens": tokens[0], "seconds": seconds, "tokens_per_s": tokens[0] / seconds, "peak_gb": peak_gb}


def run_results(cmd: list[str], env: dict[str, str] | None, label: str) -> list[dict]:
    """Run ``cmd`` (in the repository, with ``env``) and return the JSON of each of its ``RESULT`` lines (one per
    process it starts). Raises ``SystemExit`` naming ``label``, with the output's tail, when it fails or prints none."""
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env)
    found = [json.loads(ln[len("RESULT "):]) for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not found:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
        raise SystemExit(f"{label}: failed (exit {proc.returncode})")
    return found


def compare_processes(args: argparse.Namespace) -> int:
    """The sft side as one process (every thread) and as ``args.processes`` torchrun processes; prints a table."""
    cpus = os.cpu_count() or 1
    threads = max(1, cpus // args.processes)
    side = [__file__, "--side", "sft", "--config", args.config, "--dataset", args.dataset, "--steps", str(args.steps)]
    env = {**os.environ, "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "ACTIVE")}
    runs = {
        f"1 process x {cpus} threads": ([sys.executable, *side], {**env, "OMP_NUM_THREADS": str(cpus)}),
        f"{args.processes} processes x {threads} threads": (
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(args.processes), *side],
            {**env, "OMP_NUM_THREADS": str(threads)}),
    }  # fmt: skip
    rows = {}
    for label, (cmd, run_env) in runs.items():
        found = run_results(cmd, run_env, label)
        seconds = max(r["seconds"] for r in found)
        tokens = sum(r["tokens"] for r in found)
        rows[label] = {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds,
                       "peak_gb": sum(r["peak_gb"] for r in found)}  # fmt: skip
    load = os.getloadavg()
    print(f"\nSFT tokens/s, threads or processes, {args.steps} optimiser steps per process (cpus {cpus}, load average "
          f"{load[0]:.1f} {load[1]:.1f})\n")  # fmt: skip
    print("| layout | tokens | s | tokens/s | peak GB (all processes) |")
    print("|---|---:|---:|---:|---:|")
    for label, r in rows.items():
        print(f"| {label} | {r['tokens']} | {r['seconds']:.1f} | {r['tokens_per_s']:.1f} | {r['peak_gb']:.2f} |")
    one, many = rows.values()
    print(f"\nprocesses / threads = {many['tokens_per_s'] / one['tokens_per_s']:.2f}")
    print(json.dumps({"threads_tokens_per_s": round(one["tokens_per_s"], 1),
                      "processes_tokens_per_s": round(many["tokens_per_s"], 1),
                      "processes_over_threads": round(many["tokens_per_s"] / one["tokens_per_s"], 3),
                      "threads_peak_gb": round(one["peak_gb"], 2), "processes_peak_gb": round(many["peak_gb"], 2),
                      "load_average": round(load[0], 2)}))  # fmt: skip
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=str(REPO / "train/recipes/smollm2-135m/sft.yaml"))
    ap.add_argument("--dataset", default=str(REPO / "tests/fixtures/reterm10k_mini"), help="records folder or Hub id")
    ap.add_argument("--steps", type=int, default=4, help="timed optimiser steps (after one warm-up step)")
    ap.add_argument("--compare-omp", action="store_true",
                    help="time the sft side under OMP_WAIT_POLICY=PASSIVE and ACTIVE instead of sft against bare")
    ap.add_argument("--repeats", type=int, default=2, help="with --compare-omp: PASSIVE/ACTIVE pairs, in alternation")
    ap.add_argument("--processes", type=int, default=1,
                    help="time the sft side as 1 process against N data-parallel processes (torchrun, gloo)")
    ap.add_argument("--side", choices=("sft", "bare"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.side:
        print("RESULT " + json.dumps(run_side(args.side, args.config, args.dataset, args.steps)))
        return 0
    if args.processes > 1:
        return compare_processes(args)

    def side_process(side: str, env: dict[str, str] | None = None) -> dict:
        cmd = [sys.executable, __file__, "--side", side, "--config", args.config, "--dataset", args.dataset,
               "--steps", str(args.steps)]  # fmt: skip
        return run_results(cmd, env, side)[0]

    if args.compare_omp:
        runs: dict[str, list[float]] = {"PASSIVE": [], "ACTIVE": []}
        for _ in range(args.repeats):
            for policy in runs:
                runs[policy].append(side_process("sft", {**os.environ, "OMP_WAIT_POLICY": policy})["tokens_per_s"])
        load = os.getloadavg()
        print(f"\nSFT tokens/s by OMP_WAIT_POLICY, {args.steps} optimiser steps a run, {args.repeats} runs each "
              f"(cpus {os.cpu_count()}, load average {load[0]:.1f} {load[1]:.1f})\n")  # fmt: skip
        print("| OMP_WAIT_POLICY | tokens/s (each run) | median |")
        print("|---|---|---:|")
        med = {k: sorted(v)[len(v) // 2] for k, v in runs.items()}
        for k, v in runs.items():
            print(f"| {k} | {', '.join(f'{x:.0f}' for x in v)} | {med[k]:.0f} |")
        print(f"\nACTIVE / PASSIVE = {med['ACTIVE'] / med['PASSIVE']:.2f}")
        print(json.dumps({"omp_passive_tokens_per_s": [round(x, 1) for x in runs["PASSIVE"]],
                          "omp_active_tokens_per_s": [round(x, 1) for x in runs["ACTIVE"]],
                          "active_over_passive": round(med["ACTIVE"] / med["PASSIVE"], 3),
                          "load_average": round(load[0], 2)}))  # fmt: skip
        return 0

    results = {side: side_process(side) for side in ("bare", "sft")}
    load = os.getloadavg()
    print(f"\nSFT throughput, {Path(args.config).relative_to(REPO) if Path(args.config).is_relative_to(REPO) else args.config}, "
          f"{args.steps} optimiser steps (cpus {os.cpu_count()}, load average {load[0]:.1f} {load[1]:.1f})\n")  # fmt: skip
    print("| loop | tokens | s | tokens/s | peak GB |")
    print("|---|---:|---:|---:|---:|")
    for side, r in results.items():
        print(f"| {side} | {r['tokens']} | {r['seconds']:.1f} | {r['tokens_per_s']:.1f} | {r['peak_gb']:.2f} |")
    ratio = results["sft"]["tokens_per_s"] / results["bare"]["tokens_per_s"]
    peak = results["sft"]["peak_gb"]
    ok = ratio >= 0.67 and peak <= 3
    print(f"\nsft/bare = {ratio:.2f} (target >= 0.67), SFT peak {peak:.2f} GB (target <= 3): {'PASS' if ok else 'FAIL'}")
    print(json.dumps({"sft_over_bare": round(ratio, 3), "sft_peak_gb": round(peak, 3),
                      "sft_tokens_per_s": round(results["sft"]["tokens_per_s"], 1),
                      "bare_tokens_per_s": round(results["bare"]["tokens_per_s"], 1),
                      "bare_peak_gb": round(results["bare"]["peak_gb"], 3), "load_average": round(load[0], 2)}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
