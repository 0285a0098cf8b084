"""The policy GRPO rollouts run through the harness: exact token ids per conversation, no re-tokenisation.

:func:`reterm.agent.episode.run_episodes` asks a policy for the next turn of every live conversation
(chat messages). For GRPO the loss must be computed on exactly the tokens the model sampled, conditioned
on exactly the tokens it saw, so :class:`TokenTrajectoryPolicy` keeps, per conversation (a *chain*):

- ``prompt_ids``: the history rendered once by the chat template (tools included, generation prompt);
- ``completion_ids``: every turn's **generated** ids (``env_mask`` 1; the end-of-turn token included when
  the model produced it) followed by the template-rendered tokens of the observation that answered it
  (``env_mask`` 0, no loss) and the next generation prompt; the next turn is generated from
  ``prompt_ids + completion_ids``, never from re-rendered text.

Observation tokens are rendered as TRL's ``GRPOTrainer._get_tool_suffix_ids`` does (TRL 1.16): the tokens a
prefix-preserving chat template adds after an assistant turn for the observation messages (a ``tool``
message after a tool call; a ``user`` message holding the parse-error correction after a reply without
one). A turn cut by the token limit gets the end-of-turn token appended with ``env_mask`` 0 (the model
did not write it) so that the conversation stays well-formed.

Generation is delegated to a ``generate_fn`` (the trainer's model through TRL's own generation path:
transformers or vLLM; or a scripted function in tests and benchmarks), so the harness, the parser and
the observation format are exactly those of the evaluation.

Written for this kit: TRL's tool loop renders tools as Python callables and runs rollouts one after
another; the kit's harness needs a :class:`reterm.policies.base.Policy`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from reterm.agent.protocol import TOOLS, step_messages
from reterm.policies.base import FINISH_CONTEXT_LENGTH, Generation
from reterm.policies.transformers_policy import template_messages
from reterm.trajectory import Trajectory


@dataclass
class GenerationRequest:
    """One conversation to continue: ``chain_id`` (stable for the conversation within a rollout),
    its chat ``messages`` and the exact ``token_ids`` to generate from."""

    chain_id: int
    messages: list[dict[str, Any]]
    token_ids: list[int]


GenerateFn = Callable[[list[GenerationRequest], int], list[tuple[list[int], list[float] | None]]]
"""``(requests, max_new_tokens) -> [(generated ids, their log-probabilities or None)]`` in order. Generated
ids end with an end-of-turn token when the model stopped by itself."""


@dataclass
class AttemptTokens:
    """The token sequences of one attempt, as TRL's ``rollout_func`` returns them.

    ``env_mask[i]`` is 1 for tokens the model generated and 0 for observation/template tokens;
    ``logprobs`` (same length as ``completion_ids``, 0.0 on observation tokens) or ``None``.
    ``exact``: the sequence is the chain the model was conditioned on (``False`` only when a
    conversation could not be matched to its chain and was re-assembled from its trajectory).
    """

    prompt_ids: list[int]
    completion_ids: list[int]
    env_mask: list[int]
    logprobs: list[float] | None
    exact: bool = True

    @property
    def generated_tokens(self) -> int:
        return sum(self.env_mask)


@dataclass
class _Chain:
    chain_id: int
    messages: list[dict[str, Any]]  # the conversation as of the last generate call
    prompt_ids: list[int]
    completion_ids: list[int] = field(default_factory=list)
    env_mask: list[int] = field(default_factory=list)
    logprobs: list[float] | None = field(default_factory=list)
    pending: list[int] = field(default_factory=list)  # observation tokens not yet followed by a generation
    segments: list[list[int]] = field(default_factory=list)  # generated ids per turn
    ended_with_eos: bool = True


class TokenTrajectoryPolicy:
    """A :class:`reterm.policies.base.Policy` that records exact token ids per conversation (see module doc).

    Args:
        tokenizer: the model's tokenizer (its ``eos_token_id`` must be the chat template's end-of-turn
            token, as for ChatML and Qwen3.5 templates).
        generate_fn: the generation backend (:data:`GenerateFn`).
        chat_template: the (prefix-preserving) template text; ``None``: the tokenizer's own.
        chat_template_kwargs: extra template variables (e.g. ``{"enable_thinking": False}``).
        tools: tool schemas rendered in the prompt (default :data:`reterm.agent.protocol.TOOLS`).
        max_turn_tokens: tokens generated per turn at most.
        max_completion_tokens: tokens of one conversation's completion (all turns and observations).
        max_context: prompt + completion tokens at most (the model's context).
        eos_token_ids: ids that end a turn (default: the tokenizer's EOS).
        name: the policy name written into trajectories.

    Raises:
        ValueError: the template is not prefix-preserving for observation messages (TRL's
            ``get_training_chat_template`` gives one that is).
    """

    def __init__(
        self,
        tokenizer: Any,
        generate_fn: GenerateFn,
        *,
        chat_template: str | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        tools: list[dict[str, Any]] | None = None,
        max_turn_tokens: int = 1024,
        max_completion_tokens: int = 4096,
        max_context: int = 32768,
        eos_token_ids: Sequence[int] | None = None,
        name: str = "grpo-policy",
    ) -> None:
        self.tokenizer, self.generate_fn = tokenizer, generate_fn
        self.chat_template = chat_template
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.tools = TOOLS if tools is None else tools
        self.max_turn_tokens, self.max_completion_tokens, self.max_context = max_turn_tokens, max_completion_tokens, max_context
        self.end_of_turn = tokenizer.eos_token_id
        if self.end_of_turn is None:
            raise ValueError("the tokenizer has no eos_token_id (the end-of-turn token of the chat template)")
        self.eos_token_ids = set(eos_token_ids or [self.end_of_turn]) | {self.end_of_turn}
        self.name = name
        template = chat_template or tokenizer.chat_template or ""
        self.call_format = "qwen" if "<function=" in template else "hermes"
        self._lock = threading.Lock()
        self.reset()
        self._check_suffixes()

    # ------------------------------------------------------------------------------ rendering
    def _render(self, messages: list[dict[str, Any]], *, generation_prompt: bool, tools: Any = None) -> list[int]:
        out = self.tokenizer.apply_chat_template(
            template_messages(messages), tools=tools or None, chat_template=self.chat_template,
            add_generation_prompt=generation_prompt, tokenize=True, return_dict=False, **self.chat_template_kwargs,
        )  # fmt: skip
        return list(out[0] if out and isinstance(out[0], list) else out)

    def prompt_ids(self, messages: list[dict[str, Any]]) -> list[int]:
        """Token ids of a conversation's first prompt (template with tools and the generation prompt)."""
        return self._render(messages, generation_prompt=True, tools=self.tools)

    def observation_ids(self, observation: list[dict[str, Any]], after_tool_call: bool) -> list[int]:
        """Tokens the template adds for ``observation`` messages after an assistant turn (from just after
        its end-of-turn token up to and including the next generation prompt), as TRL computes them."""
        if after_tool_call:
            call = {"type": "function", "function": {"name": observation[0].get("name") or "bash", "arguments": {}}}
            dummy = [{"role": "user", "content": "dummy"}, {"role": "assistant", "content": "", "tool_calls": [call]}]
        else:
            dummy = [{"role": "user", "content": "dummy"}, {"role": "assistant", "content": "dummy"}]
        prefix = self._render(dummy, generation_prompt=False)
        full = self._render(dummy + list(observation), generation_prompt=True)
        ends = [i for i, t in enumerate(prefix) if t == self.end_of_turn]
        if ends:
            prefix = prefix[: ends[-1] + 1]
        if full[: len(prefix)] != prefix:
            raise ValueError("the chat template is not prefix-preserving for observation messages; use TRL's "
                             "get_training_chat_template(tokenizer)")  # fmt: skip
        return full[len(prefix) :]

    def _check_suffixes(self) -> None:
        self.observation_ids([{"role": "tool", "name": "bash", "tool_call_id": "call_0", "content": "x"}], True)
        self.observation_ids([{"role": "user", "content": "x"}], False)

    # ------------------------------------------------------------------------------- chains
    def reset(self) -> None:
        """Forget every conversation (call before each rollout)."""
        with getattr(self, "_lock", threading.Lock()):
            self._chains: list[_Chain] = []
            self.errors: list[BaseException] = []
            self.generated_tokens = 0
            self.generation_s = 0.0

    def _match(self, messages: list[dict[str, Any]], used: set[int]) -> _Chain | None:
        """The chain this conversation continues: its last-seen messages are a strict prefix of
        ``messages`` followed by the assistant turn it generated (first unused one wins)."""
        for chain in self._chains:
            n = len(chain.messages)
            if chain.chain_id in used or n >= len(messages) or not chain.segments:
                continue
            if messages[n].get("role") == "assistant" and messages[:n] == chain.messages:
                return chain
        return None

    def generate(self, batch: list[list[dict[str, Any]]], tools: list[dict[str, Any]]) -> list[Generation]:
        """Next turn of every conversation (see :class:`reterm.policies.base.Policy`).

        Returns ``Generation`` with ``token_ids`` (the generated ids, end-of-turn token included when the
        model stopped) and ``finish_reason`` ``stop``/``length``, or :data:`FINISH_CONTEXT_LENGTH` with no
        text when the conversation's token budget (``max_completion_tokens``, ``max_context``) is spent.
        Exceptions of ``generate_fn`` are recorded in :attr:`errors` and re-raised (the harness turns
        them into infrastructure faults; the trainer raises them).
        """
        import time

        with self._lock:
            used: set[int] = set()
            chains: list[_Chain] = []
            for messages in batch:
                chain = self._match(messages, used)
                if chain is None:
                    chain = _Chain(chain_id=len(self._chains), messages=list(messages),
                                   prompt_ids=self.prompt_ids(messages))  # fmt: skip
                    self._chains.append(chain)
                else:
                    assistant = messages[len(chain.messages)]
                    observation = messages[len(chain.messages) + 1 :]
                    if not observation:
                        raise ValueError(f"conversation {chain.chain_id}: no observation after the assistant turn")
                    pending = [] if chain.ended_with_eos else [self.end_of_turn]
                    pending += self.observation_ids(observation, bool(assistant.get("tool_calls")))
                    chain.pending, chain.messages = pending, list(messages)
                used.add(chain.chain_id)
                chains.append(chain)

            budgets = []
            for chain in chains:
                used_tokens = len(chain.completion_ids) + len(chain.pending)
                budgets.append(min(self.max_turn_tokens, self.max_completion_tokens - used_tokens,
                                   self.max_context - len(chain.prompt_ids) - used_tokens))  # fmt: skip
            results: list[Generation | None] = [None] * len(batch)
            todo = [i for i, b in enumerate(budgets) if b > 0]
            for i, b in enumerate(budgets):
                if b <= 0:
                    results[i] = Generation(text="", prompt_tokens=len(chains[i].prompt_ids) + len(chains[i].completion_ids),
                                            completion_tokens=0, finish_reason=FINISH_CONTEXT_LENGTH)  # fmt: skip
            if todo:
                requests = [GenerationRequest(chains[i].chain_id, batch[i],
                                              chains[i].prompt_ids + chains[i].completion_ids + chains[i].pending)
                            for i in todo]  # fmt: skip
                t0 = time.monotonic()
                try:
                    outputs = self.generate_fn(requests, max(budgets[i] for i in todo))
                except BaseException as exc:
                    self.errors.append(exc)
                    raise
                self.generation_s += time.monotonic() - t0
                if len(outputs) != len(requests):
                    raise RuntimeError(f"generate_fn returned {len(outputs)} results for {len(requests)} requests")
                for i, (ids, lps) in zip(todo, outputs):
                    results[i] = self._extend(chains[i], list(ids), None if lps is None else list(lps), budgets[i])
            return [r for r in results if r is not None]

    def _extend(self, chain: _Chain, ids: list[int], lps: list[float] | None, budget: int) -> Generation:
        if len(ids) > budget:
            ids = ids[:budget]
            lps = lps[:budget] if lps is not None else None
        stopped = bool(ids) and ids[-1] in self.eos_token_ids
        n_before = len(chain.prompt_ids) + len(chain.completion_ids) + len(chain.pending)
        chain.completion_ids += chain.pending + ids
        chain.env_mask += [0] * len(chain.pending) + [1] * len(ids)
        if chain.logprobs is not None and lps is not None and len(lps) == len(ids):
            chain.logprobs += [0.0] * len(chain.pending) + lps
        else:
            chain.logprobs = None
        chain.pending = []
        chain.segments.append(ids)
        chain.ended_with_eos = stopped
        self.generated_tokens += len(ids)
        text = self.tokenizer.decode(ids[:-1] if stopped else ids, skip_special_tokens=False)
        return Generation(text=text, prompt_tokens=n_before, completion_tokens=len(ids), token_ids=ids,
                          logprobs=lps, finish_reason="stop" if stopped else "length")  # fmt: skip

    # ------------------------------------------------------------------------------ results
    def tokens_for(self, trajectories: Sequence[Trajectory]) -> list[AttemptTokens]:
        """The token sequences of finished attempts, one per trajectory, in order.

        Each trajectory is matched to the chain that generated it (same generated ids per turn, same
        conversation); trailing observation tokens with no generation after them are left out. An attempt
        that generated nothing (e.g. a sandbox fault before its first turn) gets its prompt and a single
        end-of-turn token with ``env_mask`` 0 (TRL needs a non-empty completion; it carries no loss).
        """
        taken: set[int] = set()
        out = []
        for traj in trajectories:
            segments = [list(s.extra.get("completion_token_ids") or []) for s in traj.steps[traj.prefix_len :]
                        if "completion_token_ids" in s.extra]  # fmt: skip
            messages = traj.to_messages()
            chain = next((c for c in self._chains if c.chain_id not in taken and c.segments == segments and segments
                          and messages[: len(c.messages)] == c.messages), None)  # fmt: skip
            if chain is not None:
                taken.add(chain.chain_id)
                out.append(AttemptTokens(list(chain.prompt_ids), list(chain.completion_ids), list(chain.env_mask),
                                         None if chain.logprobs is None else list(chain.logprobs)))  # fmt: skip
            else:
                out.append(self.assemble(traj))
        return out

    def assemble(self, traj: Trajectory) -> AttemptTokens:
        """Token sequences rebuilt from a trajectory's recorded generated ids and its observations (used
        when no chain matches; ``exact=False`` unless nothing was generated)."""
        prompt = self.prompt_ids(traj.to_messages(upto=traj.prefix_len))
        completion: list[int] = []
        mask: list[int] = []
        pending: list[int] = []
        generated = [s for s in traj.steps[traj.prefix_len :] if "completion_token_ids" in s.extra]

        for k, step in enumerate(generated):
            ids = list(step.extra["completion_token_ids"])
            completion += pending + ids
            mask += [0] * len(pending) + [1] * len(ids)
            obs = step_messages(step)[1:]
            pending = []
            if obs and k + 1 < len(generated):
                pending = ([] if ids and ids[-1] in self.eos_token_ids else [self.end_of_turn])
                pending += self.observation_ids(obs, step.action is not None)
        if not completion:
            return AttemptTokens(prompt, [self.end_of_turn], [0], None, exact=True)
        return AttemptTokens(prompt, completion, mask, None, exact=False)


def scripted_generate_fn(tokenizer: Any, reply: Callable[[int, list[dict[str, Any]]], str]) -> GenerateFn:
    """A :data:`GenerateFn` from a text function, for tests and benchmarks: ``reply(chain_id, messages)``
    gives the raw reply text, which is tokenised and ended with the end-of-turn token (no log-probs)."""

    def generate(requests: list[GenerationRequest], max_new_tokens: int) -> list[tuple[list[int], None]]:
        out = []
        for r in requests:
            ids = tokenizer.encode(reply(r.chain_id, r.messages), add_special_tokens=False) + [tokenizer.eos_token_id]
            out.append((ids, None))
        return out

    return generate
