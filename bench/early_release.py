"""Benchmark of early release in batched generation (:meth:`reterm.policies.kv_cache.PrefixKVCache.generate`).

``model.generate`` computes every row of a batch until its last row ends; with early release, once at most half
of a call's rows are still generating, the finished ones leave and the others go on in a smaller call (their
key/value states from the store). What it saves depends on how unequal the replies are: an agent's tool calls
(20-60 tokens) next to one reply that runs to the turn's cap is the case it is for.

One process, one model, the same ``--batch`` first-turn prompts (the kit's system prompt and tools, then a task
instruction: the drills' when ``--tasks`` names a drills folder, else a fixed list), greedy, ``--new-tokens`` at
most; ``--reps`` rounds, each generating the batch with release off then on (interleaved, so that the machine's
load affects both sides alike). Checks that both sides generated the same tokens (exact in float32; in bf16 a
near-tie can flip where the batch's shape differs, reported as ``rows_differing``). Prints per side the median
wall and CPU seconds, then one JSON line: ``speedup_wall``, ``speedup_cpu`` (off / on), ``released_rows`` per
call, the replies' mean and longest length.

Usage: ``python bench/early_release.py [--model smollm2|hf:PATH] [--tasks RUN/drills] [--batch 32] [--reps 3]``
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ASKS = ["List the files in /app.", "Fix the permissions of /app/run.sh so that it runs.", "Run the tests in /app.",
        "Install the wheel in /app/dist.", "Count the words in /app/notes.txt and write the number to /app/count.txt.",
        "Remove the stale lock /app/app.lock and start the service.", "Create /app/out with the word hello.",
        "Set GIT identity and commit the change in /app/repo."]  # fmt: skip


def _instructions(tasks: Path | None, n: int) -> list[str]:
    if tasks is None:
        return [f"{ASKS[i % len(ASKS)]} (case {i})" for i in range(n)]
    found = sorted(p.read_text() for p in tasks.glob("*/instruction.md"))
    if not found:
        raise SystemExit(f"bench/early_release.py: --tasks {tasks}: no */instruction.md (a drills folder?)")
    return [found[(i * 7) % len(found)] for i in range(n)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2", help="smollm2 or hf:PATH (e.g. an SFT checkpoint's merged/)")
    p.add_argument("--tasks", type=Path, default=None, help="a drills folder: its instructions as prompts")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=96)
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args()

    from reterm.generation import apply_thread_policy

    apply_thread_policy()
    from reterm.agent.protocol import TOOLS, initial_messages
    from reterm.policies import load_policy
    from reterm.policies.kv_cache import PrefixKVCache

    policy = load_policy(args.model, temperature=0.0, max_new_tokens=args.new_tokens, seed=0)
    prompts = [policy.prompt_ids(initial_messages(t), TOOLS) for t in _instructions(args.tasks, args.batch)]
    stops = set(policy.stop_token_ids)
    times: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    ids: dict[bool, list[list[int]]] = {}
    released = []
    for rep in range(args.reps):
        for release in (False, True):
            kv = PrefixKVCache(early_release=release, fast_decode=False)  # model.generate's path
            t, c = time.perf_counter(), time.process_time()
            out = kv.generate(policy.model, prompts, max_new_tokens=args.new_tokens,
                              stop_token_ids=policy.stop_token_ids, pad_token_id=policy.pad_token_id,
                              generation_kwargs={"do_sample": False})  # fmt: skip
            times[release].append((time.perf_counter() - t, time.process_time() - c))
            ids[release] = out.new_ids.tolist()
            if release:
                released.append(kv.released_rows)
            print(f"  round {rep + 1}/{args.reps}, release {'on' if release else 'off'}: "
                  f"{times[release][-1][0]:.1f} s wall, {times[release][-1][1]:.1f} s CPU, rows released "
                  f"{kv.released_rows}", file=sys.stderr, flush=True)  # fmt: skip
    lengths = [next((k + 1 for k, t in enumerate(r) if t in stops), len(r)) for r in ids[False]]
    differ = sum(a[: n] != b[: n] for a, b, n in zip(ids[False], ids[True], lengths))
    med = {r: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v)) for r, v in times.items()}
    for r in (False, True):
        print(f"release {'on ' if r else 'off'}: median {med[r][0]:.1f} s wall, {med[r][1]:.1f} s CPU")
    print(json.dumps({"model": args.model, "dtype": str(policy.dtype), "batch": args.batch,
                      "new_tokens": args.new_tokens, "reps": args.reps,
                      "speedup_wall": round(med[False][0] / med[True][0], 2),
                      "speedup_cpu": round(med[False][1] / med[True][1], 2),
                      "released_rows": released, "reply_tokens_mean": round(sum(lengths) / len(lengths), 1),
                      "reply_tokens_max": max(lengths), "rows_differing": differ}))  # fmt: skip


if __name__ == "__main__":
    main()
