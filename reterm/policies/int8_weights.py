"""Int8 copies of a Llama model's linear layers for the decoding loop (:mod:`reterm.policies.llama_decode`).

A decoding step of the embedded SmolLM2 at 32 rows on a 2-core AVX2 CPU spends about half its time in the
matrix products of its linear layers and LM head (``bench/decode.py --profile``), and in float32 those run well
below the machine's arithmetic peak at that width. torch's quantized engine (``fbgemm``/``x86``, the
``torch.ops.quantized.linear_dynamic`` kernel) multiplies int8 weights by activations quantised on the fly, about
2.5-4x faster there (measured on that CPU: a 576->1536 projection at 32 rows 0.63 ms against 1.8 ms in float32,
the 49152x576 LM head 24 ms against 91 ms; loaded machine).

Weights are quantised per output channel, symmetric, scale ``max|w| / 127`` (``torch.quantize_per_channel``);
activations per tensor by the kernel, ``reduce_range`` on (7-bit activations: the AVX2 kernel's 16-bit
accumulation cannot overflow). The outputs differ from float32 by about 2% relative per layer, so greedy tokens
can differ from float32 decoding: ``bench/decode.py --int8`` counts the rows that do. It is opt-in
(``PrefixKVCache(decode_weights="int8")``, ``--policy-arg decode_weights=int8``), never a measuring default.

The copies follow the model: :func:`for_model` rebuilds them when any weight's storage or in-place version
changed (an optimiser step, a weight sync), so a policy being trained decodes with its current weights.
"""

from __future__ import annotations

from typing import Any

from reterm.policies.packed_weights import copies_for
from reterm.policies.packed_weights import decoder_linears as _linears
from reterm.policies.packed_weights import weights_signature as _signature

#: The decoding loop's weight modes.
DECODE_WEIGHTS = ("float", "int8")


def available() -> bool:
    """Whether this torch build has a quantized engine with the dynamic int8 linear kernel (``x86``/``fbgemm``
    on x86-64, ``qnnpack`` on ARM)."""
    import torch

    engines = [e for e in torch.backends.quantized.supported_engines if e != "none"]
    return bool(engines) and hasattr(torch.ops.quantized, "linear_dynamic")


def _pack(module: Any) -> Any:
    import torch

    w = module.weight.detach().float()
    scale = (w.abs().amax(dim=1).clamp(min=1e-12) / 127.0).double()
    zero = torch.zeros(w.shape[0], dtype=torch.long)
    qw = torch.quantize_per_channel(w, scale, zero, 0, torch.qint8)
    bias = module.bias.detach().float() if getattr(module, "bias", None) is not None else None
    return torch.ops.quantized.linear_prepack(qw, bias)


class Int8Linears:
    """Packed int8 weights of one model's decoder linear layers and LM head.

    Args:
        model: a Llama-architecture causal LM (``model.model.layers[i].self_attn.{q,k,v,o}_proj``,
            ``.mlp.{gate,up,down}_proj``, ``model.lm_head``), float weights.

    Raises:
        RuntimeError: the torch build has no quantized engine (:func:`available`).
    """

    def __init__(self, model: Any) -> None:
        if not available():
            raise RuntimeError("int8 decoding: this torch build has no quantized engine (torch.backends.quantized)")
        mods = _linears(model)
        self.signature = _signature(mods)
        self._packed = {id(m): _pack(m) for m in mods}

    def __call__(self, module: Any, x: Any) -> Any:
        """``module(x)`` with the int8 weights: ``x`` ``(..., in)`` float32 -> ``(..., out)`` float32."""
        import torch

        return torch.ops.quantized.linear_dynamic(x, self._packed[id(module)], True)


def for_model(model: Any) -> Int8Linears:
    """The model's :class:`Int8Linears`, built on first use and rebuilt when any of its weights changed (storage or
    in-place version); kept beside the model. Building them for SmolLM2-135M takes a few seconds."""
    return copies_for(model, Int8Linears)
