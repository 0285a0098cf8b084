"""EndpointPolicy against a real HTTP server on 127.0.0.1 whose answers each test scripts: raw text,
structured tool calls (converted back to model-native text), retries with back-off, faults."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from reterm.agent.protocol import TOOLS, initial_messages, parse_action
from reterm.policies import FINISH_CONTEXT_LENGTH, EndpointError
from reterm.policies.endpoint import EndpointPolicy, tool_calls_to_text


class FakeOpenAI:
    """A chat-completions server: ``plan`` is a list of (status, body) answered in order (the last
    one repeats); ``requests`` records every JSON request body."""

    def __init__(self) -> None:
        self.plan: list[tuple[int, dict]] = []
        self.requests: list[dict] = []
        self.lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep pytest output clean
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with owner.lock:
                    owner.requests.append(body)
                    status, answer = owner.plan[min(len(owner.requests), len(owner.plan)) - 1]
                if callable(answer):
                    answer = answer(body)
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def completion(content=None, tool_calls=None, finish="stop", **message_extra) -> dict:
    message = {"role": "assistant", "content": content, **message_extra}
    if tool_calls:
        message["tool_calls"] = [
            {"id": f"c{i}", "type": "function", "function": {"name": n, "arguments": a}} for i, (n, a) in enumerate(tool_calls)
        ]
    return {"id": "x", "object": "chat.completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}}  # fmt: skip


def error(message: str) -> dict:
    return {"error": {"message": message, "type": "x", "code": None}}


@pytest.fixture
def server():
    s = FakeOpenAI()
    yield s
    s.close()


def policy(server, **kw) -> EndpointPolicy:
    kw.setdefault("backoff_s", 0.01)
    return EndpointPolicy(kw.pop("model", "m"), base_url=server.url, api_key_env="RETERM_TEST_UNSET_KEY", **kw)


HISTORY = initial_messages("List files.") + [
    {"role": "assistant", "content": "", "tool_calls": [{"id": "call_0", "type": "function",
                                                         "function": {"name": "bash", "arguments": {"command": "ls"}}}]},
    {"role": "tool", "tool_call_id": "call_0", "name": "bash", "content": "a.txt"},
]  # fmt: skip


def test_raw_text_and_request_shape(server):
    raw = '<tool_call>\n{"name": "bash", "arguments": {"command": "cat a.txt"}}\n</tool_call>'
    server.plan = [(200, completion(raw))]
    (g,) = policy(server, temperature=0.5, top_p=0.9, max_new_tokens=33, seed=3).generate([HISTORY], TOOLS)
    assert g.text == raw and (g.prompt_tokens, g.completion_tokens, g.finish_reason) == (11, 7, "stop")
    assert parse_action(g.text).action.command == "cat a.txt"
    req = server.requests[0]
    assert req["model"] == "m" and req["tools"] == TOOLS
    assert (req["temperature"], req["top_p"], req["max_completion_tokens"], req["seed"]) == (0.5, 0.9, 33, 3)
    sent_call = req["messages"][2]["tool_calls"][0]["function"]
    assert sent_call["arguments"] == '{"command": "ls"}'  # OpenAI wants a JSON string
    assert req["messages"][3] == {"role": "tool", "content": "a.txt", "tool_call_id": "call_0", "name": "bash"}


def test_structured_tool_calls_become_native_text(server):
    server.plan = [(200, completion("I will look.", [("bash", '{"command": "ls -la", "timeout": 5}')]))]
    (g,) = policy(server).generate([HISTORY], TOOLS)
    assert g.text == 'I will look.\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls -la", "timeout": 5}}\n</tool_call>'
    parsed = parse_action(g.text)
    assert parsed.outcome == "ok" and parsed.action.command == "ls -la" and parsed.action.timeout == 5
    assert g.extra == {"structured_tool_calls": 1}

    server.plan = [(200, completion(None, [("bash", '{"command": "pwd"}')], reasoning_content="Where am I?"))]
    (g,) = policy(server, model="Qwen/Qwen3.5-9B").generate([HISTORY], TOOLS)  # Qwen3.5's own call format
    assert g.text == "<think>\nWhere am I?\n</think>\n\n<tool_call>\n<function=bash>\n<parameter=command>\npwd\n</parameter>\n</function>\n</tool_call>"
    parsed = parse_action(g.text)
    assert (parsed.outcome, parsed.action.command, parsed.reasoning) == ("ok", "pwd", "Where am I?")

    server.plan = [(200, completion(None, [("bash", '{"command": "ls"'), ("submit", "{}")]))]
    (g,) = policy(server).generate([HISTORY], TOOLS)
    assert parse_action(g.text).outcome == "malformed_json"  # the model's broken JSON stays visible


def test_tool_calls_to_text_matches_the_chatml_template():
    """The Hermes text equals what ReTerm's ChatML template renders for the same call (parsing inverts
    rendering, so a structured answer reads exactly like a raw one)."""
    from transformers import AutoTokenizer

    from reterm.policies.smollm2 import chat_template, embedded_model_path

    tok = AutoTokenizer.from_pretrained(embedded_model_path())
    msgs = [{"role": "user", "content": "x"},
            {"role": "assistant", "content": "ok", "tool_calls": [{"function": {"name": "bash", "arguments": '{"command": "echo \\"hi\\""}'}}]}]  # fmt: skip
    rendered = tok.apply_chat_template(msgs, tokenize=False, chat_template=chat_template())
    text = tool_calls_to_text("ok", [{"function": {"name": "bash", "arguments": '{"command": "echo \\"hi\\""}'}}])
    assert f"<|im_start|>assistant\n{text}<|im_end|>" in rendered


def test_batch_is_concurrent_and_ordered(server):
    server.plan = [(200, lambda body: completion("echo:" + body["messages"][1]["content"]))]
    batch = [initial_messages(f"task {i}") for i in range(5)]
    gens = policy(server, max_concurrency=3).generate(batch, TOOLS)
    assert [g.text for g in gens] == [f"echo:task {i}" for i in range(5)]


def test_retries_transient_faults_with_backoff(server):
    server.plan = [(503, error("overloaded")), (429, error("slow down")), (500, error("boom")), (200, completion("fine"))]
    p = policy(server, max_retries=3)
    (g,) = p.generate([HISTORY], TOOLS)
    assert g.text == "fine" and p.retries == 3 and len(server.requests) == 4


def test_gives_up_with_endpoint_error(server):
    server.plan = [(502, error("bad gateway"))]
    with pytest.raises(EndpointError, match=r"failed after 3 attempts.*bad gateway"):
        policy(server, max_retries=2).generate([HISTORY], TOOLS)
    assert len(server.requests) == 3


def test_non_retryable_errors_fail_at_once(server):
    server.plan = [(401, error("invalid api key"))]
    with pytest.raises(EndpointError, match="HTTP 401"):
        policy(server).generate([HISTORY], TOOLS)
    assert len(server.requests) == 1


def test_connection_refused_is_an_endpoint_error():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = EndpointPolicy("m", base_url=f"http://127.0.0.1:{port}/v1", max_retries=2, backoff_s=0.01)
    with pytest.raises(EndpointError, match="APIConnectionError"):
        p.generate([HISTORY], TOOLS)
    assert p.retries == 2


def test_context_overflow_is_not_a_fault(server):
    server.plan = [(400, error("This model's maximum context length is 4096 tokens. However, you requested 5000 tokens."))]
    (g,) = policy(server).generate([HISTORY], TOOLS)
    assert (g.text, g.finish_reason) == ("", FINISH_CONTEXT_LENGTH) and len(server.requests) == 1
    server.plan = [(400, error("unknown field"))]
    server.requests.clear()
    with pytest.raises(EndpointError, match="HTTP 400"):
        policy(server).generate([HISTORY], TOOLS)


def test_logprobs_and_token_ids_are_read(server):
    body = completion("hi")
    body["choices"][0]["logprobs"] = {"content": [{"token": "hi", "logprob": -0.5, "bytes": [104, 105], "top_logprobs": []}]}
    body["choices"][0]["token_ids"] = [42]
    server.plan = [(200, body)]
    (g,) = policy(server, return_logprobs=True, extra_body={"return_token_ids": True}).generate([HISTORY], TOOLS)
    assert (g.logprobs, g.token_ids) == ([-0.5], [42])
    assert server.requests[0]["logprobs"] is True and server.requests[0]["return_token_ids"] is True
