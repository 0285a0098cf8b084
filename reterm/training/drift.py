"""How far a LoRA GRPO run moved the policy from where it started: KL to the start on the run's own attempts.

GRPO in this kit runs with ``beta: 0`` (no KL term, no reference model in the loss), so TRL logs no KL. Whether a
run changed the model at all (issue 30: "GRPO runs end where SFT ended") is measured after training on the
attempts the run itself generated: for each of the last ``max_attempts`` attempts in ``rollouts/``, the
log-probabilities of its assistant tokens under the trained policy (adapter on) and under the start (the same
model with the adapter disabled: the SFT checkpoint GRPO started from). With ``r = log p_start - log p_trained``
per token, two estimators of KL(trained || start) per token (Schulman, "Approximating KL divergence", 2020):
``k1 = mean(-r)`` (unbiased, can be negative) and ``k3 = mean(exp(r) - 1 - r)`` (unbiased, never negative). The
attempts were sampled from the policy while it trained, so they approximate samples of the trained policy.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from reterm.policies.transformers_policy import template_messages
from reterm.training.grpo_outputs import read_rollout_file
from reterm.trajectory import Trajectory


def last_attempts(rollouts: str | Path, max_attempts: int) -> list[Trajectory]:
    """The trajectories of the last ``max_attempts`` attempts (by step, then file order) in a run's rollouts
    folder; attempts without a trajectory (dropped groups, infrastructure faults) are left out."""
    rows = []
    for path in sorted(Path(rollouts).glob("*.jsonl")):
        rows += [r for r in read_rollout_file(path) if r.get("trajectory")]
    rows.sort(key=lambda r: (r["step"], r["round"]))
    return [Trajectory.model_validate(r["trajectory"]) for r in rows[-max_attempts:]]


def kl_to_start(model: Any, tokenizer: Any, trajectories: list[Trajectory], *, tools: list[dict[str, Any]],
                chat_template: str | None = None, chat_template_kwargs: dict[str, Any] | None = None,
                bf16: bool = False) -> dict[str, Any]:  # fmt: skip
    """Per-token KL between a PEFT model with its adapter (the trained policy) and without it (the start), on the
    assistant tokens of ``trajectories`` (see the module docstring).

    Args:
        model: a ``peft.PeftModel`` (``disable_adapter()`` gives the start).
        tokenizer: its tokenizer; ``chat_template``: the template with ``{% generation %}`` markers (TRL's
            training template; ``None``: the tokenizer's own).
        trajectories: the attempts (``Trajectory.to_messages()`` is what the model saw and wrote).
        tools: the tool schemas rendered in the system block.
        bf16: run the forwards under CPU/GPU bf16 autocast (as the run did).

    Returns:
        ``{"kl_k1", "kl_k3", "tokens", "attempts"}`` (nats per assistant token; NaN with no token).

    Raises:
        TypeError: ``model`` has no ``disable_adapter`` (full fine-tuning keeps no start to compare with).
    """
    import torch

    if not hasattr(model, "disable_adapter"):
        raise TypeError("kl_to_start needs a PEFT model (its adapter disabled is the start)")
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    k1 = k3 = 0.0
    n = 0
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16)

    def logprobs(ids: Any) -> Any:
        logits = model(input_ids=ids).logits[0, :-1].float()
        return logits.log_softmax(-1).gather(-1, ids[0, 1:, None])[:, 0]

    try:
        for traj in trajectories:
            enc = tokenizer.apply_chat_template(template_messages(traj.to_messages()), tools=tools, tokenize=True,
                                                chat_template=chat_template, return_dict=True,
                                                return_assistant_tokens_mask=True, **(chat_template_kwargs or {}))  # fmt: skip
            mask = torch.tensor(enc["assistant_masks"][1:], dtype=torch.bool, device=device)
            if not mask.any():
                continue
            ids = torch.tensor([enc["input_ids"]], device=device)
            with torch.no_grad(), autocast:
                new = logprobs(ids)
                with model.disable_adapter():
                    start = logprobs(ids)
            r = (start - new)[mask].double()
            k1 += float((-r).sum())
            k3 += float((r.exp() - 1 - r).sum())
            n += int(mask.sum())
    finally:
        model.train(was_training)
    return {"kl_k1": k1 / n if n else math.nan, "kl_k3": k3 / n if n else math.nan, "tokens": n,
            "attempts": len(trajectories)}  # fmt: skip
