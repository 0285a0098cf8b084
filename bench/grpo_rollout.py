"""Benchmark of ReTerm-GRPO rollouts: one group of G attempts from one failure state, G=1 vs G=8.

Every attempt runs ``--turns`` commands that each take ``--command-s`` seconds (``sleep``), then submits;
replies are scripted (:func:`reterm.training.grpo_policy.scripted_generate_fn`), so the figures measure
the rollout machinery itself: forking the failure state's snapshot, a terminal session per fork, the
lock-step turns with the commands of all attempts running concurrently, the verifier, tear-down.
TRL's own tool loop runs rollouts one after another (4 rollouts with a 0.5 s tool add 2 s a step): G
sequential attempts would cost G times one. Target: G=8 under 1.5x G=1.

The failure state is the first record of ``tests/fixtures/grpo_seed`` (hello-file: a write to a
mistyped path). Its environment is rebuilt and snapshotted once (warm-up), as in training, where the
snapshot cache keeps it; then each size runs ``--repeats`` times. Prints a markdown table (median
seconds, and the parts of a rollout), the ratio and PASS/FAIL. The machine's load average is printed
too: other processes change the figures.

Usage (root, as the local sandbox needs): ``python bench/grpo_rollout.py [--g 8] [--turns 3]
[--command-s 0.5] [--repeats 3]``
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--g", type=int, default=8, help="the large group size (compared with G=1)")
    ap.add_argument("--turns", type=int, default=3, help="commands per attempt before it submits")
    ap.add_argument("--command-s", type=float, default=0.5, help="seconds each command takes")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)

    from datasets import load_dataset
    from transformers import AutoTokenizer

    from reterm.policies.scripted import assistant_turns, bash_call, submit_call
    from reterm.training.failure_pool import SnapshotCache, seed_states_from_records
    from reterm.training.grpo_policy import TokenTrajectoryPolicy, scripted_generate_fn
    from reterm.training.grpo_rollout import RolloutEngine, RolloutSettings
    from reterm.training.models import resolve_model_name_or_path

    record = load_dataset(str(REPO / "tests/fixtures/grpo_seed"), split="train")[0]
    (state,), _ = seed_states_from_records([record], ["tasks", str(REPO / "tests/fixtures/tasks")])
    prefix_turns = len(state.history)
    tok = AutoTokenizer.from_pretrained(resolve_model_name_or_path("smollm2"))

    def reply(chain_id: int, messages: list[dict]) -> str:
        k = assistant_turns(messages) - prefix_turns
        return bash_call(f"sleep {args.command_s}") if k < args.turns else submit_call()

    policy = TokenTrajectoryPolicy(tok, scripted_generate_fn(tok, reply), max_turn_tokens=64, max_completion_tokens=4096)
    cache = SnapshotCache(4)
    engine = RolloutEngine(RolloutSettings(max_turns=args.turns + 1), cache=cache)

    def run(g: int) -> tuple[float, dict]:
        t0 = time.perf_counter()
        (group,) = asyncio.run(engine.run(policy, [(state, g, 0)]))
        wall = time.perf_counter() - t0
        if group.dropped or len(group.attempts) != g:
            raise SystemExit(f"G={g}: the group failed: {group.dropped}")
        timing = [a.trajectory.metadata["timing"] for a in group.attempts]
        parts = {
            "fork_s": group.fork_s,
            "session_start_s": max(t["session_start_s"] for t in timing),
            "turns_s": max(t["loop_s"] for t in timing),
            "verify_s": max(t.get("verify_s", 0.0) for t in timing),
        }
        return wall, parts

    try:
        t0 = time.perf_counter()
        run(1)  # warm-up: rebuilds the state (replay) and caches its snapshot, as the first use in training
        print(f"warm-up (replay the prefix, snapshot, one attempt): {time.perf_counter() - t0:.2f} s", file=sys.stderr)
        results = {}
        for g in (1, args.g):
            runs = [run(g) for _ in range(args.repeats)]
            walls = [w for w, _ in runs]
            med = sorted(runs, key=lambda r: r[0])[len(runs) // 2][1]
            results[g] = (statistics.median(walls), min(walls), med)
    finally:
        cache.close()

    load = os.getloadavg()
    print(f"\nReTerm-GRPO rollout: {args.turns} commands of {args.command_s:g} s per attempt, then submit "
          f"(cpus {os.cpu_count()}, load average {load[0]:.1f} {load[1]:.1f})\n")  # fmt: skip
    print("| G | step s (median) | min s | fork s | session start s | turns s | verifier s |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for g, (med, low, parts) in results.items():
        print(f"| {g} | {med:.2f} | {low:.2f} | {parts['fork_s']:.2f} | {parts['session_start_s']:.2f} | "
              f"{parts['turns_s']:.2f} | {parts['verify_s']:.2f} |")  # fmt: skip
    ratio = results[args.g][0] / results[1][0]
    sequential = args.g * results[1][0]
    verdict = "PASS" if ratio < 1.5 else "FAIL"
    print(f"\nG={args.g} / G=1 = {ratio:.2f}x (target < 1.5x; attempts one after another: ~{sequential:.1f} s = "
          f"{args.g:.0f}x): {verdict}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
