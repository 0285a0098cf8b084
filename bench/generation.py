"""Benchmark of the kit's local generation: KV-cache reuse across turns, and a GRPO group batched.

Two measurements, one run (ratios in one run, so that the machine's load cancels):

1. **Turns of one episode** through :class:`reterm.policies.transformers_policy.TransformersPolicy` (what
   ``reterm run``, evaluation, ``reterm serve`` and the Space use): the kit's system prompt and tools, then
   ``--turns`` turns, each the model's greedy reply (at most ``--new-tokens`` tokens) followed by a terminal
   observation of a few lines. Run ``--episodes`` times each way, interleaved, re-reading every prompt
   (``kv_cache=False``) and with reuse; the generated tokens must be identical; per turn the median seconds. Prints each turn's
   latency, prompt tokens, tokens read from the cache and tokens/s; ``turn6_speedup`` is turn 6's latency
   without reuse over with reuse.
2. **A rollout step** as GRPO runs it (token ids extended turn after turn, no re-rendering): G attempts from
   one failure-state prompt, ``--step-turns`` turns, batched, with reuse; each attempt gets its own
   observations. ``g8_over_g1`` is the step's wall time for G=``--g`` over G=1 (attempt 0 does the same work
   in both).

Wall time and this process's CPU time are both measured: on a machine shared with other jobs the CPU time
is the steadier of the two. Ends with one JSON line: ``turn6_speedup``, ``g8_over_g1`` (wall time; ``_cpu``
variants on CPU time), per-turn latencies and tokens/s. Targets: turn 6
at least 3x faster with reuse; G=8 at most 1.5x G=1.

Usage: ``python bench/generation.py [--model smollm2] [--turns 6] [--new-tokens 32] [--g 8] [--step-turns 3]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

OBSERVATIONS = [
    "Traceback (most recent call last):\n  File \"/app/main.py\", line 3, in <module>\n    import yaml\n"
    "ModuleNotFoundError: No module named 'yaml'\n[exit status: 1]",
    "total 12\ndrwxr-xr-x 2 root root 4096 Dec  1 10:00 .\ndrwxr-xr-x 1 root root 4096 Dec  1 10:00 ..\n"
    "-rw-r--r-- 1 root root   42 Dec  1 10:00 config.ini\n[exit status: 0]",
    "bash: pytest: command not found\n[exit status: 127]",
    "make: *** [Makefile:12: build] Error 1\ngcc: error: src/util.c: No such file or directory\n[exit status: 2]",
    "sed: can't read config.yaml: No such file or directory\n[exit status: 2]",
    "Collecting requests\n  ERROR: Could not find a version that satisfies the requirement requests\n[exit status: 1]",
]


def _obs(turn: int, row: int) -> str:
    return OBSERVATIONS[(turn + row) % len(OBSERVATIONS)] + ("" if row == 0 else f"\n(attempt {row})")


def episode(policy, turns: int) -> list[dict]:
    """One conversation, ``turns`` greedy turns; per turn: seconds, prompt tokens, cached tokens, ids."""
    from reterm.agent.protocol import TOOLS, initial_messages

    messages = initial_messages("The script /app/main.py fails. Make `python3 /app/main.py` print OK.")
    out = []
    for turn in range(turns):
        t0, c0 = time.perf_counter(), time.process_time()
        (g,) = policy.generate([messages], TOOLS)
        dt, cpu = time.perf_counter() - t0, time.process_time() - c0
        out.append({"s": dt, "cpu": cpu, "prompt": g.prompt_tokens, "cached": g.extra.get("cached_prompt_tokens", 0),
                    "new": g.completion_tokens, "ids": g.token_ids})  # fmt: skip
        messages = messages + [{"role": "assistant", "content": g.text},
                               {"role": "user", "content": _obs(turn, 0)}]  # fmt: skip
    return out


def rollout_step(policy, g: int, turns: int, new_tokens: int) -> tuple[float, int, float]:
    """G attempts from one prompt, ``turns`` turns, token-level as GRPO; returns (seconds, generated tokens,
    CPU seconds of this process)."""
    from reterm.agent.protocol import TOOLS, initial_messages

    tok, kv = policy.tokenizer, policy.kv_cache
    kv.clear()
    prompt = policy.prompt_ids(initial_messages("The script /app/main.py fails. Make `python3 /app/main.py` print OK."), TOOLS)
    ids = [list(prompt) for _ in range(g)]
    generated = 0
    t0, c0 = time.perf_counter(), time.process_time()
    for turn in range(turns):
        kv.advance()
        res = kv.generate(policy.model, ids, max_new_tokens=new_tokens, stop_token_ids=policy.stop_token_ids,
                          pad_token_id=policy.pad_token_id, generation_kwargs={"do_sample": False, "temperature": None,
                                                                               "top_p": None})  # fmt: skip
        stops = set(policy.stop_token_ids)
        for row, seq in enumerate(res.new_ids.tolist()):
            end = next((k for k, t in enumerate(seq) if t in stops), None)
            kept = seq if end is None else seq[: end + 1]
            generated += len(kept)
            obs = tok.apply_chat_template([{"role": "user", "content": _obs(turn, row)}], add_generation_prompt=True,
                                          tokenize=True, return_dict=False)  # fmt: skip
            tail = [] if kept[-1] in stops else [policy.stop_token_ids[0]]
            ids[row] = ids[row] + kept + tail + tok.encode("\n") + list(obs)
    return time.perf_counter() - t0, generated, time.process_time() - c0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--new-tokens", type=int, default=32, help="tokens generated per turn at most")
    ap.add_argument("--g", type=int, default=8)
    ap.add_argument("--step-turns", type=int, default=3)
    ap.add_argument("--episodes", type=int, default=3, help="episodes each way (median seconds per turn)")
    ap.add_argument("--repeats", type=int, default=2, help="rollout steps per group size (median)")
    args = ap.parse_args(argv)

    from reterm.policies.transformers_policy import TransformersPolicy

    policy = TransformersPolicy(args.model, temperature=0, max_new_tokens=args.new_tokens)
    policy.generate([[{"role": "user", "content": "hi"}]], [])  # warm-up
    reps: dict[bool, list[list[dict]]] = {False: [], True: []}
    for _ in range(args.episodes):  # interleaved, so that a change of the machine's load hits both
        for reuse in (False, True):
            policy.kv_cache.enabled = reuse
            policy.kv_cache.clear()
            reps[reuse].append(episode(policy, args.turns))
    identical = all([a["ids"] for a in r] == [b["ids"] for b in reps[False][0]] for r in reps[False] + reps[True])
    runs = {reuse: [dict(r[0][t], s=statistics.median(x[t]["s"] for x in r), cpu=statistics.median(x[t]["cpu"] for x in r))
                    for t in range(args.turns)]
            for reuse, r in reps.items()}  # per turn: the median seconds over the episodes

    load = os.getloadavg()
    print(f"\nGeneration, {args.model}, greedy, at most {args.new_tokens} new tokens a turn (cpus {os.cpu_count()}, "
          f"load average {load[0]:.1f} {load[1]:.1f})\n")  # fmt: skip
    print("| turn | prompt tokens | cached | new tokens | s, re-read | s, reuse | tokens/s re-read | tokens/s reuse | "
          "speed-up | CPU s re-read | CPU s reuse | CPU speed-up |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for t in range(args.turns):
        a, b = runs[False][t], runs[True][t]
        print(f"| {t + 1} | {a['prompt']} | {b['cached']} | {a['new']} | {a['s']:.2f} | {b['s']:.2f} | "
              f"{a['new'] / a['s']:.1f} | {b['new'] / b['s']:.1f} | {a['s'] / b['s']:.2f}x | {a['cpu']:.2f} | "
              f"{b['cpu']:.2f} | {a['cpu'] / b['cpu']:.2f}x |")  # fmt: skip
    last = args.turns - 1
    turn_speedup = runs[False][last]["s"] / runs[True][last]["s"]
    turn_speedup_cpu = runs[False][last]["cpu"] / runs[True][last]["cpu"]
    print(f"\ngreedy tokens identical with and without reuse: {identical}")
    print(f"turn {args.turns}: {turn_speedup:.2f}x faster with reuse (CPU time {turn_speedup_cpu:.2f}x; target >= 3): "
          f"{'PASS' if turn_speedup >= 3 and identical else 'FAIL'}")  # fmt: skip

    policy.kv_cache.enabled = True
    steps = {}
    for g in (1, args.g):
        res = [rollout_step(policy, g, args.step_turns, args.new_tokens) for _ in range(args.repeats)]
        steps[g] = (statistics.median(r[0] for r in res), statistics.median(r[1] for r in res),
                    statistics.median(r[2] for r in res))
    ratio = steps[args.g][0] / steps[1][0]
    ratio_cpu = steps[args.g][2] / steps[1][2]
    print(f"\nRollout step: G attempts, {args.step_turns} turns each from one failure-state prompt, with reuse, batched")
    print("| G | step s (median) | generated tokens | tokens/s | CPU s |")
    print("|---:|---:|---:|---:|---:|")
    for g, (s, n, c) in steps.items():
        print(f"| {g} | {s:.2f} | {n:.0f} | {n / s:.1f} | {c:.2f} |")
    print(f"\nG={args.g} / G=1 = {ratio:.2f}x (CPU time {ratio_cpu:.2f}x; target <= 1.5): {'PASS' if ratio <= 1.5 else 'FAIL'}")
    print(json.dumps({
        "turn6_speedup": round(turn_speedup, 3), "g8_over_g1": round(ratio, 3), "identical": identical,
        "turn6_speedup_cpu": round(turn_speedup_cpu, 3), "g8_over_g1_cpu": round(ratio_cpu, 3),
        "turn_s_reread": {t + 1: round(runs[False][t]["s"], 3) for t in (0, 2, 5) if t < args.turns},
        "turn_s_reuse": {t + 1: round(runs[True][t]["s"], 3) for t in (0, 2, 5) if t < args.turns},
        "tokens_per_s_reread": round(sum(x["new"] for x in runs[False]) / sum(x["s"] for x in runs[False]), 2),
        "tokens_per_s_reuse": round(sum(x["new"] for x in runs[True]) / sum(x["s"] for x in runs[True]), 2),
        "step_s": {str(g): round(s, 3) for g, (s, _, _) in steps.items()}, "model": args.model,
        "new_tokens": args.new_tokens, "load_average": round(load[0], 2),
    }))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
