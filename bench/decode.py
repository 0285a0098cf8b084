"""Benchmark of the kit's generation path against the machine's limits: today's ``model.generate`` path and the
Llama decoding loop (:mod:`reterm.policies.llama_decode`), same prompts, one run.

Prompts: the drills evaluation's first turns (the kit's system prompt and tools, then a drill's instruction,
rendered by :meth:`TransformersPolicy.prompt_ids`), one drill of each family in turn from the drills generator
(:func:`reterm.drills.generate.make_drill`, seed 0) until ``--rows`` prompts; greedy, ``--new-tokens`` at most
(the evaluation's cap), the model in float32 unless ``--dtype``.

Measured, in this order:

1. the machine: read bandwidth (best of 5 sums of a 1 GiB float32 tensor) and float32 matrix-product peak (best
   of 5 products of 2048x2048 matrices), with torch's thread count as generation runs;
2. a decoding step at ``--rows`` rows at the prompts' width: today's (the model's forward with transformers'
   cache) and the loop's (:func:`reterm.policies.llama_decode._step`), interleaved, median of ``--steps``;
   ``--profile`` adds a torch.profiler split of the loop's step (weights: ``mm``/``addmm``; attention:
   ``bmm``/softmax; cache: copies and ``index_select``; the rest: element-wise operations and Python);
3. prefill: one forward of the rows' prompts (no cache), real prompt tokens a second;
4. whole generation through :class:`PrefixKVCache` (prefix sharing, store, early release as in the evaluation),
   today's path then the loop, ``--reps`` rounds interleaved so that the machine's load hits both alike; the
   greedy tokens of both are compared (rows differing).

Ends with one JSON line: ``decode_over_read`` (loop's step ms over the time to read the weights and the rows' KV
cache once at the measured bandwidth), ``prefill_share_of_peak`` (prefill tokens/s x FLOPs a token over the
measured peak; FLOPs a token: 2 x non-embedding parameters + 4 x layers x query width x mean context),
``speedup`` (today's whole-generation wall over the loop's, medians), the step times, the CPU flags and
``rows_differing``.

Usage: ``python bench/decode.py [--rows 32] [--new-tokens 96] [--reps 2] [--steps 5] [--profile]``
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def cpu_flags() -> list[str]:
    """The vector/matrix flags of this CPU that matter to generation (``/proc/cpuinfo``; empty elsewhere)."""
    try:
        text = open("/proc/cpuinfo").read()
    except OSError:
        return []
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    keep = ("avx", "fma", "f16c", "amx", "vnni", "bf16")
    return sorted(f for f in set(flags) if f.startswith(keep) or any(k in f for k in ("vnni", "bf16", "amx")))


def machine(torch) -> tuple[float, float]:
    """``(read GB/s, fp32 matmul GFLOP/s)``, best of 5 each."""
    x = torch.ones(1 << 28)  # 1 GiB
    best = min(_timed(lambda: x.sum()) for _ in range(5))
    bw = x.numel() * 4 / best / 1e9
    x = None  # free the 1 GiB before the matmul
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    best = min(_timed(lambda: torch.mm(a, b)) for _ in range(5))
    return bw, 2 * 2048**3 / best / 1e9


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def prompts_of(policy, rows: int) -> list[list[int]]:
    """First-turn prompts of the drills evaluation: a drill of each family in turn (seed 0)."""
    from reterm.agent.protocol import TOOLS, initial_messages
    from reterm.drills.families import FAMILIES
    from reterm.drills.generate import make_drill

    families = sorted(FAMILIES)
    instructions = [make_drill(families[i % len(families)], 0, i // len(families)).instruction for i in range(rows)]
    return [policy.prompt_ids(initial_messages(t), TOOLS) for t in instructions]


def step_times(torch, model, prompts, pad: int, steps: int, profile: bool) -> tuple[float, float, dict | None]:
    """Median ms of a decoding step at ``len(prompts)`` rows after their prefill: today's, the loop's."""
    from reterm.policies import llama_decode
    from reterm.policies.kv_cache import _reserved_cache

    B, W = len(prompts), max(len(p) for p in prompts)
    ids = torch.full((B, W), pad, dtype=torch.long)
    att = torch.zeros((B, W), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, W - len(p) :] = torch.tensor(p)
        att[i, W - len(p) :] = 1
    pos = (att.cumsum(-1) - 1).masked_fill(att == 0, 1)
    old, new = [], []
    with torch.inference_mode():
        cache = _reserved_cache(model, W + steps + 3)
        model(input_ids=ids, attention_mask=att, position_ids=pos, cache=cache, use_cache=True,
              logits_to_keep=1)  # fmt: skip
        keys, values = [layer._k for layer in cache.layers], [layer._v for layer in cache.layers]
        mask = torch.zeros((B, keys[0].shape[2]), dtype=keys[0].dtype)
        mask[:, :W].masked_fill_(att == 0, torch.finfo(keys[0].dtype).min)
        tok = torch.full((B,), 198, dtype=torch.long)
        last = pos[:, -1]
        cache2 = _reserved_cache(model, W + steps + 2)
        model(input_ids=ids, attention_mask=att, position_ids=pos, cache=cache2, use_cache=True,
              logits_to_keep=1)  # fmt: skip
        a = att
        for s in range(steps + 1):  # interleaved, so that the machine's load hits both; the first step is a warm-up
            a = torch.cat([a, torch.ones((B, 1), dtype=a.dtype)], 1)
            dt_new = _timed(lambda: llama_decode._step(model, tok, last + 1 + s, keys, values, W + s, mask))
            dt_old = _timed(lambda: model(input_ids=tok[:, None], attention_mask=a, position_ids=(last + 1 + s)[:, None],
                                          cache=cache2, use_cache=True))  # fmt: skip
            if s:
                new.append(dt_new)
                old.append(dt_old)
        split = None
        if profile:
            split = _profile(torch, lambda: llama_decode._step(model, tok, last + 1, keys, values, W, mask))
    return statistics.median(old) * 1e3, statistics.median(new) * 1e3, split


def _profile(torch, fn) -> dict:
    """ms of one call split into weights, attention, cache and the rest (torch.profiler, self CPU time)."""
    from torch.profiler import profile

    fn()
    t = time.perf_counter()
    with profile() as prof:
        fn()
    wall = (time.perf_counter() - t) * 1e3
    groups = {"weights": ("aten::mm", "aten::addmm"), "attention": ("aten::bmm", "aten::_softmax"),
              "cache": ("aten::copy_", "aten::index_select", "aten::cat")}  # fmt: skip
    out = {k: 0.0 for k in groups}
    for ev in prof.key_averages():
        for k, names in groups.items():
            if ev.key in names:
                out[k] += ev.self_cpu_time_total / 1e3
    out["elementwise_and_python"] = wall - sum(out.values())
    out["wall_with_profiler"] = wall
    return {k: round(v, 1) for k, v in out.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--rows", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=96)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--profile", action="store_true")
    args = p.parse_args()

    from reterm.generation import apply_thread_policy

    apply_thread_policy()
    import torch

    from reterm.policies import load_policy
    from reterm.policies.kv_cache import PrefixKVCache, cut_at_stop

    policy = load_policy(args.model, temperature=0.0, max_new_tokens=args.new_tokens, seed=0, dtype=args.dtype)
    model, cfg = policy.model, policy.model.config
    prompts = prompts_of(policy, args.rows)
    B, W = len(prompts), max(len(q) for q in prompts)
    _say(f"{B} prompts, {min(len(q) for q in prompts)}-{W} tokens; {torch.get_num_threads()} threads")

    bw, peak = machine(torch)
    _say(f"read {bw:.1f} GB/s, fp32 matmul {peak:.0f} GFLOP/s")

    old_ms, new_ms, split = step_times(torch, model, prompts, policy.pad_token_id, args.steps, args.profile)
    _say(f"decode step at {B} rows x {W}: today {old_ms:.0f} ms, loop {new_ms:.0f} ms; profile {split}")
    elt = next(model.parameters()).element_size()
    weight_bytes = sum(t.numel() * t.element_size() for t in model.parameters())  # tied embedding counted once
    hkv = cfg.num_key_value_heads
    d = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kv_bytes = 2 * cfg.num_hidden_layers * hkv * d * elt * B * W
    read_ms = (weight_bytes + kv_bytes) / (bw * 1e9) * 1e3

    with torch.inference_mode():
        ids = torch.full((B, W), policy.pad_token_id, dtype=torch.long)
        att = torch.zeros((B, W), dtype=torch.long)
        for i, q in enumerate(prompts):
            ids[i, W - len(q) :] = torch.tensor(q)
            att[i, W - len(q) :] = 1
        pos = (att.cumsum(-1) - 1).masked_fill(att == 0, 1)
        prefill_s = _timed(lambda: model(input_ids=ids, attention_mask=att, position_ids=pos, logits_to_keep=1))
    real = sum(len(q) for q in prompts)
    embed = model.get_input_embeddings().weight.numel()
    flops_token = 2 * (sum(t.numel() for t in model.parameters()) - embed) \
        + 4 * cfg.num_hidden_layers * cfg.num_attention_heads * d * (W / 2)  # fmt: skip
    prefill_tps = real / prefill_s
    _say(f"prefill {prefill_tps:.0f} real tokens/s ({B}x{W} padded in {prefill_s:.1f} s)")

    walls: dict[bool, list[float]] = {False: [], True: []}
    ids_of: dict[bool, list[list[int]]] = {}
    stops = set(policy.stop_token_ids)
    for rep in range(args.reps):
        for fast in (False, True):
            kv = PrefixKVCache(fast_decode=fast)
            t = time.perf_counter()
            out = kv.generate(model, prompts, max_new_tokens=args.new_tokens, stop_token_ids=policy.stop_token_ids,
                              pad_token_id=policy.pad_token_id, generation_kwargs={"do_sample": False})  # fmt: skip
            walls[fast].append(time.perf_counter() - t)
            ids_of[fast] = [cut_at_stop(r, stops)[0] for r in out.new_ids.tolist()]
            _say(f"  round {rep + 1}/{args.reps} {'loop ' if fast else 'today'}: {walls[fast][-1]:.1f} s")
    differ = sum(a != b for a, b in zip(ids_of[False], ids_of[True]))
    med = {k: statistics.median(v) for k, v in walls.items()}
    lengths = [len(r) for r in ids_of[True]]
    print(json.dumps({
        "decode_over_read": round(new_ms / read_ms, 2),
        "prefill_share_of_peak": round(prefill_tps * flops_token / (peak * 1e9), 3),
        "speedup": round(med[False] / med[True], 2),
        "step_ms_today": round(old_ms, 1), "step_ms_loop": round(new_ms, 1), "read_ms": round(read_ms, 1),
        "read_gb_s": round(bw, 1), "matmul_gflop_s": round(peak, 1), "prefill_tokens_s": round(prefill_tps, 1),
        "wall_s_today": [round(w, 1) for w in walls[False]], "wall_s_loop": [round(w, 1) for w in walls[True]],
        "rows": B, "width": W, "new_tokens": args.new_tokens, "reply_tokens_mean": round(sum(lengths) / B, 1),
        "reply_tokens_max": max(lengths), "rows_differing": differ, "dtype": str(policy.dtype),
        "threads": torch.get_num_threads(), "cpu_flags": cpu_flags(), "profile_ms": split,
    }))  # fmt: skip


if __name__ == "__main__":
    main()
