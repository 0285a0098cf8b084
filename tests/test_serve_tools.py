"""``reterm serve`` speaks OpenAI tools: a scripted policy served for real on 127.0.0.1 (uvicorn, the
kit's FastAPI app), called with the ``openai`` client as an agent framework would call it."""

from __future__ import annotations

import json
import socket
import threading
import time

import openai
import pytest

from reterm.agent.protocol import TOOLS, initial_messages
from reterm.policies.scripted import ScriptedPolicy, bash_call
from reterm.policies.serve import Server

COMMANDS = ["ls -la", 'echo "a;b" > out.txt']


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _reply(messages):
    """The scripted model: bash calls from COMMANDS, a short thought before the second one, then
    submit; a user asking for prose gets prose, one asking for Qwen's form gets a Qwen3.5 call."""
    last = messages[-1].get("content") or ""
    if "prose please" in last:
        return "Nothing to run here."
    if "qwen please" in last:
        return bash_call("pwd", timeout=5, call_format="qwen")
    k = sum(1 for m in messages if m["role"] == "assistant")
    if k == 0:
        return bash_call(COMMANDS[0])
    if k == 1:
        return "<think>\nlisted; now write the file\n</think>\n\n" + bash_call(COMMANDS[1], timeout=10)
    return '<tool_call>\n{"name": "submit", "arguments": {}}\n</tool_call>'


@pytest.fixture(scope="module")
def base_url():
    import uvicorn

    server = Server(ScriptedPolicy(_reply, name="scripted"), "scripted")
    port = _free_port()
    uv = uvicorn.Server(uvicorn.Config(server.app(), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not uv.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}/v1"
    uv.should_exit = True
    thread.join(timeout=10)


@pytest.fixture
def client(base_url):
    return openai.OpenAI(base_url=base_url, api_key="EMPTY", max_retries=0)


def test_a_tool_call_comes_back_as_tool_calls_and_the_loop_goes_on(client):
    messages = initial_messages("List the files, then write out.txt.")
    r = client.chat.completions.create(model="scripted", messages=messages, tools=TOOLS, n=2)
    assert [c.finish_reason for c in r.choices] == ["tool_calls", "tool_calls"]
    calls = [c.message.tool_calls for c in r.choices]
    assert all(len(c) == 1 for c in calls)
    call = calls[0][0]
    assert call.type == "function" and call.function.name == "bash"
    assert isinstance(call.function.arguments, str) and json.loads(call.function.arguments) == {"command": "ls -la"}
    assert r.choices[0].message.content is None  # nothing outside the call
    assert calls[0][0].id != calls[1][0].id and call.id.startswith("call_")

    # the client sends the call and its result back, as any agent framework does
    messages += [r.choices[0].message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": "out.txt\n[exit status: 0]"}]  # fmt: skip
    r2 = client.chat.completions.create(model="scripted", messages=messages, tools=TOOLS)
    (c2,) = r2.choices
    assert c2.finish_reason == "tool_calls"
    assert json.loads(c2.message.tool_calls[0].function.arguments) == {"command": COMMANDS[1], "timeout": 10}
    assert c2.message.content == "<think>\nlisted; now write the file\n</think>"  # the text outside the call
    assert c2.message.tool_calls[0].id != call.id
    messages += [c2.message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": c2.message.tool_calls[0].id, "content": "[exit status: 0]"}]  # fmt: skip
    r3 = client.chat.completions.create(model="scripted", messages=messages, tools=TOOLS)
    assert r3.choices[0].message.tool_calls[0].function.name == "submit"
    assert json.loads(r3.choices[0].message.tool_calls[0].function.arguments) == {}


def test_qwen_calls_are_read_by_the_same_parser(client):
    r = client.chat.completions.create(model="scripted", messages=[{"role": "user", "content": "qwen please"}], tools=TOOLS)
    assert r.choices[0].finish_reason == "tool_calls"
    assert json.loads(r.choices[0].message.tool_calls[0].function.arguments) == {"command": "pwd", "timeout": 5}


def test_text_stays_text(client):
    prose = client.chat.completions.create(model="scripted", messages=[{"role": "user", "content": "prose please"}],
                                           tools=TOOLS)  # fmt: skip
    assert (prose.choices[0].message.content, prose.choices[0].message.tool_calls) == ("Nothing to run here.", None)
    assert prose.choices[0].finish_reason == "stop"
    # no tools offered, tool_choice "none", or a tool the request did not offer: the raw text
    ask = initial_messages("List the files.")
    for kwargs in ({}, {"tools": TOOLS, "tool_choice": "none"}, {"tools": [TOOLS[1]]}):
        r = client.chat.completions.create(model="scripted", messages=ask, **kwargs)
        assert r.choices[0].message.tool_calls is None and r.choices[0].finish_reason == "stop", kwargs
        assert r.choices[0].message.content == bash_call(COMMANDS[0])
    auto = client.chat.completions.create(model="scripted", messages=ask, tools=TOOLS, tool_choice="auto")
    assert auto.choices[0].finish_reason == "tool_calls"


def test_unsupported_tool_choice_is_refused_in_openais_error_shape(client):
    for choice in ("required", {"type": "function", "function": {"name": "bash"}}):
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(model="scripted", messages=initial_messages("x"), tools=TOOLS, tool_choice=choice)
        err = info.value.body
        assert err["param"] == "tool_choice" and err["type"] == "invalid_request_error" and "auto" in err["message"]


def test_streaming_assembles_to_the_same_reply(client):
    stream = client.chat.completions.create(model="scripted", messages=initial_messages("List the files."), tools=TOOLS,
                                            stream=True, stream_options={"include_usage": True})  # fmt: skip
    chunks = list(stream)
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert deltas[0].role == "assistant"
    calls = [tc for d in deltas for tc in (d.tool_calls or [])]
    assert len(calls) == 1 and calls[0].index == 0 and calls[0].function.name == "bash"
    assert json.loads(calls[0].function.arguments) == {"command": "ls -la"}
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None

    text = client.chat.completions.create(model="scripted", messages=[{"role": "user", "content": "prose please"}],
                                          stream=True)  # fmt: skip
    assert "".join(c.choices[0].delta.content or "" for c in text if c.choices) == "Nothing to run here."


def _terminus_reply(steps):
    """Terminus-2's JSON answer format: the whole solution as keystrokes in the first turn, then
    ``task_complete`` (Terminus-2 asks to confirm it once)."""

    def reply(messages):
        first = not any(m["role"] == "assistant" for m in messages)
        commands = [{"keystrokes": step + "\n", "duration": 1.0} for step in steps] if first else []
        return json.dumps({"analysis": "scripted", "plan": "run the solution", "commands": commands,
                           "task_complete": not first})  # fmt: skip

    return reply


@pytest.mark.slow
def test_harbors_terminus2_agent_runs_a_kit_task_against_the_server(tmp_path):
    """`harbor run -a terminus-2 -m hosted_vllm/NAME --ak api_base=...` on a kit task in the local sandbox."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    import uvicorn

    from reterm.tasks import load_task, solution_steps

    task = Path(__file__).resolve().parents[1] / "tasks" / "semver-sort"
    server = Server(ScriptedPolicy(_terminus_reply(list(solution_steps(load_task(task)))), name="scripted"), "scripted")
    port = _free_port()
    uv = uvicorn.Server(uvicorn.Config(server.app(), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    try:
        while not uv.started:
            assert thread.is_alive()
            time.sleep(0.05)
        info = {"max_input_tokens": 32768, "max_output_tokens": 1024, "input_cost_per_token": 0.0,
                "output_cost_per_token": 0.0}  # fmt: skip
        args = [str(Path(sys.executable).parent / "harbor"), "run", "-p", str(task), "-a", "terminus-2",
                "-m", "hosted_vllm/scripted", "--ak", f"api_base=http://127.0.0.1:{port}/v1",
                "--ak", f"model_info={json.dumps(info)}", "--ak", "max_turns=6",
                "-e", "reterm.sandbox.local:LocalEnvironment", "-o", str(tmp_path / "jobs"), "-y"]  # fmt: skip
        proc = subprocess.run(args, capture_output=True, text=True, cwd=tmp_path, timeout=900,
                              env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"})  # fmt: skip
    finally:
        uv.should_exit = True
        thread.join(timeout=10)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (result_file,) = (tmp_path / "jobs").glob("*/*/result.json")
    result = json.loads(result_file.read_text())
    assert result["exception_info"] is None, result["exception_info"]
    assert result["verifier_result"]["rewards"]["reward"] == 1.0
    assert server.stats["requests"] >= 2  # the solution turn and the confirmation


def test_unknown_model_is_404_and_unknown_role_is_400_in_openais_error_shape(client, base_url):
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="nope", messages=initial_messages("x"), tools=TOOLS)
    err = info.value.body
    assert info.value.status_code == 404 and err["code"] == "model_not_found" and err["param"] == "model"
    assert "`nope`" in err["message"] and "`scripted`" in err["message"] and err["type"] == "invalid_request_error"
    bad = [*initial_messages("x"), {"role": "wizard", "content": "hi"}]
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="scripted", messages=bad, tools=TOOLS)
    err = info.value.body
    assert info.value.status_code == 400 and err["param"] == "messages.[2].role" and "'wizard'" in err["message"]
    # OpenAI's `developer` role is a system message
    dev = [{"role": "developer", "content": initial_messages("List the files.")[0]["content"]},
           *initial_messages("List the files.")[1:]]
    assert client.chat.completions.create(model="scripted", messages=dev, tools=TOOLS).choices[0].finish_reason
