"""Probe: the decoding loop's step compiled with ``torch.compile`` against the eager step with packed weights.

:func:`reterm.policies.llama_decode._step` takes its column as a Python int, which ``torch.compile`` bakes into the
graph (a recompile every step). This probe compiles a copy of the step that takes the column as a tensor
(``index_copy_`` into the key/value storage, ``index_fill_`` of the mask), on SmolLM2 with random keys/values
(``--rows`` rows, a ``--prompt`` column prompt in a ``--capacity`` column storage), and times it against the eager
step on the same storage; then it calls the compiled step at other batch sizes and capacities, to see whether it
recompiles. ``--freezing`` turns on inductor's freezing (the weights become constants the compiler packs: a model
whose weights change, as GRPO's, would compile again), ``--dynamic`` compiles for symbolic shapes from the first call.

Prints one line per shape and one JSON line (first-call seconds, ms a step compiled and eager, the dynamo frame and
recompile counters). Run it on an otherwise idle machine: the two sides are timed one after the other.

Usage: ``python bench/compile_step.py [--dtype bfloat16] [--freezing] [--dynamic] [--rows 32]``
"""

from __future__ import annotations

import argparse
import json
import time


def compiled_step(model, tokens, positions, keys, values, col, mask):
    """:func:`reterm.policies.llama_decode._step` without packed weights, its column ``col`` a 1-element long
    tensor; returns the logits ``(b, V)`` in float32."""
    import torch

    from reterm.policies.llama_decode import _rotate

    cfg, inner = model.config, model.model
    b = tokens.shape[0]
    hq, hkv = cfg.num_attention_heads, cfg.num_key_value_heads
    d, rep = cfg.hidden_size // hq, hq // hkv
    h = inner.embed_tokens(tokens)
    cos, sin = inner.rotary_emb(h[:, None], positions[:, None])
    cos, sin = cos.to(h.dtype), sin.to(h.dtype)
    mask.index_fill_(1, col, 0)
    capacity = mask.shape[1]
    bias = mask[:, None, :].expand(b, hq, capacity).reshape(b * hkv, rep, capacity)
    for li, layer in enumerate(inner.layers):
        attn = layer.self_attn
        x = layer.input_layernorm(h)
        q = _rotate(attn.q_proj(x).view(b, hq, d), cos, sin).view(b * hkv, rep, d)
        k = _rotate(attn.k_proj(x).view(b, hkv, d), cos, sin)
        keys[li].index_copy_(2, col, k[:, :, None])
        values[li].index_copy_(2, col, attn.v_proj(x).view(b, hkv, d)[:, :, None])
        scores = torch.baddbmm(bias, q, keys[li].view(b * hkv, capacity, d).transpose(1, 2), alpha=attn.scaling)
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        h = h + attn.o_proj(torch.bmm(probs, values[li].view(b * hkv, capacity, d)).reshape(b, hq * d))
        mlp = layer.mlp
        x = layer.post_attention_layernorm(h)
        h = h + mlp.down_proj(mlp.act_fn(mlp.gate_proj(x)) * mlp.up_proj(x))
    return model.lm_head(inner.norm(h)).float()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--freezing", action="store_true", help="inductor freezing (weights as constants)")
    ap.add_argument("--dynamic", action="store_true", help="torch.compile(dynamic=True)")
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=420)
    ap.add_argument("--capacity", type=int, default=520)
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args()

    import torch
    import torch._inductor.config as inductor
    from torch._dynamo.utils import counters

    from reterm.policies import llama_decode, packed_weights
    from reterm.policies.transformers_policy import TransformersPolicy

    model = TransformersPolicy("smollm2", temperature=0, max_new_tokens=8, dtype=args.dtype).model.eval()
    cfg = model.config
    hkv, d = cfg.num_key_value_heads, cfg.hidden_size // cfg.num_attention_heads
    dtype = model.lm_head.weight.dtype
    linears = packed_weights.for_model(model) if packed_weights.usable(model) else None
    torch.manual_seed(0)

    def storage(rows: int, capacity: int):
        keys = [torch.randn(rows, hkv, capacity, d, dtype=dtype) for _ in model.model.layers]
        values = [torch.randn(rows, hkv, capacity, d, dtype=dtype) for _ in model.model.layers]
        mask = llama_decode.decode_mask(keys, values, torch.ones(rows, args.prompt, dtype=torch.long))
        return keys, values, mask

    inductor.freezing = args.freezing
    step = torch.compile(compiled_step, dynamic=True if args.dynamic else None)
    shapes = [(args.rows, args.capacity), (args.rows // 2, args.capacity + 80), (args.rows // 4, args.capacity - 70)]
    results = []
    with torch.inference_mode():
        for rows, capacity in shapes:
            tok = torch.randint(0, cfg.vocab_size, (rows,))
            pos = torch.full((rows,), args.prompt, dtype=torch.long)
            keys, values, mask = storage(rows, capacity)
            t = time.perf_counter()
            step(model, tok, pos, keys, values, torch.tensor([args.prompt]), mask)
            first = time.perf_counter() - t
            t = time.perf_counter()
            for i in range(args.steps):
                step(model, tok, pos, keys, values, torch.tensor([args.prompt + 1 + i]), mask)
            compiled_ms = (time.perf_counter() - t) / args.steps * 1000
            col = args.prompt + 1 + args.steps
            t = time.perf_counter()
            for i in range(args.steps):
                llama_decode._step(model, tok, pos, keys, values, col + i, mask, linears)
            eager_ms = (time.perf_counter() - t) / args.steps * 1000
            print(f"{rows} rows x {capacity} columns: first call {first:.1f} s, compiled {compiled_ms:.1f} ms a step, "
                  f"eager (packed weights) {eager_ms:.1f} ms", flush=True)  # fmt: skip
            results.append({"rows": rows, "capacity": capacity, "first_call_s": round(first, 2),
                            "compiled_ms": round(compiled_ms, 1), "eager_ms": round(eager_ms, 1)})  # fmt: skip
    print(json.dumps({"dtype": args.dtype, "freezing": args.freezing, "dynamic": args.dynamic, "shapes": results,
                      "frames": dict(counters["frames"]), "recompiles": dict(counters.get("recompiles", {}))}))  # fmt: skip


if __name__ == "__main__":
    main()
