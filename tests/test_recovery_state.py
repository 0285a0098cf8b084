"""One failure-state id (reterm.recovery.state): the same state gets the same id through every conversion.

One failed attempt is built once; its id is read back from the localiser, the attempt-level protocol
(``attempt_end_state``, what the data stage and the eval use), the dataset record the drills builder
writes, the GRPO pool's seed row read from that record, the GRPO online state of a later failed attempt
(against ``attempt_end_state`` of the same attempt), and the eval item.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reterm.agent.protocol import initial_messages
from reterm.policies.scripted import bash_call
from reterm.records import COLUMNS, RELEASE_COLUMNS
from reterm.recovery.attempts import Attempt, attempt_end_state
from reterm.recovery.localise import localise
from reterm.recovery.state import Level, Source, State, canonical_messages, from_localiser_json, state_id, state_id_of
from reterm.trajectory import Action, Step, Trajectory

FIXTURES = Path(__file__).resolve().parent / "fixtures"
TASK_DIR = FIXTURES / "tasks" / "hello-file"
SYSTEM = initial_messages("")[0]["content"]


def _bash(i: int, cmd: str, out: str, status: int, **kw) -> Step:
    return Step(index=i, model_text=bash_call(cmd), action=Action(tool="bash", command=cmd),
                observation=f"{out}\n[exit status: {status}]", exit_status=status, **kw)  # fmt: skip


def _submit(i: int) -> Step:
    return Step(index=i, model_text='{"name": "submit", "arguments": {}}', action=Action(tool="submit"))


def _failed_attempt() -> Trajectory:
    t = Trajectory(task_id="hello-file", instruction="Create /app/out/hello.txt containing hello.",
                   system_prompt=SYSTEM, policy="first-mistake",
                   steps=[_bash(0, "echo hello > /app/out/hello.txt",
                                "bash: /app/out/hello.txt: No such file or directory", 1, generation_s=0.3),
                          _submit(1)])  # fmt: skip
    t.set_reward(0.0)
    return t


def _recovery(fs) -> Trajectory:
    first = _failed_attempt()
    rec = Trajectory(task_id="hello-file", instruction=first.instruction, system_prompt=SYSTEM, policy="oracle",
                     steps=[*fs.history, _bash(2, "mkdir -p /app/out && echo hello > /app/out/hello.txt", "", 0),
                            _submit(3)], prefix_len=len(fs.history))  # fmt: skip
    rec.set_reward(1.0)
    return rec


def test_one_state_has_one_id_in_dataset_grpo_and_eval():
    from reterm.data.drills import _record
    from reterm.training.failure_pool import online_states_from_attempt, seed_states_from_records

    first = _failed_attempt()
    fs = attempt_end_state(Attempt(TASK_DIR, first))
    assert fs.level is Level.ATTEMPT and len(fs.id) == 16
    # content-derived: timings and tool-call ids do not change it; the history does
    again = _failed_attempt()
    again.steps[0].generation_s = 9.0
    assert attempt_end_state(Attempt(TASK_DIR, again)).id == fs.id
    other = _failed_attempt()
    other.steps[0] = _bash(0, "echo hi > /app/out/hello.txt", "bash: /app/out/hello.txt: No such file or directory", 1)
    assert attempt_end_state(Attempt(TASK_DIR, other)).id != fs.id

    # dataset record (what reterm.data.drills writes) -> State.from_record
    rec = _recovery(fs)
    k = len(rec.to_messages(upto=rec.prefix_len))
    record = _record(fs.with_source("injected"), rec, failure_step=1, failed=first.steps[0],
                     source_policy="first-mistake", family="")  # fmt: skip
    assert record["train_from_message_index"] == k and record["target_attempt_index"] == 2
    assert record["recovery_turns"] == 2 and record["replay_commands"] == fs.replay_commands
    record = json.loads(json.dumps(record))  # as stored (arguments are JSON strings)
    from_record = State.from_record(record)
    assert record["trajectory_id"] == from_record.id == fs.id
    assert from_record.level == "attempt" and from_record.source == "injected"
    assert from_record.record_columns()["trajectory_id"] == fs.id

    # GRPO pool: the seed row read from that record, then an online state from a later failed attempt
    (seed,), skipped = seed_states_from_records([record], [FIXTURES / "tasks"], exclude=set())
    assert not skipped and seed.state_id == fs.id and seed.row()["state_id"] == from_record.pool_row()["state_id"]
    second = Trajectory(task_id="hello-file", instruction=first.instruction, system_prompt=SYSTEM,
                        steps=[*fs.history, _bash(2, "ls /app/out", "ls: cannot access '/app/out': No such file or "
                                                  "directory", 2), _submit(3)], prefix_len=len(fs.history))  # fmt: skip
    second.set_reward(0.0)
    (online,) = online_states_from_attempt(second, seed, step=1)
    assert online.state_id == attempt_end_state(Attempt(TASK_DIR, second)).id != fs.id
    assert online.state_id == state_id(online.task_id, online.prompt)
    # one spelling of source and level: the pool entry's State says where it came from like the record does,
    # the pool's own notion stays beside it
    assert seed.row()["state_source"] == from_record.pool_row()["state_source"] == "injected"
    assert seed.row()["pool_origin"] == "seed" and seed.state.level is Level.ATTEMPT and seed.state.id == fs.id
    assert online.row()["state_source"] == "online" == online.state.source and online.state.level is Level.ATTEMPT
    # a journal written before the localiser made State objects (its own layout, the older level spelling)
    new = fs.to_json()
    old = {k: v for k, v in new.items() if k not in ("messages", "source", "localisation")}
    old |= new["localisation"] | {"level": "attempt_end", "history_len": len(fs.history)}
    with pytest.raises(ValueError, match="older layout"):
        State.from_json(old)
    back = from_localiser_json(json.loads(json.dumps(old)), first, "injected")
    assert back.id == fs.id and back.level is Level.ATTEMPT and back.source is Source.INJECTED
    assert back.localisation == fs.localisation and back.history == fs.history and back.messages == fs.messages
    assert State.from_json(json.loads(json.dumps(new))) == fs and new["level"] == "attempt"
    # the pipeline's journal (WorkItem) converts that layout as the pipeline did then (kit prompt + instruction)
    from reterm.data.recover import WorkItem

    item = WorkItem.from_json({"state": old, "instruction": first.instruction, "source": "injected",
                               "source_policy": "p", "default_timeout": 10.0})  # fmt: skip
    assert item.state.id == fs.id and item.state.source is Source.INJECTED

    # eval: the item of a recovery attempt from the state
    st = fs.with_source("injected")
    assert st.id == fs.id and st.source is Source.INJECTED and fs.source is Source.OWN and st.eval_item(rec) | {"state_id": fs.id} == st.eval_item(rec)
    assert st.eval_item(rec)["passed"] is True

    # in-attempt: the localiser's state and the step-level record agree
    whole = Trajectory(task_id="hello-file", instruction=first.instruction, system_prompt=SYSTEM,
                       steps=[first.steps[0], _bash(1, "mkdir -p /app/out && echo hello > /app/out/hello.txt", "", 0),
                              _submit(2)])  # fmt: skip
    whole.set_reward(1.0)
    failing = _failed_attempt()
    failing.steps = failing.steps[:1]
    failing.set_reward(0.0)
    primary = localise(failing).primary
    in_attempt = State.from_history(whole, whole.steps[:1], category=primary.category, source="injected",
                                    level="in_attempt")  # fmt: skip
    row = _record(in_attempt, whole, failure_step=0, failed=whole.steps[0], source_policy="first-mistake", family="")
    assert row["train_from_message_index"] == 4 and row["target_attempt_index"] == 1
    assert in_attempt.id == state_id_of(whole, whole.steps[:1])
    assert primary.id == row["trajectory_id"] == State.from_record(json.loads(json.dumps(row))).id
    assert primary.level == "in_attempt" and primary.source == "own" and primary.localisation.primary
    assert primary.history[-1].command == primary.command and primary.step == len(primary.history) - 1


def test_a_premature_completion_state_keeps_its_id_through_record_pool_eval_and_space():
    """A premature completion (the agent submits too early; the failing step is the ``submit``): the localiser's
    history stops before the ``submit``, and the record, the GRPO seed, the eval item and the Space's group all
    name the state by that id (the record reader once kept the ``submit`` in the history: another id)."""
    import sys

    from reterm.data.recover import WorkItem
    from reterm.data.tasks import TaskInfo
    from reterm.data.write import make_record
    from reterm.training.failure_pool import seed_states_from_records

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "space"))
    from replay_sources import group_key

    early = Trajectory(task_id="hello-file", instruction="Create /app/out/hello.txt containing hello.",
                       system_prompt=SYSTEM, steps=[_bash(0, "ls /app", "out", 0), _submit(1)])  # fmt: skip
    early.set_reward(0.0)
    (fs,) = localise(early).states
    assert fs.category == "premature_completion" and fs.step == 1 and len(fs.history) == 1
    recovery = Trajectory(task_id="hello-file", instruction=early.instruction, system_prompt=SYSTEM, policy="oracle",
                          steps=[*fs.history, _bash(1, "echo hello > /app/out/hello.txt", "", 0), _submit(2)],
                          prefix_len=len(fs.history), metadata={"state_id": fs.id})  # fmt: skip
    recovery.set_reward(1.0)
    item = WorkItem(state=fs, instruction=early.instruction, source="own", source_policy="smollm2", default_timeout=30)
    task = TaskInfo(id="hello-file", path=TASK_DIR, instruction=early.instruction, license="Apache-2.0")
    record = json.loads(json.dumps(make_record(item, recovery, task, 1, 1)))
    assert record["failure_step"] == 1 and record["target_attempt_index"] == 1
    assert record["trajectory_id"] == fs.id == State.from_record(record).id
    (seed,), _ = seed_states_from_records([record], [FIXTURES / "tasks"], exclude=set())
    assert seed.state_id == fs.id
    assert fs.eval_item(recovery)["state_id"] == fs.id
    assert group_key(recovery) == f"hello-file/{fs.id}"
    recovery.metadata.clear()
    assert group_key(recovery) == f"hello-file/{fs.id}"  # computed from the history when not recorded


def test_the_record_writer_fixes_the_state_columns_and_reads_back():
    first = _failed_attempt()
    st = attempt_end_state(Attempt(TASK_DIR, first), source="injected")
    assert st.level is Level.ATTEMPT and st.source is Source.INJECTED and st.level == "attempt"
    only = st.to_record(None, failure_step=1)
    assert list(only)[:6] == list(RELEASE_COLUMNS) and tuple(only) == COLUMNS
    assert only["train_from_message_index"] == len(only["messages"]) and only["target_attempt_index"] == 2
    assert State.from_record(only).id == st.id == only["trajectory_id"]
    with pytest.raises(ValueError, match="trajectory_id.*given by the state"):
        st.to_record(None, trajectory_id="other")
    with pytest.raises(ValueError, match="not dataset columns"):
        st.to_record(None, colour="red")
    other = _failed_attempt()
    other.steps[0] = _bash(0, "true", "", 0)
    with pytest.raises(ValueError, match="does not begin with the state's history"):
        st.to_record(other)


def test_canonical_messages_and_bad_input():
    a = [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_0", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}]},
         {"role": "tool", "tool_call_id": "call_0", "name": "bash", "content": "x"}]
    b = [{"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_7", "function": {"name": "bash", "arguments": {"command": "ls"}}}]},
         {"role": "tool", "content": [{"type": "text", "text": "x"}]}]
    assert canonical_messages(a) == canonical_messages(b) and state_id("t", a) == state_id("t", b)
    assert state_id("t", a) != state_id("u", a)
    with pytest.raises(ValueError, match="message 0.*not JSON"):
        canonical_messages([{"role": "assistant", "tool_calls": [{"function": {"name": "bash", "arguments": "{"}}]}])
    with pytest.raises(ValueError, match="source 'teacher'"):
        State(id="x", task_id="t", messages=[], category="other", source="teacher", level="attempt")
    with pytest.raises(ValueError, match="record r1: not a usable failure state"):
        State.from_record({"id": "r1", "task_id": "t"})


def test_atomic_output_replaces_files_and_folders_only_on_success(tmp_path):
    from reterm.io import atomic_output

    f = tmp_path / "a" / "x.parquet"
    with atomic_output(f) as tmp:
        tmp.write_text("one")
    assert f.read_text() == "one"
    with pytest.raises(RuntimeError), atomic_output(f) as tmp:
        tmp.write_text("half")
        raise RuntimeError("killed")
    assert f.read_text() == "one" and sorted(p.name for p in f.parent.iterdir()) == ["x.parquet"]
    d = tmp_path / "model"
    for text in ("old", "new"):
        with atomic_output(d, directory=True) as tmp:
            (tmp / "config.json").write_text(text)
    assert (d / "config.json").read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["a", "model"]
    with pytest.raises(RuntimeError), atomic_output(d, directory=True) as tmp:
        (tmp / "config.json").write_text("half")
        raise RuntimeError("killed")
    assert (d / "config.json").read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["a", "model"]


def test_context_steps_keeps_the_last_steps_and_the_feedback():
    """``attempt_end_state(..., context_steps=K)``: the history is the attempt's last K steps, the last one carrying
    the feedback; its messages, id and replay commands are those of that shorter prefix (rebuilt from the
    snapshot only); K below 1 is refused."""
    first = _failed_attempt()
    whole = attempt_end_state(Attempt(TASK_DIR, first))
    last = attempt_end_state(Attempt(TASK_DIR, first), context_steps=1)
    assert [s.model_text for s in last.history] == [first.steps[-1].model_text]
    assert last.history[-1].extra["feedback"] == whole.history[-1].extra["feedback"]
    assert last.replay_commands == [] and whole.replay_commands == ["echo hello > /app/out/hello.txt"]
    assert last.id != whole.id and len(last.messages) < len(whole.messages)
    assert last.messages[:2] == whole.messages[:2]  # system prompt and instruction
    assert attempt_end_state(Attempt(TASK_DIR, first), context_steps=5).id == whole.id
    with pytest.raises(ValueError, match="context_steps"):
        attempt_end_state(Attempt(TASK_DIR, first), context_steps=0)
