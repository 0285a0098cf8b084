"""A skip marker for the few tests whose SFT arithmetic does not fit CI's time limit on a CPU without bf16.

Measured in a fresh-clone ``.ci/run`` on 2 AVX2-only cores (AMD EPYC, 2026-12-06): the 32-step SFT behaviour test
ran past 25 minutes and the SmolLM2 SFT fixture past 15 in fp32; with bf16 arithmetic (AMX, AVX-512 BF16) each takes
a few minutes. Where the CPU has none, these tests run only with ``RETERM_FP32_SLOW_TESTS=1``.
"""

from __future__ import annotations

import os

import pytest

from reterm.precision import cpu_bf16_fast

needs_bf16_or_asked = pytest.mark.skipif(
    not cpu_bf16_fast() and os.environ.get("RETERM_FP32_SLOW_TESTS") != "1",
    reason="SFT on SmolLM2 in fp32 (no bf16 arithmetic on this CPU) exceeds CI's budget; RETERM_FP32_SLOW_TESTS=1 runs it",
)
