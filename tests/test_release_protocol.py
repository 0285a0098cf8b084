"""The release's recovery protocol: attempt-level failure states in the real local sandbox, records in the
release's columns, SFT on a dataset that has only those columns, and the intervals every number carries."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from reterm.agent.atif import conversation_view, from_messages
from reterm.agent.protocol import FEEDBACK_MESSAGE, PROMPT_VERSION, SYSTEM_PROMPT, TOOLS
from reterm.record_features import FEATURES
from reterm.records import RELEASE_COLUMNS, release_columns, trajectory_sha256
from reterm.stats import paired_bootstrap, rate, wilson
from reterm.training.sft_data import load_records, record_to_prompt_completion

REPO = Path(__file__).resolve().parents[1]
RELEASE_FIXTURE = REPO / "tests" / "fixtures" / "reterm10k_release" / "train.jsonl"


def test_prompt_follows_the_release_and_is_one_versioned_file():
    assert SYSTEM_PROMPT.startswith("You are a helpful assistant that can interact with a Linux terminal.\n"
                                    "Goal: complete the user's terminal task by using the available tools.")
    assert "exactly one non-interactive shell command at a time" in SYSTEM_PROMPT
    assert SYSTEM_PROMPT == (REPO / "reterm/agent/prompts" / f"system_{PROMPT_VERSION}.md").read_text().strip()
    assert [t["function"]["name"] for t in TOOLS] == ["bash", "submit"]
    assert "test" not in FEEDBACK_MESSAGE.lower().replace("tests.", "").split("pass")[0]  # says it failed, no tests shown


def test_records_lead_with_the_six_release_columns():
    assert list(FEATURES)[:6] == list(RELEASE_COLUMNS)
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "call_0", "type": "function",
                                                                 "function": {"name": "submit", "arguments": {}}}]}]
    row = release_columns("task_000000_f8baca82", msgs, 2, 2)
    assert row["trajectory_sha256"] == trajectory_sha256(msgs) and len(row["trajectory_sha256"]) == 64
    assert row["id"] == f"task_000000_f8baca82:{row['trajectory_sha256'][:16]}" and len(row["id"]) == 37
    # arguments as a mapping or as a JSON string hash the same
    msgs2 = json.loads(json.dumps(msgs))
    msgs2[2]["tool_calls"][0]["function"]["arguments"] = "{}"
    assert trajectory_sha256(msgs2) == row["trajectory_sha256"]
    with pytest.raises(ValueError, match="train_from_message_index=1"):
        release_columns("t", msgs, 1, 2)
    with pytest.raises(ValueError, match="target_attempt_index"):
        release_columns("t", msgs, 2, 3)


def test_release_shaped_jsonl_loads_and_splits_at_train_from_message_index():
    ds = load_records(str(RELEASE_FIXTURE), "train")
    assert set(ds.column_names) == set(RELEASE_COLUMNS)
    for row in ds:
        sft = record_to_prompt_completion(row)
        k = row["train_from_message_index"]
        assert sft["completion"][0]["role"] == "assistant"
        assert len(sft["prompt"]) == k and row["target_attempt_index"] == 2
        # the feedback message is the last thing the model reads before its second attempt
        assert sft["prompt"][-1]["content"] == FEEDBACK_MESSAGE
        assert json.loads(sft["tools"]) == TOOLS  # the release has no tools column: the kit's schemas


def test_wilson_and_paired_bootstrap():
    lo, hi = wilson(0, 10)
    assert lo == 0.0 and abs(hi - 0.2775) < 1e-3
    lo, hi = wilson(5, 10)
    assert abs(lo - 0.2366) < 1e-3 and abs(hi - 0.7634) < 1e-3
    assert rate([1, 0, 1, 1]) == {"value": 0.75, "ci95": [round(wilson(3, 4)[0], 4), round(wilson(3, 4)[1], 4)],
                                  "n": 4, "successes": 3}
    better = paired_bootstrap([0] * 30 + [1] * 10, [1] * 30 + [1] * 10)
    assert better["diff"] == 0.75 and better["excludes_zero"] and better["ci95"][0] > 0
    same = paired_bootstrap([0, 1] * 20, [1, 0] * 20)
    assert same["diff"] == 0.0 and not same["excludes_zero"]
    with pytest.raises(ValueError, match="same items"):
        paired_bootstrap([1], [1, 0])


@pytest.fixture(scope="module")
def drills(tmp_path_factory):
    from reterm.drills import generate_drills

    out = tmp_path_factory.mktemp("drills")
    generate_drills(out, 0, 4, families=["mkdir-parent", "exec-bit", "off-by-one", "wc-number"],
                    ood_families=["wc-number"])
    return out


def test_attempt_level_failure_state_in_the_real_sandbox(drills):
    """A failed first attempt is snapshotted before the verifier; a fork of it, with the whole attempt and the
    feedback as context, is recovered by the reference solution; the record is target_attempt_index 2."""
    from reterm.agent.episode import load_task
    from reterm.data.drills import first_mistake, read_splits
    from reterm.policies.scripted import OraclePolicy
    from reterm.recovery.attempts import attempt_end_state, release, run_attempts

    dirs = [drills / n for n in read_splits(drills)["train"]]
    mistakes = OraclePolicy([(load_task(d).instruction, [first_mistake(d)]) for d in dirs])

    async def go():
        firsts = await run_attempts(mistakes, dirs, keep_failed_snapshots=True)
        try:
            assert all(a.failed and a.snapshot is not None for a in firsts)
            states = [attempt_end_state(a) for a in firsts]
            recs = await run_attempts(OraclePolicy(dirs), dirs, states=states, snapshots=[a.snapshot for a in firsts],
                                      max_turns=8)
        finally:
            release(firsts)
        return firsts, states, recs

    firsts, states, recs = asyncio.run(go())
    for first, state, rec in zip(firsts, states, recs):
        assert state.level == "attempt" and state.history[-1].extra["feedback"] == FEEDBACK_MESSAGE
        assert state.replay_commands[0] == first.trajectory.steps[0].command
        assert rec.trajectory.passed, rec.trajectory.task_id
        msgs = rec.trajectory.to_messages()
        k = len(rec.trajectory.to_messages(upto=rec.trajectory.prefix_len))
        row = release_columns(rec.trajectory.task_id, msgs, k, 2)
        assert msgs[k - 1]["content"] == FEEDBACK_MESSAGE and msgs[k]["role"] == "assistant"
        # the conversation round-trips, feedback included (the GRPO pool rebuilds states from records)
        back = from_messages(msgs[:k], task_id=rec.trajectory.task_id)
        assert back.steps[-1].extra.get("feedback") == FEEDBACK_MESSAGE
        assert conversation_view(back)["steps"] == conversation_view(
            from_messages(row["messages"][:k], task_id=rec.trajectory.task_id))["steps"]
    # the first mistake left its mark: the state's files are what the attempt left, not a fresh task
    assert {s.category for s in states} >= {"path_permission"}


@pytest.mark.slow
def test_sft_trains_on_a_dataset_with_only_the_release_columns(tmp_path):
    """The acceptance command of the release protocol: train/sft.py on JSON lines with the six columns only."""
    data = tmp_path / "release"
    data.mkdir()
    (data / "train.jsonl").write_text(RELEASE_FIXTURE.read_text())
    out = tmp_path / "sft"
    r = subprocess.run([sys.executable, "train/sft.py", "--config", "train/recipes/smollm2-135m/sft.yaml",
                        "--dataset_name", str(data), "--dataset_test_split", "none", "--max_steps", "1",
                        "--output_dir", str(out), "--eval_strategy", "no", "--eval_on_start", "false",
                        "--save_strategy", "no", "--merge_adapter", "false"],
                       cwd=REPO, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    summary = json.loads((out / "training_summary.json").read_text())
    assert summary["steps"] == 1 and summary["first_loss"] > 0


@pytest.mark.slow  # data build and two evaluations, ~76 s
def test_drills_data_and_evaluation_end_to_end_with_scripted_policies(drills, tmp_path):
    """reterm.data.drills writes verified attempt-level records; reterm.eval.drills scores an oracle against an agent that
    submits at once, on the same items, with Wilson intervals, Recovery@k, the Fatal Attempt Rate and a paired
    difference whose interval excludes 0."""
    from reterm.data.drills import build, read_splits
    from reterm.eval.drills import _injected_states, compare, evaluate_model, report
    from reterm.policies.scripted import OraclePolicy, ScriptedPolicy
    from reterm.recovery.attempts import release

    stats = build(drills, tmp_path / "data", policies=[], max_turns=2, batch=4, held_out=0.3)
    ds = load_records(str(tmp_path / "data"), "train")
    assert list(ds.column_names)[:6] == list(RELEASE_COLUMNS)
    assert all(r["failure_source"] == "injected" for r in ds)
    kinds = {r["target_attempt_index"] for r in ds}
    assert kinds == {1, 2}  # the release's attempt-level records and in-attempt recoveries
    for r in ds:
        k = r["train_from_message_index"]
        if r["target_attempt_index"] == 2:
            assert r["messages"][k - 1]["content"] == FEEDBACK_MESSAGE
        else:
            # the mistake (step 0) and its error are context; training starts at the first recovery turn
            assert k == 4 and r["messages"][3]["role"] == "tool" and r["failure_step"] == 0
    assert stats["filters"]["kept"] == sum(stats["splits"].values()) >= 5

    splits = read_splits(drills)
    id_dirs = [drills / n for n in splits["test"]]
    ood_dirs = [drills / n for n in splits["test_ood"]]
    out = tmp_path / "eval"

    async def go():
        injected = await _injected_states(id_dirs + ood_dirs, 8)
        try:
            oracle = await evaluate_model("sft", OraclePolicy(id_dirs + ood_dirs), id_dirs, ood_dirs, injected, out,
                                          max_turns=8, batch=8, own_items=4, k_max=2)
            nop = await evaluate_model("base", ScriptedPolicy([]), id_dirs, ood_dirs, injected, out,
                                       max_turns=2, batch=8, own_items=4, k_max=2)
        finally:
            release(injected[0])
        return oracle, nop

    oracle, nop = asyncio.run(go())
    n = len(id_dirs)
    assert oracle["pass_at_1"]["drills_id"]["value"] == 1.0 and oracle["pass_at_1"]["drills_id"]["n"] == n
    assert nop["pass_at_1"]["drills_id"]["value"] == 0.0
    assert oracle["recovery_at_1"]["drills_id"]["value"] == 1.0 and nop["recovery_at_1"]["drills_id"]["value"] == 0.0
    assert oracle["valid_tool_call_rate"]["value"] == 1.0
    # the agent that submits at once fails every item; the reference solution still passes from its states
    own = nop["recovery_own"]
    assert own["n_failed_attempts"] == 4 and own["recovery_at_2"]["value"] == 0.0
    assert own["fatal_attempt_rate"]["value"] == 0.0 and own["conditional_recovery_at_1"]["n"] == 4
    diffs = compare(out, ["base", "sft"])["sft - base"]
    assert diffs["pass_at_1/drills_id"]["diff"] == 1.0 and diffs["pass_at_1/drills_id"]["n"] == n
    md = report({"models": {"base": nop, "sft": oracle}, "differences": {"sft - base": diffs}})
    assert "| sft | 1.000 [" in md and "Fatal Attempt Rate" in md


def test_grpo_pool_takes_attempt_level_records_and_grows_attempt_level_online_states(drills, tmp_path):
    """ReTerm-GRPO in the release's protocol: seed states are the records' failed attempts plus feedback, and a
    failed recovery attempt from one of them becomes the next sequential state (attempt + feedback again)."""
    from datasets import load_dataset

    from reterm.data.drills import build
    from reterm.training.failure_pool import _attempt_level, online_states_from_attempt, seed_states_from_records

    build(drills, tmp_path / "data", policies=[], max_turns=2, batch=8, held_out=0.0)
    records = load_dataset(str(tmp_path / "data"), split="train")
    states, skipped = seed_states_from_records(records, [drills])
    attempt_level = sum(r["target_attempt_index"] == 2 for r in records)
    # step-level records (target 1) are step-level states: the prompt ends with the mistake's observation
    assert sum(_attempt_level(st) for st in states) == attempt_level and not skipped
    assert len(states) == len(records) and all(st.prompt[-1]["role"] in ("tool", "user") for st in states)
    states = [st for st in states if _attempt_level(st)]
    parent = states[0]
    assert parent.prompt[-1]["content"] == FEEDBACK_MESSAGE
    wrong = [{"role": "assistant", "content": "", "tool_calls": [{"id": "call_9", "type": "function", "function": {
                 "name": "bash", "arguments": json.dumps({"command": "ls /nope"})}}]},
             {"role": "tool", "tool_call_id": "call_9", "name": "bash",
              "content": "ls: cannot access '/nope': No such file or directory\n[exit status: 2]"},
             {"role": "assistant", "content": "", "tool_calls": [{"id": "call_10", "type": "function",
                                                                  "function": {"name": "submit", "arguments": "{}"}}]}]
    attempt = from_messages(parent.prompt + wrong, task_id=parent.task_id)
    attempt.prefix_len = len(parent.trajectory.steps)
    attempt.set_reward(0.0)
    (new,) = online_states_from_attempt(attempt, parent, step=3)
    assert new.prompt[: len(parent.prompt)] == parent.prompt  # the first attempt and its feedback stay context
    assert new.prompt[-1]["content"] == FEEDBACK_MESSAGE and len(new.prompt) == len(parent.prompt) + 4
    assert new.source == "online" and new.parent_id == parent.state_id


@pytest.mark.slow
def test_drills_evaluation_without_injected_states(drills, tmp_path):
    """``--max-states 0``: Pass@1 only; Recovery@1 from injected states is reported with n = 0 instead of the
    run failing on an empty set of states."""
    from reterm.eval.drills import main

    out = tmp_path / "eval"
    rc = main(["--tasks", str(drills), "--output", str(out), "--model", "base=smollm2", "--max-id", "1",
               "--max-ood", "0", "--max-states", "0", "--own-items", "0", "--k-max", "1", "--max-turns", "1",
               "--max-new-tokens", "8"])  # fmt: skip
    assert rc == 0
    metrics = json.loads((out / "base" / "metrics.json").read_text())
    assert metrics["pass_at_1"]["drills_id"]["n"] == 1
    assert metrics["recovery_at_1"]["drills_id"]["n"] == 0
