"""Benchmark of GRPO's rollout generation: the LoRA policy under bf16 autocast vs its merged copy.

A CPU GRPO step is mostly rollouts and a rollout mostly decode steps. Without ``merged_generation`` the trainer
generates from the LoRA-wrapped model under autocast (every base weight re-cast to bf16 at every call, the
LoRA matrices run beside it); with it, from :class:`reterm.training.generation_copy.MergedGenerationCopy`, a
plain copy with the LoRA update merged in, in bf16. Both run the same rollout step as ``bench/generation.py``:
G attempts from one failure-state prompt, ``--step-turns`` turns, batched, with key/value reuse across turns,
greedy, interleaved ``--repeats`` times. The LoRA adapter (r16, all-linear, as the CPU recipes) gets random B
matrices, so that it changes the outputs as a trained one does.

Prints a markdown table (median step seconds, generated tokens, tokens/s, CPU seconds), the speed-up, and
one JSON line. Target: the merged copy at least 2x faster (tokens/s). Wall and CPU time are both printed; on a
machine shared with other jobs CPU time is the steadier. The generated tokens of the two sides can differ
(bf16 rounding of merged vs separate weights), so tokens/s is the figure to compare.

Usage: ``python bench/grpo_generation.py [--model smollm2] [--g 8] [--step-turns 3] [--new-tokens 48]``
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from generation import rollout_step  # noqa: E402  (the same rollout step as bench/generation.py)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--g", type=int, default=8)
    ap.add_argument("--step-turns", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=48, help="tokens generated per turn at most")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)

    import torch
    from peft import LoraConfig, get_peft_model

    from reterm.policies.transformers_policy import TransformersPolicy
    from reterm.training.generation_copy import MergedGenerationCopy

    policy = TransformersPolicy(args.model, temperature=0, max_new_tokens=args.new_tokens, dtype="float32")
    lora = get_peft_model(policy.model, LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", lora_dropout=0.0))
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.02)
    copy = MergedGenerationCopy(lora, torch.bfloat16)
    sides = {"LoRA model, bf16 autocast": (lora, lambda: torch.autocast("cpu", dtype=torch.bfloat16)),
             "merged bf16 copy": (copy.model, contextlib.nullcontext)}  # fmt: skip
    res: dict[str, list[tuple[float, int, float]]] = {k: [] for k in sides}
    for rep in range(args.repeats + 1):  # the first round warms up and is not counted
        for name, (model, precision) in sides.items():
            policy.model = model
            with torch.no_grad(), precision():
                r = rollout_step(policy, args.g, args.step_turns, args.new_tokens)
            if rep:
                res[name].append(r)
    med = {k: tuple(statistics.median(x[i] for x in v) for i in range(3)) for k, v in res.items()}
    load = os.getloadavg()
    print(f"\nGRPO rollout step, {args.model} + LoRA r16: G={args.g}, {args.step_turns} turns, at most "
          f"{args.new_tokens} new tokens a turn, greedy (cpus {os.cpu_count()}, load average {load[0]:.1f})\n")  # fmt: skip
    print("| generation from | step s (median) | generated tokens | tokens/s | CPU s | CPU s per token |")
    print("|---|---:|---:|---:|---:|---:|")
    for k, (s, n, c) in med.items():
        print(f"| {k} | {s:.2f} | {n:.0f} | {n / s:.1f} | {c:.2f} | {c / n:.3f} |")
    (s0, n0, c0), (s1, n1, c1) = med.values()
    speedup, speedup_cpu = (n1 / s1) / (n0 / s0), (c0 / n0) / (c1 / n1)
    print(f"\nmerged copy: {speedup:.2f}x tokens/s (CPU time per token {speedup_cpu:.2f}x; target >= 2): "
          f"{'PASS' if speedup >= 2 else 'FAIL'}")  # fmt: skip
    print(json.dumps({"speedup": round(speedup, 3), "speedup_cpu": round(speedup_cpu, 3),
                      "tokens_per_s": {k: round(n / s, 2) for k, (s, n, _) in med.items()},
                      "model": args.model, "g": args.g, "load_average": round(load[0], 2)}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
