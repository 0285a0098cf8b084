"""TRL's fused LM head made lean on CPUs (only labelled positions scored, small tiles): the same
log-probabilities and gradients as the full logits, on the tiny Qwen3.5."""

from __future__ import annotations

import copy

import torch

from reterm.tiny_qwen import build_tiny_qwen3_5
from reterm.training.lean import lean_fused_lm_head


def test_lean_fused_head_matches_full_logits():
    from transformers import AutoModelForCausalLM
    from trl.trainer.utils import add_fused_lm_head

    assert lean_fused_lm_head(token_tile=7, vocab_tile=300)  # tiny tiles: many of them, ragged edges
    from trl.trainer import utils as trl_utils

    assert trl_utils._use_triton(torch.device("cpu"))  # only labelled positions are scored on a CPU
    model = AutoModelForCausalLM.from_pretrained(build_tiny_qwen3_5(), dtype=torch.float32)
    fused = copy.deepcopy(model)
    add_fused_lm_head(fused, outputs=("log_probs", "entropy"))
    ids = torch.randint(0, model.config.vocab_size, (2, 40), generator=torch.Generator().manual_seed(0))
    labels = ids.clone()
    labels[:, :25] = -100  # a prompt without loss
    labels[1, 30:] = -100

    out = fused(input_ids=ids, labels=labels, fused_lm_head=True)
    logits = model(input_ids=ids).logits[:, :-1]
    target = labels[:, 1:]
    mask = target != -100
    ref = torch.log_softmax(logits, -1).gather(-1, target.clamp(min=0)[..., None])[..., 0] * mask
    assert torch.allclose(out.log_probs, ref, atol=1e-5)
    assert (out.log_probs[~mask] == 0).all() and (out.entropy[~mask] == 0).all()

    out.log_probs.sum().backward()
    ref.sum().backward()
    for (name, p), q in zip(fused.named_parameters(), model.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-5), name
