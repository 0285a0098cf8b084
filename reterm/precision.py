"""bf16 arithmetic on the CPU: detected once, used where it is fast, fp32 elsewhere.

CPUs with AMX (``amx_bf16``) or AVX-512 BF16 (``avx512_bf16``) run bf16 matrix products several times faster
than fp32 through oneDNN (measured on this project's 2-core machine: a 1024x2048 @ 2048x2048 matmul at ~818
GFLOP/s in bf16 against ~133 in fp32 on one thread; ``../shared/NOTES.md``, issue 30). A CPU without them
emulates bf16 and is slower than fp32, so nothing here assumes it: :func:`cpu_bf16_fast` reads the CPU's flags.

What uses it:

- training on a CPU (``train/sft.py``, ``train/grpo.py``): a recipe's ``bf16: true`` is autocast (bf16 matrix
  products, fp32 master weights, LoRA and optimiser state), kept where the CPU has the instructions and turned
  off, with a message, where it does not (:func:`resolve_training_bf16`);
- generation on a CPU (:class:`reterm.policies.transformers_policy.TransformersPolicy`, ``dtype="auto"``): bf16
  weights where the CPU has the instructions (:func:`auto_cpu_dtype`), else fp32.

``RETERM_CPU_BF16=0`` (or ``1``) overrides the detection, e.g. to compare the two on one machine
(``bench/bf16.py``).
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Any

BF16_FLAGS = ("amx_bf16", "avx512_bf16")
"""``/proc/cpuinfo`` flags of native bf16 matrix arithmetic (x86: AMX tiles, AVX-512 BF16)."""


@lru_cache(maxsize=1)
def _cpu_flags() -> frozenset[str]:
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def cpu_bf16_fast() -> bool:
    """Whether this CPU runs bf16 matrix products natively (:data:`BF16_FLAGS`), so that bf16 beats fp32.

    ``RETERM_CPU_BF16=1`` / ``0`` forces the answer (any other value is an error).

    Raises:
        ValueError: ``RETERM_CPU_BF16`` is set to something other than ``0`` or ``1``.
    """
    forced = os.environ.get("RETERM_CPU_BF16", "").strip()
    if forced:
        if forced not in ("0", "1"):
            raise ValueError(f"RETERM_CPU_BF16={forced!r}: use 1 (bf16 on the CPU) or 0 (fp32)")
        return forced == "1"
    return any(flag in _cpu_flags() for flag in BF16_FLAGS)


def auto_cpu_dtype() -> str:
    """The dtype name a model loaded for CPU generation gets under ``dtype="auto"``: ``"bfloat16"`` where
    :func:`cpu_bf16_fast`, else ``"float32"``."""
    return "bfloat16" if cpu_bf16_fast() else "float32"


def resolve_training_bf16(training_args: Any) -> str | None:
    """Keep a CPU training run's ``bf16: true`` only where the CPU has bf16 arithmetic (:func:`cpu_bf16_fast`).

    On a CPU run (``use_cpu`` set, or no CUDA device) whose recipe asks for ``bf16`` and whose CPU lacks the
    instructions, ``training_args.bf16`` is set to False and ``training_args.mixed_precision`` to ``"no"`` (fp32
    training: emulated bf16 is several times slower). Both, because ``TrainingArguments.__post_init__`` (transformers
    5) derives ``mixed_precision`` from ``bf16`` once and the Trainer's accelerator reads ``mixed_precision``: with
    ``bf16`` alone turned off, accelerate still wraps the model's forward in bf16 autocast (measured on a 2-core AVX2
    EPYC: an SFT step of two ~700-token records 185 s instead of ~15 s). GPU runs and runs without ``bf16`` are left
    as they are.

    Args:
        training_args: a transformers ``TrainingArguments`` (TRL ``SFTConfig`` / ``GRPOConfig``); changed in place.

    Returns:
        A one-line message saying what was decided for a CPU run that asked for bf16, else ``None``.
    """
    if not getattr(training_args, "bf16", False):
        return None
    on_cpu = bool(getattr(training_args, "use_cpu", False))
    if not on_cpu:
        import torch

        on_cpu = not torch.cuda.is_available()
    if not on_cpu:
        return None
    if cpu_bf16_fast():
        why = ", ".join(f for f in BF16_FLAGS if f in _cpu_flags()) or "RETERM_CPU_BF16=1"
        return f"bf16 autocast on the CPU ({why})"
    training_args.bf16 = False
    if getattr(training_args, "mixed_precision", None) == "bf16":
        training_args.mixed_precision = "no"
    return f"bf16 off: this CPU has none of {list(BF16_FLAGS)} (fp32 is faster here)"
