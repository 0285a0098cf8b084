"""Chained drills of three and four stages (reterm.drills.multistage): the two-stage drills are the special case
and keep their files; chains are sound in the local sandbox (the oracle passes, the null agent fails), their
verifier reports the stages done, and the SFT data's resumption plans (j stages of the reference, then the rest)
pass from the state j stages leave."""

import asyncio
import hashlib
import json
import tomllib

import pytest

from reterm.agent.protocol import FEEDBACK_MESSAGE, feedback_message, is_feedback, verifier_progress
from reterm.drills import generate_drills
from reterm.drills.families import DEFAULT_OOD_FAMILIES
from reterm.drills.generate import stage_parts
from reterm.drills.multistage import (
    CHAIN_STAGES,
    TRAIN_START,
    add_train_instances,
    generate_multistage,
    make_multistage,
    record_kinds,
    resume_plan,
    stages_done,
    turn_budget,
)

TWO_STAGE_DIGEST = "144147d3a317b7a6a9d2cab3b9df6f4b36c6633bd2cce9f270b9175f81e43f29"
"""sha256 over the paths and bytes of the two-stage drills below, as the code wrote them before chains existed
(12 held-out ``multi-*`` and 6 train ``multi-10000``.. of seed 0): the measured runs' tasks must not change."""


def _digest(root) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file() and "multi-" in str(p.relative_to(root)):
            h.update(str(p.relative_to(root)).encode())
            h.update(p.read_bytes())
    return h.hexdigest()


def test_two_stage_drills_keep_their_files(tmp_path):
    generate_multistage(tmp_path / "m", 0, 12)
    generate_drills(tmp_path / "d", 0, 1)
    add_train_instances(tmp_path / "d", 6)
    assert _digest(tmp_path) == TWO_STAGE_DIGEST
    assert "STAGES DONE" not in (tmp_path / "m" / "multi-000" / "tests" / "test.sh").read_text()
    assert record_kinds(2) == ("part1_submit", "part2_mistake", "part1_mistake")


@pytest.mark.parametrize("k", CHAIN_STAGES)
def test_chains_split_by_chain_and_family(tmp_path, k):
    generate_drills(tmp_path, 0, 2)
    train = add_train_instances(tmp_path, 12, stages=k)
    held = generate_multistage(tmp_path / "held", 0, 12, stages=k)
    splits = json.loads((tmp_path / "splits.json").read_text())
    assert [t.name for t in train] == [f"chain{k}-{i}" for i in range(TRAIN_START, TRAIN_START + 12)]
    assert splits["drills"]["chains"] == {str(k): 12} and splits["drills"]["multistage"] == 0
    assert {t.name for t in held} == {f"chain{k}-{i:03d}" for i in range(12)}
    for t in train:
        fams = [p["family"] for p in stage_parts(t.path)]
        assert len(fams) == len(set(fams)) == k and not set(fams) & set(DEFAULT_OOD_FAMILIES)
        assert t.name in splits["train"] and t.split == "train"
    # no stage instance of a held-out chain is one of a train chain (instructions differ by their random names)
    def stage_texts(ts):
        return {line for t in ts for line in (t.path / "instruction.md").read_text().splitlines()[1:]}
    assert not stage_texts(train) & stage_texts(held)
    for t in held:
        meta = tomllib.loads((t.path / "task.toml").read_text())["metadata"]
        assert meta["drill_split"] == "test" and meta["family"].count("+") == k - 1
        assert f"STAGES DONE: $stages_done of {k}" in (t.path / "tests" / "test.sh").read_text()


@pytest.mark.parametrize("k", (2, *CHAIN_STAGES))
def test_resume_plans_cover_the_chain(k):
    d = make_multistage(0, 3, stages=k)
    parts = d.parts
    kinds = record_kinds(k)
    assert len(kinds) == 2 * k - 1
    for kind in kinds:
        first, teacher, done = resume_plan(parts, kind)
        assert first[: sum(len(p["solution"]) for p in parts[:done])] == [c for p in parts[:done] for c in p["solution"]]
        if kind.endswith("_submit"):
            assert first + teacher == d.solution and done == int(kind[4])
        else:
            assert first[-1] == parts[done]["first_mistake"] and teacher[: len(parts[done]["recovery"])] == \
                parts[done]["recovery"]
    with pytest.raises(ValueError, match="unknown multi-stage record kind"):
        resume_plan(parts, f"part{k}_submit")
    assert turn_budget(k) == 3 * k + 2


def test_feedback_names_the_parts_left_only_where_the_verifier_reports_progress():
    out = "FAIL: /srv/x does not contain exactly: 42\nSTAGES DONE: 1 of 4\nSTAGES LEFT: part 2 (a-b), part 4 (c)\n"
    assert verifier_progress(out) == (1, 4, (2, 4))
    instruction = "This task has 4 parts; do all of them, in order.\nPart 1: one.\nPart 2: two `/a`.\nPart 3: three.\n"
    fb = feedback_message(out, instruction)
    assert fb == FEEDBACK_MESSAGE + " Parts done: 1 of 4. Still to do:\nPart 2: two `/a`.\nPart 4"  # no line 4: its number
    assert "42" not in fb and "/srv" not in fb and "a-b" not in fb  # no check, expected content or family
    assert feedback_message(out) == FEEDBACK_MESSAGE + " Parts done: 1 of 4. Still to do:\nPart 2\nPart 4"
    assert feedback_message("FAIL: x\n") == feedback_message(None) == FEEDBACK_MESSAGE  # e.g. Terminal-Bench
    assert feedback_message("STAGES DONE: 4 of 4\n").endswith("Parts done: 4 of 4.")
    assert is_feedback(fb) and is_feedback(FEEDBACK_MESSAGE) and not is_feedback("wrote /srv/x") and not is_feedback(None)
    with pytest.raises(ValueError, match="malformed progress line"):
        feedback_message("STAGES DONE: 5 of 4")


def test_stages_done_reads_the_verifier_line():
    assert stages_done("FAIL: x\nSTAGES DONE: 1 of 3\nSTAGES LEFT: part 2 (a), part 3 (b)\n") == (1, 3)
    assert stages_done("FAIL: x\n") is None and stages_done(None) is None
    with pytest.raises(ValueError, match="malformed progress line"):
        stages_done("STAGES DONE: 4 of 3")


@pytest.mark.slow
def test_chains_in_the_sandbox_oracle_passes_null_fails_and_resumption_passes(tmp_path):
    """Real local sandbox, through the harness: on a three- and a four-stage chain the reference passes (k of k
    stages done), submitting at once fails (0 of k), the reference of j stages then submit fails with j of k
    done, and the teacher's rest of the reference from that state (the SFT data's resumption) passes."""
    from reterm.drills.check import check_drills
    from reterm.policies.scripted import OraclePolicy
    from reterm.recovery.attempts import attempt_end_state, release, run_attempts

    chains = [generate_multistage(tmp_path / f"c{k}", 0, 1, stages=k)[0].path for k in CHAIN_STAGES]
    for r in check_drills(chains, progress=False):
        assert r.error is None and (r.oracle_reward, r.null_reward, r.mistake_reward, r.recovery_reward) == (
            1.0, 0.0, 0.0, 1.0), r.problems_found()

    def tail(a):
        return a.trajectory.metadata.get("verifier_output_tail")

    async def go():
        out = []
        for d in chains:
            parts = stage_parts(d)
            k = len(parts)
            plans = [resume_plan(parts, f"part{j}_submit") for j in range(1, k)]
            instr = (d / "instruction.md").read_text().strip()
            runs = [([], None)] + [(p[0], p) for p in plans] + [([c for p in parts for c in p["solution"]], None)]
            firsts = [(await run_attempts(OraclePolicy([(instr, cmds)]), [d], max_turns=turn_budget(k),
                                          keep_failed_snapshots=True))[0] for cmds, _ in runs]  # fmt: skip
            failed = [(a, p) for a, (_, p) in zip(firsts, runs) if p is not None]
            try:
                recs = [await run_attempts(OraclePolicy([(instr, p[1])]), [d], states=[attempt_end_state(a)],
                                           snapshots=[a.snapshot], max_turns=turn_budget(k)) for a, p in failed]
            finally:
                release(firsts)
            out.append((k, firsts, [r[0] for r in recs]))
        return out

    for k, firsts, recs in asyncio.run(go()):
        assert [a.trajectory.passed for a in firsts] == [False] * k + [True]
        assert [stages_done(tail(a)) for a in firsts] == [(j, k) for j in range(k + 1)]
        assert "STAGES LEFT: part 1 (" in tail(firsts[0]) and "STAGES LEFT" not in tail(firsts[-1])
        assert all(r.trajectory.passed for r in recs), [tail(r) for r in recs]
        # the recovery's feedback names the parts done and left (the instruction's numbers), nothing of the checks
        for j, a in enumerate(firsts[:k]):
            fb = attempt_end_state(a).history[-1].extra["feedback"]
            left = [line for line in a.trajectory.instruction.splitlines() if line.startswith("Part ")][j:]
            assert fb == f"{FEEDBACK_MESSAGE} Parts done: {j} of {k}. Still to do:\n" + "\n".join(left), fb
            assert "FAIL" not in fb and "STAGES" not in fb


@pytest.mark.slow
def test_sft_data_on_chains_teaches_each_stage_and_the_resumption(tmp_path):
    """``reterm.data.drills.build`` on three-stage train chains (one per :func:`record_kinds` kind), in the local
    sandbox: a verified whole reference from each chain's start, and one verified recovery of each kind after the
    feedback, whose failed attempt holds the reference of the stages it had done (``part<j>_submit``: j stages) and
    whose trained part does the rest; the mistake kinds also give a step-level record."""
    from datasets import concatenate_datasets

    from reterm.data.drills import build
    from reterm.records import NO_FAILURE_STEP, trains_on_mistake
    from reterm.training.sft_data import load_records

    generate_drills(tmp_path / "drills", 0, 1, families=["mkdir-parent", "exec-bit", "python-alias"], ood_families=[])
    chains = add_train_instances(tmp_path / "drills", len(record_kinds(3)), stages=3)
    build(tmp_path / "drills", tmp_path / "data", policies=[], max_turns=2, batch=4, held_out=0.0,
          injected_per_family=0)  # fmt: skip
    rows = concatenate_datasets([load_records(str(tmp_path / "data"), s) for s in ("train", "test")])
    mine = [r for r in rows if r["task_id"].startswith("chain3-")]
    whole = [r for r in mine if r["failure_step"] == NO_FAILURE_STEP]
    assert sorted(r["task_id"] for r in whole) == sorted(c.name for c in chains)
    resumed = {r["injection"]: r for r in mine if r["target_attempt_index"] == 2}
    assert set(resumed) == set(record_kinds(3))
    for kind, r in resumed.items():
        assert r["verifier_reward"] == 1.0 and not trains_on_mistake(r)
        k = r["train_from_message_index"]
        assert r["messages"][k - 1]["role"] == "tool" and "did not pass" in r["messages"][k - 1]["content"]
        task = next(c.path for c in chains if r["task_id"] == c.name)
        first, teacher, done = resume_plan(stage_parts(task), kind)
        todo = r["messages"][k - 1]["content"].split(f"Parts done: {done} of 3. Still to do:\n")[1].splitlines()
        assert [line.split(":")[0] for line in todo] == [f"Part {n}" for n in range(done + 1, 4)]
        assert all(line in r["messages"][1]["content"] for line in todo)  # the instruction's own lines

        def calls(msgs):
            return [json.loads(c["function"]["arguments"]).get("command") for m in msgs if m["role"] == "assistant"
                    for c in m.get("tool_calls") or []]  # fmt: skip

        assert [c for c in calls(r["messages"][:k]) if c] == first  # the state: j stages (and a mistake) done
        assert [c for c in calls(r["messages"][k:]) if c] == teacher  # trained: the rest of the chain
    step_level = {r["injection"] for r in mine if r["target_attempt_index"] == 1 and r["failure_step"] >= 0}
    assert step_level == {k for k in record_kinds(3) if k.endswith("_mistake")}


def test_resumption_commands_are_the_parts_the_verifier_reports_left(tmp_path):
    from reterm.data.drills import resumption_commands

    chain = generate_multistage(tmp_path, 0, 1, stages=3)[0].path
    parts = stage_parts(chain)
    out = "FAIL: x\nSTAGES DONE: 1 of 3\nSTAGES LEFT: part 1 (a), part 3 (b)\n"
    assert resumption_commands(chain, out) == [*parts[0]["solution"], *parts[2]["solution"]]
    assert resumption_commands(chain, "FAIL: x\n") is None  # no report: the caller's teacher types the reference
    assert resumption_commands(chain, "STAGES DONE: 3 of 3\n") is None
    two = generate_multistage(tmp_path / "two", 0, 1, stages=2)[0].path
    assert resumption_commands(two, out) is None  # two-stage drills report no progress


@pytest.mark.slow
def test_own_failure_on_a_chain_is_recovered_by_doing_the_parts_left(tmp_path):
    """Local sandbox: a policy's own attempt on a three-stage chain that does parts 3 and 1 (out of order) and
    submits fails with part 2 left; the data stage's teacher (``resume_left``) types part 2's reference only, after
    the feedback that names it, and the verifier keeps that record."""
    from reterm.data.drills import _batch
    from reterm.policies.scripted import OraclePolicy

    chain = generate_multistage(tmp_path, 0, 1, stages=3)[0].path
    parts = stage_parts(chain)
    instr = (chain / "instruction.md").read_text().strip()
    own = OraclePolicy([(instr, [*parts[2]["solution"], *parts[0]["solution"]])], name="own")
    entry = asyncio.run(_batch(own, OraclePolicy([chain], name="oracle-teacher"), [chain], "own", turn_budget(3),
                               teacher_turns=turn_budget(3), resume_left=True))  # fmt: skip
    (r,) = entry["records"]
    k = r["train_from_message_index"]
    part2 = next(line for line in instr.splitlines() if line.startswith("Part 2: "))
    assert r["messages"][k - 1]["content"].endswith(f"Parts done: 2 of 3. Still to do:\n{part2}")
    trained = [json.loads(c["function"]["arguments"]).get("command") for m in r["messages"][k:]
               if m["role"] == "assistant" for c in m.get("tool_calls") or []]  # fmt: skip
    assert [c for c in trained if c] == parts[1]["solution"] and r["verifier_reward"] == 1.0
