"""No two tool calls of one trajectory share an id: in the episode loop's steps, the chat messages,
ATIF trajectories, trajectories read back from messages, and the history sent to an endpoint."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from reterm.agent.atif import from_atif, from_messages, to_atif
from reterm.agent.episode import run_episode
from reterm.policies.endpoint import api_messages
from reterm.policies.scripted import ScriptedPolicy
from reterm.sandbox.local import LocalEnvironment
from reterm.trajectory import Action, Step, Trajectory, tool_call_id

TASK = Path(__file__).parent / "fixtures" / "tasks" / "hello-file"


def _ids(messages):
    calls = [c["id"] for m in messages for c in (m.get("tool_calls") or [])]
    answers = [m["tool_call_id"] for m in messages if m["role"] == "tool"]
    return calls, answers


def _check_unique(messages):
    calls, answers = _ids(messages)
    assert calls and len(set(calls)) == len(calls), calls
    assert set(answers) <= set(calls) and len(set(answers)) == len(answers), (calls, answers)
    return calls


def test_episode_steps_messages_atif_and_endpoint_history_have_unique_ids():
    async def main():
        env = LocalEnvironment.for_task(TASK)
        async with env:
            return await run_episode(ScriptedPolicy(["ls /app", "echo hi", "cat /nope"]), env, TASK)

    traj = asyncio.run(main())
    assert [s.action.call_id for s in traj.steps] == [tool_call_id(i) for i in range(len(traj.steps))]
    messages = traj.to_messages()
    assert _check_unique(messages) == [f"call_{i}" for i in range(4)]
    atif = to_atif(traj)
    atif_ids = [c.tool_call_id for s in atif.steps for c in (s.tool_calls or [])]
    assert len(set(atif_ids)) == len(atif_ids) == 4
    assert from_atif(atif) == traj
    _check_unique(api_messages(messages))
    # stable: the same trajectory always gives the same ids
    assert _ids(Trajectory.model_validate_json(traj.model_dump_json()).to_messages()) == _ids(messages)


def test_duplicate_ids_of_old_records_are_made_unique():
    steps = [Step(index=i, model_text="", action=Action(tool="bash", command=f"echo {i}"), observation=str(i))
             for i in range(3)]  # fmt: skip
    traj = Trajectory(task_id="t", instruction="i", system_prompt="s", steps=steps)
    assert [s.action.call_id for s in traj.steps] == ["call_0", "call_1", "call_2"]
    # a step appended later with a repeated id is renamed when the messages are made
    traj.steps.append(Step(index=3, model_text="", action=Action(tool="submit", call_id="call_1")))
    assert _check_unique(traj.to_messages()) == ["call_0", "call_1", "call_2", "call_3"]
    # distinct ids of an imported trajectory are kept
    kept = Trajectory(task_id="t", instruction="i", system_prompt="s",
                      steps=[Step(index=i, model_text="", action=Action(tool="bash", command="x", call_id=f"abc{i}"))
                             for i in range(2)])  # fmt: skip
    assert [s.action.call_id for s in kept.steps] == ["abc0", "abc1"]
    # messages that all say call_0 (written before ids were unique) read back with unique ids
    dup = []
    for i in range(3):
        dup.append({"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_0", "type": "function", "function": {"name": "bash", "arguments": json.dumps({"command": "ls"})}}]})
        dup.append({"role": "tool", "tool_call_id": "call_0", "name": "bash", "content": f"out{i}\n[exit status: 0]"})
    back = from_messages([{"role": "system", "content": "s"}, {"role": "user", "content": "u"}, *dup])
    _check_unique(back.to_messages())
    # the endpoint history: repeated or missing ids are renamed and the tool answers follow them
    sent = api_messages(dup)
    assert _check_unique(sent) == ["call_0", "call_1", "call_2"]
    assert [m["tool_call_id"] for m in sent if m["role"] == "tool"] == ["call_0", "call_1", "call_2"]
    no_ids = [{k: v for k, v in m.items() if k != "tool_call_id"} for m in dup]
    for m in no_ids:
        for c in m.get("tool_calls") or []:
            c.pop("id")
    sent = api_messages(no_ids)
    assert [m["tool_call_id"] for m in sent if m["role"] == "tool"] == _check_unique(sent)
