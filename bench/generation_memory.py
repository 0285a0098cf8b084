"""Benchmark of resident memory across batched CPU generation calls, with and without handing freed heap memory
back to the operating system after each call (:func:`reterm.policies.kv_cache.release_freed_memory`).

The agent harness generates from a worker thread (``asyncio.to_thread``), a new event loop per chunk of attempts,
with a batch whose prompt width changes every call. glibc keeps what such calls free in its per-thread arenas;
with the shapes changing it fragments, and a long run (the mechanism stage, the evaluation) grows until the
machine kills it. Each side runs in its own process: ``--calls`` calls of ``PrefixKVCache.generate`` (the
harness's generation path, reuse off) on ``--batch`` random prompts of a random width in [300, 1200] tokens, from
a worker thread of a new event loop each, with the release on (the kit) or off.

Prints resident memory (GB) after every call and the wall time of each side, then one JSON line
(``rss_gb_off``, ``rss_gb_on``: last call; ``time_s_off``, ``time_s_on``).

Usage: ``python bench/generation_memory.py [--model smollm2] [--calls 12] [--batch 32] [--new-tokens 8]``
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _rss_gb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1e6
    return float("nan")


def side(args: argparse.Namespace) -> None:
    """One process: load the model as the kit does, then the calls; prints one JSON line."""
    import asyncio
    import random

    from reterm.generation import apply_thread_policy

    apply_thread_policy()
    from reterm.policies import kv_cache, load_policy

    policy = load_policy(args.model, kv_cache=False)
    if args.release == "off":
        kv_cache.release_freed_memory = lambda: False  # the generate wrapper looks it up at call time
    rng = random.Random(0)
    rows = []
    t0 = time.monotonic()
    for i in range(args.calls):
        width = rng.randint(300, 1200)
        prompts = [[rng.randint(100, 40000) for _ in range(width)] for _ in range(args.batch)]

        def call() -> None:
            policy.kv_cache.generate(policy.model, prompts, max_new_tokens=args.new_tokens,
                                     stop_token_ids=policy.stop_token_ids, pad_token_id=policy.pad_token_id,
                                     generation_kwargs={"do_sample": False})  # fmt: skip

        asyncio.run(asyncio.to_thread(call))
        rows.append(round(_rss_gb(), 2))
        print(f"  release {args.release}: call {i + 1}/{args.calls}, width {width}: {rows[-1]} GB", file=sys.stderr,
              flush=True)  # fmt: skip
    print(json.dumps({"rss_gb": rows, "time_s": round(time.monotonic() - t0, 1), "dtype": str(policy.dtype)}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--calls", type=int, default=12)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=8)
    p.add_argument("--release", choices=["on", "off"], default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.release:
        side(args)
        return
    out = {}
    for release in ("off", "on"):
        cmd = [sys.executable, __file__, "--model", args.model, "--calls", str(args.calls), "--batch", str(args.batch),
               "--new-tokens", str(args.new_tokens), "--release", release]  # fmt: skip
        proc = subprocess.run(cmd, cwd=REPO, stdout=subprocess.PIPE, text=True, check=True)
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        print(f"release {release}: resident GB after each call {r['rss_gb']}; {r['time_s']} s ({r['dtype']})")
        out[f"rss_gb_{release}"], out[f"time_s_{release}"] = r["rss_gb"][-1], r["time_s"]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
