"""``reterm serve MODEL``: a local model behind an OpenAI-compatible chat-completions API.

So that Harbor's own agents (Terminus-2 through litellm's ``hosted_vllm/NAME``) and any OpenAI client
can use a model of this kit (the embedded SmolLM2, a trained checkpoint, a PEFT adapter) with the same
prompt rendering as ReTerm's harness: generation goes through
:class:`~reterm.policies.transformers_policy.TransformersPolicy`.

Why not ``transformers serve`` (transformers 5.24's CLI; tried here offline on the embedded model's
folder, where it loads and answers ``/v1/chat/completions`` with tools): it pins the served model to
its path and refuses requests whose ``model`` differs, while Harbor's ``hosted_vllm/NAME`` needs a NAME
of letters, digits, ``.-_`` only (``harbor.llms.utils.validate_hosted_vllm_model_config``), so
Terminus-2 cannot address a local folder; it ignores ``logprobs`` and has no ``return_token_ids``
(Harbor's ``collect_rollout_details`` needs both); it silently ignores ``n``; it drops an assistant
message's text when the message has tool calls (our histories keep reasoning there); and it cannot
load a Qwen3.5 checkpoint text-only or apply a PEFT adapter. This server is small and written for the
kit; it uses FastAPI and uvicorn (installed with gradio).

API (the subset agents use, vLLM-compatible where OpenAI's is silent):
- ``GET /health`` (``status`` plus counts of requests, conversations and generate batches), ``GET /v1/models``.
- ``POST /v1/chat/completions``: ``messages``, ``tools`` (rendered by the chat template), ``tool_choice``
  (``"auto"``, the default, or ``"none"``: the tools are left out of the prompt and the reply is plain
  text; ``"required"`` and named functions are refused with a 400, as the reply cannot be forced),
  ``temperature``, ``top_p``, ``max_completion_tokens``/``max_tokens``, ``n``, ``logprobs``,
  ``stream`` (with ``stream_options.include_usage``), ``chat_template_kwargs`` and ``return_token_ids``
  (vLLM extensions: the response then has ``prompt_token_ids`` and each choice ``token_ids``). ``model``
  must be the served name (``/v1/models``; ``--served-model-name``): any other is answered with 404
  ``model_not_found``, as vLLM and OpenAI do. Roles are :data:`ROLES`; any other is a 400.
  ``seed`` is ignored (requests share batches).
- Tool calls: when the request offers tools, each reply is read with the kit's own parser
  (:func:`reterm.agent.protocol.parse_action`, Hermes JSON and Qwen3.5 calls). A reply that holds a
  valid call of an offered tool comes back as ``message.tool_calls`` (one call, a unique ``call_...``
  id, ``arguments`` a JSON string; the protocol runs one call per turn, so only the first of several
  calls is returned), ``content`` = the text outside the call (``None`` when empty) and
  ``finish_reason: "tool_calls"``. Any other reply (prose, a malformed call, a tool the request did
  not offer) is returned as text content with the model's own ``finish_reason``.
- Streaming (``stream: true``): server-sent events in the OpenAI chunk shape, sent while the reply is
  generated. Per choice a role chunk, then a content delta as each token is decoded (text that could still
  change is held back: an incomplete UTF-8 character; with tools offered, whitespace at the end and
  everything from a ``<``, where a tool call may begin), then at the end the rest of the reply's ``content``,
  a ``tool_calls`` delta when the reply is a tool call (as in the non-streamed response), and a finish chunk
  (with the choice's ``logprobs`` when asked); an optional usage chunk; ``data: [DONE]``. The concatenated
  content deltas equal the non-streamed ``message.content`` of the same greedy request in float32 (both decode
  through the same loop; in bf16 a second call that reuses the first one's stored prompt states reads the prompt
  in other matrix shapes, and the rounding can part two greedy replies at a near-tie). A streamed request is
  generated in a batch of its own (its ``n`` choices together). A policy without a ``streamer`` attribute (a
  scripted one) is generated whole, then sent in the same shape.
- Errors use OpenAI's shape ``{"error": {"message", "type", "param", "code"}}``. A prompt longer than
  the context gets vLLM's 400 "maximum context length" error.
- Requests that arrive within ``--batch-wait-ms`` of each other and share sampling parameters and tools
  are generated as one batch (up to ``--max-batch`` conversations).

:class:`Server` serves any :class:`~reterm.policies.base.Policy` (a scripted one too); sampling,
logprobs and chat-template settings apply to policies that have them.
"""

import argparse
import asyncio
import json
import re
import sys
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from reterm.generation import MAX_TURN_TOKENS, TEMPERATURE, TOP_P
from reterm.policies import resolve_hf_model
from reterm.policies.base import FINISH_CONTEXT_LENGTH, Generation
from reterm.policies.sampling import SamplingParams
from reterm.policies.transformers_policy import TransformersPolicy
from reterm.tool_calls import parse_action

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
MAX_N = 16


def served_name(model: str) -> str:
    """A model name Harbor's ``hosted_vllm/NAME`` accepts (letters, digits, ``.-_``; under 64 chars):
    ``smollm2`` for the embedded model, else the last path component with other characters as ``-``."""
    base = Path(model.rstrip("/")).name or "model"
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", base).strip("-") or "model"
    return name[:63]


ROLES = ("system", "developer", "user", "assistant", "tool")
"""Message roles a request may use (OpenAI's chat roles; ``developer`` is rendered as ``system``). Any other
role is refused with a 400, as vLLM does."""


class RequestError(ValueError):
    """A bad request, answered with HTTP ``status`` (400, or 404 for an unknown model) in OpenAI's error shape;
    ``param`` names the offending request field and ``code`` is OpenAI's error code (``model_not_found``...)."""

    def __init__(self, message: str, param: str | None = None, status: int = 400, code: str | None = None) -> None:
        super().__init__(message)
        self.param, self.status, self.code = param, status, code


def tool_call_message(text: str, tools: list[dict[str, Any]] | None) -> tuple[dict[str, Any], bool]:
    """The OpenAI ``message`` for one reply text, and whether it holds a tool call.

    With ``tools`` (the request's tool schemas), ``text`` is parsed with
    :func:`reterm.agent.protocol.parse_action`; a valid call of a tool named in ``tools`` becomes
    ``tool_calls=[{"id": "call_<24 hex>", "type": "function", "function": {"name", "arguments"}}]``
    (``arguments`` a JSON string) with ``content`` = the text outside the call or ``None``. Otherwise
    (no tools, no valid call, a tool not offered) ``content`` is ``text`` and ``tool_calls`` is ``None``.
    """

    plain = {"role": "assistant", "content": text, "tool_calls": None}
    if not tools:
        return plain, False
    offered = {(t.get("function") or t).get("name") for t in tools if isinstance(t, dict)}
    parsed = parse_action(text)
    if not parsed.ok or parsed.action is None or parsed.action.tool not in offered:
        return plain, False
    action = parsed.action
    args: dict[str, Any] = {}
    if action.tool == "bash":
        args["command"] = action.command or ""
        if action.timeout is not None:
            args["timeout"] = action.timeout
    call = {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": action.tool, "arguments": json.dumps(args, ensure_ascii=False)}}  # fmt: skip
    return {"role": "assistant", "content": parsed.message_content or None, "tool_calls": [call]}, True


@dataclass
class _Job:
    key: tuple
    sampling: SamplingParams
    logprobs: bool
    template_kwargs: dict[str, Any]
    tools: list[dict[str, Any]] | None
    conversations: list[list[dict[str, Any]]]
    future: asyncio.Future = field(repr=False)
    stream: "asyncio.Queue | None" = field(default=None, repr=False)  # (row, token id) events, None at the end


class _QueueStreamer:
    """A transformers streamer that hands each generated token to an event loop's queue as ``(row, token id)``.

    ``generate`` calls :meth:`put` with the prompt ids ``(B, W)`` first, then with each step's tokens ``(B,)``,
    then :meth:`end`. Rows are numbered across successive ``generate`` calls of one request (a policy that
    splits a batch into chunks), so row ``k`` is the request's choice ``k``. Called from the generation
    thread; the queue is filled through ``loop.call_soon_threadsafe``.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue) -> None:
        self.loop, self.queue = loop, queue
        self.offset, self.rows = 0, 0

    def put(self, value: Any) -> None:
        """Take one ``generate`` call's prompt (2-D: a new call starts) or one step's tokens (1-D)."""
        if value.dim() == 2:
            self.offset, self.rows = self.offset + self.rows, int(value.shape[0])
            return
        for row, tid in enumerate(value.tolist()):
            self.loop.call_soon_threadsafe(self.queue.put_nowait, (self.offset + row, int(tid)))

    def end(self) -> None:
        """The end of one ``generate`` call (the request's end is signalled by the server)."""


class _RowText:
    """One streamed choice: its token ids up to the first stop token, and how much of its text was sent."""

    def __init__(self, tokenizer: Any, stops: set[int], tools: bool) -> None:
        self.tokenizer, self.stops, self.tools = tokenizer, stops, tools
        self.ids: list[int] = []
        self.ended = False
        self.sent = ""

    def add(self, tid: int) -> str:
        """Take one token; return the new text that can be sent now (``""`` when none)."""
        if self.ended:
            return ""
        if tid in self.stops:
            self.ended = True
            return ""
        self.ids.append(tid)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=False)
        if text.endswith("\ufffd"):  # an incomplete UTF-8 character
            return ""
        if self.tools:  # the content of a tool-call reply is the text outside the call, stripped
            cut = text.find("<")
            text = (text if cut < 0 else text[:cut]).strip()
        if not text.startswith(self.sent) or len(text) == len(self.sent):
            return ""
        delta, self.sent = text[len(self.sent):], text
        return delta


class Server:
    """The request batcher and the FastAPI app around one :class:`TransformersPolicy`.

    Args:
        policy: the loaded policy (its sampling/logprobs/template settings are set per batch).
        name: the served model name (reported by ``/v1/models`` and in responses).
        max_batch: at most this many conversations per generate call.
        batch_wait_s: how long the batcher waits for more requests after the first one.
    """

    def __init__(self, policy: Any, name: str, max_batch: int = 16, batch_wait_s: float = 0.01) -> None:
        self.policy, self.name = policy, name
        self.max_batch, self.batch_wait_s = max(1, max_batch), batch_wait_s
        self.default_sampling: SamplingParams = getattr(policy, "sampling", None) or SamplingParams()
        self.default_template_kwargs = dict(getattr(policy, "chat_template_kwargs", None) or {})
        self.stats = {"requests": 0, "conversations": 0, "batches": 0}
        self._queue: asyncio.Queue[_Job] | None = None
        self._worker: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # ----------------------------------------------------------------------------- batching
    async def _work(self) -> None:
        assert self._queue is not None
        while True:
            jobs = [await self._queue.get()]
            await asyncio.sleep(self.batch_wait_s)
            while not self._queue.empty():
                jobs.append(self._queue.get_nowait())
            while jobs:
                key = jobs[0].key
                group, rest, size = [], [], 0
                for job in jobs:
                    if job.key == key and (not group or size + len(job.conversations) <= self.max_batch):
                        group.append(job)
                        size += len(job.conversations)
                    else:
                        rest.append(job)
                jobs = rest
                try:
                    results = await asyncio.to_thread(self._generate, group)
                except Exception as exc:  # the error goes to every request of the group
                    for job in group:
                        if not job.future.done():
                            job.future.set_exception(exc)
                        if job.stream is not None:
                            job.stream.put_nowait(None)
                    continue
                for job in group:
                    out, results = results[: len(job.conversations)], results[len(job.conversations) :]
                    if not job.future.done():
                        job.future.set_result(out)
                    if job.stream is not None:  # after the tokens the generation thread queued
                        job.stream.put_nowait(None)

    def _generate(self, group: list[_Job]) -> list[Generation]:
        first = group[0]
        for attr, value in (("sampling", first.sampling), ("return_logprobs", first.logprobs),
                            ("chat_template_kwargs", first.template_kwargs)):  # fmt: skip
            if hasattr(self.policy, attr):
                setattr(self.policy, attr, value)
        batch = [conv for job in group for conv in job.conversations]
        self.stats["requests"] += len(group)
        self.stats["conversations"] += len(batch)
        self.stats["batches"] += 1
        if first.stream is None:
            return self.policy.generate(batch, first.tools or [])
        # a streamed request: its tokens go to its queue as they are generated. Early release (the KV cache
        # continuing unfinished rows in a new, smaller call) would renumber the rows, so it is off meanwhile.
        kv = getattr(self.policy, "kv_cache", None)
        release = getattr(kv, "early_release", None)
        self.policy.streamer = _QueueStreamer(self._loop, first.stream)
        if release is not None:
            kv.early_release = False
        try:
            return self.policy.generate(batch, first.tools or [])
        finally:
            self.policy.streamer = None
            if release is not None:
                kv.early_release = release

    async def submit(self, job: _Job) -> list[Generation]:
        """Queue a job and wait for its generations."""
        if self._queue is None:
            self._queue = asyncio.Queue()
            self._loop = asyncio.get_running_loop()
            self._worker = asyncio.create_task(self._work())
        await self._queue.put(job)
        return await job.future

    # ----------------------------------------------------------------------------- requests
    def parse(self, body: Any) -> _Job:
        """Validate a chat-completions request body into a job. Raises :class:`RequestError`."""
        if not isinstance(body, dict):
            raise RequestError("the request body must be a JSON object")
        stream_options = body.get("stream_options")
        if stream_options is not None and not isinstance(stream_options, dict):
            raise RequestError("`stream_options` must be an object", "stream_options")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) and "role" in m
                                                                      for m in messages):  # fmt: skip
            raise RequestError("`messages` must be a non-empty list of objects with a `role`", "messages")
        model = body.get("model")
        if model != self.name:
            raise RequestError(f"The model `{model}` does not exist (this server serves `{self.name}`).", "model",
                               status=404, code="model_not_found")  # fmt: skip
        for i, m in enumerate(messages):
            if m["role"] not in ROLES:
                raise RequestError(f"messages[{i}].role {m['role']!r} is not one of {', '.join(ROLES)}",
                                   f"messages.[{i}].role")  # fmt: skip
        messages = [{**m, "role": "system"} if m["role"] == "developer" else m for m in messages]
        n = body.get("n") or 1
        if not isinstance(n, int) or not 1 <= n <= MAX_N:
            raise RequestError(f"`n` must be an integer in [1, {MAX_N}], got {n!r}", "n")
        d = self.default_sampling
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or d.max_new_tokens
        try:
            sampling = replace(
                d,
                temperature=float(body["temperature"]) if body.get("temperature") is not None else d.temperature,
                top_p=float(body["top_p"]) if body.get("top_p") is not None else d.top_p,
                max_new_tokens=int(max_tokens),
            )
        except (TypeError, ValueError) as exc:
            raise RequestError(f"bad sampling parameter: {exc}") from exc
        tools = body.get("tools") or None
        if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
            raise RequestError("`tools` must be a list of tool objects", "tools")
        choice = body.get("tool_choice")
        if choice not in (None, "auto", "none"):
            raise RequestError(f"tool_choice {json.dumps(choice)} is not supported by reterm serve (a reply cannot "
                               "be forced to call a tool); send \"auto\" or \"none\"", "tool_choice")  # fmt: skip
        if choice == "none":
            tools = None
        template_kwargs = dict(self.default_template_kwargs)
        extra = body.get("chat_template_kwargs") or {}
        if not isinstance(extra, dict):
            raise RequestError("`chat_template_kwargs` must be an object", "chat_template_kwargs")
        template_kwargs.update(extra)
        logprobs = bool(body.get("logprobs"))
        stream = None
        if body.get("stream") and hasattr(self.policy, "streamer"):
            stream = asyncio.Queue()
        key = (sampling, logprobs, json.dumps(template_kwargs, sort_keys=True), json.dumps(tools, sort_keys=True),
               id(stream) if stream is not None else None)  # a streamed request is a batch of its own
        loop = asyncio.get_running_loop()
        return _Job(key, sampling, logprobs, template_kwargs, tools, [messages] * n, loop.create_future(), stream)

    def response(self, body: dict[str, Any], generations: list[Generation],
                 tools: list[dict[str, Any]] | None = None) -> dict[str, Any]:  # fmt: skip
        """The ChatCompletion JSON for a request's generations (``tools``: the tools the prompt offered;
        see :func:`tool_call_message`)."""
        tok = getattr(self.policy, "tokenizer", None)
        want_ids = bool(body.get("return_token_ids"))
        choices = []
        for i, g in enumerate(generations):
            message, called = tool_call_message(g.text, tools)
            choice: dict[str, Any] = {
                "index": i,
                "message": message,
                "finish_reason": "tool_calls" if called else g.finish_reason,
                "logprobs": None,
            }
            if g.logprobs is not None and g.token_ids is not None and tok is not None:
                content = []
                for tid, lp in zip(g.token_ids, g.logprobs):
                    piece = tok.decode([tid], skip_special_tokens=False)
                    content.append({"token": piece, "logprob": lp, "bytes": list(piece.encode()), "top_logprobs": []})
                choice["logprobs"] = {"content": content}
            if want_ids:
                choice["token_ids"] = g.token_ids
            choices.append(choice)
        prompt_tokens = generations[0].prompt_tokens or 0
        completion = sum(g.completion_tokens or 0 for g in generations)
        out: dict[str, Any] = {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.name,
            "choices": choices,
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
                      "total_tokens": prompt_tokens + completion},  # fmt: skip
        }
        if want_ids:
            out["prompt_token_ids"] = generations[0].extra.get("prompt_token_ids")
        return out

    @staticmethod
    def stream_chunks(completion: dict[str, Any], include_usage: bool = False) -> list[dict[str, Any]]:
        """A whole ChatCompletion as the ``chat.completion.chunk`` objects of a stream: per choice a role
        chunk, a content and/or tool-call delta (each call with its ``index``), a finish chunk; then,
        with ``include_usage``, a chunk without choices carrying ``usage``."""
        head = {"id": completion["id"], "object": "chat.completion.chunk", "created": completion["created"],
                "model": completion["model"]}  # fmt: skip
        chunks: list[dict[str, Any]] = []
        for choice in completion["choices"]:
            i, message = choice["index"], choice["message"]
            chunks.append({**head, "choices": [{"index": i, "delta": {"role": "assistant", "content": ""},
                                                "logprobs": None, "finish_reason": None}]})  # fmt: skip
            delta: dict[str, Any] = {}
            if message.get("content"):
                delta["content"] = message["content"]
            if message.get("tool_calls"):
                delta["tool_calls"] = [{"index": k, **call} for k, call in enumerate(message["tool_calls"])]
            if delta:
                chunks.append({**head, "choices": [{"index": i, "delta": delta, "logprobs": choice.get("logprobs"),
                                                    "finish_reason": None}]})  # fmt: skip
            chunks.append({**head, "choices": [{"index": i, "delta": {}, "logprobs": None,
                                                "finish_reason": choice["finish_reason"]}]})  # fmt: skip
        if include_usage:
            chunks.append({**head, "choices": [], "usage": completion["usage"]})
        return chunks

    async def token_events(self, body: dict[str, Any], job: _Job, first: Any):
        """The server-sent events of a streamed request while it is generated (see the module's Streaming).

        ``first`` is the job's first queue item, already read (the caller waits for it to tell an error, sent as
        a plain JSON response, from a stream). Yields ``data: ...`` lines; the last is ``data: [DONE]``.
        """
        assert job.stream is not None
        created, cid = int(time.time()), f"chatcmpl-{uuid.uuid4().hex}"
        head = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": self.name}

        def event(choices: list[dict[str, Any]], **extra: Any) -> str:
            return f"data: {json.dumps({**head, 'choices': choices, **extra})}\n\n"

        def delta(i: int, d: dict[str, Any], finish: str | None = None, logprobs: Any = None) -> str:
            return event([{"index": i, "delta": d, "logprobs": logprobs, "finish_reason": finish}])

        stops = set(getattr(self.policy, "stop_token_ids", None) or [])
        rows = [_RowText(self.policy.tokenizer, stops, bool(job.tools)) for _ in job.conversations]
        for i in range(len(rows)):
            yield delta(i, {"role": "assistant", "content": ""})
        item = first
        while item is not None:
            row, tid = item
            if row < len(rows) and (text := rows[row].add(tid)):
                yield delta(row, {"content": text})
            item = await job.stream.get()
        try:
            generations = await job.future
        except Exception as exc:  # the stream has begun: the error is its last event
            yield f"data: {json.dumps({'error': {'message': f'{type(exc).__name__}: {exc}', 'type': 'server_error'}})}\n\n"
            return
        completion = self.response(body, generations, job.tools)
        for choice, row in zip(completion["choices"], rows):
            i, message = choice["index"], choice["message"]
            content = message.get("content") or ""
            if content.startswith(row.sent) and len(content) > len(row.sent):
                yield delta(i, {"content": content[len(row.sent):]})
            if message.get("tool_calls"):
                calls = [{"index": k, **call} for k, call in enumerate(message["tool_calls"])]
                yield delta(i, {"tool_calls": calls})
            yield delta(i, {}, choice["finish_reason"], choice.get("logprobs"))
        if (body.get("stream_options") or {}).get("include_usage"):
            yield event([], usage=completion["usage"])
        yield "data: [DONE]\n\n"

    def app(self):
        """The FastAPI application."""
        from fastapi import FastAPI, Request
        from fastapi.responses import JSONResponse, StreamingResponse

        app = FastAPI(title="reterm serve", version="1")

        def error(status: int, message: str, kind: str = "invalid_request_error", param: str | None = None,
                  code: str | int | None = None):
            return JSONResponse({"error": {"message": message, "type": kind, "param": param,
                                           "code": status if code is None else code}},
                                status_code=status)  # fmt: skip

        @app.get("/health")
        async def health() -> dict[str, Any]:
            return {"status": "ok", **self.stats}

        @app.get("/v1/models")
        async def models() -> dict[str, Any]:
            return {"object": "list", "data": [{"id": self.name, "object": "model", "created": 0, "owned_by": "reterm",
                                                "max_model_len": getattr(self.policy, "max_context", None)}]}  # fmt: skip

        @app.post("/v1/chat/completions")
        async def chat(request: Request):
            try:
                body = await request.json()
            except ValueError:
                return error(400, "the request body is not JSON")
            try:
                job = self.parse(body)
                if job.stream is not None:
                    waiting = asyncio.ensure_future(self.submit(job))
                    first = await job.stream.get()  # a first token, or the end (then an error is answered whole)
                    if first is not None:
                        return StreamingResponse(self.token_events(body, job, first), media_type="text/event-stream")
                    generations = await waiting
                else:
                    generations = await self.submit(job)
            except RequestError as exc:
                return error(exc.status, str(exc), param=exc.param, code=exc.code)
            except (ValueError, TypeError, KeyError) as exc:
                return error(400, f"{type(exc).__name__}: {exc}")
            except Exception as exc:  # a fault of the server itself
                return error(500, f"{type(exc).__name__}: {exc}", "server_error")
            if generations and generations[0].finish_reason == FINISH_CONTEXT_LENGTH:
                return error(400, f"This model's maximum context length is {self.policy.max_context} tokens. "
                             f"However, your messages resulted in {generations[0].prompt_tokens} tokens.",
                             param="messages")  # fmt: skip
            completion = self.response(body, generations, job.tools)
            if not body.get("stream"):
                return completion
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            events = [f"data: {json.dumps(c)}\n\n" for c in self.stream_chunks(completion, include_usage)]
            events.append("data: [DONE]\n\n")
            return StreamingResponse(iter(events), media_type="text/event-stream")

        return app


def build_parser() -> argparse.ArgumentParser:
    """The ``reterm serve`` argument parser."""
    p = argparse.ArgumentParser(
        prog="reterm serve",
        description="Serve a local model behind an OpenAI-compatible /v1/chat/completions API "
        "(for Harbor's Terminus-2 via litellm hosted_vllm/NAME, or any OpenAI client).",
    )
    p.add_argument("model", help="'smollm2' (the embedded default), a local checkpoint folder written as a path "
                   "(/..., ./..., ~/...) or a Hub id (org/name); an 'hf:' prefix is accepted")  # fmt: skip
    p.add_argument("--host", default=DEFAULT_HOST, help=f"listen address (default {DEFAULT_HOST})")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"listen port (default {DEFAULT_PORT})")
    p.add_argument("--served-model-name", help="name reported to clients (default: derived from MODEL)")
    p.add_argument("--adapter", help="a PEFT adapter folder applied on top of MODEL")
    p.add_argument("--dtype", default="auto", help="auto (bf16 on a GPU or a CPU with bf16 instructions, else fp32), float32, bfloat16, float16")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1, ...")
    p.add_argument("--max-context", type=int, help="context length in tokens (default: the model's)")
    p.add_argument("--max-new-tokens", type=int, default=MAX_TURN_TOKENS,
                   help=f"default max tokens per reply (default {MAX_TURN_TOKENS}: reterm.generation, the evaluation's)")
    p.add_argument("--temperature", type=float, default=TEMPERATURE,
                   help=f"default temperature (default {TEMPERATURE:g}: greedy, as the evaluation)")
    p.add_argument("--top-p", type=float, default=TOP_P, help=f"default top_p (default {TOP_P})")
    p.add_argument("--enable-thinking", choices=["true", "false"], help="chat template's enable_thinking (Qwen3.5)")
    p.add_argument("--max-batch", type=int, default=16, help="most conversations per generate call (default 16)")
    p.add_argument("--batch-wait-ms", type=float, default=10.0, help="wait for more requests before a batch (ms)")
    p.add_argument("--log-level", default="warning", help="uvicorn log level (default warning)")
    return p


def main(argv: list[str] | None = None) -> int:
    """Load the model and serve it until interrupted. Returns the exit status."""
    args = build_parser().parse_args(argv)
    import uvicorn

    ref = args.model.strip().removeprefix("hf:")
    try:
        model = resolve_hf_model(ref)
    except ValueError as exc:
        print(f"reterm serve: {exc}", file=sys.stderr)
        return 2
    thinking = None if args.enable_thinking is None else args.enable_thinking == "true"
    print(f"[reterm serve] loading {model} ...", file=sys.stderr, flush=True)
    policy = TransformersPolicy(
        model, adapter=args.adapter, dtype=args.dtype, device=args.device, max_context=args.max_context,
        sampling=SamplingParams(temperature=args.temperature, top_p=args.top_p, max_new_tokens=args.max_new_tokens),
        enable_thinking=thinking,
    )  # fmt: skip
    name = args.served_model_name or served_name(ref)
    server = Server(policy, name, max_batch=args.max_batch, batch_wait_s=args.batch_wait_ms / 1000)
    base = f"http://{args.host}:{args.port}/v1"
    info = json.dumps({"max_input_tokens": policy.max_context, "max_output_tokens": args.max_new_tokens,
                       "input_cost_per_token": 0.0, "output_cost_per_token": 0.0})  # fmt: skip
    print(
        f"[reterm serve] {name} ({policy.model_path}, {policy.device}, {policy.dtype}) at {base}\n"
        f"  openai:  OpenAI(base_url='{base}', api_key='EMPTY').chat.completions.create(model='{name}', ...)\n"
        f"  reterm:  --policy openai:{name} (base_url={base})\n"
        f"  harbor:  -a terminus-2 -m hosted_vllm/{name} --ak api_base={base} --ak 'model_info={info}'",
        file=sys.stderr,
        flush=True,
    )
    uvicorn.run(server.app(), host=args.host, port=args.port, log_level=args.log_level)
    return 0


if __name__ == "__main__":
    sys.exit(main())
