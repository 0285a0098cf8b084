"""Benchmark of the kit's generation path against the machine's limits: today's ``model.generate`` path and the
Llama decoding loop (:mod:`reterm.policies.llama_decode`), same prompts, one run.

Prompts: the drills evaluation's first turns (the kit's system prompt and tools, then a drill's instruction,
rendered by :meth:`TransformersPolicy.prompt_ids`), one drill of each family in turn from the drills generator
(:func:`reterm.drills.generate.make_drill`, seed 0) until ``--rows`` prompts; greedy, ``--new-tokens`` at most
(the evaluation's cap), the model in float32 unless ``--dtype``.

Measured, in this order:

1. the machine: read bandwidth (best of 5 sums of a 1 GiB float32 tensor) and the model dtype's matrix-product peak (best
   of 5 products of 2048x2048 matrices), with torch's thread count as generation runs;
2. a decoding step at ``--rows`` rows at the prompts' width: today's (the model's forward with transformers'
   cache) and the loop's (:func:`reterm.policies.llama_decode._step`), interleaved, median of ``--steps``;
   ``--profile`` adds a torch.profiler split of the loop's step (weights: ``mm``/``addmm``/oneDNN's packed
   linear; attention: ``bmm``/``baddbmm``/softmax; cache: copies and ``index_select``; the rest: element-wise operations and Python);
3. prefill: one forward of the rows' prompts (no cache), real prompt tokens a second;
4. whole generation through :class:`PrefixKVCache` (prefix sharing, store, early release as in the evaluation),
   today's path then the loop, ``--reps`` rounds interleaved so that the machine's load hits both alike; the
   greedy tokens of both are compared (rows differing).

``--int8`` adds a third path, the loop with int8 copies of the linear layers (:mod:`reterm.policies.int8_weights`),
in steps 2 and 4 (interleaved with the others), and the rows whose greedy tokens differ from today's path.

``--processes N`` (N >= 2) adds the kit's process split (:mod:`reterm.workers`, the data, mechanism and mine
stages' ``RETERM_GEN_WORKERS``): N processes of cpus/N threads each generate the same ``--rows`` prompts through
today's path, started together (each loads the model, then waits for the others); ``speedup_processes`` is N times
this process's median wall for those rows over the wall of the N processes (rows a second, against one process
of all the threads), with ``wall_s_processes`` and ``rows_differing_processes`` (rows whose greedy tokens differ
from this process's: one thread's sums may round differently).

Ends with one JSON line: ``decode_over_read`` (loop's step ms over the time to read the weights and the rows' KV
cache once at the measured bandwidth; the rows' ``width`` columns, though the loop reads its whole reserved
storage, ``width + new_tokens`` columns), ``decode_floor_over_read`` (the step's arithmetic at the measured matmul
peak over that same read time: the least ``decode_over_read`` the model dtype's arithmetic allows on this machine), ``prefill_share_of_peak`` (prefill tokens/s x FLOPs a token over the
measured peak; FLOPs a token: 2 x non-embedding parameters + 4 x layers x query width x mean context),
``speedup`` (today's whole-generation wall over the loop's, medians), the step times, the CPU flags and
``rows_differing``; with ``--int8`` also ``speedup_int8``, ``step_ms_int8``, ``decode_over_read_int8`` (against
the int8 weights' read time) and ``rows_differing_int8``.

Usage: ``python bench/decode.py [--rows 32] [--new-tokens 96] [--reps 2] [--steps 5] [--profile] [--int8]
[--processes 2]``
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


def machine(torch, dtype=None) -> tuple[float, float]:
    """``(read GB/s, matmul GFLOP/s)``, best of 5 each; the matmul in ``dtype`` (float32 by default): the
    model's own, since a CPU with bf16 instructions multiplies bf16 several times faster."""
    x = torch.ones(1 << 28)  # 1 GiB
    best = min(_timed(lambda: x.sum()) for _ in range(5))
    bw = x.numel() * 4 / best / 1e9
    x = None  # free the 1 GiB before the matmul
    a, b = torch.randn(2048, 2048, dtype=dtype), torch.randn(2048, 2048, dtype=dtype)
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


def step_times(torch, model, prompts, pad: int, steps: int, profile: bool, int8: bool = False,
               new_tokens: int = 96) -> tuple[float, float, float | None, dict | None]:  # fmt: skip
    """Median ms of a decoding step at ``len(prompts)`` rows after their prefill: today's, the loop's, the loop's
    with int8 weights (``None`` without ``int8``); and the profile split. The loop's cache is reserved for
    ``new_tokens`` as generation reserves it (its attention reads the whole storage)."""
    from reterm.policies import llama_decode
    from reterm.policies.kv_cache import _reserved_cache

    B, W = len(prompts), max(len(p) for p in prompts)
    ids = torch.full((B, W), pad, dtype=torch.long)
    att = torch.zeros((B, W), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, W - len(p) :] = torch.tensor(p)
        att[i, W - len(p) :] = 1
    pos = (att.cumsum(-1) - 1).masked_fill(att == 0, 1)
    old, new, new8 = [], [], []
    from reterm.policies import packed_weights

    w8 = None
    pk = packed_weights.for_model(model) if packed_weights.usable(model) else None  # as generation multiplies
    if int8:
        from reterm.policies import int8_weights

        w8 = int8_weights.for_model(model)
    with torch.inference_mode():
        cache = _reserved_cache(model, W + max(steps + 3, new_tokens))
        model(input_ids=ids, attention_mask=att, position_ids=pos, cache=cache, use_cache=True,
              logits_to_keep=1)  # fmt: skip
        keys, values = [layer._k for layer in cache.layers], [layer._v for layer in cache.layers]
        mask = llama_decode.decode_mask(keys, values, att)
        tok = torch.full((B,), 198, dtype=torch.long)
        last = pos[:, -1]
        cache2 = _reserved_cache(model, W + steps + 2)
        model(input_ids=ids, attention_mask=att, position_ids=pos, cache=cache2, use_cache=True,
              logits_to_keep=1)  # fmt: skip
        a = att
        for s in range(steps + 1):  # interleaved, so that the machine's load hits both; the first step is a warm-up
            a = torch.cat([a, torch.ones((B, 1), dtype=a.dtype)], 1)
            dt_new = _timed(lambda: llama_decode._step(model, tok, last + 1 + s, keys, values, W + s, mask, pk))
            dt_old = _timed(lambda: model(input_ids=tok[:, None], attention_mask=a, position_ids=(last + 1 + s)[:, None],
                                          cache=cache2, use_cache=True))  # fmt: skip
            dt_8 = _timed(lambda: llama_decode._step(model, tok, last + 1 + s, keys, values, W + s, mask, w8)) \
                if w8 is not None else None  # fmt: skip
            if s:
                new.append(dt_new)
                old.append(dt_old)
                if dt_8 is not None:
                    new8.append(dt_8)
        split = None
        if profile:
            split = _profile(torch, lambda: llama_decode._step(model, tok, last + 1, keys, values, W, mask, pk))
    return (statistics.median(old) * 1e3, statistics.median(new) * 1e3,
            statistics.median(new8) * 1e3 if new8 else None, split)  # fmt: skip


def _profile(torch, fn) -> dict:
    """ms of one call split into weights, attention, cache and the rest (torch.profiler, self CPU time)."""
    from torch.profiler import profile

    fn()
    t = time.perf_counter()
    with profile() as prof:
        fn()
    wall = (time.perf_counter() - t) * 1e3
    groups = {"weights": ("aten::mm", "aten::addmm", "mkldnn::_linear_pointwise"), "attention": ("aten::bmm", "aten::baddbmm", "aten::_softmax"),
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
    p.add_argument("--int8", action="store_true", help="also the loop with int8 weights (reterm.policies.int8_weights)")
    p.add_argument("--processes", type=int, default=0, metavar="N",
                   help="also N processes of cpus/N threads generating the rows side by side (reterm.workers)")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)  # a --processes process: its start file
    args = p.parse_args()
    if args.processes == 1 or args.processes < 0:
        p.error(f"--processes {args.processes}: expected 2 or more (or 0: none)")
    if args.child:
        return child(args)

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

    bw, peak = machine(torch, policy.dtype)
    _say(f"read {bw:.1f} GB/s, {policy.dtype} matmul {peak:.0f} GFLOP/s")

    old_ms, new_ms, int8_ms, split = step_times(torch, model, prompts, policy.pad_token_id, args.steps, args.profile,
                                                args.int8, args.new_tokens)  # fmt: skip
    _say(f"decode step at {B} rows x {W}: today {old_ms:.0f} ms, loop {new_ms:.0f} ms"
         + (f", loop int8 {int8_ms:.0f} ms" if int8_ms else "") + f"; profile {split}")  # fmt: skip
    elt = next(model.parameters()).element_size()
    weight_bytes = sum(t.numel() * t.element_size() for t in model.parameters())  # tied embedding counted once
    hkv = cfg.num_key_value_heads
    d = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kv_bytes = 2 * cfg.num_hidden_layers * hkv * d * elt * B * W
    read_ms = (weight_bytes + kv_bytes) / (bw * 1e9) * 1e3
    embed_w = model.get_input_embeddings().weight
    head_w = model.get_output_embeddings().weight
    linear_params = sum(t.numel() for t in model.parameters() if t.dim() == 2 and t is not embed_w)
    tied = head_w is embed_w
    # a decoding step's arithmetic: every linear layer and the LM head once per row, attention over the context
    step_flops = B * (2 * (linear_params + (head_w.numel() if tied else 0))
                      + 4 * cfg.num_hidden_layers * cfg.num_attention_heads * d * W)  # fmt: skip
    floor_ms = step_flops / (peak * 1e9) * 1e3
    # the int8 path reads 1 byte per linear-layer weight (LM head included) and the norms as they are
    norm_bytes = sum(t.numel() * t.element_size() for t in model.parameters() if t.dim() == 1)
    int8_bytes = linear_params + (head_w.numel() if tied else 0) + norm_bytes
    read8_ms = (int8_bytes + kv_bytes) / (bw * 1e9) * 1e3

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

    paths = {"today": dict(fast_decode=False), "loop": dict(fast_decode=True)}
    if args.int8:
        paths["int8"] = dict(fast_decode=True, decode_weights="int8")
    walls: dict[str, list[float]] = {k: [] for k in paths}
    ids_of: dict[str, list[list[int]]] = {}
    stops = set(policy.stop_token_ids)
    for rep in range(args.reps):
        for name, kw in paths.items():
            kv = PrefixKVCache(**kw)
            t = time.perf_counter()
            out = kv.generate(model, prompts, max_new_tokens=args.new_tokens, stop_token_ids=policy.stop_token_ids,
                              pad_token_id=policy.pad_token_id, generation_kwargs={"do_sample": False})  # fmt: skip
            walls[name].append(time.perf_counter() - t)
            ids_of[name] = [cut_at_stop(r, stops)[0] for r in out.new_ids.tolist()]
            _say(f"  round {rep + 1}/{args.reps} {name:5}: {walls[name][-1]:.1f} s")
    differ = sum(a != b for a, b in zip(ids_of["today"], ids_of["loop"]))
    med = {k: statistics.median(v) for k, v in walls.items()}
    if args.processes:
        wall_p, differ_p = processes(args, ids_of["today"])
        extra_p = {"speedup_processes": round(args.processes * med["today"] / wall_p, 2),
                   "wall_s_processes": round(wall_p, 1), "processes": args.processes,
                   "rows_differing_processes": differ_p}  # fmt: skip
    else:
        extra_p = {}
    lengths = [len(r) for r in ids_of["loop"]]
    extra = {}
    if args.int8:
        extra = {"speedup_int8": round(med["today"] / med["int8"], 2), "step_ms_int8": round(int8_ms, 1),
                 "decode_over_read_int8": round(int8_ms / read8_ms, 2), "read_ms_int8": round(read8_ms, 1),
                 "wall_s_int8": [round(w, 1) for w in walls["int8"]],
                 "rows_differing_int8": sum(a != b for a, b in zip(ids_of["today"], ids_of["int8"]))}  # fmt: skip
    print(json.dumps({
        "decode_over_read": round(new_ms / read_ms, 2),
        "decode_floor_over_read": round(floor_ms / read_ms, 2),
        "prefill_share_of_peak": round(prefill_tps * flops_token / (peak * 1e9), 3),
        "speedup": round(med["today"] / med["loop"], 2),
        "step_ms_today": round(old_ms, 1), "step_ms_loop": round(new_ms, 1), "read_ms": round(read_ms, 1),
        "read_gb_s": round(bw, 1), "matmul_gflop_s": round(peak, 1), "prefill_tokens_s": round(prefill_tps, 1),
        "wall_s_today": [round(w, 1) for w in walls["today"]], "wall_s_loop": [round(w, 1) for w in walls["loop"]],
        "rows": B, "width": W, "new_tokens": args.new_tokens, "reply_tokens_mean": round(sum(lengths) / B, 1),
        "reply_tokens_max": max(lengths), "rows_differing": differ, "dtype": str(policy.dtype),
        "threads": torch.get_num_threads(), "cpu_flags": cpu_flags(), "profile_ms": split, **extra, **extra_p,
    }))  # fmt: skip


def child(args) -> None:
    """A ``--processes`` process: load the model, say ready, wait for the start file, generate the rows through
    today's path, print one JSON line (start and end times, the rows' tokens)."""
    from reterm.generation import apply_thread_policy

    apply_thread_policy()
    import os

    from reterm.policies import load_policy
    from reterm.policies.kv_cache import PrefixKVCache, cut_at_stop

    policy = load_policy(args.model, temperature=0.0, max_new_tokens=args.new_tokens, seed=0, dtype=args.dtype)
    prompts = prompts_of(policy, args.rows)
    print("ready", flush=True)
    while not os.path.exists(args.child):
        time.sleep(0.05)
    t0 = time.time()
    out = PrefixKVCache(fast_decode=False).generate(
        policy.model, prompts, max_new_tokens=args.new_tokens, stop_token_ids=policy.stop_token_ids,
        pad_token_id=policy.pad_token_id, generation_kwargs={"do_sample": False})  # fmt: skip
    stops = set(policy.stop_token_ids)
    rows = [cut_at_stop(r, stops)[0] for r in out.new_ids.tolist()]
    print(json.dumps({"start": t0, "end": time.time(), "rows": rows}), flush=True)


def processes(args, reference: list[list[int]]) -> tuple[float, int]:
    """Run ``--processes`` child processes of cpus/N threads (:func:`reterm.workers.threads_per_worker`), release
    them together once all are loaded; returns (seconds from the release to the last one's end, rows of any child
    whose tokens differ from ``reference``)."""
    import os
    import subprocess
    import tempfile

    from reterm.workers import threads_per_worker

    n = args.processes
    env = dict(os.environ, OMP_NUM_THREADS=str(threads_per_worker(n)))
    with tempfile.TemporaryDirectory() as tmp:
        go = os.path.join(tmp, "go")
        cmd = [sys.executable, __file__, "--model", args.model, "--dtype", args.dtype, "--rows", str(args.rows),
               "--new-tokens", str(args.new_tokens), "--child", go]  # fmt: skip
        procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True) for _ in range(n)]
        for proc in procs:
            line = proc.stdout.readline()
            if line.strip() != "ready":
                raise RuntimeError(f"bench/decode.py --processes: a process ended before it was ready ({line!r})")
        released = time.time()
        open(go, "w").close()
        results = []
        for proc in procs:
            out, _ = proc.communicate()
            if proc.returncode:
                raise RuntimeError(f"bench/decode.py --processes: a process exited with {proc.returncode}")
            results.append(json.loads(out.strip().splitlines()[-1]))
    wall = max(r["end"] for r in results) - released
    _say(f"{n} processes of {env['OMP_NUM_THREADS']} threads, {args.rows} rows each: {wall:.1f} s")
    return wall, sum(a != b for r in results for a, b in zip(r["rows"], reference))


if __name__ == "__main__":
    main()
