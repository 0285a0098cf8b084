"""The ReTerm-GRPO mechanism experiment (reterm.eval.mechanism) and multi-stage drills (reterm.drills.multistage):
the metrics from hand-computed groups, composition rules, and in the real sandbox that the failure-state arm
really starts from the failed attempt's fork (a recovery that only does the second stage passes there and fails
from a fresh start), that reruns resume without counting a task twice, and that the outputs are written."""

import asyncio
import dataclasses
import json

import pytest

from reterm.agent.protocol import FEEDBACK_MESSAGE
from reterm.drills import EnvFile, make_drill
from reterm.drills.multistage import add_train_instances, compose, generate_multistage, make_multistage
from reterm.eval import mechanism
from reterm.policies.scripted import ScriptedPolicy, assistant_commands, bash_call, submit_call
from reterm.stats import items_needed, min_detectable, signal_attempt_share


def test_signal_share_counts_attempts_in_groups_with_differing_rewards():
    groups = [[1.0, 0.0, 0.0, 0.0], [0.0] * 4, [1.0] * 4, [1.0, None, 0.0, 0.0], [None, 1.0, None, None]]
    s = signal_attempt_share(groups)
    # the last group has one scored attempt: left out; 4 + 3 signal attempts of 4 + 4 + 4 + 3 scored
    assert s["groups"] == 4 and s["signal_groups"] == 2 and s["n"] == 15
    assert s["value"] == round(7 / 15, 4) and s["ci95"][0] <= s["value"] <= s["ci95"][1]
    assert signal_attempt_share([]) ["value"] is None


def test_power_formula_matches_the_notes():
    assert items_needed(0.17, 0.10) == 126 and items_needed(0.17, 0.05) == 526  # NOTES: ~126 and ~530
    assert min_detectable(0.17, 126) == pytest.approx(0.10, abs=0.002)
    assert min_detectable(0.0, 100) is None and items_needed(0.01, 0.2) is None


def test_summarize_pairs_tasks_and_reports_power():
    rows = [
        {"task": "a", "family": "f", "category": "c1", "task_start": {"rewards": [0, 0, 0, 0]},
         "failure_state": {"rewards": [1, 0, 1, 0], "category": "c1", "state_id": "s"}},
        {"task": "b", "family": "f", "category": "c2", "task_start": {"rewards": [1, 0, 0, 0]},
         "failure_state": {"rewards": [0, 0, 0, 0], "category": "c2", "state_id": "t"}},
        {"task": "c", "family": "f", "category": "c1", "task_start": {"rewards": [0, 0, 1, 0]},
         "failure_state": {"rewards": [1, 1, 0, 1], "category": "c1", "state_id": "u"}},
        {"task": "d", "family": "f", "category": "c1", "task_start": {"rewards": [1, 1, 1, 1]}, "failure_state": None},
    ]  # fmt: skip
    m = mechanism.summarize(rows)
    assert m["n_tasks"] == 4 and m["no_failure_state"] == 1
    assert m["signal_attempt_share"]["task_start"]["value"] == 0.5  # 8 of 16 attempts
    assert m["signal_attempt_share"]["failure_state"]["value"] == round(8 / 12, 4)
    d = m["difference"]["failure_state - task_start"]
    assert d["n"] == 3 and d["diff"] == 0.0 and d["discordance"] == round(2 / 3, 4)
    assert d["min_detectable_80"] is not None
    assert set(m["by_category"]) == {"c1", "c2"}
    assert "failure_state" in mechanism.report({**m, "settings": {"model": "x", "group_size": 4, "temperature": 1,
                                                                   "max_turns": 8, "max_new_tokens": 96}})


def test_compose_merges_stages_and_refuses_conflicting_files():
    a, b = make_drill("python-alias", 0, 1), make_drill("exec-bit", 0, 2)
    d = compose([a, b])
    assert d.family == "multi:python-alias+exec-bit" and d.stages == 2 and d.category == a.category
    assert d.solution == a.solution + b.solution and d.checks == a.checks + b.checks
    assert d.first_mistake == a.first_mistake and "Part 2:" in d.instruction
    with pytest.raises(ValueError, match="at least 2 stages"):
        compose([a])
    with pytest.raises(ValueError, match="both write"):
        path = next(iter(a.files))
        compose([a, dataclasses.replace(b, files={**b.files, path: EnvFile("other content")})])
    assert make_multistage(0, 5) == make_multistage(0, 5)
    assert len({make_multistage(0, i).family for i in range(20)}) >= 10


def _second_stage_policy(dirs):
    """First attempt: the first stage's reference only, then submit (fails: the second stage is undone). After the
    feedback message: the second stage's reference only. It passes only where the first attempt's files are."""
    import tomllib

    from reterm.tasks import load_task

    stages = {}
    for d in dirs:
        meta = tomllib.loads((d / "task.toml").read_text())["metadata"]
        fams = meta["family"].removeprefix("multi:").split("+")
        sol = [c for c in (d / "solution" / "solve.sh").read_text().splitlines() if c and not c.startswith("#")]
        first = make_drill(fams[0], 0, 0)  # only its command count is used
        stages[load_task(d).instruction.strip()] = (sol[: len(first.solution)], sol[len(first.solution):])

    def reply(messages):
        instr = next(m["content"] for m in messages if m["role"] == "user").strip()
        one, two = stages[instr]
        done = assistant_commands(messages)
        recovering = None in done  # the history holds the first attempt, which ended with its submit
        if recovering:
            assert FEEDBACK_MESSAGE in json.dumps(messages)  # the feedback follows the failed attempt
            done = done[done.index(None) + 1 :]
        plan = two if recovering else one
        return bash_call(plan[len(done)]) if len(done) < len(plan) else submit_call()

    return ScriptedPolicy(reply, name="second-stage")


@pytest.mark.slow
def test_failure_state_arm_starts_from_the_failed_attempts_fork_and_resumes(tmp_path):
    out = tmp_path / "m"
    tasks = generate_multistage(out / "tasks", 0, 3, families=["python-alias", "exec-bit", "mkdir-parent"])
    # every stage's reference is the same length for all instances of these families
    policy = _second_stage_policy([t.path for t in tasks])
    rows, lines = asyncio.run(mechanism.run_chunk(policy, tasks[:1], 2, max_turns=8))
    assert rows[0]["task_start"]["rewards"] == [0.0, 0.0]
    assert rows[0]["failure_state"]["rewards"] == [1.0, 1.0], rows
    # both start attempts did part 1 only: equal progress, so the earliest; part 2's checks failed
    assert rows[0]["failure_state"]["from_attempt"] == 0 and rows[0]["failure_state"]["failed_checks"] >= 1, rows
    assert len(lines) == 4
    # the same second-stage commands from a fresh start fail: the pass above came from the fork's files
    from reterm.recovery.attempts import attempt_end_state, run_attempts

    async def fresh():
        first = await run_attempts(policy, [tasks[0].path], keep_failed_snapshots=False)
        st = attempt_end_state(first[0])
        return await run_attempts(policy, [tasks[0].path], states=[st], snapshots=[None])

    assert not asyncio.run(fresh())[0].trajectory.passed
    # the command line: two tasks, then a rerun with three resumes and never counts a task twice
    args = ["--model", "unused", "--output", str(out), "--group-size", "2", "--max-turns", "8",
            "--families", "python-alias,exec-bit,mkdir-parent"]  # fmt: skip
    assert mechanism.main([*args, "--tasks", "2", "--batch", "2"], policy=policy) == 0
    assert len(mechanism.read_rows(out / "groups.jsonl")) == 2
    assert mechanism.main([*args, "--tasks", "3", "--batch", "2"], policy=policy) == 0
    rows = mechanism.read_rows(out / "groups.jsonl")
    assert sorted(r["task"] for r in rows) == ["multi-000", "multi-001", "multi-002"]
    m = json.loads((out / "mechanism.json").read_text())
    assert m["n_tasks"] == 3 and m["signal_attempt_share"]["failure_state"]["value"] == 0.0
    assert m["pass_rate"]["failure_state"]["value"] == 1.0 and m["pass_rate"]["task_start"]["value"] == 0.0
    assert (out / "report.md").is_file() and (out / "signal.png").is_file()
    assert "ablation" not in (out / "report.md").read_text()
    # the recovery-context ablation: not mixed into rows made with the whole attempt, recorded where it ran
    assert mechanism.main([*args, "--tasks", "3", "--batch", "2", "--context-steps", "1"], policy=policy) == 2
    short = tmp_path / "short"
    argv = [*args[:2], "--output", str(short), *args[4:], "--tasks", "1", "--batch", "2", "--context-steps", "1"]
    assert mechanism.main(argv, policy=policy) == 0
    (row,) = mechanism.read_rows(short / "groups.jsonl")
    assert row["failure_state"]["context_steps"] == 1 and row["failure_state"]["rewards"] == [1.0, 1.0]
    assert "last 1 steps (an ablation)" in (short / "report.md").read_text()


def test_single_stage_control_takes_instances_spread_over_families(tmp_path):
    from reterm.drills import generate_drills

    generate_drills(tmp_path, 0, 4)
    add_train_instances(tmp_path, 2)
    tasks = mechanism.single_stage_tasks(tmp_path, "train", 200)
    assert tasks and not any(t.family.startswith("multi:") for t in tasks)  # the folder's two-stage drills stay out
    tasks = mechanism.single_stage_tasks(tmp_path, "train", 6)
    assert len(tasks) == 6 and len({t.family for t in tasks}) == 6 and all((t.path / "task.toml").is_file() for t in tasks)
    with pytest.raises(ValueError, match="split 'nope' has no single-stage instance"):
        mechanism.single_stage_tasks(tmp_path, "nope", 2)
