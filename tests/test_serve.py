"""``reterm serve``: the embedded SmolLM2 behind an OpenAI-compatible API on 127.0.0.1, called with the
openai client, with EndpointPolicy (same replies as the local policy) and with Harbor's LiteLLM
(``hosted_vllm/NAME``, rollout details) as Terminus-2 calls it."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import openai
import pytest

from reterm.agent.protocol import TOOLS, initial_messages
from reterm.policies import FINISH_CONTEXT_LENGTH
from reterm.policies.endpoint import EndpointPolicy
from reterm.policies.serve import served_name

MAX_CONTEXT = 1024
CONVERSATIONS = [
    initial_messages("Create hello.txt containing the word hello."),
    initial_messages("Print the current directory."),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from reterm.policies.smollm2 import embedded_model_path

    embedded_model_path()  # build the cache here, not inside the server's start-up wait
    port = _free_port()
    log = tmp_path_factory.mktemp("serve") / "server.log"
    with open(log, "w") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "reterm.cli", "serve", "smollm2", "--host", "127.0.0.1", "--port", str(port),
             "--max-context", str(MAX_CONTEXT), "--max-new-tokens", "8", "--temperature", "0",
             "--batch-wait-ms", "500",  # long enough that concurrent requests surely share a batch
             "--dtype", "float32"],  # greedy replies compared across calls: bf16 rounds them apart (serve.py)
            stdout=fh, stderr=subprocess.STDOUT,
        )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                urllib.request.urlopen(f"{base}/health", timeout=2).read()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"reterm serve did not start:\n{Path(log).read_text()[-3000:]}")
                time.sleep(0.5)
        yield f"{base}/v1"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _health(base_v1: str) -> dict:
    return json.loads(urllib.request.urlopen(base_v1.removesuffix("/v1") + "/health", timeout=5).read())


def test_served_name_fits_hosted_vllm():
    assert served_name("smollm2") == "smollm2"
    assert served_name("/some/dir/checkpoint-500/") == "checkpoint-500"
    assert served_name("Qwen/Qwen3.5-9B") == "Qwen3.5-9B"
    assert served_name("my model (v2)") == "my-model-v2"


def test_openai_client(server):
    client = openai.OpenAI(base_url=server, api_key="EMPTY", max_retries=0)
    assert [m.id for m in client.models.list().data] == ["smollm2"]
    r = client.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "Hi!"}], temperature=0, max_tokens=4, n=2, logprobs=True,
        extra_body={"return_token_ids": True},
    )  # fmt: skip
    assert r.model == "smollm2" and len(r.choices) == 2
    a, b = r.choices
    assert a.message.content == b.message.content and a.message.content  # greedy: identical
    ids = a.model_extra["token_ids"]
    assert len(ids) == len(a.logprobs.content) == 4 and all(t.logprob <= 0 for t in a.logprobs.content)
    assert r.usage.completion_tokens == 8 and r.usage.prompt_tokens == len(r.model_extra["prompt_token_ids"]) > 3
    streamed = client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "Hi!"}],
                                              temperature=0, max_tokens=4, stream=True)  # fmt: skip
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == a.message.content
    with pytest.raises(openai.BadRequestError, match="n"):
        client.chat.completions.create(model="smollm2", messages=CONVERSATIONS[0], n=99)


def test_endpoint_policy_gets_the_local_policys_replies(server):
    """Served and local generation render the same prompt and decode the same greedy tokens."""
    from reterm.policies.transformers_policy import TransformersPolicy

    remote = EndpointPolicy("smollm2", base_url=server, temperature=0, max_new_tokens=5, max_retries=0)
    before = _health(server)
    served = remote.generate(CONVERSATIONS, TOOLS)
    after = _health(server)
    assert (after["requests"] - before["requests"], after["batches"] - before["batches"]) == (2, 1)  # one batch
    local = TransformersPolicy("smollm2", temperature=0, max_new_tokens=5).generate(CONVERSATIONS, TOOLS)
    assert [g.text for g in served] == [g.text for g in local]
    assert [(g.prompt_tokens, g.completion_tokens) for g in served] == [(g.prompt_tokens, g.completion_tokens) for g in local]


def test_context_overflow_reaches_the_endpoint_policy_as_context_length(server):
    remote = EndpointPolicy("smollm2", base_url=server, temperature=0, max_new_tokens=8, max_retries=0)
    (g,) = remote.generate([initial_messages("word " * MAX_CONTEXT)], TOOLS)
    assert (g.text, g.finish_reason) == ("", FINISH_CONTEXT_LENGTH)


def test_harbor_litellm_hosted_vllm_with_rollout_details(server, monkeypatch):
    """What Terminus-2 does with ``-m hosted_vllm/smollm2 --ak api_base=... --ak collect_rollout_details=true``."""
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # offline: no remote cost map
    from harbor.llms.lite_llm import LiteLLM

    llm = LiteLLM(
        model_name="hosted_vllm/smollm2", api_base=server, temperature=0.0, collect_rollout_details=True,
        model_info={"max_input_tokens": MAX_CONTEXT, "max_output_tokens": 64, "input_cost_per_token": 0.0,
                    "output_cost_per_token": 0.0},
    )  # fmt: skip
    r = asyncio.run(llm.call("What is the capital of France? One word.", max_tokens=64))
    assert r.content == "The capital of France is Paris."
    assert len(r.completion_token_ids) == len(r.logprobs) == r.usage.completion_tokens
    assert r.prompt_token_ids and len(r.prompt_token_ids) == r.usage.prompt_tokens
    assert os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] == "True"


def test_stream_sends_tokens_as_they_are_generated(server):
    """``stream: true`` sends a delta per decoded token while the reply is generated; the deltas add up to the
    non-streamed reply of the same greedy request, and the openai client's streaming API reads them."""
    import httpx

    messages = [{"role": "user", "content": "Write one sentence about the sea."}]
    client = openai.OpenAI(base_url=server, api_key="EMPTY", max_retries=0)
    whole = client.chat.completions.create(model="smollm2", messages=messages, temperature=0, max_tokens=20)
    assert whole.usage.completion_tokens >= 15 and whole.choices[0].message.content

    request = {"model": "smollm2", "messages": messages, "temperature": 0, "max_tokens": 20, "stream": True,
               "stream_options": {"include_usage": True}}  # fmt: skip
    events, arrived = [], []
    start = time.monotonic()
    with httpx.stream("POST", f"{server}/chat/completions", json=request, timeout=120) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(line.removeprefix("data: "))
                arrived.append(time.monotonic() - start)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    content = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]
    assert len(content) > 3, chunks  # not one text chunk: one per token (or few)
    assert "".join(c["choices"][0]["delta"]["content"] for c in content) == whole.choices[0].message.content
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == whole.choices[0].finish_reason
    assert chunks[-1]["usage"]["completion_tokens"] == whole.usage.completion_tokens
    # the first token was sent while the others were still being generated, not with them at the end
    first = arrived[next(i for i, c in enumerate(chunks) if c["choices"] and c["choices"][0]["delta"].get("content"))]
    assert arrived[-1] - first > 0.25, (first, arrived[-1])

    streamed = client.chat.completions.create(model="smollm2", messages=messages, temperature=0, max_tokens=20,
                                              stream=True)  # fmt: skip
    parts = [c.choices[0].delta.content or "" for c in streamed if c.choices]
    assert "".join(parts) == whole.choices[0].message.content and sum(map(bool, parts)) > 3


def test_stream_with_tools_matches_the_whole_reply(server):
    """With tools offered the streamed content still adds up to the non-streamed ``content`` (and a tool call,
    when the reply is one, comes as a ``tool_calls`` delta at the end)."""
    client = openai.OpenAI(base_url=server, api_key="EMPTY", max_retries=0)
    kw = dict(model="smollm2", messages=CONVERSATIONS[0], tools=TOOLS, temperature=0, max_tokens=20)
    whole = client.chat.completions.create(**kw).choices[0]
    content, calls, finish = "", [], None
    for c in client.chat.completions.create(**kw, stream=True):
        if c.choices:
            content += c.choices[0].delta.content or ""
            calls += c.choices[0].delta.tool_calls or []
            finish = c.choices[0].finish_reason or finish
    assert content == (whole.message.content or "") and finish == whole.finish_reason
    assert [(t.function.name, t.function.arguments) for t in calls] == [
        (t.function.name, t.function.arguments) for t in whole.message.tool_calls or []]
