"""Trajectory conversions: ATIF and chat-message round trips, other agents' ATIF
(Terminus-2's layout), Harbor job folders."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from harbor.models.trajectories import Agent, Metrics, Observation, ObservationResult, ToolCall
from harbor.models.trajectories import Step as AtifStep
from harbor.models.trajectories import Trajectory as AtifTrajectory

from reterm.agent.atif import (
    ATIF_FILE,
    RETERM_FILE,
    conversation_view,
    from_atif,
    from_messages,
    to_atif,
    trajectories_from_job,
    trajectory_from_trial,
    write_trial_files,
)
from reterm.agent.protocol import SYSTEM_PROMPT, format_observation, parse_action, render_action
from reterm.records import chat_messages, normalise_message
from reterm.trajectory import Action, Outcome, Step, Trajectory

JOBS = Path(__file__).parent / "fixtures" / "jobs"


def _trajectory() -> Trajectory:
    think = "<think>\nthe file is missing\n</think>\n\nCreate it."
    steps = [
        Step(index=0, model_text=render_action(Action(tool="bash", command="cat /app/x"), "Look first."),
             reasoning="Look first.", action=Action(tool="bash", command="cat /app/x"),
             observation=format_observation("cat: /app/x: No such file or directory", 1), exit_status=1,
             from_history=True, generation_s=0.5, execution_s=0.02, prompt_tokens=310, completion_tokens=21,
             extra={"parse_outcome": "ok", "completion_token_ids": [5, 6, 7], "logprobs": [-0.1, -0.2, -0.3]}),
        Step(index=1, model_text="I am not sure what to do ünïcödé 漢字", reasoning="I am not sure what to do ünïcödé 漢字",
             parse_error="no_tool_call", observation=parse_action("I am not sure").observation()),
        Step(index=2, model_text=think + "\n" + render_action(Action(tool="bash", command="printf 'a\\tb' > /app/x", timeout=5.0)),
             reasoning=think, action=Action(tool="bash", command="printf 'a\\tb' > /app/x", timeout=5.0, call_id="call_2"),
             observation=format_observation("x" * 20000, 130, timed_out=True, timeout_s=5),
             timed_out=True, extra={"terminal_restarted": "the shell exited"}),
        Step(index=3, model_text="", reasoning=None, action=Action(tool="bash", command=""),
             observation=format_observation("", None, running="python3", waiting_for_input=True)),
        Step(index=4, model_text=render_action(Action(tool="submit")), action=Action(tool="submit", call_id="call_9")),
    ]  # fmt: skip
    return Trajectory(task_id="demo", instruction="Make /app/x hold a tab.", system_prompt=SYSTEM_PROMPT,
                      policy="smollm2", steps=steps, prefix_len=1, reward=0.0, outcome=Outcome.FAILURE,
                      stop_reason="submitted", wall_s=12.5,
                      metadata={"parse_outcomes": {"ok": 3}, "timing": {"loop_s": 3.0}})  # fmt: skip


def test_atif_round_trip_is_exact_and_valid_atif():
    traj = _trajectory()
    atif = to_atif(traj, session_id="s-1")
    data = json.loads(json.dumps(atif.to_json_dict()))
    again = AtifTrajectory.model_validate(data)  # Harbor's validators (step ids, call references)
    assert [s.source for s in again.steps] == ["system", "user"] + ["agent"] * 5
    agent = again.steps[2:]
    assert agent[0].is_copied_context and agent[0].metrics.completion_token_ids == [5, 6, 7]
    assert agent[2].reasoning_content == "the file is missing"
    assert agent[2].tool_calls[0].arguments == {"command": "printf 'a\\tb' > /app/x", "timeout": 5.0}
    assert agent[1].tool_calls is None and agent[1].observation.results[0].source_call_id is None
    assert agent[4].tool_calls[0].function_name == "submit" and agent[4].observation is None
    # the only step with token counts is the copied one: this trajectory's own turns report none
    assert again.final_metrics.total_prompt_tokens is None and again.final_metrics.total_steps == 6
    assert from_atif(data) == traj
    assert from_atif(atif) == traj


def test_continued_trajectory_totals_count_its_own_turns_only():
    """A recovery attempt continues from a failed attempt's turns (its prefix, marked is_copied_context):
    ATIF's final_metrics count the attempt's own turns, not the copied ones."""

    def turn(i, prompt, completion, copied):
        action = Action(tool="bash", command=f"echo {i}")
        return Step(index=i, model_text=render_action(action), action=action, observation=format_observation(str(i), 0),
                    exit_status=0, from_history=copied, prompt_tokens=prompt, completion_tokens=completion)

    prefix = [turn(0, 300, 40, True), turn(1, 533, 60, True)]  # the failed attempt: 833 prompt tokens
    own = [turn(2, 240, 11, False), turn(3, 263, 17, False)]  # the continuation: 503 prompt tokens
    traj = Trajectory(task_id="demo", instruction="Fix it.", system_prompt=SYSTEM_PROMPT, policy="p",
                      steps=prefix + own, prefix_len=2, reward=1.0, outcome=Outcome.SUCCESS)  # fmt: skip
    atif = AtifTrajectory.model_validate(json.loads(json.dumps(to_atif(traj).to_json_dict())))
    fm = atif.final_metrics
    assert (fm.total_prompt_tokens, fm.total_completion_tokens) == (503, 28)
    assert fm.total_steps == len(atif.steps) - 2 == 4  # system, instruction and the two own turns
    assert [bool(s.is_copied_context) for s in atif.steps[2:]] == [True, True, False, False]
    assert "is_copied_context" in atif.notes
    assert from_atif(atif) == traj  # the copied turns stay in the file
    # a trajectory that continues nothing counts every turn
    fresh = traj.model_copy(update={"steps": [s.model_copy(update={"from_history": False}) for s in traj.steps],
                                    "prefix_len": 0})  # fmt: skip
    assert to_atif(fresh).final_metrics.total_prompt_tokens == 833 + 503


def test_messages_round_trip():
    traj = _trajectory()
    messages = traj.to_messages()
    back = from_messages(messages)
    assert back.to_messages() == messages
    assert conversation_view(back) == conversation_view(traj)
    # through the dataset's column layout (reterm.records) and back
    stored = [normalise_message(m) for m in messages]
    assert from_messages(chat_messages(stored)).to_messages() == messages
    with pytest.raises(ValueError, match=r"messages\[2\]"):
        from_messages(messages[:2] + [{"role": "tool", "content": "x"}])


def test_trial_files_round_trip(tmp_path):
    traj = _trajectory()
    atif_path, own_path = write_trial_files(traj, tmp_path / "agent")
    assert (atif_path.name, own_path.name) == (ATIF_FILE, RETERM_FILE)
    assert Trajectory.load(own_path) == traj
    assert from_atif(atif_path) == traj
    with pytest.raises(ValueError, match="not an ATIF trajectory"):
        bad = tmp_path / "bad.json"
        bad.write_text('{"steps": []}')
        from_atif(bad)


def _terminus_like_atif() -> AtifTrajectory:
    """An ATIF file laid out as Harbor's Terminus-2 writes it (see terminus_2.py): a user prompt,
    agent steps with several `bash_command` calls sharing one observation, `mark_task_complete`."""
    return AtifTrajectory(
        session_id="t2-session",
        agent=Agent(name="terminus-2", version="2.0.0", model_name="hosted_vllm/qwen"),
        steps=[
            AtifStep(step_id=1, source="user", message="You are an AI assistant... Task: make hello.txt"),
            AtifStep(step_id=2, source="agent", message='{"analysis": "start", "commands": [...]}',
                     tool_calls=[ToolCall(tool_call_id="call_0_1", function_name="bash_command",
                                          arguments={"keystrokes": "cd /app\n", "duration": 0.1}),
                                 ToolCall(tool_call_id="call_0_2", function_name="bash_command",
                                          arguments={"keystrokes": "ls -la\n", "duration": 1.0})],
                     observation=Observation(results=[ObservationResult(content="New Terminal Output:\n$ ls -la\ntotal 0")]),
                     metrics=Metrics(prompt_tokens=900, completion_tokens=40)),
            AtifStep(step_id=3, source="agent", message='{"analysis": "write it"}',
                     tool_calls=[ToolCall(tool_call_id="call_1_1", function_name="bash_command",
                                          arguments={"keystrokes": "echo hi > hello.txt\n", "duration": 0.1}),
                                 ToolCall(tool_call_id="call_1_task_complete", function_name="mark_task_complete",
                                          arguments={})],
                     observation=Observation(results=[ObservationResult(source_call_id="call_1_1", content="$ ")])),
            AtifStep(step_id=4, source="agent", message="no json here",
                     observation=Observation(results=[ObservationResult(content="Previous response had parsing errors")])),
        ],
    )  # fmt: skip


def test_other_agents_atif():
    traj = from_atif(_terminus_like_atif().to_json_dict(), task_id="hello", instruction="make hello.txt")
    assert traj.task_id == "hello" and traj.instruction == "make hello.txt" and traj.policy == "terminus-2:hosted_vllm/qwen"
    assert [s.command for s in traj.steps] == ["cd /app\nls -la", "echo hi > hello.txt", None, None]
    assert traj.steps[2].action.tool == "submit" and traj.steps[3].parse_error == "no_tool_call"
    assert traj.steps[0].observation.endswith("total 0") and traj.steps[0].prompt_tokens == 900
    assert all(s.exit_status is None for s in traj.steps)
    assert traj.metadata["atif_agent"]["name"] == "terminus-2"
    # it converts onwards like our own trajectories
    assert from_atif(to_atif(traj)) == traj


def test_trajectories_from_harbor_job_folders(tmp_path):
    trajs = {t.metadata["trial_name"]: t for t in trajectories_from_job(JOBS / "demo")}
    # trials 0-5 carry this kit's files; the rest have no trajectory and are skipped
    assert sorted(trajs) == [f"task-{t}__demo{i}" for t, i in
                             [("a", 0), ("a", 1), ("a", 2), ("b", 3), ("b", 4), ("b", 5)]]  # fmt: skip
    assert trajs["task-a__demo0"].outcome is Outcome.SUCCESS and trajs["task-a__demo0"].reward == 1.0
    assert trajs["task-a__demo2"].outcome is Outcome.FAILURE
    assert trajs["task-b__demo4"].outcome is Outcome.FAILURE  # agent timeout: an agent failure, reward 0
    assert trajs["task-b__demo4"].metadata["harbor_exception"] == "AgentTimeoutError"
    assert trajs["task-b__demo5"].outcome is Outcome.VERIFIER_ERROR and trajs["task-b__demo5"].reward is None
    assert all(t.steps for t in trajs.values())
    with pytest.raises(FileNotFoundError):
        list(trajectories_from_job(JOBS / "oracle", skip_missing=False))

    # another agent's trial: ATIF only, reward from result.json
    trial = tmp_path / "job" / "hello__t2"
    shutil.copytree(JOBS / "demo" / "task-c__demo6", trial)
    shutil.rmtree(trial / "agent", ignore_errors=True)
    (trial / "agent").mkdir()
    (trial / "agent" / ATIF_FILE).write_text(json.dumps(_terminus_like_atif().to_json_dict()))
    traj = trajectory_from_trial(trial)
    assert traj.outcome is Outcome.SUCCESS and traj.reward == 1.0 and traj.task_id == "task-c"
    assert [s.command for s in traj.steps][:2] == ["cd /app\nls -la", "echo hi > hello.txt"]
    assert [t.task_id for t in trajectories_from_job(tmp_path / "job")] == ["task-c"]
