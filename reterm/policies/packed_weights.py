"""oneDNN-packed copies of a Llama model's linear layers for the decoding loop (:mod:`reterm.policies.llama_decode`).

A decoding step multiplies a few dozen rows by every linear layer's weight. Through ``torch.nn.functional.linear``
the CPU product re-lays the weight out on every call; oneDNN's packed ("blocked") layout, made once with
``torch.ops.mkldnn._reorder_linear_weight`` and multiplied by ``torch.ops.mkldnn._linear_pointwise`` (the pair
torch's own compiler uses for frozen bf16 CPU linear layers), skips that. Measured on SmolLM2-135M's 30 layers at 32
rows, weights cold, 2 threads of an AMD EPYC with AVX-512 BF16 (2026-12-07): float32 77 ms against 45 ms packed,
bf16 38 against 31 ms.

The values are the same dot products summed in another order: bf16 outputs were bit-identical on a 576x576
layer, float32 ones differed by up to ~1e-4 of an output's size, so a greedy near-tie could flip a token
(``tests/test_llama_decode.py`` compares the loop's greedy tokens with ``model.generate``'s).

The copies follow the model: :func:`for_model` rebuilds them when any weight's or bias's storage or in-place
version changed (an optimiser step, ``param.copy_`` as :class:`reterm.training.generation_copy.MergedGenerationCopy`
syncs), so a policy being trained decodes with its current weights. A write that bypasses autograd's version
counter (``param.data.copy_(...)``, ``param.data = t``) is not seen: call :func:`invalidate` after one. They cost
one more copy of the linear weights in memory (SmolLM2: ~270 MB in bf16, ~540 MB in float32). Only plain
``torch.nn.Linear`` layers without hooks are packed (:func:`usable`): a layer that does more in its forward (LoRA
injected in place, offload hooks, quantized layers) keeps the model's own modules.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

#: Each model's copies, kept beside it rather than on it (an attribute would travel with ``copy.deepcopy(model)``,
#: which cannot copy oneDNN's opaque tensors) and dropped with it.
_COPIES: "weakref.WeakKeyDictionary[Any, dict[Any, Any]]" = weakref.WeakKeyDictionary()


def available() -> bool:
    """Whether this torch build has oneDNN (``torch.backends.mkldnn``) with the packed linear kernels."""
    import torch

    return bool(torch.backends.mkldnn.is_available()) and hasattr(torch.ops.mkldnn, "_linear_pointwise") \
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")  # fmt: skip


def decoder_linears(model: Any) -> list[Any]:
    """Every linear layer a decoding step multiplies by: per layer q, k, v, o, gate, up, down; then the LM head."""
    out = []
    for layer in model.model.layers:
        a, m = layer.self_attn, layer.mlp
        out += [a.q_proj, a.k_proj, a.v_proj, a.o_proj, m.gate_proj, m.up_proj, m.down_proj]
    return out + [model.lm_head]


def weights_signature(mods: list[Any]) -> tuple:
    """What identifies the current weights of ``mods``: each weight's and bias's storage address and in-place
    version (autograd's counter, bumped by in-place operations on the parameter).

    Raises:
        RuntimeError: a parameter is an inference tensor (made under ``torch.inference_mode``): it has no version.
    """
    out = []
    for m in mods:
        for t in (m.weight, getattr(m, "bias", None)):
            if t is not None:
                out.append((t.data_ptr(), t._version))
    return tuple(out)


def plain_linears(model: Any) -> bool:
    """Whether every layer :func:`decoder_linears` names is exactly a ``torch.nn.Linear`` without forward hooks,
    so that ``F.linear(x, weight, bias)`` is all its forward does."""
    import torch

    for m in decoder_linears(model):
        if type(m) is not torch.nn.Linear or m._forward_hooks or m._forward_pre_hooks:
            return False
    return True


class PackedLinears:
    """oneDNN-packed copies of one model's decoder linear layers and LM head, in the weights' own dtype.

    Args:
        model: a Llama-architecture causal LM (``model.model.layers[i].self_attn.{q,k,v,o}_proj``,
            ``.mlp.{gate,up,down}_proj``, ``model.lm_head``), CPU weights in float32 or bfloat16.
        rows: the batch width the layout is chosen for (oneDNN's hint; any width multiplies correctly).

    Raises:
        RuntimeError: the torch build lacks the kernels (:func:`available`).
    """

    def __init__(self, model: Any, rows: int = 32) -> None:
        import torch

        if not available():
            raise RuntimeError("packed decoding: this torch build has no oneDNN packed linear kernels")
        mods = decoder_linears(model)
        self.signature = weights_signature(mods)
        with torch.inference_mode():
            self._packed = {id(m): (torch.ops.mkldnn._reorder_linear_weight(m.weight.detach(), rows),
                                    None if m.bias is None else m.bias.detach()) for m in mods}  # fmt: skip

    def __call__(self, module: Any, x: Any) -> Any:
        """``module(x)`` with the packed weight: ``x`` ``(b, in)`` in the weights' dtype -> ``(b, out)``."""
        import torch

        w, bias = self._packed[id(module)]
        return torch.ops.mkldnn._linear_pointwise(x, w, bias, "none", [], "")


def usable(model: Any) -> bool:
    """Whether :func:`for_model` can serve ``model``: the kernels exist, its weights are CPU float32, or bf16 where
    oneDNN has native bf16 (``torch.ops.mkldnn._is_mkldnn_bf16_supported``: elsewhere it would emulate it, slowly),
    its linear layers are plain (:func:`plain_linears`) and their parameters carry versions (not inference tensors)."""
    import torch

    w = model.lm_head.weight
    if not available() or w.device.type != "cpu" or w.dtype not in (torch.float32, torch.bfloat16):
        return False
    if w.dtype == torch.bfloat16 and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return False
    if not plain_linears(model):
        return False
    try:
        weights_signature(decoder_linears(model))
    except RuntimeError:
        return False
    return True


_LOCK = threading.Lock()


def copies_for(model: Any, build: Any) -> Any:
    """``model``'s copies made by ``build`` (:class:`PackedLinears`, :class:`reterm.policies.int8_weights.Int8Linears`:
    a class taking the model, with a ``signature`` of :func:`weights_signature`), built on first use and rebuilt when
    any of its weights changed (storage or in-place version); kept beside the model, one build at a time (the old
    copies are dropped first, so two never coexist).

    Raises:
        RuntimeError: as ``build``, or a parameter is an inference tensor (check :func:`usable`).
    """
    mods = decoder_linears(model)
    with _LOCK:
        held = _COPIES.setdefault(model, {})
        have = held.get(build)
        if have is None or have.signature != weights_signature(mods):
            held.pop(build, None)
            have = held[build] = build(model)
        return have


def for_model(model: Any) -> PackedLinears:
    """The model's :class:`PackedLinears` (:func:`copies_for`). Packing SmolLM2-135M took 0.17 s in bf16 and
    0.27 s in float32 (2-core EPYC)."""
    return copies_for(model, PackedLinears)


def invalidate(model: Any) -> None:
    """Drop ``model``'s copies (packed and int8), so the next :func:`copies_for` builds them from its weights as
    they are now (after a write that bypassed autograd's version counter)."""
    with _LOCK:
        _COPIES.pop(model, None)
