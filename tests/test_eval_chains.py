"""Recovery@1 from the state model's own held-out chain failure states and Pass@1 from the chains' start
(``python -m eval.drills --multistage-states N --chain-stages 3``), end to end on the local sandbox with scripted
models behind ``load_policy``.

``sft`` (the state model) clears stages 1 and 2 of each three-stage chain and submits, so every attempt from the
start fails with ``STAGES DONE: 2 of 3`` and its end state is an item; ``grpo-reterm`` types the last stage only
(it recovers from every item, and fails from the start); ``grpo-standard`` types the whole reference (it passes
from every start, and recovers too: the earlier stages' commands can be typed again); ``base`` answers in prose.
"""

from __future__ import annotations

import json

from reterm.agent.episode import load_task
from reterm.drills import generate_drills
from reterm.drills.generate import stage_parts
from reterm.drills.multistage import generate_multistage, turn_budget
from reterm.eval import drills as eval_drills
from reterm.policies.scripted import OraclePolicy, ScriptedPolicy, _first_user_text


def _policy(pairs: dict[str, list[str]], name: str) -> ScriptedPolicy:
    oracle = OraclePolicy(list(pairs.items()), name=name)

    def reply(messages):
        text = _first_user_text(messages)
        return oracle.reply(messages) if any(k in text for k in pairs) else "I am not sure what to do."

    return ScriptedPolicy(reply, name=name)


def test_recovery_and_pass_on_own_chain_failure_states(tmp_path, monkeypatch):
    tasks = tmp_path / "drills"
    generate_drills(tasks, 0, 4, families=["mkdir-parent", "exec-bit", "off-by-one", "wc-number"],
                    ood_families=["wc-number"])  # fmt: skip
    fams = eval_drills.multistage_families(tasks)
    chains = generate_multistage(tmp_path / "ms", eval_drills.MULTISTAGE_SEED, 4, families=fams, stages=3)
    assert [c.name for c in chains][:2] == ["chain3-000", "chain3-001"]

    def cmds(t, idx):
        parts = stage_parts(t.path)
        return [c for i in idx for c in parts[i]["solution"]]

    instr = {t.name: load_task(t.path).instruction.strip() for t in chains}
    plans = {"first2": [0, 1], "last": [2], "all": [0, 1, 2]}
    policies = {k: (lambda k=k, v=v: _policy({instr[t.name]: cmds(t, v) for t in chains}, k)) for k, v in plans.items()}
    policies["nothing"] = lambda: ScriptedPolicy(lambda m: "I am not sure what to do.", name="nothing")
    seen_turns = []
    real_run = eval_drills.run_attempts

    async def spy(*args, **kw):
        seen_turns.append(kw.get("max_turns"))
        return await real_run(*args, **kw)

    monkeypatch.setattr(eval_drills, "run_attempts", spy)
    monkeypatch.setattr(eval_drills, "load_policy", lambda spec, **kw: policies[spec]())
    out = tmp_path / "eval"
    argv = ["--tasks", str(tasks), "--output", str(out), "--model", "base=nothing", "--model", "sft=first2",
            "--model", "grpo-standard=all", "--model", "grpo-reterm=last", "--max-id", "0", "--max-ood", "0",
            "--max-states", "0", "--own-items", "0", "--k-max", "1", "--max-turns", "4", "--batch", "8",
            "--multistage-states", "2", "--chain-stages", "3"]  # fmt: skip
    assert eval_drills.main(argv) == 0
    assert set(seen_turns) == {turn_budget(3)}  # every chain attempt got the chain's turns, not --max-turns 4

    results = json.loads((out / "results.json").read_text())
    info = results["multistage_states"]
    assert info["stages"] == 3 and info["max_turns"] == 11 and info["n_states"] == 2 and info["n_tasks"] == 3
    assert info["stages_done"] == {"2": 2}  # sft's failed attempts cleared two of three stages
    states = json.loads((out / "multistage" / "states.json").read_text())
    assert [(i["task"], i["stages_done"]) for i in states["items"]] == [("chain3-000", 2), ("chain3-001", 2)]
    rec = {n: m["recovery_at_1"]["multistage_own"] for n, m in results["models"].items()}
    assert rec["grpo-reterm"]["value"] == 1.0 and rec["grpo-reterm"]["n"] == 2
    assert rec["base"]["value"] == rec["sft"]["value"] == 0.0
    # Pass@1 from the start of the 3 chains the states came from, paired by task
    p1 = {n: m["pass_at_1"]["multistage_start"] for n, m in results["models"].items()}
    assert p1["grpo-standard"]["value"] == 1.0 and p1["grpo-standard"]["n"] == 3
    assert p1["sft"]["value"] == 0.0 and p1["sft"]["n"] == 3 and p1["grpo-reterm"]["value"] == 0.0
    d = results["differences"]["grpo-standard - sft"]["pass_at_1/multistage_start"]
    assert d["diff"] == 1.0 and d["n"] == 3 and "min_detectable_80" in d
    d = results["differences"]["grpo-reterm - sft"]["recovery_at_1/multistage_own"]
    assert d["diff"] == 1.0 and d["n"] == 2 and "min_detectable_80" in d
    # the state model's Pass@1 is its state-building attempts (greedy, same caps): not run again
    kinds = [json.loads(x).get("kind") for x in (out / "sft" / "attempts.jsonl").read_text().splitlines() if x]
    assert "pass_at_1_multistage" not in kinds
    assert "pass_at_1_multistage" in [json.loads(x).get("kind") for x in
                                      (out / "base" / "attempts.jsonl").read_text().splitlines() if x]  # fmt: skip
    report = (out / "report.md").read_text()
    assert "Recovery@1 own 3-stage chain states" in report and "failure states per stages done: 2: 2" in report


def test_chain_stages_is_checked(tmp_path, capsys):
    tasks = tmp_path / "drills"
    generate_drills(tasks, 0, 2, families=["mkdir-parent", "exec-bit", "wc-number"], ood_families=["wc-number"])
    argv = ["--tasks", str(tasks), "--output", str(tmp_path / "e"), "--model", "sft=smollm2",
            "--multistage-states", "2"]  # fmt: skip
    assert eval_drills.main(argv + ["--chain-stages", "1"]) == 2
    assert "--chain-stages 1: expected 2 or more" in capsys.readouterr().err
    assert eval_drills.main(argv + ["--chain-stages", "4"]) == 2
    assert "a chain needs one per stage" in capsys.readouterr().err


def test_own_attempts_go_to_the_longest_chains_first(tmp_path):
    from reterm.data.drills import own_multistage_dirs, read_splits
    from reterm.drills.generate import stage_parts
    from reterm.drills.multistage import add_train_instances

    tasks = tmp_path / "drills"
    generate_drills(tasks, 0, 2, families=["mkdir-parent", "exec-bit", "off-by-one", "git-identity"], ood_families=[])
    add_train_instances(tasks, 3)
    add_train_instances(tasks, 2, stages=4)
    add_train_instances(tasks, 1, stages=3)
    multi = [tasks / n for n in read_splits(tasks)["train"] if stage_parts(tasks / n)]
    assert [d.name for d in multi][:3] == ["multi-10000", "multi-10001", "multi-10002"]  # splits.json order
    got = [d.name for d in own_multistage_dirs(multi, 4)]
    assert got == ["chain4-10000", "chain4-10001", "chain3-10000", "multi-10000"]
    assert own_multistage_dirs(multi, 0) == [] and len(own_multistage_dirs(multi, 99)) == 6
