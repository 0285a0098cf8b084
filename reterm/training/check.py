"""``--check``: run a GPU recipe's code path on a CPU in seconds.

A 9B recipe cannot run here, but everything except the model size and the GPU-only options can: the
recipe is parsed by the same ``TrlParser``, the dataset goes through the same conversion, the trainer
is built by the same code and takes one optimiser step. ``--check`` appends these overrides to the
command line (command-line values beat the recipe's, so they win over the YAML):

- model: ``tiny-qwen3.5`` (:mod:`reterm.tiny_qwen`: the Qwen3.5 class, tokenizer layout and chat
  template at about 330 k parameters), loaded in float32 with SDPA attention, no 4/8-bit quantisation;
- GPU-only options off: ``bf16``/``fp16``/``tf32``, Liger kernels, ``torch_compile``, packing and
  padding-free batching (Qwen3.5's packed path needs the ``causal-conv1d`` CUDA kernel), fused or 8-bit
  optimisers (``optim: adamw_torch``); ``use_cpu: true``;
- one step: ``max_steps: 1`` without warm-up, batch 2, no gradient accumulation, logging every step, no checkpoints,
  no Hub push, no trackers; ``output_dir`` gets a ``-check`` suffix so a real run's folder is never
  touched.

Distributed settings live in ``accelerate`` configs (``train/accelerate_configs/``), not in recipes, so a
check run is a plain ``python`` process. Used by ``train/sft.py --check`` (and by ``bash train/run_all.sh
--check``); ``train/grpo.py`` can use the same :func:`check_overrides`.
"""

from __future__ import annotations

from typing import Any

from reterm.training.models import TINY_QWEN_NAME

CHECK_MODEL = TINY_QWEN_NAME


def check_overrides(training_args: Any, model_args: Any) -> dict[str, Any]:
    """Field -> value overrides of a ``--check`` run (see the module docstring).

    Args:
        training_args: the parsed ``SFTConfig``/``GRPOConfig`` (only ``output_dir`` and the presence of
            fields are read).
        model_args: the parsed TRL ``ModelConfig`` (unused today; kept so callers pass both).

    Returns:
        A mapping of dataclass field names to values, only for fields the config classes have.
    """
    out: dict[str, Any] = {
        # ModelConfig
        "model_name_or_path": CHECK_MODEL,
        "dtype": "float32",
        "attn_implementation": "sdpa",
        "load_in_4bit": False,
        "load_in_8bit": False,
        # TrainingArguments
        "output_dir": f"{str(training_args.output_dir).rstrip('/')}-check",
        "use_cpu": True,
        "bf16": False,
        "fp16": False,
        "tf32": False,
        "use_liger_kernel": False,
        "torch_compile": False,
        "optim": "adamw_torch",
        "max_steps": 1,
        "warmup_steps": 0,  # so the one step changes the weights
        "per_device_train_batch_size": 2,
        "per_device_eval_batch_size": 2,
        "gradient_accumulation_steps": 1,
        "logging_steps": 1,
        "save_strategy": "no",
        "push_to_hub": False,
        "report_to": "none",
        "dataloader_num_workers": 0,
        "dataloader_pin_memory": False,
        # SFTConfig
        "packing": False,
        "padding_free": False,
    }
    fields = set(vars(training_args)) | set(vars(model_args))
    return {k: v for k, v in out.items() if k in fields}


def as_cli_args(overrides: dict[str, Any]) -> list[str]:
    """``{"bf16": False, "max_steps": 1}`` -> ``["--bf16", "False", "--max_steps", "1"]`` (HfArgumentParser
    syntax)."""
    args: list[str] = []
    for key, value in overrides.items():
        args += [f"--{key}", str(value)]
    return args
