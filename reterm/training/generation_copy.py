"""A merged copy of the policy for generation: what TRL's vLLM weight sync does, inside the training process.

GRPO with LoRA generates from the trained model: every linear layer of the base runs its frozen weight, then
its LoRA A and B, and on a CPU with bf16 training the autocast re-casts every frozen fp32 weight to bf16 at
every call (torch caches casts only of leaf tensors that require grad). A decode step of SmolLM2-135M with
its LoRA (r16, all-linear, batch 8) took 245 ms against 92 ms for the plain model with bf16 weights (one
thread, same process, 2026-12-05); ``bench/grpo_generation.py`` measures a whole rollout step on any machine
(2.51x the tokens/s, G=8, quiet machine). Rollouts are most of a CPU GRPO step, decode steps most of a rollout.

:class:`MergedGenerationCopy` holds a plain model of the same architecture in ``dtype`` and, at
:meth:`sync`, writes into it each layer's weight with the LoRA update merged in (``W + scale * B @ A``,
PEFT's ``get_delta_weight``) and every other weight as it is; buffers that transformers keeps in fp32 (the
rotary frequencies) stay fp32, as in a model loaded with ``from_pretrained(dtype=bfloat16)``. The sampled tokens
then come from the merged weights rounded to ``dtype`` while the loss is computed by the LoRA model: the gap
TRL's vLLM path also has, which TRL can correct there by importance sampling
(``vllm_importance_sampling_correction``); this path returns no log-probabilities and corrects nothing (the
bf16 copy's logits are as close to the LoRA model's fp32 ones as its own bf16 autocast: tests).

Only plain LoRA on linear layers merges here: DoRA, LoRA biases, LoRA on embeddings and ``modules_to_save``
raise a ValueError naming the layer (use vLLM, or generate from the LoRA model with ``merged_generation`` off).
"""

from __future__ import annotations

from typing import Any


class MergedGenerationCopy:
    """A generation-only copy of ``policy`` (a ``PeftModel`` or a plain ``PreTrainedModel``).

    Args:
        policy: the model being trained; a PEFT model has its active LoRA adapters merged into the copy.
        dtype: the copy's torch dtype (``torch.bfloat16`` on a CPU with bf16 matrix instructions).

    Attributes:
        model: the copy, in eval mode, with no gradients, on the policy's device (moved at :meth:`sync` when the
            policy has moved since).
        syncs: how many times :meth:`sync` ran (the constructor runs it once).

    Raises:
        ValueError: a PEFT layer that does not merge into a plain linear weight (DoRA, LoRA bias, LoRA on an
            embedding, ``modules_to_save``, parameter targets), named with its module path.
    """

    def __init__(self, policy: Any, dtype: Any) -> None:
        import copy

        base = _base_model(policy)
        _check_mergeable(base)
        # _from_config keeps what transformers keeps in fp32 (rotary frequencies) and ties the embeddings
        model = type(base)._from_config(copy.deepcopy(base.config), dtype=dtype)
        model.generation_config = copy.deepcopy(base.generation_config)
        self.model = model.to(base.device).eval().requires_grad_(False)
        self.dtype = dtype
        self.syncs = 0
        self.sync(policy)

    def sync(self, policy: Any) -> None:
        """Copy ``policy``'s current weights into :attr:`model`, one tensor at a time (LoRA merged, cast to the
        copy's dtype).

        Raises:
            ValueError: the policy's weights do not cover the copy's or name weights it lacks (another
                architecture), naming the keys.
        """
        import torch

        base = _base_model(policy)
        if self.model.device != base.device:
            self.model.to(base.device)
        targets = dict(self.model.named_parameters())  # tied weights appear once
        done, unexpected = set(), []
        with torch.no_grad():
            for key, value in merged_weights(base):
                target = targets.get(key)
                if target is None:
                    if not _tied(self.model, key):
                        unexpected.append(key)
                    continue
                target.copy_(value)
                done.add(key)
        missing = sorted(set(targets) - done)
        if missing or unexpected:
            raise ValueError(f"MergedGenerationCopy: weights do not match the copy: missing {missing[:5]}, "
                             f"unexpected {unexpected[:5]}")  # fmt: skip
        self.syncs += 1


def merged_weights(model: Any):
    """Yield ``(name, tensor)`` for every parameter of the plain model under ``model`` (a PEFT model or its base):
    each LoRA layer's base weight plus the update of its active, unmerged adapters (PEFT's ``get_delta_weight``:
    ``scale * B @ A``, fan-in/fan-out handled), LoRA tensors left out, PEFT's ``base_layer`` names mapped back.
    One merged tensor exists at a time; nothing is modified. Call under ``torch.no_grad()``."""
    from peft.tuners.lora import LoraLayer

    base = _base_model(model)
    lora = {name: m for name, m in base.named_modules() if isinstance(m, LoraLayer)}
    for key, value in base.named_parameters():
        if "lora_" in key:
            continue
        key = key.replace(".base_layer.", ".")
        layer = lora.get(key.rpartition(".")[0]) if key.endswith(".weight") else None
        if layer is not None:
            for adapter in layer.active_adapters:
                if adapter in layer.lora_A and adapter not in layer.merged_adapters:
                    value = value + layer.get_delta_weight(adapter).to(value.dtype)
        yield key, value


def _check_mergeable(base: Any) -> None:
    """Raise ValueError for PEFT layers :func:`merged_weights` cannot merge into a plain linear weight."""
    from peft.tuners.lora import Linear as LoraLinear
    from peft.tuners.lora import LoraLayer
    from peft.utils import ModulesToSaveWrapper

    for name, m in base.named_modules():
        if isinstance(m, ModulesToSaveWrapper):
            raise ValueError(f"merged_generation: {name} is in modules_to_save; only LoRA on linear layers merges")
        if not isinstance(m, LoraLayer):
            continue
        if type(m) is not LoraLinear or any(len(d) for d in (m.lora_embedding_A, m.lora_embedding_B)):
            raise ValueError(f"merged_generation: {name} is a {type(m).__name__} LoRA layer; only LoRA on linear "
                             "layers merges")  # fmt: skip
        for adapter in m.active_adapters:
            extras = [k for k, on in (("DoRA", m.use_dora.get(adapter)), ("lora_bias", m.lora_bias.get(adapter)),
                                      ("lora_variant", getattr(m, "lora_variant", {}).get(adapter))) if on]  # fmt: skip
            if extras:
                raise ValueError(f"merged_generation: {name} (adapter {adapter!r}) uses {', '.join(extras)}; only "
                                 "plain LoRA merges")  # fmt: skip


def _base_model(policy: Any) -> Any:
    """The transformers model under a PEFT wrapper (the same object's layers, LoRA layers included)."""
    get_base = getattr(policy, "get_base_model", None)
    return get_base() if callable(get_base) else policy


def _tied(model: Any, key: str) -> bool:
    """Whether ``key`` is a weight tied to another (the LM head of a model with tied embeddings)."""
    tied = getattr(model, "_tied_weights_keys", None) or {}
    keys = tied.keys() if isinstance(tied, dict) else tied
    return key in keys and bool(getattr(model.config.get_text_config(), "tie_word_embeddings", False))
