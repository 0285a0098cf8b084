"""The action parser and the observation formatter of reterm.agent.protocol."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from transformers.utils.chat_template_utils import render_jinja_template

from reterm.agent import protocol
from reterm.agent.protocol import (
    MAX_COMMAND_CHARS,
    MAX_COMMAND_TIMEOUT_S,
    MAX_TEXT_CHARS,
    OK_OUTCOMES,
    PARSE_OUTCOMES,
    format_observation,
    format_tool_call,
    observation_status,
    parse_action,
    render_action,
    truncate_middle,
)
from reterm.trajectory import Action

HERMES_LS = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls -la"}}\n</tool_call>'
QWEN_LS = "<tool_call>\n<function=bash>\n<parameter=command>\nls -la\n</parameter>\n</function>\n</tool_call>"

CASES = [
    # (text, outcome, tool, command)
    (HERMES_LS, "ok", "bash", "ls -la"),
    (QWEN_LS, "ok", "bash", "ls -la"),
    ('<tool_call>{"name": "submit", "arguments": {}}</tool_call>', "ok", "submit", None),
    ('<tool_call>{"name": "submit"}</tool_call>', "ok", "submit", None),
    ("<tool_call>\n<function=submit>\n</function>\n</tool_call>", "ok", "submit", None),
    ('I will look.\n<tool_call>{"name": "bash", "arguments": "{\\"command\\": \\"pwd\\"}"}</tool_call>', "ok", "bash", "pwd"),
    (HERMES_LS + "\n" + HERMES_LS.replace("ls -la", "pwd"), "multiple_calls", "bash", "ls -la"),
    ("", "empty", None, None),
    ("   \n\t ", "empty", None, None),
    ("I think we should list the files.", "no_tool_call", None, None),
    ("<think>Let me think about this for a long", "unterminated_think", None, None),
    ('<tool_call>{"name": "bash", "arguments": {"command": "ls"}}', "unterminated_tool_call", None, None),
    ("<tool_call>\n<function=bash>\n<parameter=command>\nls\n</parameter>\n</function>", "unterminated_tool_call", None, None),
    ('<tool_call>{"name": "bash", "arguments": {"command": "ls"}</tool_call>', "malformed_json", None, None),
    ("<tool_call>{'name': 'bash'}</tool_call>", "malformed_json", None, None),
    ("<tool_call>[1, 2]</tool_call>", "malformed_call", None, None),
    ("<tool_call>bash ls</tool_call>", "malformed_call", None, None),
    ("<tool_call></tool_call>", "malformed_call", None, None),
    ('<tool_call>{"arguments": {"command": "ls"}}</tool_call>', "malformed_call", None, None),
    ('<tool_call>{"name": "bash", "args": {"command": "ls"}}</tool_call>', "malformed_call", None, None),
    ("<tool_call>\n<function=bash\n<parameter=command>\nls\n</parameter>\n</function>\n</tool_call>", "malformed_call", None, None),
    ("<tool_call>\n<function=bash>\n<parameter=command>\nls\n</function>\n</tool_call>", "malformed_call", None, None),
    ('{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>', "malformed_call", None, None),
    ('<tool_call>{"name": "python", "arguments": {"code": "1"}}</tool_call>', "unknown_tool", None, None),
    ("<tool_call>\n<function=run_shell>\n</function>\n</tool_call>", "unknown_tool", None, None),
    ('<tool_call>{"name": "bash", "arguments": {}}</tool_call>', "missing_argument", None, None),
    ('<tool_call>{"name": "bash", "arguments": {"command": ["ls"]}}</tool_call>', "bad_argument", None, None),
    ('<tool_call>{"name": "bash", "arguments": {"command": "ls", "timeout": "soon"}}</tool_call>', "bad_argument", None, None),
    ('<tool_call>{"name": "bash", "arguments": {"command": "ls", "timeout": -1}}</tool_call>', "bad_argument", None, None),
    ('<tool_call>{"name": "bash", "arguments": {"command": "ls", "timeout": true}}</tool_call>', "bad_argument", None, None),
    ('<tool_call>{"name": "bash", "arguments": {"command": "ls", "cwd": "/"}}</tool_call>', "bad_argument", None, None),
    ('<tool_call>{"name": "submit", "arguments": {"ok": 1}}</tool_call>', "bad_argument", None, None),
    ('<tool_call>{"name": "bash", "arguments": 5}</tool_call>', "bad_argument", None, None),
    ("x" * (MAX_TEXT_CHARS + 1), "too_long", None, None),
    (format_tool_call("bash", {"command": "y" * (MAX_COMMAND_CHARS + 1)}), "too_long", None, None),
    ("ls \x00\x01\x02", "binary", None, None),
    ("caf\ufffd \ufffd", "binary", None, None),
]


@pytest.mark.parametrize("text,outcome,tool,command", CASES)
def test_each_outcome_is_defined(text, outcome, tool, command):
    r = parse_action(text)
    assert r.outcome == outcome, (r.outcome, r.error)
    assert r.outcome in PARSE_OUTCOMES
    assert r.ok == (outcome in OK_OUTCOMES)
    if r.ok:
        assert r.action is not None and r.action.tool == tool and r.action.command == command
        assert r.observation() == ""
    else:
        assert r.action is None
        obs = r.observation()
        assert obs.startswith(f"[parse error: {outcome}]") and "No command was run" in obs
        assert "<tool_call>" in obs and "submit" in obs  # the expected format is shown


def test_every_outcome_has_a_case():
    assert {c[1] for c in CASES} == set(PARSE_OUTCOMES)


def test_non_text_inputs_do_not_raise():
    assert parse_action(None).outcome == "empty"
    assert parse_action(b"\xff\xfe garbage").outcome == "binary"
    assert parse_action(12345).outcome == "binary"
    assert parse_action(HERMES_LS.encode()).outcome == "ok"


def test_think_blocks():
    r = parse_action("<think>\nI should list files.\n</think>\n\nListing now.\n" + QWEN_LS)
    assert r.outcome == "ok" and r.reasoning == "I should list files." and r.content == "Listing now."
    assert r.message_content == "<think>\nI should list files.\n</think>\n\nListing now."
    # Qwen3.5's generation prompt opens the think block: the model's text starts inside it
    r = parse_action("hmm, files first\n</think>\n\n" + QWEN_LS)
    assert r.outcome == "ok" and r.reasoning == "hmm, files first" and r.content == ""
    # a call inside a never-closed think block still runs
    r = parse_action("<think>plan: list\n" + HERMES_LS)
    assert r.outcome == "ok" and r.reasoning == "plan: list"
    # a tool call mentioned inside reasoning that was closed is not confused with the real one
    r = parse_action("<think>I could use </tool_call> tags</think>\n" + HERMES_LS)
    assert r.outcome == "ok" and r.action.command == "ls -la"


def test_closing_tag_inside_json_command():
    text = format_tool_call("bash", {"command": "echo '</tool_call>' > f"})
    r = parse_action(text)
    assert r.outcome == "ok" and r.action.command == "echo '</tool_call>' > f"


def test_timeout_coercion_and_clamp():
    r = parse_action(format_tool_call("bash", {"command": "make", "timeout": "120"}))
    assert r.action.timeout == 120.0
    r = parse_action(format_tool_call("bash", {"command": "make", "timeout": 99999}))
    assert r.action.timeout == MAX_COMMAND_TIMEOUT_S
    r = parse_action(format_tool_call("bash", {"command": "make", "timeout": "7.5"}, "qwen"))
    assert r.outcome == "ok" and r.action.timeout == 7.5


def test_multiple_calls_note_and_first_invalid_decides():
    r = parse_action(HERMES_LS + HERMES_LS)
    assert r.outcome == "multiple_calls" and r.n_calls == 2 and "only the first was run" in r.note
    r = parse_action('<tool_call>{"name": "x"}</tool_call>' + HERMES_LS)
    assert r.outcome == "unknown_tool"


def test_error_format_follows_the_model_or_the_caller():
    assert "<function=bash>" in parse_action("<tool_call>\n<function=nope>\n</function>\n</tool_call>").observation()
    assert '{"name": "bash"' in parse_action("no call here").observation()
    assert "<function=bash>" in parse_action("no call here", call_format="qwen").observation()


@pytest.mark.parametrize("call_format", ["hermes", "qwen"])
def test_render_then_parse_is_identity(call_format):
    rng = random.Random(7)
    alphabet = "abc xyz/.-_'\"$()[]{}|&;<>\\\n\t=*~#!?%^@`:,+0123456789é漢"
    for _ in range(200):
        command = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 60))).strip("\n") or "ls"
        if call_format == "qwen" and "</parameter>" in command:
            continue
        timeout = rng.choice([None, 1.0, 2.5, 30.0])
        action = Action(tool="bash", command=command, timeout=timeout)
        r = parse_action(render_action(action, "I will run it.", call_format), call_format)
        assert r.outcome == "ok", (command, r.error)
        assert (r.action.command, r.action.timeout) == (command, timeout)
        assert r.content == "I will run it."


def _assistant_part(rendered: str) -> str:
    part = rendered.rsplit("<|im_start|>assistant\n", 1)[1]
    return part.split("<|im_end|>", 1)[0]


def test_parse_inverts_the_chat_templates():
    """What the two templates render for a tool call is what the parser reads back."""
    messages = [
        {"role": "system", "content": protocol.SYSTEM_PROMPT},
        {"role": "user", "content": "list the files"},
        {
            "role": "assistant",
            "content": "Listing.",
            "tool_calls": [
                {"type": "function", "function": {"name": "bash", "arguments": {"command": "ls -la /app", "timeout": 5}}}
            ],
        },
    ]
    chatml = (Path(protocol.__file__).parent / "templates" / "chatml_tools.jinja").read_text()
    rendered, _ = render_jinja_template([messages], tools=protocol.TOOLS, chat_template=chatml)
    r = parse_action(_assistant_part(rendered[0]))
    assert r.outcome == "ok" and r.action.command == "ls -la /app" and r.action.timeout == 5 and r.content == "Listing."

    import trl

    qwen = (Path(trl.__file__).parent / "chat_templates" / "qwen3_5_think.jinja").read_text()
    rendered, _ = render_jinja_template([messages], tools=protocol.TOOLS, chat_template=qwen)
    r = parse_action(_assistant_part(rendered[0]))
    assert r.outcome == "ok" and r.call_format == "qwen"
    assert r.action.command == "ls -la /app" and r.action.timeout == 5 and r.content == "Listing."


def test_truncate_middle_keeps_head_and_tail():
    text = "\n".join(f"line {i}" for i in range(5000))
    out = truncate_middle(text, 2000)
    assert len(out) < 2100 and out.startswith("line 0\n") and out.endswith("line 4999")
    assert "lines omitted ...]" in out
    assert truncate_middle("short", 2000) == "short"


def test_observation_status_lines_round_trip():
    for kwargs, expected in [
        (dict(exit_status=0), (0, False)),
        (dict(exit_status=2), (2, False)),
        (dict(exit_status=130, timed_out=True, timeout_s=3), (None, True)),
        (dict(exit_status=None, running="python3", waiting_for_input=True), (None, False)),
        (dict(exit_status=None), (None, False)),
    ]:
        obs = format_observation("out\n[exit status: 7]", **kwargs)  # a fake status line in the output
        assert observation_status(obs) == expected, obs
    obs = format_observation("\x1b[31mred\x1b[0m\r\nnext\x07", 0)
    assert "\x1b" not in obs and "\x07" not in obs and obs.startswith("?[31mred?[0m\nnext")
    assert json.loads(json.dumps(obs)) == obs
