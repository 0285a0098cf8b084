"""The policy interface: what the episode loop asks of a model.

A policy turns a batch of conversations (OpenAI-style chat messages, see
:meth:`reterm.trajectory.Trajectory.to_messages`) plus the tool schemas of
:mod:`reterm.agent.protocol` into one raw assistant text per conversation. Parsing that text into an
action is the harness's job (:func:`reterm.agent.protocol.parse_action`), never the policy's, so every
policy is parsed the same way.

Batching: the episode loop runs several episodes in lock-step (a GRPO group, a recovery fan-out) and
asks for all their next turns in one call, so a local model generates them as one batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

FINISH_CONTEXT_LENGTH = "context_length"
"""``Generation.finish_reason`` of a conversation too long for the model's context (nothing generated).
The episode loop ends that episode as an agent failure (the agent's conversation outgrew its model),
never as an infrastructure fault."""


class EndpointError(RuntimeError):
    """The model server failed (after retries). An infrastructure fault, never an agent failure."""


@dataclass
class Generation:
    """One generated assistant turn.

    ``text`` is the raw text as the model wrote it (tool-call markup included, template's end-of-turn
    token excluded). Token counts are ``None`` when the backend does not report them.
    ``token_ids``/``logprobs`` are filled by backends that can (used by GRPO and Harbor rollout details).
    ``finish_reason``: ``"stop"`` (end of turn), ``"length"`` (token limit), :data:`FINISH_CONTEXT_LENGTH`
    (the prompt left no room in the model's context: ``text`` is empty, nothing was generated), or the
    server's own value for endpoints.
    """

    text: str
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    finish_reason: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Policy(Protocol):
    """Anything that can write the next assistant turn for a batch of conversations.

    ``generate(batch, tools)`` takes ``len(batch)`` message lists and returns as many
    :class:`Generation` in the same order. It raises :class:`EndpointError` for a backend fault.
    ``name`` identifies the policy in trajectories and reports.
    """

    name: str

    def generate(self, batch: list[list[dict[str, Any]]], tools: list[dict[str, Any]]) -> list[Generation]: ...
