"""``bash train/run_all.sh --recipe qwen3.5-9b --gpu-smoke``: the 9B recipe's training step on ONE GPU, before renting eight.

    python train/gpu_smoke.py --recipe qwen3.5-9b [--out RUN/gpu-smoke.json] [--tiny] [--seq N] [--steps 2]

Builds the recipe's model from its config with random weights (Qwen3.5-9B's shape: transformers 5.24's
``Qwen3_5TextConfig()`` defaults, 8.95e9 parameters; nothing is downloaded), then runs a forward and backward pass
of one SFT micro-batch and of one GRPO micro-batch at the recipe's longest sequence with the recipe's settings:

- SFT (``sft.yaml``): ``per_device_train_batch_size`` x ``max_length`` tokens, every position scored, the loss TRL
  1.16's ``SFTTrainer`` computes (``add_fused_lm_head``: the LM head in tiles, no logits materialised);
- GRPO (``grpo.yaml``): ``per_device_train_batch_size`` x (``max_state_prompt_tokens`` + ``max_completion_length``,
  capped by ``vllm_max_model_length``) tokens, the completion scored, TRL's fused head with its ``temperature``, and
  the clipped-ratio loss of ``loss_type`` (``dapo``: token-level normalisation) with ``epsilon``/``epsilon_high``;
- both with ``gradient_checkpointing`` (activation checkpointing) and the recipe's dtype and ``attn_implementation``.

It prints, per micro-batch, the kernels in use (which implementation transformers' Qwen3.5 kernel functions
dispatch to: flash-linear-attention and causal-conv1d, or the PyTorch fallback), peak memory per term (weights,
gradients, what the forward keeps for the backward, the peak, and "activations" = peak - weights - gradients),
seconds per step, tokens/s and MFU (model FLOPs: 6 x parameters + the causal attention of the full-attention layers,
per token, over the GPU's dense bf16 peak). The first step includes Triton's autotuning (minutes with fla); the
figures are from the last step. The per-GPU terms that need 8 GPUs (ZeRO-3's shards of weights, gradients and Adam
states, the colocated vLLM engine, ZeRO-3's buffers) are **computed** from the measured ones and printed as such:
the optimizer states of a full fine-tune do not fit one GPU.

Without CUDA (or with ``--tiny``) it runs the tiny Qwen3.5 (:mod:`reterm.tiny_qwen`) in float32 on the CPU at
``--seq`` tokens (default 256): the same code path, so a test can run it; its figures say nothing about a GPU.
Writes everything to ``--out`` as JSON. Exit status 0 when both micro-batches ran, 1 otherwise.
Written for this kit.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "train"))

#: Dense bf16 peak of a GPU (FLOP/s), by a substring of its name (NVIDIA's datasheets, SXM parts, no sparsity).
PEAK_BF16_FLOPS = {"H200": 989.4e12, "H100": 989.4e12, "H800": 989.4e12, "GH200": 989.4e12, "B200": 2.25e15,
                   "A100": 312e12, "A800": 312e12, "L40S": 362e12}  # fmt: skip


def read_recipe(recipe_dir: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The ``sft.yaml`` and ``grpo.yaml`` of a recipe folder as dicts.

    Raises:
        FileNotFoundError: a recipe file is missing (naming it).
        ValueError: a field the smoke needs is missing (naming the file and field).
    """
    import yaml

    out = []
    for name, needed in (("sft.yaml", ("max_length", "per_device_train_batch_size")),
                         ("grpo.yaml", ("max_completion_length", "per_device_train_batch_size"))):  # fmt: skip
        path = recipe_dir / name
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such recipe file")
        data = yaml.safe_load(path.read_text()) or {}
        for key in needed:
            if key not in data:
                raise ValueError(f"{path}: field {key} is missing (the smoke runs the recipe's own sizes)")
        out.append(data)
    return out[0], out[1]


def grpo_sequence(grpo: dict[str, Any]) -> tuple[int, int]:
    """``(total tokens, prompt tokens)`` of the GRPO recipe's longest sequence (the failure prefix + the attempt,
    capped by ``vllm_max_model_length``)."""
    prompt = int(grpo.get("max_state_prompt_tokens") or 0)
    total = prompt + int(grpo["max_completion_length"])
    if grpo.get("vllm_max_model_length"):
        total = min(total, int(grpo["vllm_max_model_length"]))
    return total, min(prompt, total - 1)


def model_flops_per_token(config: Any, n_params: int, seq: int) -> float:
    """Training FLOPs a token (forward + backward, no recomputation): ``6 x parameters`` plus the causal attention
    of the full-attention layers, ``6 x seq x layers x heads x head_dim`` (the linear-attention layers count through
    their parameters). With the H200 figures of docs/REPRODUCING.md this gives their MFU (36.3% at 8K tokens)."""
    full = sum(1 for t in getattr(config, "layer_types", []) or [] if t == "full_attention")
    return 6.0 * n_params + 6.0 * seq * full * config.num_attention_heads * config.head_dim


def build_model(tiny: bool, dtype_name: str, attn: str | None):
    """The model with random weights: the tiny Qwen3.5 (float32, CPU) or Qwen3.5-9B's shape on the GPU (no download).

    Returns:
        ``(model, description, device)``.
    """
    import torch
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    if tiny:
        from reterm.tiny_qwen import build_tiny_qwen3_5

        model = Qwen3_5ForCausalLM.from_pretrained(build_tiny_qwen3_5(), dtype=torch.float32)
        return model, "tiny Qwen3.5 (reterm.tiny_qwen, random weights), float32", torch.device("cpu")
    dtype = getattr(torch, dtype_name)
    config = Qwen3_5TextConfig()  # transformers 5.24's defaults: Qwen3.5-9B's text model
    config.use_cache = False
    if attn:
        config._attn_implementation = attn
    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device("cuda"):
            model = Qwen3_5ForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    return model, f"Qwen3.5-9B's shape (Qwen3_5TextConfig defaults, random weights), {dtype_name}", torch.device("cuda")


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


def _allocated(device) -> float:
    import torch

    return torch.cuda.memory_allocated() / 1e9 if device.type == "cuda" else 0.0


def run_micro_batch(model, kind: str, batch: int, seq: int, prompt: int, device, *, loss_type: str = "dapo",
                    epsilon: float = 0.2, epsilon_high: float | None = None, steps: int = 2) -> dict[str, Any]:  # fmt: skip
    """Forward and backward of one micro-batch of random tokens, ``steps`` times; the figures of the last step.

    Args:
        kind: ``"sft"`` (every position scored, mean negative log-likelihood) or ``"grpo"`` (positions after
            ``prompt`` scored, the clipped-ratio loss with random +-1 advantages).
        loss_type: GRPO's normalisation: ``dapo``/``bnpo`` (over the batch's scored tokens) or ``grpo`` (per
            sequence, then averaged); other values raise ``ValueError``.

    Returns:
        ``{"tokens", "seconds_per_step", "first_step_seconds", "tokens_per_s", "memory_gb": {...}}`` where the
        memory terms (CUDA only; ``None`` on the CPU) are ``weights``, ``gradients``, ``saved_by_forward`` (allocated
        after the forward minus before it), ``peak`` and ``activations`` (peak - weights - gradients).
    """
    import torch

    if loss_type not in ("dapo", "bnpo", "grpo"):
        raise ValueError(f"loss_type {loss_type!r}: the smoke computes dapo, bnpo or grpo")
    vocab = model.config.vocab_size
    gen = torch.Generator(device="cpu").manual_seed(1)
    ids = torch.randint(0, vocab, (batch, seq), generator=gen).to(device)
    labels = ids.clone()
    if kind == "grpo":
        labels[:, :prompt] = -100
    advantages = (torch.randint(0, 2, (batch, 1), generator=gen).float() * 2 - 1).to(device)
    times, mem = [], {}
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else torch.autocast(
        "cpu", enabled=False)
    for _ in range(steps):
        model.zero_grad(set_to_none=True)
        _sync(device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        before = _allocated(device)
        t0 = time.perf_counter()
        with autocast:
            out = model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels, fused_lm_head=True)
        logps, mask = out.log_probs, out.label_mask.float()
        if kind == "sft":
            loss = -logps.sum() / mask.sum().clamp(min=1)
        else:
            ratio = torch.exp(logps - logps.detach())  # one update per generation: the old policy is this one
            clipped = torch.clamp(ratio, 1 - epsilon, 1 + (epsilon_high or epsilon))
            per_token = -torch.min(ratio * advantages, clipped * advantages)
            if loss_type == "grpo":
                loss = ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1)).mean()
            else:
                loss = (per_token * mask).sum() / mask.sum().clamp(min=1)
        _sync(device)
        after_forward = _allocated(device)
        loss.backward()
        _sync(device)
        times.append(time.perf_counter() - t0)
        if not torch.isfinite(loss):
            raise RuntimeError(f"{kind}: the loss is {loss.item()} (random weights should still give a finite loss)")
        grads = sum(p.grad.numel() * p.grad.element_size() for p in model.parameters() if p.grad is not None) / 1e9
        if device.type == "cuda":
            peak = torch.cuda.max_memory_allocated() / 1e9
            weights = sum(p.numel() * p.element_size() for p in model.parameters()) / 1e9
            mem = {"weights": weights, "gradients": grads, "saved_by_forward": after_forward - before, "peak": peak,
                   "activations": peak - weights - grads}  # fmt: skip
        else:
            mem = {"weights": None, "gradients": None, "saved_by_forward": None, "peak": None, "activations": None}
    model.zero_grad(set_to_none=True)
    tokens = batch * seq
    return {"tokens": tokens, "seconds_per_step": times[-1], "first_step_seconds": times[0],
            "tokens_per_s": tokens / times[-1], "memory_gb": mem}  # fmt: skip


def computed_per_gpu(n_params: int, measured_activations: float | None, *, vllm_utilization: float, gpu_gb: float,
                     n_gpus: int = 8) -> dict[str, float | None]:  # fmt: skip
    """The per-GPU terms of the 8-GPU run, **computed** (not measured) from the measured activations:
    ZeRO-3's shards (16 bytes a parameter over ``n_gpus``), the colocated vLLM engine (its budget), the micro-batch's
    activations as measured on one GPU, and ZeRO-3's margin (train/check_recipe.py's)."""
    from check_recipe import ZERO3_MARGIN_GB

    out: dict[str, float | None] = {
        "zero3_states": 16 * n_params / n_gpus / 1e9,
        "vllm": vllm_utilization * gpu_gb,
        "activations_measured": measured_activations,
        "margin": ZERO3_MARGIN_GB,
    }
    out["total"] = None if measured_activations is None else sum(v for v in out.values() if v is not None)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="train/gpu_smoke.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--recipe", default="qwen3.5-9b", help="a folder of train/recipes/ (default qwen3.5-9b)")
    p.add_argument("--out", type=Path, default=None, help="write the figures here as JSON")
    p.add_argument("--tiny", action="store_true", help="the tiny Qwen3.5 on the CPU (automatic without CUDA)")
    p.add_argument("--seq", type=int, default=None,
                   help="tokens a sequence instead of the recipe's (default: the recipe's; 256 with the tiny model)")
    p.add_argument("--steps", type=int, default=2, help="steps a micro-batch; the figures are the last's (default 2)")
    p.add_argument("--peak-tflops", type=float, default=None, help="the GPU's dense bf16 peak, if not in the table")
    a = p.parse_args(argv)
    if a.steps < 1 or (a.seq is not None and a.seq < 8):
        p.error("--steps must be >= 1 and --seq >= 8")

    import torch

    from reterm.training.kernels import cuda_summary, kernels_in_use

    recipe_dir = REPO / "train" / "recipes" / a.recipe
    try:
        sft, grpo = read_recipe(recipe_dir)
    except (FileNotFoundError, ValueError) as exc:
        print(f"gpu_smoke: {exc}", file=sys.stderr)
        return 2
    on_gpu, _, where = cuda_summary()
    tiny = a.tiny or not on_gpu
    if not tiny and not str(sft.get("model_name_or_path", "")).startswith("Qwen/Qwen3.5"):
        print(f"gpu_smoke: {recipe_dir / 'sft.yaml'}: model_name_or_path {sft.get('model_name_or_path')!r} is not "
              "Qwen3.5: the smoke builds Qwen3.5-9B's shape from its config", file=sys.stderr)  # fmt: skip
        return 2
    if not tiny:
        torch.backends.cuda.matmul.allow_tf32 = True
    dtype = "float32" if tiny else str(sft.get("dtype") or "bfloat16")
    model, desc, device = build_model(tiny, dtype, sft.get("attn_implementation"))
    from trl.trainer import add_fused_lm_head

    # what TRL's trainers do at construction: the LM head in tiles (SFT's outputs; GRPO asks for a subset)
    add_fused_lm_head(model, temperature=float(grpo.get("temperature") or 1.0),
                      outputs=("log_probs", "entropy", "is_top1"))  # fmt: skip
    if sft.get("gradient_checkpointing", False) or grpo.get("gradient_checkpointing", False):
        # as transformers' Trainer does with the recipe's gradient_checkpointing(_kwargs): 5.24 names the method
        # activation_checkpointing_enable (gradient_checkpointing_enable is its deprecated alias), 5.20 has only
        # gradient_checkpointing_enable; both take the kwargs dict first, then every_n_layers and offload
        kw = dict(sft.get("gradient_checkpointing_kwargs") or {})
        every, offload = kw.pop("every_n_layers", 1), kw.pop("offload", False)
        enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
        enable(kw or None, every_n_layers=every, offload=offload)
    model.config.use_cache = False
    model.train()
    n_params = sum(p.numel() for p in model.parameters())
    used = kernels_in_use()
    attn = getattr(model.config, "_attn_implementation", None)
    total_gpu_gb = torch.cuda.get_device_properties(0).total_memory / 1e9 if on_gpu else None
    peak_flops = (a.peak_tflops * 1e12 if a.peak_tflops else
                  next((v for k, v in PEAK_BF16_FLOPS.items() if on_gpu and k in torch.cuda.get_device_name(0)), None))  # fmt: skip

    print(f"== GPU smoke of recipe {a.recipe}: {desc}, {n_params / 1e9:.3g}e9 parameters, on {where}"
          + (" (tiny model on the CPU: code path only, no GPU figures)" if tiny else ""), flush=True)  # fmt: skip
    print("   kernels in use: " + "; ".join(f"{f} -> {impl}" for f, impl in used.items())
          + f"; attention {attn}; LM head: TRL add_fused_lm_head (tiles, no logits)")  # fmt: skip
    ckpt = bool(sft.get("gradient_checkpointing", False))
    g_seq, g_prompt = grpo_sequence(grpo)
    plans = {
        "sft": (int(sft["per_device_train_batch_size"]), a.seq or (256 if tiny else int(sft["max_length"])), 0),
        "grpo": (int(grpo["per_device_train_batch_size"]), a.seq or (256 if tiny else g_seq),
                 (a.seq or 256) // 2 if tiny or a.seq else g_prompt),
    }
    report: dict[str, Any] = {"recipe": a.recipe, "model": desc, "parameters": n_params, "device": where,
                              "tiny": tiny, "kernels_in_use": used, "attn_implementation": attn,
                              "activation_checkpointing": ckpt, "peak_bf16_flops": peak_flops, "micro_batches": {}}  # fmt: skip
    ok = True
    for kind, (batch, seq, prompt) in plans.items():
        try:
            r = run_micro_batch(model, kind, batch, seq, prompt, device, loss_type=str(grpo.get("loss_type", "dapo")),
                                epsilon=float(grpo.get("epsilon", 0.2)), epsilon_high=grpo.get("epsilon_high"),
                                steps=a.steps)  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - an out-of-memory or kernel error is the smoke's finding
            ok = False
            report["micro_batches"][kind] = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
            print(f"   [{kind}] FAILED at {batch} x {seq} tokens: {type(exc).__name__}: {str(exc)[:500]}", flush=True)
            if device.type == "cuda":
                torch.cuda.empty_cache()
            continue
        fpt = model_flops_per_token(model.config, n_params, seq)
        r["mfu"] = (r["tokens_per_s"] * fpt / peak_flops) if peak_flops else None
        r["model_flops_per_token"] = fpt
        r["batch"], r["seq"], r["prompt_tokens"] = batch, seq, prompt
        report["micro_batches"][kind] = r
        mfu = f", MFU {r['mfu']:.1%}" if r["mfu"] is not None else ""
        print(f"   [{kind}] {batch} x {seq} tokens ({'completion after ' + str(prompt) if prompt else 'all'} scored), "
              f"activation checkpointing {'on' if ckpt else 'off'}: {r['seconds_per_step']:.2f} s/step (first step "
              f"{r['first_step_seconds']:.1f} s), {r['tokens_per_s']:,.0f} tokens/s{mfu}", flush=True)  # fmt: skip
        m = r["memory_gb"]
        if m["peak"] is not None:
            print(f"         measured: weights {m['weights']:.1f} GB, gradients {m['gradients']:.1f} GB, kept by the "
                  f"forward {m['saved_by_forward']:.1f} GB, peak {m['peak']:.1f} GB, activations (peak - weights - "
                  f"gradients) {m['activations']:.1f} GB", flush=True)  # fmt: skip
        else:
            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
            print(f"         memory: no CUDA here (process peak RSS {rss:.1f} GB)", flush=True)
    for kind, util in (("sft", 0.0), ("grpo", float(grpo.get("vllm_gpu_memory_utilization") or 0.0)
                                      if grpo.get("use_vllm") else 0.0)):  # fmt: skip
        act = (report["micro_batches"].get(kind) or {}).get("memory_gb", {}).get("activations")
        terms = computed_per_gpu(n_params, act, vllm_utilization=util, gpu_gb=total_gpu_gb or 80.0)
        report.setdefault("computed_per_gpu_8", {})[kind] = terms
        if terms["total"] is not None:
            print(f"   computed for 8 GPUs (ZeRO-3{' + colocated vLLM' if util else ''}; arithmetic on the measured "
                  f"activations, not measured) [{kind}]: ZeRO-3 states {terms['zero3_states']:.1f} GB, vLLM "
                  f"{terms['vllm']:.1f} GB, activations {terms['activations_measured']:.1f} GB, margin "
                  f"{terms['margin']:.1f} GB -> {terms['total']:.1f} GB of {total_gpu_gb or 80.0:.0f}", flush=True)  # fmt: skip
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(report, indent=1))
        print(f"   written: {a.out}")
    print("== GPU smoke " + ("passed" if ok else "FAILED (see above)"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
