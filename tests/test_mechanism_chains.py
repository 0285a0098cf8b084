"""The mechanism stage on chains (``python -m eval.mechanism --chain-stages K``): the failure state is the failed
start attempt with the most stages done (the chain verifier's report), rows and metrics carry stages done, the
power calculation is stated before the run; end to end in the local sandbox with a scripted policy and with the
real SmolLM2."""

import json

import pytest

from reterm.drills.generate import stage_parts
from reterm.eval import mechanism
from reterm.policies.scripted import ScriptedPolicy, assistant_commands, bash_call, submit_call


def _row(task, start, start_done, fail, done):
    return {"task": task, "family": "f", "category": "c", "task_start": {"rewards": start, "stages_done": start_done},
            "failure_state": None if fail is None else {"rewards": fail, "category": "c", "state_id": task,
                                                        "stages_done": done}}  # fmt: skip


def test_summarize_gives_both_arms_by_stages_done():
    rows = [_row("a", [0, 0], [1, 2], [1, 0], 2), _row("b", [0, 0], [0, 1], [0, 0], 1),
            _row("c", [0, 1], [2, 3], [1, 1], 2), _row("d", [1, 1], [3, 3], None, None)]  # fmt: skip
    m = mechanism.summarize(rows)
    assert list(m["by_stages_done"]) == ["1", "2"]
    two = m["by_stages_done"]["2"]
    assert two["tasks"] == 2 and two["pass_rate"]["failure_state"]["value"] == 0.75
    assert two["pass_rate"]["task_start"]["value"] == 0.25
    assert two["difference"]["n"] == 2 and two["difference"]["diff"] == 0.0  # a: 0 -> 1, c: 1 -> 0
    assert m["by_stages_done"]["1"]["signal_attempt_share"]["failure_state"]["value"] == 0.0
    plan = mechanism.power_plan(48, 0.4, 0.2)
    assert plan["n_needed"] == 71 and 0.2 < plan["min_detectable_at_planned"] < 0.25  # sqrt(7.85 * 0.4 / 55.85)
    text = mechanism.report({**m, "power_plan": plan, "settings": {"model": "x", "group_size": 2, "temperature": 1,
                                                                    "max_turns": 11, "max_new_tokens": 96}})
    assert "By the failure state's stages done" in text and "= 71 paired tasks" in text


def _chain_policy(dirs):
    """Start attempt i of a task (counted per task): ``echo attempt-i`` (which tells its later turns apart), parts
    1..(i % k) by their reference, then submit, so the start group's failed attempts have 0, 1, ... stages done.
    After the feedback: the rest of the reference from the stages the history did."""
    plans = {}
    for d in dirs:
        parts = stage_parts(d)
        plans[(d / "instruction.md").read_text().strip()] = [p["solution"] for p in parts]
    starts: dict[str, int] = {}

    def reply(messages):
        instr = next(m["content"] for m in messages if m["role"] == "user").strip()
        sols = plans[instr]
        done = assistant_commands(messages)
        if None in done:  # resuming after the failed attempt's submit: do the stages it did not
            first, now = done[1 : done.index(None)], done[done.index(None) + 1 :]
            j = next(j for j in range(len(sols) + 1) if sum(map(len, sols[:j])) == len(first))
            rest = [c for s in sols[j:] for c in s]
            return bash_call(rest[len(now)]) if len(now) < len(rest) else submit_call()
        if not done:
            starts[instr] = starts.get(instr, -1) + 1
            return bash_call(f"echo attempt-{starts[instr]}")
        j = int(done[0].removeprefix("echo attempt-")) % len(sols)
        mine = [c for s in sols[:j] for c in s]
        return bash_call(mine[len(done) - 1]) if len(done) - 1 < len(mine) else submit_call()

    return ScriptedPolicy(reply, name="chain-stages")


@pytest.mark.slow
def test_chain_mechanism_forks_from_the_most_stages_done(tmp_path, capsys):
    out = tmp_path / "m"
    from reterm.drills.multistage import generate_multistage

    tasks = generate_multistage(out / "tasks", 0, 1, stages=3)
    policy = _chain_policy([t.path for t in tasks])
    args = ["--model", "unused", "--output", str(out), "--chain-stages", "3", "--tasks", "1", "--group-size", "3",
            "--max-turns", "11", "--batch", "3"]  # fmt: skip
    assert mechanism.main(args, policy=policy) == 0
    said = capsys.readouterr().out
    assert "power: assumed discordance psi=0.4, difference delta=0.2" in said and "= 71 paired tasks" in said
    row = mechanism.read_rows(out / "groups.jsonl")[0]
    assert row["task"] == "chain3-000" and row["task_start"]["stages_done"] == [0, 1, 2]
    assert row["task_start"]["rewards"] == [0.0, 0.0, 0.0]
    fs = row["failure_state"]
    assert fs["stages_done"] == 2 and fs["from_attempt"] == 2 and fs["rewards"] == [1.0, 1.0, 1.0], row
    m = json.loads((out / "mechanism.json").read_text())
    assert m["settings"]["stages"] == 3 and m["power_plan"]["n_needed"] == 71
    assert m["by_stages_done"]["2"]["pass_rate"]["failure_state"]["value"] == 1.0


@pytest.mark.slow
def test_chain_mechanism_end_to_end_with_smollm2(tmp_path):
    """The real SmolLM2 on one four-stage chain, G=2, a few short turns: the stage runs, rows carry stages done
    (an int from the verifier's report for every scored start attempt), the outputs are written."""
    out = tmp_path / "m"
    args = ["--model", "smollm2", "--output", str(out), "--chain-stages", "4", "--tasks", "1", "--group-size", "2",
            "--max-turns", "2", "--max-new-tokens", "48", "--batch", "2"]  # fmt: skip
    assert mechanism.main(args) == 0
    row = mechanism.read_rows(out / "groups.jsonl")[0]
    scored = [d for d, r in zip(row["task_start"]["stages_done"], row["task_start"]["rewards"]) if r is not None]
    assert scored and all(isinstance(d, int) and 0 <= d <= 4 for d in scored), row
    m = json.loads((out / "mechanism.json").read_text())
    assert m["settings"]["stages"] == 4 and "by_stages_done" in m and (out / "report.md").is_file()
