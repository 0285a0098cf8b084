"""reterm.eval.recovery: recovery attempts from recorded failure states, in real local sandboxes.

Two hand-written ReTerm-10K records on the fixture task hello-file (write /app/hello.txt). Both
prefixes write the right text to ``hello.txt.tmp`` in the current folder and then fail; the recovery
policy only runs ``mv hello.txt.tmp hello.txt`` (a relative path) and submits. So an attempt passes
exactly when the replay rebuilt the state, cwd included:
  - record ``in-app`` (category path_permission): ``cd /app`` first -> every attempt passes;
  - record ``in-tmp`` (category wrong_command): ``cd /tmp`` first -> the file lands in /tmp: fails.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reterm.agent.protocol import format_observation, initial_messages, step_messages
from reterm.eval import recovery
from reterm.policies.scripted import ScriptedPolicy, assistant_commands, bash_call, submit_call
from reterm.records import normalise_message
from reterm.recovery.state import State
from reterm.trajectory import Action, Step

TASKS = Path(__file__).parent / "fixtures" / "tasks"


def _record(rid: str, category: str, folder: str, failing: tuple[str, str, int]) -> dict:
    commands = [(f"cd {folder}", "", 0), ("printf 'Hello, world!\\n' > hello.txt.tmp", "", 0), failing]
    steps = [Step(index=i, model_text=c, action=Action(tool="bash", command=c, call_id=f"call_{i}"),
                  observation=format_observation(out, code), exit_status=code)
             for i, (c, out, code) in enumerate(commands)]
    messages = initial_messages(Path(TASKS / "hello-file" / "instruction.md").read_text())
    for s in steps:
        messages += step_messages(s)
    return {"id": rid, "task_id": "hello-file", "messages": [normalise_message(m) for m in messages],
            "train_from_message_index": len(messages), "failure_step": 2, "failure_category": category,
            "failure_command": failing[0], "failure_output": failing[1],
            "replay_commands": [c for c, _, _ in commands]}


def _fixer(messages: list[dict]) -> str:
    if "mv hello.txt.tmp hello.txt" in assistant_commands(messages):
        return submit_call()
    return bash_call("mv hello.txt.tmp hello.txt")


@pytest.fixture()
def records(tmp_path) -> Path:
    path = tmp_path / "records.jsonl"
    rows = [
        _record("in-app", "path_permission", "/app", ("cat hello.txt", "cat: hello.txt: No such file or directory", 1)),
        _record("in-tmp", "wrong_command", "/tmp", ("hello --check", "bash: hello: command not found", 127)),
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _ids(records: Path) -> dict[str, str]:
    """record id -> the failure state's content-derived id (reterm.recovery.state.state_id)."""
    from reterm.recovery.state import State

    return {r["id"]: State.from_record(r).id for r in map(json.loads, records.read_text().splitlines())}


def test_states_from_records(records):
    states = recovery.states_from_records(records)
    ids = _ids(records)
    assert [s.id for s in states] == [ids["in-app"], ids["in-tmp"]] and len(set(ids.values())) == 2
    assert all(isinstance(s, State) for s in states)
    assert len(states[0].history) == 3 and all(s.from_history for s in states[0].history)
    assert states[0].history[2].command == "cat hello.txt" and states[0].replay_commands[0] == "cd /app"
    assert [s.id for s in recovery.select_states(states, 1)] == [ids["in-app"]]  # round-robin: first category


@pytest.mark.slow
def test_recovery_from_states_in_sandboxes(records, tmp_path, monkeypatch):
    states = recovery.states_from_records(records)
    policy = ScriptedPolicy(_fixer, name="fixer")
    out = tmp_path / "attempts"
    rates = recovery.recover_from_states(policy, states, TASKS, out, attempts=2, max_turns=3)
    assert rates["path_permission"] | {"stderr": None} == {
        "failure_states": 1, "attempts": 2, "recovered": 2, "rate": 1.0, "stderr": None,
        "states_recovered": 1, "state_recovery_rate": 1.0, "infra_faults": 0, "diverged": 0}
    assert (rates["wrong_command"]["attempts"], rates["wrong_command"]["recovered"]) == (2, 0)
    ids = _ids(records)
    assert sorted(p.name for p in out.glob("*.json")) == sorted(f"{ids[r]}__{i}.json" for r in ("in-app", "in-tmp")
                                                                for i in range(2))
    # one attempt: the rebuilt sandbox itself, with the terminal session that replayed the prefix
    one = recovery.recover_from_states(policy, states, TASKS, tmp_path / "one", attempts=1, max_turns=3)
    assert (one["path_permission"]["recovered"], one["wrong_command"]["recovered"]) == (1, 0)

    # resume: finished attempts are read back, no sandbox is started
    def no_run(*args, **kwargs):
        raise AssertionError("a finished attempt ran again")

    monkeypatch.setattr(recovery, "_attempts_from_state", no_run)
    assert recovery.recover_from_states(policy, states, TASKS, out, attempts=2, max_turns=3) == rates


def test_missing_task_folder_is_named(records, tmp_path):
    states = recovery.states_from_records(records)
    with pytest.raises(FileNotFoundError, match="hello-file"):
        recovery.recover_from_states(ScriptedPolicy([]), states, tmp_path, tmp_path / "o")


@pytest.mark.slow
def test_config_wiring_with_the_oracle_policy(records, tmp_path):
    from reterm.eval.run import EvalConfig

    cfg = EvalConfig.model_validate({
        "name": "r", "output_dir": str(tmp_path), "dataset": {"path": str(TASKS)},
        "models": [{"name": "kit-oracle", "agent": "reterm", "policy": "oracle"}, {"name": "h", "agent": "oracle"}],
        "recovery_from_states": {"records": str(records), "max_turns": 4},
    })
    entries = [{"name": "kit-oracle", "recovery_from_states": None}, {"name": "h", "recovery_from_states": None}]
    recovery.add_recovery_from_states(cfg, entries)
    # the solution writes /app/hello.txt with an absolute path: both states recover
    got = {c: (e["attempts"], e["recovered"]) for c, e in entries[0]["recovery_from_states"].items()}
    assert got == {"path_permission": (1, 1), "wrong_command": (1, 1)}
    assert entries[1]["recovery_from_states"] is None  # Harbor's oracle cannot start from a history
    assert (tmp_path / "recovery_from_states" / "kit-oracle" / f"{_ids(records)['in-app']}__0.json").is_file()
    bad = cfg.model_copy(update={"recovery_from_states": cfg.recovery_from_states.model_copy(update={"models": ["h"]})})
    with pytest.raises(ValueError, match="only this kit's agent"):
        recovery.add_recovery_from_states(bad, entries)
    with pytest.raises(ValueError, match="from_models: nobody not among the models"):
        EvalConfig.model_validate({**cfg.model_dump(), "recovery_from_states": {"from_models": ["nobody"]}})


def test_states_from_job_folders():
    # tests/fixtures/jobs/demo: failed trials with trajectories are 2 (missing file), 3 (jq missing) and
    # 4 (hang, agent timeout); trial 5 has the same error but is an infrastructure fault: no state
    states = recovery.states_from_jobs([Path(__file__).parent / "fixtures" / "jobs" / "demo"])
    assert sorted((s.task_id, s.category) for s in states) == [
        ("task-a", "path_permission"), ("task-b", "missing_dependency"), ("task-b", "timeout_hang")]
    jq = next(s for s in states if s.category == "missing_dependency")
    assert jq.replay_commands == ["jq . data.json"] and len(jq.history) == 1


STATE_SET = Path(__file__).resolve().parent.parent / "eval" / "states" / "test_split.jsonl"


def test_held_out_state_set_is_on_the_test_split():
    states = recovery.states_from_records(STATE_SET)
    splits = json.loads((Path(__file__).resolve().parent.parent / "tasks" / "splits.json").read_text())
    assert len(states) == 10 and {s.task_id for s in states} <= set(splits["test"])
    assert len({s.category for s in states}) >= 4
    for s in states:
        assert s.history[-1].command == s.replay_commands[-1] and s.history[-1].exit_status != 0


@pytest.mark.slow
def test_held_out_states_are_real_failures(tmp_path):
    """Rebuilt by replay and submitted at once, no state passes its verifier (one state per category)."""
    states = recovery.select_states(recovery.states_from_records(STATE_SET), 4)
    root = Path(__file__).resolve().parent.parent / "tasks"
    rates = recovery.recover_from_states(ScriptedPolicy([]), states, root, tmp_path, max_turns=1)
    assert len(rates) == 4 and all(e["attempts"] == 1 and e["recovered"] == 0 for e in rates.values())


def test_model_settings_carry_over_to_recovery_attempts():
    from reterm.eval.run import ModelSpec

    m = ModelSpec(name="b", agent="reterm", policy="openai:q", api_base="http://h/v1",
                  kwargs={"max_turns": 8, "max_consecutive_parse_errors": "3", "command_timeout": 20,
                          "policy_kwargs": '{"max_new_tokens": 192}'})
    assert recovery._policy_and_episode_kwargs(m) == (
        {"max_new_tokens": 192, "base_url": "http://h/v1"},
        {"command_timeout_s": 20.0, "max_consecutive_parse_errors": 3})
