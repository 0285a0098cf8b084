"""A model behind an OpenAI-compatible chat-completions API (vLLM, SGLang, ``reterm serve``, any API).

Every request sends the conversation and :data:`reterm.agent.protocol.TOOLS`. The server may answer
in one of two ways, and both end as one raw text for the harness's parser, so every policy is parsed
the same way:

- raw text content holding the model's own tool-call markup (vLLM/SGLang without a tool-call parser,
  ``reterm serve``): used as is. This is the preferred set-up.
- structured ``tool_calls`` (OpenAI, vLLM with ``--enable-auto-tool-choice``): converted back into
  the model-native text form with :func:`reterm.agent.protocol.format_tool_call`: Qwen3.5's
  ``<tool_call><function=...>`` block when the model name names Qwen3.5, else Hermes JSON
  (``tool_call_format`` overrides). Arguments that are not valid JSON are embedded verbatim, so the
  parser reports them as ``malformed_json`` (the model's error, not the harness's).

A separate ``reasoning_content``/``reasoning`` field (vLLM/SGLang reasoning parsers) is put back in
front as ``<think>\\n...\\n</think>\\n\\n``.

Faults: connection errors, time-outs, HTTP 408/409/429 and 5xx are retried with exponential back-off
(``backoff_s * 2**attempt``, capped at ``max_backoff_s``, +0-25 % jitter); after ``max_retries``
retries, or at once for other errors (401 bad key, 404 unknown model, ...), :class:`EndpointError`
is raised: an infrastructure fault, never an agent failure. A 400 that says the prompt
exceeds the context length is not a fault: that conversation gets ``Generation(text="",
finish_reason="context_length")``, the same as :class:`~reterm.policies.transformers_policy.TransformersPolicy`.

Uses the ``openai`` client (its own retries off, so the back-off above is the only one).
"""

from __future__ import annotations

import json
import os
import random
import re
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

from reterm.policies.base import FINISH_CONTEXT_LENGTH, EndpointError, Generation
from reterm.policies.sampling import SamplingParams
from reterm.tool_calls import format_tool_call

DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"  # vLLM's and `reterm serve`'s default

_CONTEXT_RE = re.compile(r"context length|context_length|maximum context|context window|too many tokens|prompt is too long",
                         re.IGNORECASE)  # fmt: skip
_QWEN3_5_RE = re.compile(r"qwen3[._-]?5", re.IGNORECASE)
_RETRY_STATUS = {408, 409, 429}


def api_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages in the strict OpenAI request shape: only ``role``, ``content``, ``tool_calls``
    (``arguments`` as JSON strings), ``tool_call_id`` and ``name`` (tool messages); empty
    ``tool_calls`` lists dropped (OpenAI rejects them).

    Tool-call ids are unique in the result (strict servers reject a history that repeats one): a
    call without an id, or with one an earlier call already used, gets ``call_<n>`` (``n`` counting
    the calls of the history), and the tool messages that answer it follow (by that id, else in order).
    """
    out = []
    seen: set[str] = set()
    n_calls = 0
    renamed: dict[str, str] = {}  # ids of the last assistant message's calls -> the ids sent
    unanswered: list[str] = []  # ids sent for the last assistant message, not yet answered
    for m in messages:
        msg: dict[str, Any] = {"role": m["role"], "content": m.get("content") if m.get("content") is not None else ""}
        if m.get("tool_calls"):
            calls = []
            renamed, unanswered = {}, []
            for call in m["tool_calls"]:
                fn = call.get("function", call)
                args = fn.get("arguments", {})
                given = call.get("id") or ""
                cid, k = given, n_calls
                while not cid or cid in seen:
                    cid, k = f"call_{k}", k + 1
                n_calls += 1
                seen.add(cid)
                renamed.setdefault(given, cid)
                unanswered.append(cid)
                calls.append({
                    "id": cid,
                    "type": "function",
                    "function": {"name": fn["name"], "arguments": args if isinstance(args, str) else json.dumps(args)},
                })  # fmt: skip
            msg["tool_calls"] = calls
        if m["role"] == "tool":
            given = m.get("tool_call_id") or ""
            cid = renamed.pop(given, None) if given in renamed else None
            if cid is None and unanswered and (not given or given not in seen):
                cid = unanswered[0]
            cid = cid or given
            if cid in unanswered:
                unanswered.remove(cid)
            if cid:
                msg["tool_call_id"] = cid
        elif m.get("tool_call_id"):
            msg["tool_call_id"] = m["tool_call_id"]
        if m["role"] == "tool" and m.get("name"):
            msg["name"] = m["name"]
        out.append(msg)
    return out


def tool_calls_to_text(
    content: str | None,
    tool_calls: list[dict[str, Any]],
    call_format: Literal["hermes", "qwen"] = "hermes",
    reasoning: str | None = None,
) -> str:
    """The model-native text of a structured reply (see the module docstring).

    Args:
        content: the reply's text content (may be ``None``).
        tool_calls: OpenAI-style calls (``{"function": {"name", "arguments"}}``, ``arguments`` a JSON
            string or a mapping).
        call_format: ``"hermes"`` (JSON in ``<tool_call>``) or ``"qwen"`` (Qwen3.5's XML-style call).
        reasoning: a separately returned reasoning text, put back as a ``<think>`` block.

    Returns:
        ``[<think>\\nREASONING\\n</think>\\n\\n]CONTENT[SEP]CALL[\\nCALL...]`` with ``SEP`` as the
        format's chat template writes it (``\\n`` for ChatML/Hermes, ``\\n\\n`` for Qwen3.5).
    """

    calls = []
    for call in tool_calls:
        fn = call.get("function", call)
        name, args = fn.get("name") or "", fn.get("arguments")
        parsed: Any = args
        if isinstance(args, str):
            try:
                parsed = json.loads(args) if args.strip() else {}
            except ValueError:
                parsed = None
        if isinstance(parsed, dict):
            calls.append(format_tool_call(name, parsed, call_format))
        else:  # keep the model's broken arguments visible to the parser
            calls.append(f'<tool_call>\n{{"name": {json.dumps(name)}, "arguments": {args}}}\n</tool_call>')
    text = (content or "").strip()
    if calls:  # separators as the templates render them: ChatML "\n", Qwen3.5 "\n\n" after the content
        text = (text + ("\n\n" if call_format == "qwen" else "\n") if text else "") + "\n".join(calls)
    if reasoning:
        text = f"<think>\n{reasoning.strip()}\n</think>\n\n{text}"
    return text


class EndpointPolicy:
    """A :class:`~reterm.policies.base.Policy` over an OpenAI-compatible ``/v1/chat/completions``.

    Args:
        model: the served model name (vLLM's ``--served-model-name``, ``reterm serve``'s name, ...).
        base_url: the API root ending in ``/v1``; default ``$OPENAI_BASE_URL``, else
            ``http://127.0.0.1:8000/v1``.
        api_key_env: name of the environment variable holding the API key (never the key itself);
            ``"EMPTY"`` is sent when it is unset (local servers ignore it).
        sampling / temperature / top_p / max_new_tokens / seed: as :class:`SamplingParams`
            (``max_new_tokens`` is sent as ``max_completion_tokens``).
        tool_call_format: how structured tool calls are turned into text: ``"auto"`` (Qwen3.5's form
            when the model name matches ``qwen3.5``/``qwen3_5``, else Hermes JSON), ``"hermes"``, ``"qwen"``.
        return_logprobs: request ``logprobs`` and fill :attr:`Generation.logprobs`.
        extra_body: extra request fields for server extensions (e.g. vLLM's
            ``{"chat_template_kwargs": {"enable_thinking": False}, "top_k": 20, "return_token_ids": True}``).
        max_retries / backoff_s / max_backoff_s: retry policy for transient faults (see module docstring).
        timeout_s: per-request time-out in seconds (a time-out is retried).
        max_concurrency: requests in flight at once for one batch (servers batch them).
        name: the policy's name in trajectories; default ``openai:<model>``.
    """

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key_env: str = "OPENAI_API_KEY",
        sampling: SamplingParams | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        max_new_tokens: int | None = None,
        seed: int | None = None,
        tool_call_format: Literal["auto", "hermes", "qwen"] = "auto",
        return_logprobs: bool = False,
        extra_body: dict[str, Any] | None = None,
        max_retries: int = 5,
        backoff_s: float = 1.0,
        max_backoff_s: float = 30.0,
        timeout_s: float = 600.0,
        max_concurrency: int = 16,
        name: str | None = None,
    ) -> None:
        import openai

        if not model:
            raise ValueError("EndpointPolicy: `model` (the served model name) is required")
        if tool_call_format not in ("auto", "hermes", "qwen"):
            raise ValueError(f"tool_call_format must be 'auto', 'hermes' or 'qwen', got {tool_call_format!r}")
        self.sampling = SamplingParams.merged(sampling, temperature=temperature, top_p=top_p,
                                              max_new_tokens=max_new_tokens, seed=seed)
        self.model = model
        self.name = name or f"openai:{model}"
        self.base_url = base_url or os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL
        self.call_format: Literal["hermes", "qwen"] = (
            ("qwen" if _QWEN3_5_RE.search(model) else "hermes") if tool_call_format == "auto" else tool_call_format
        )
        self.return_logprobs = return_logprobs
        self.extra_body = dict(extra_body or {})
        self.max_retries, self.backoff_s, self.max_backoff_s = max_retries, backoff_s, max_backoff_s
        self.max_concurrency = max(1, max_concurrency)
        self.retries = 0  # transient faults retried so far (for reports)
        self._client = openai.OpenAI(
            base_url=self.base_url, api_key=os.environ.get(api_key_env) or "EMPTY", max_retries=0, timeout=timeout_s
        )

    def generate(self, batch: list[list[dict[str, Any]]], tools: list[dict[str, Any]]) -> list[Generation]:
        """One request per conversation, sent concurrently; results in batch order.

        Returns:
            ``len(batch)`` :class:`Generation` (``text`` as described in the module docstring;
            token counts from the response's ``usage``; ``token_ids`` when the server returns them,
            e.g. vLLM with ``return_token_ids``).

        Raises:
            EndpointError: a request still failed after the retries, or failed with a non-retryable
                error; the message names the base URL, the model and the last error.
        """
        if len(batch) <= 1 or self.max_concurrency == 1:
            return [self._one(messages, tools) for messages in batch]
        with ThreadPoolExecutor(max_workers=min(len(batch), self.max_concurrency)) as pool:
            return list(pool.map(lambda m: self._one(m, tools), batch))

    # ------------------------------------------------------------------------------ requests
    def _request(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> dict[str, Any]:
        s = self.sampling
        kwargs: dict[str, Any] = {
            "model": self.model,
            "messages": api_messages(messages),
            "temperature": s.temperature,
            "max_completion_tokens": s.max_new_tokens,
        }
        if tools:
            kwargs["tools"] = tools
        if not s.greedy:
            kwargs["top_p"] = s.top_p
        if s.seed is not None:
            kwargs["seed"] = s.seed
        if self.return_logprobs:
            kwargs["logprobs"] = True
        if self.extra_body:
            kwargs["extra_body"] = self.extra_body
        return kwargs

    def _one(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Generation:
        import openai

        kwargs = self._request(messages, tools)
        attempt = 0
        while True:
            try:
                response = self._client.chat.completions.create(**kwargs)
                return self._to_generation(response)
            except openai.APIStatusError as exc:
                status = exc.status_code
                if status == 400 and _CONTEXT_RE.search(str(exc)):
                    return Generation(text="", completion_tokens=0, finish_reason=FINISH_CONTEXT_LENGTH,
                                      extra={"error": str(exc)[:500]})  # fmt: skip
                if not (status in _RETRY_STATUS or status >= 500):
                    raise EndpointError(f"{self.base_url} model {self.model!r}: HTTP {status}: {exc}") from exc
                last: Exception = exc
            except (openai.APIConnectionError, openai.APIResponseValidationError) as exc:  # incl. time-outs
                last = exc
            if attempt >= self.max_retries:
                raise EndpointError(
                    f"{self.base_url} model {self.model!r}: failed after {attempt + 1} attempts: "
                    f"{type(last).__name__}: {last}"
                ) from last
            delay = min(self.max_backoff_s, self.backoff_s * 2**attempt) * (1 + 0.25 * random.random())
            attempt += 1
            self.retries += 1
            time.sleep(delay)

    def _to_generation(self, response: Any) -> Generation:
        if not response.choices:
            raise EndpointError(f"{self.base_url} model {self.model!r}: response without choices")
        choice = response.choices[0]
        message = choice.message
        extra = message.model_extra or {}
        reasoning = extra.get("reasoning_content") or extra.get("reasoning")
        calls = [c.model_dump() for c in (message.tool_calls or [])]
        if calls or reasoning:
            text = tool_calls_to_text(message.content, calls, self.call_format, reasoning)
        else:
            text = message.content or ""
        logprobs = None
        if choice.logprobs is not None and choice.logprobs.content is not None:
            logprobs = [t.logprob for t in choice.logprobs.content]
        token_ids = (choice.model_extra or {}).get("token_ids")
        usage = response.usage
        return Generation(
            text=text,
            prompt_tokens=usage.prompt_tokens if usage else None,
            completion_tokens=usage.completion_tokens if usage else None,
            token_ids=list(token_ids) if isinstance(token_ids, list) else None,
            logprobs=logprobs,
            finish_reason=choice.finish_reason,
            extra={"structured_tool_calls": len(calls)} if calls else {},
        )

    def __repr__(self) -> str:
        return f"EndpointPolicy(name={self.name!r}, base_url={self.base_url!r})"
