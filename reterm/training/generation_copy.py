"""A merged copy of the policy for generation: what TRL's vLLM weight sync does, inside the training process.

GRPO with LoRA generates from the trained model: every linear layer of the base runs its frozen weight, then
its LoRA A and B, and on a CPU with bf16 training the autocast re-casts every frozen fp32 weight to bf16 at
every call (torch caches casts only of leaf tensors that require grad). A decode step of SmolLM2-135M with
its LoRA (r16, all-linear, batch 8) took 245 ms against 92 ms for the plain model with bf16 weights (one
thread, same process, 2026-12-05; ``bench/generation.py --merged`` prints it on any machine). Rollouts are
most of a CPU GRPO step, and the decode steps most of a rollout.

:class:`MergedGenerationCopy` holds a plain model of the same architecture in ``dtype`` and, at
:meth:`sync`, writes into it each layer's weight with the LoRA update merged in (``W + scale * B @ A``,
PEFT's ``get_delta_weight``) and every other weight as it is. The sampled tokens then come from the merged
weights rounded to ``dtype`` while the loss is computed by the LoRA model, the same gap TRL's vLLM path has
(bf16 weights in vLLM, the trainer's own numerics in the loss).
"""

from __future__ import annotations

from typing import Any


class MergedGenerationCopy:
    """A generation-only copy of ``policy`` (a ``PeftModel`` or a plain ``PreTrainedModel``).

    Args:
        policy: the model being trained; a PEFT model has its active LoRA adapters merged into the copy.
        dtype: the copy's torch dtype (``torch.bfloat16`` on a CPU with bf16 matrix instructions).

    Attributes:
        model: the copy, in eval mode, with no gradients; call :meth:`sync` before generating from it.

    Raises:
        ValueError: a LoRA variant whose update cannot be merged (PEFT raises for it), named with its layer.
    """

    def __init__(self, policy: Any, dtype: Any) -> None:
        import copy


        base = _base_model(policy)
        model = type(base)(copy.deepcopy(base.config)).to(device=base.device, dtype=dtype)
        model.generation_config = copy.deepcopy(base.generation_config)
        model.eval().requires_grad_(False)
        self.model = model
        self.dtype = dtype
        self.syncs = 0
        self.sync(policy)

    def sync(self, policy: Any) -> None:
        """Copy ``policy``'s current weights into :attr:`model` (LoRA merged, cast to :attr:`dtype`).

        Raises:
            ValueError: the policy's weights do not match the copy's (another architecture), naming the keys.
        """
        import torch

        with torch.no_grad():
            state = merged_state_dict(policy)
            missing, unexpected = self.model.load_state_dict(state, strict=False)
            missing = [k for k in missing if not _tied(self.model, k)]
            if missing or unexpected:
                raise ValueError(f"MergedGenerationCopy: weights do not match the copy: missing {missing[:5]}, "
                                 f"unexpected {unexpected[:5]}")  # fmt: skip
        self.syncs += 1


def merged_state_dict(policy: Any) -> dict[str, Any]:
    """The weights of ``policy`` as a plain model's state dict: each LoRA layer's base weight plus the update
    of its active adapters (PEFT's ``get_delta_weight``: ``scale * B @ A``, fan-in/fan-out handled), LoRA
    tensors left out, PEFT's ``base_layer`` names mapped back. Tensors are the policy's own (fp32) or new
    merged ones; nothing is modified. Call under ``torch.no_grad()``."""
    from peft.tuners.lora import LoraLayer

    base = _base_model(policy)
    out: dict[str, Any] = {}
    for name, module in base.named_modules():
        if isinstance(module, LoraLayer):
            weight = module.get_base_layer().weight
            for adapter in module.active_adapters:
                if adapter in module.lora_A and not module.merged:
                    weight = weight + module.get_delta_weight(adapter).to(weight.dtype)
            out[f"{name}.weight"] = weight
    for key, value in base.state_dict().items():
        if "lora_" in key:
            continue
        out.setdefault(key.replace(".base_layer.", "."), value)
    return out


def _base_model(policy: Any) -> Any:
    """The transformers model under a PEFT wrapper (the same object's layers, LoRA layers included)."""
    get_base = getattr(policy, "get_base_model", None)
    return get_base() if callable(get_base) else policy


def _tied(model: Any, key: str) -> bool:
    """Whether ``key`` is a weight tied to another (the LM head of a model with tied embeddings)."""
    tied = getattr(model, "_tied_weights_keys", None) or {}
    keys = tied.keys() if isinstance(tied, dict) else tied
    return key in keys and bool(getattr(model.config.get_text_config(), "tie_word_embeddings", False))
