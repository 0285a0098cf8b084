"""Scripted and oracle policies: replies parse through the harness's parser, and every reply depends
only on its own conversation (episodes at different points share one batch)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reterm.agent.protocol import TOOLS, initial_messages, parse_action
from reterm.policies import Policy, load_policy
from reterm.policies.scripted import OraclePolicy, ScriptedPolicy, assistant_commands, bash_call, submit_call

ROOT = Path(__file__).resolve().parent.parent


def after(messages: list[dict], *commands: str) -> list[dict]:
    """``messages`` followed by one bash turn (call + tool result) per command."""
    out = list(messages)
    for i, command in enumerate(commands):
        call_id = f"call_{len(out)}_{i}"
        out.append({"role": "assistant", "content": "", "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": "bash", "arguments": json.dumps({"command": command})}}]})
        out.append({"role": "tool", "tool_call_id": call_id, "name": "bash", "content": "[exit status: 0]"})  # fmt: skip
    return out


def actions(policy: Policy, batch: list[list[dict]]) -> list[tuple[str, str | None]]:
    out = []
    for g in policy.generate(batch, TOOLS):
        parsed = parse_action(g.text)
        assert parsed.outcome == "ok", (g.text, parsed.error)
        out.append((parsed.action.tool, parsed.action.command))
    return out


def test_call_text_parses_in_both_formats():
    for fmt in ("hermes", "qwen"):
        parsed = parse_action(bash_call('printf "a\\n" > x && cat x', timeout=7, call_format=fmt))
        assert (parsed.outcome, parsed.action.command, parsed.action.timeout) == ("ok", 'printf "a\\n" > x && cat x', 7)
        assert parse_action(submit_call(fmt)).action.tool == "submit"
    assert bash_call("ls") == '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'


def test_scripted_list_is_keyed_by_the_conversation():
    policy = ScriptedPolicy(["ls", "cat a.txt"])
    start = initial_messages("t")
    batch = [start, after(start, "ls"), after(start, "ls", "cat a.txt"), after(start, "x", "y", "z")]
    assert actions(policy, batch) == [("bash", "ls"), ("bash", "cat a.txt"), ("submit", None), ("submit", None)]
    assert actions(policy, batch[::-1]) == [("submit", None), ("submit", None), ("bash", "cat a.txt"), ("bash", "ls")]
    no_submit = ScriptedPolicy(["ls"], submit=False)
    assert parse_action(no_submit.generate([after(start, "ls")], TOOLS)[0].text).outcome == "no_tool_call"


def test_scripted_function_writes_raw_text():
    policy = ScriptedPolicy(lambda messages: "<tool_call>{broken" if len(messages) > 2 else bash_call("pwd"), name="fn")
    start = initial_messages("t")
    texts = [g.text for g in policy.generate([start, after(start, "pwd")], TOOLS)]
    assert parse_action(texts[0]).action.command == "pwd"
    assert parse_action(texts[1]).outcome == "unterminated_tool_call" and policy.name == "fn"
    with pytest.raises(TypeError):
        ScriptedPolicy([1, 2])


def test_oracle_mixed_tasks_and_recovery_from_a_failure_prefix():
    a = ("Make a.txt.", ["cd /app", "touch a.txt", "ls a.txt"])
    b = ("Make b.txt.", ["touch b.txt"])
    oracle = OraclePolicy([a, b])
    sa, sb = initial_messages(a[0]), initial_messages(b[0])
    batch = [sa, after(sa, "cd /app"), after(sa, "cd /app", "touch a.txt", "ls a.txt"), sb, after(sb, "touch b.txt")]
    assert actions(oracle, batch) == [("bash", "cd /app"), ("bash", "touch a.txt"), ("submit", None),
                                      ("bash", "touch b.txt"), ("submit", None)]  # fmt: skip
    # A recovery attempt from a failure prefix replays the solution from its first step ...
    failed = after(sa, "cd /ap", "touch /a.txt")
    assert actions(oracle, [failed, after(failed, "cd /app")]) == [("bash", "cd /app"), ("bash", "touch a.txt")]
    # ... and a prefix whose last commands are the first solution steps continues after them.
    assert OraclePolicy.position(["rm -rf x", "cd /app", "touch a.txt"], a[1]) == 2
    assert OraclePolicy.position(["cd /app", "cd /app"], ["cd /app", "cd /app", "x"]) == 2
    extra = initial_messages(b[0] + "\n\nExtra instructions from the harness.")  # contained: still task b
    assert actions(oracle, [extra]) == [("bash", "touch b.txt")]
    with pytest.raises(ValueError, match="no task has the instruction 'Other task.'"):
        oracle.generate([initial_messages("Other task.")], TOOLS)


def test_assistant_commands_reads_tool_calls():
    msgs = after(initial_messages("t"), "ls") + [{"role": "assistant", "content": "prose"}, {"role": "user", "content": "err"}]
    msgs.append({"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "submit", "arguments": "{}"}}]})
    assert assistant_commands(msgs) == ["ls", None, None]


def test_oracle_replays_a_suite_task_solution():
    from reterm.tasks import load_task, solution_steps

    task_dir = ROOT / "tasks" / "fix-makefile-build"
    steps = solution_steps(task_dir)
    assert len(steps) >= 2
    oracle = load_policy("oracle", tasks=task_dir)
    other = OraclePolicy([task_dir, ROOT / "tasks" / "sqlite-import-csv"])  # two tasks: matched by instruction
    conv = initial_messages(load_task(task_dir).instruction)
    seen = []
    for _ in range(len(steps) + 1):
        ((tool, command),) = actions(oracle, [conv])
        assert actions(other, [conv]) == [(tool, command)]
        seen.append(command)
        if tool == "submit":
            break
        conv = after(conv, command)
    assert seen == [*steps, None]
