"""Bounded memory for TRL's fused LM head on CPUs (SFT and GRPO losses).

TRL 1.16's SFT and GRPO trainers compute the loss's per-token log-probabilities with a fused LM head
(``trl.trainer.utils.add_fused_lm_head``): the ``(tokens, vocabulary)`` logits are never materialised, the
projection runs in tiles of ``TOKEN_CHUNK_SIZE`` tokens by ``_CHUNKED_LOGPROB_CHUNK_SIZE`` vocabulary
entries. Two of its choices suit GPUs but not a CPU:

- only on Triton devices (CUDA, XPU) does it score just the positions that carry loss; elsewhere every
  position is scored (to keep tile shapes fixed for compilers such as Neuron's). A CPU does not recompile,
  and an SFT record's loss covers only its recovery turns, a GRPO sequence's only its completion: scoring
  every prompt token there wastes most of the head's work;
- a tile of 4,096 tokens by 32,768 vocabulary entries is 512 MB in float32, and folding it in torch (no Triton
  on a CPU) makes several temporaries of that size: SmolLM2's SFT peaked above 10 GB.

:func:`lean_fused_lm_head` scores only the positions with a label on CPUs and makes the tiles smaller (the
results are the same: the log-sum-exp is accumulated over tiles either way). It changes module-level values
of TRL, read at call time; with a TRL that lacks them it warns and changes nothing.
"""

from __future__ import annotations

import warnings

#: Tokens per projection tile on a CPU.
CPU_TOKEN_TILE = 1024
#: Vocabulary entries per projection tile on a CPU (1,024 x 8,192 float32 = 32 MB a tile).
CPU_VOCAB_TILE = 8192

_APPLIED = False


def lean_fused_lm_head(token_tile: int = CPU_TOKEN_TILE, vocab_tile: int = CPU_VOCAB_TILE) -> bool:
    """Score only the positions that carry loss on CPUs, and use smaller tiles, in TRL's fused LM head.

    Call before training (idempotent; CUDA/XPU behaviour is unchanged apart from the tile sizes, which only
    change how the same sums are split).

    Args:
        token_tile: tokens per tile (TRL's default 4,096).
        vocab_tile: vocabulary entries per tile (TRL's default 32,768).

    Returns:
        ``True`` when applied, ``False`` (with a warning) when this TRL has no such fused head.

    Raises:
        ValueError: a tile size below 1.
    """
    global _APPLIED
    if token_tile < 1 or vocab_tile < 1:
        raise ValueError(f"lean_fused_lm_head: tile sizes must be >= 1, got {token_tile}, {vocab_tile}")
    try:
        from trl.kernels import chunked_logprob
        from trl.trainer import utils as trl_utils
    except ImportError:
        chunked_logprob = trl_utils = None
    names_ok = (
        chunked_logprob is not None
        and hasattr(chunked_logprob, "TOKEN_CHUNK_SIZE")
        and hasattr(trl_utils, "_CHUNKED_LOGPROB_CHUNK_SIZE")
        and callable(getattr(trl_utils, "_use_triton", None))
    )
    if not names_ok:
        warnings.warn("lean_fused_lm_head: this TRL has no fused LM head with tiles; nothing changed", stacklevel=2)
        return False
    chunked_logprob.TOKEN_CHUNK_SIZE = int(token_tile)
    trl_utils._CHUNKED_LOGPROB_CHUNK_SIZE = int(vocab_tile)
    if not _APPLIED:
        original = trl_utils._use_triton

        def compact(device):
            """Score only labelled positions: TRL's rule on Triton devices, and on CPUs too."""
            return original(device) or getattr(device, "type", None) == "cpu"

        # `trl.trainer.utils._use_triton` only decides which positions are scored (the kernel module keeps its
        # own reference for choosing Triton kernels).
        trl_utils._use_triton = compact
        _APPLIED = True
    return True
