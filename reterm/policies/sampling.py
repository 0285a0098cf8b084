"""Sampling parameters shared by every generating policy (local transformers model, endpoint, server)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SamplingParams:
    """How a policy samples one assistant turn.

    Attributes:
        temperature: softmax temperature; ``0`` means greedy decoding. Default 0.7 (Qwen3.5's
            recommendation for non-thinking use is 0.7, for thinking 0.6).
        top_p: nucleus sampling mass in ``(0, 1]``; ignored when greedy.
        max_new_tokens: at most this many generated tokens per turn (end-of-turn token included).
        seed: seeds torch's generator once when the policy is built (local models) or is sent with
            every request (endpoints that support it); ``None`` leaves sampling unseeded.

    Raises:
        ValueError: a value out of range (named in the message).
    """

    temperature: float = 0.7
    top_p: float = 0.95
    max_new_tokens: int = 512
    seed: int | None = None

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature!r}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if int(self.max_new_tokens) < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens!r}")

    @property
    def greedy(self) -> bool:
        """True when decoding is greedy (``temperature == 0``)."""
        return self.temperature == 0

    @classmethod
    def merged(cls, base: "SamplingParams | None" = None, **overrides: float | int | None) -> "SamplingParams":
        """``base`` (or the defaults) with every override that is not ``None`` applied.

        Policies take both a ``sampling=SamplingParams(...)`` and single keywords (``temperature=0.2``);
        the keywords win. Raises ``ValueError`` for a value out of range or ``TypeError`` for an unknown name.
        """
        values = dict(base.__dict__) if base else {}
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)
