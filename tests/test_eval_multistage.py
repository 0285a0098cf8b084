"""Recovery@1 from the state model's own held-out two-stage failure states (``python -m eval.drills
--multistage-states N``), end to end on the local sandbox with scripted models behind ``load_policy``.

``sft`` (the state model) clears part 1 of each two-stage drill and submits, so every attempt from the task start
fails and its end state (part 1 done) is an item; ``grpo-reterm`` types part 2 only (it recovers from every item);
``base`` answers in prose (it recovers from none). Same items for every model, so ``compare`` pairs them. The
evaluation is of these items only (`--max-id 0`: no Pass@1 items, no own failed attempts to follow).
"""

from __future__ import annotations

import json

import pytest

from reterm.agent.episode import load_task
from reterm.drills import generate_drills
from reterm.drills.generate import stage_parts
from reterm.drills.multistage import generate_multistage
from reterm.eval import drills as eval_drills
from reterm.policies.scripted import OraclePolicy, ScriptedPolicy, _first_user_text
from reterm.sandbox.snapshot import Snapshot


def _stage_policy(pairs: dict[str, list[str]], name: str) -> ScriptedPolicy:
    """Replays ``pairs[instruction]`` on the two-stage drills it knows; prose on any other task."""
    oracle = OraclePolicy(list(pairs.items()), name=name)

    def reply(messages):
        text = _first_user_text(messages)
        return oracle.reply(messages) if any(k in text for k in pairs) else "I am not sure what to do."

    return ScriptedPolicy(reply, name=name)


def test_recovery_from_own_two_stage_failure_states_is_paired(tmp_path, monkeypatch):
    tasks = tmp_path / "drills"
    generate_drills(tasks, 0, 4, families=["mkdir-parent", "exec-bit", "off-by-one", "wc-number"],
                    ood_families=["wc-number"])  # fmt: skip
    # the same two-stage drills the evaluation writes (its seed, the folder's stage families)
    fams = eval_drills.multistage_families(tasks)
    assert "wc-number" not in fams
    ms = generate_multistage(tmp_path / "ms", eval_drills.MULTISTAGE_SEED, 4, families=fams)
    part = {i: {load_task(t.path).instruction.strip(): stage_parts(t.path)[i]["solution"] for t in ms} for i in (0, 1)}
    policies = {"part1": lambda: _stage_policy(part[0], "part1"), "part2": lambda: _stage_policy(part[1], "part2"),
                "nothing": lambda: ScriptedPolicy(lambda m: "I am not sure what to do.", name="nothing")}  # fmt: skip
    out = tmp_path / "eval"
    argv = ["--tasks", str(tasks), "--output", str(out), "--model", "base=nothing", "--model", "sft=part1",
            "--model", "grpo-reterm=part2", "--max-id", "0", "--max-ood", "0", "--max-states", "0",
            "--own-items", "0", "--k-max", "1", "--max-turns", "8", "--batch", "8", "--multistage-states", "2"]

    # a run that stops after the state model (it goes first: it builds the states at its turn)
    def stop(spec, **kw):
        if spec == "nothing":
            raise RuntimeError("stopped")
        return policies[spec]()

    monkeypatch.setattr(eval_drills, "load_policy", stop)
    with pytest.raises(RuntimeError, match="stopped"):
        eval_drills.main(argv)
    assert (out / "sft" / "metrics.json").is_file() and not (out / "base").exists()
    built = (out / "multistage" / "states.json").read_text()
    assert not json.loads(built).get("released")
    # the re-run reuses the states (their snapshots were kept) instead of attempting the tasks again
    monkeypatch.setattr(eval_drills, "load_policy", lambda spec, **kw: policies[spec]())
    monkeypatch.setattr(eval_drills, "build_multistage_states", None)
    assert eval_drills.main(argv) == 0
    assert json.loads((out / "multistage" / "states.json").read_text()) == json.loads(built) | {"released": True}

    results = json.loads((out / "results.json").read_text())
    info = results["multistage_states"]
    # sft fails every two-stage drill from its start: the first 2 of the ceil(1.1 x 2) = 3 tried are the items
    assert info["state_model"] == "sft" and info["n_states"] == 2 and info["n_tasks"] == 3
    assert info["pass_at_1_from_start"]["value"] == 0.0 and info["pass_at_1_from_start"]["n"] == 3
    rec = {n: m["recovery_at_1"]["multistage_own"] for n, m in results["models"].items()}
    assert rec["grpo-reterm"]["value"] == 1.0 and rec["grpo-reterm"]["n"] == 2
    assert rec["base"]["value"] == 0.0 and rec["sft"]["value"] == 0.0 and rec["base"]["n"] == 2
    d = results["differences"]["grpo-reterm - sft"]["recovery_at_1/multistage_own"]
    assert d["diff"] == 1.0 and d["n"] == 2 and "min_detectable_80" in d
    assert results["differences"]["sft - base"]["recovery_at_1/multistage_own"]["diff"] == 0.0
    # the same items (state ids) for every model
    ids = {}
    for name in results["models"]:
        items = [json.loads(x) for x in (out / name / "recovery_items.jsonl").read_text().splitlines()]
        ids[name] = [i["state_id"] for i in items if i["kind"] == "recovery_multistage_own"]
        assert sorted(json.loads((out / name / "per_item.json").read_text())["recovery_at_1/multistage_own"]) == \
            sorted(ids[name])
    assert ids["base"] == ids["sft"] == ids["grpo-reterm"] and len(set(ids["base"])) == 2
    states = json.loads((out / "multistage" / "states.json").read_text())
    assert [i["task"] for i in states["items"]] == ["multi-000", "multi-001"]
    assert [i["state"]["id"] for i in states["items"]] == ids["base"]
    report = (out / "report.md").read_text()
    assert "Recovery@1 own two-stage states" in report and "two-stage pass rate from task start" in report

    # every model is done: the states' snapshots were released; a re-run evaluates nothing and keeps the numbers
    assert states["released"]
    for item in states["items"]:
        with pytest.raises(FileNotFoundError):
            Snapshot.load(item["snapshot"])
    assert eval_drills.main(argv) == 0
    again = json.loads((out / "results.json").read_text())
    assert again["multistage_states"] == info and again["differences"] == results["differences"]


@pytest.mark.slow
def test_multistage_states_with_smollm2(tmp_path):
    """The real SmolLM2 as the state model (``--states-from`` names no evaluated model: the first one is used),
    one state, one short turn: the path runs end to end with a model and reports its numbers."""
    tasks = tmp_path / "drills"
    generate_drills(tasks, 0, 4, families=["mkdir-parent", "exec-bit", "off-by-one", "wc-number"],
                    ood_families=["wc-number"])  # fmt: skip
    out = tmp_path / "eval"
    rc = eval_drills.main(["--tasks", str(tasks), "--output", str(out), "--model", "base=smollm2", "--max-id", "1",
                           "--max-ood", "0", "--max-states", "0", "--own-items", "0", "--k-max", "1", "--max-turns",
                           "1", "--max-new-tokens", "8", "--multistage-states", "1"])  # fmt: skip
    assert rc == 0
    results = json.loads((out / "results.json").read_text())
    info = results["multistage_states"]
    assert info["state_model"] == "base" and results["settings"]["states_from"] == "base"
    assert info["n_tasks"] >= info["n_states"] == 1 and info["pass_at_1_from_start"]["n"] >= 1
    r = results["models"]["base"]["recovery_at_1"]["multistage_own"]
    assert r["n"] + results["models"]["base"]["infra_faults"]["multistage_own"] == 1


def test_kept_states_let_a_later_run_add_a_model(tmp_path, monkeypatch):
    """``--keep-states``: the snapshots outlive the run, so a model added later recovers from the very same states
    (paired with the first run's models) instead of a rebuilt set."""
    tasks = tmp_path / "drills"
    generate_drills(tasks, 0, 4, families=["mkdir-parent", "exec-bit", "off-by-one"], ood_families=[])
    fams = eval_drills.multistage_families(tasks)
    ms = generate_multistage(tmp_path / "ms", eval_drills.MULTISTAGE_SEED, 4, families=fams)
    part = {i: {load_task(t.path).instruction.strip(): stage_parts(t.path)[i]["solution"] for t in ms} for i in (0, 1)}
    policies = {"part1": lambda: _stage_policy(part[0], "part1"), "part2": lambda: _stage_policy(part[1], "part2")}
    monkeypatch.setattr(eval_drills, "load_policy", lambda spec, **kw: policies[spec]())
    out = tmp_path / "eval"
    common = ["--tasks", str(tasks), "--output", str(out), "--max-id", "0", "--max-ood", "0", "--max-states", "0",
              "--own-items", "0", "--k-max", "1", "--max-turns", "8", "--batch", "8", "--multistage-states", "2"]
    assert eval_drills.main([*common, "--model", "sft=part1", "--keep-states"]) == 0
    built = json.loads((out / "multistage" / "states.json").read_text())
    assert not built.get("released")  # every model is done, and the states are kept
    monkeypatch.setattr(eval_drills, "build_multistage_states", None)  # a rebuild would fail here
    assert eval_drills.main([*common, "--model", "sft=part1", "--model", "grpo-reterm=part2"]) == 0
    d = json.loads((out / "results.json").read_text())["differences"]["grpo-reterm - sft"]
    assert d["recovery_at_1/multistage_own"]["n"] == 2 and d["recovery_at_1/multistage_own"]["diff"] == 1.0
    assert json.loads((out / "multistage" / "states.json").read_text())["released"]  # released without the flag
    # any two evaluated names can be paired: a re-run evaluates nothing and adds the difference
    both = [*common, "--model", "sft=part1", "--model", "grpo-reterm=part2"]
    assert eval_drills.main([*both, "--pair", "sft:grpo-reterm"]) == 0
    d = json.loads((out / "results.json").read_text())["differences"]["sft - grpo-reterm"]
    assert d["recovery_at_1/multistage_own"]["n"] == 2 and d["recovery_at_1/multistage_own"]["diff"] == -1.0
    assert eval_drills.main([*both, "--pair", "sft:standard"]) == 2  # a name that was not evaluated


def test_a_state_build_killed_midway_resumes_from_its_journal(tmp_path, monkeypatch):
    """Building the own multi-stage failure states journals its attempts: killed after its first batch, a re-run
    attempts only the rest, reuses the kept snapshots of the journaled failures, and gives the same items."""
    import asyncio

    fams = ("mkdir-parent", "exec-bit", "off-by-one")
    ms = generate_multistage(tmp_path / "ms", eval_drills.MULTISTAGE_SEED, 6, families=fams)
    part1 = {load_task(t.path).instruction.strip(): stage_parts(t.path)[0]["solution"] for t in ms}
    real = eval_drills.run_attempts
    calls: list[int] = []

    async def counted(policy, dirs, **kw):
        if len(calls) == 1 and kill:
            raise KeyboardInterrupt
        calls.append(len(dirs))
        return await real(policy, dirs, **kw)

    monkeypatch.setattr(eval_drills, "run_attempts", counted)

    def build(folder):
        return asyncio.run(eval_drills.build_multistage_states(
            _stage_policy(part1, "part1"), "sft", folder, 4, families=fams, batch=2, journal_tag="part1|96",
            max_turns=8))  # fmt: skip

    kill = False
    whole = build(tmp_path / "whole")
    assert whole["n_states"] == 4 and sum(calls) == whole["n_tasks"]
    kill, calls[:] = True, []
    with pytest.raises(KeyboardInterrupt):
        build(tmp_path / "resumed")
    journal = [json.loads(x) for x in (tmp_path / "resumed" / eval_drills.START_JOURNAL).read_text().splitlines()]
    assert len(journal) == 2 and all(row["snapshot"] for row in journal)  # two failed attempts, snapshots kept
    kill, calls[:] = False, []
    again = build(tmp_path / "resumed")
    assert sum(calls) == whole["n_tasks"] - 2
    assert [(i["task"], i["stages_done"]) for i in again["items"]] == [(i["task"], i["stages_done"]) for i in whole["items"]]
    assert {i["snapshot"] for i in again["items"]} >= {row["snapshot"] for row in journal}
    for data, folder in ((whole, tmp_path / "whole"), (again, tmp_path / "resumed")):
        assert not any(Snapshot.load(i["snapshot"]).released for i in data["items"])
        eval_drills.release_multistage(folder)
