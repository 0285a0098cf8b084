"""The keyword a transformers model takes its KV cache under, across the two transformers lines the kit runs
(5.24 on the CPU, requirements.txt; 5.20 in the GPU set, requirements-gpu.txt)."""

from __future__ import annotations

from typing import Any

__all__ = ["cache_kwarg"]


def cache_kwarg(model: Any) -> str:
    """The keyword ``model``'s ``forward`` (and so ``generate``) takes its KV cache under: ``"cache"`` in
    transformers 5.24 (where ``past_key_values`` is a deprecated alias), ``"past_key_values"`` in 5.20 (the GPU set,
    requirements-gpu.txt), which has no ``cache`` parameter and would pass such a keyword on unread: every turn
    would then re-read its whole prompt. A PEFT wrapper is looked through to its base model."""
    import inspect

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"
