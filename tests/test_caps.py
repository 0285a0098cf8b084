"""The embedded run's generation caps leave every item winnable (issue 24): the reference solution and the reference
recovery of every drill, written as the harness's tool calls in SmolLM2's real tokens, fit the evaluation's and
GRPO's tokens per turn and turns; and, in the real sandbox, the oracle cut to those caps passes every evaluated
kind of item (from the start and from an injected failure state), while the old 56-token cap fails some.

The caps are read from the run's own configuration (train/run_all.sh's sizes block, the GRPO recipes), so a
change that makes items unwinnable fails here."""

import asyncio
import re
from pathlib import Path

import pytest
import yaml

from reterm.drills import FAMILIES, generate_drills
from reterm.drills.caps import reference_needs, unwinnable
from reterm.drills.multistage import (
    CHAIN_STAGES,
    TRAIN_START,
    generate_multistage,
    make_multistage,
    record_kinds,
    resume_plan,
    turn_budget,
)
from reterm.policies.scripted import bash_call, turn_tokens

REPO = Path(__file__).resolve().parents[1]


def _run_all_sizes(var: str) -> list[str]:
    """The default size's ``VAR=(...)`` flags of train/run_all.sh."""
    text = (REPO / "train" / "run_all.sh").read_text()
    block = text.split("smollm2-135m:default)", 1)[1].split(";;", 1)[0]
    m = re.search(rf"^\s*{var}=\(([^)]*)\)", block, re.M)
    assert m, f"train/run_all.sh: no {var} in the default sizes"
    return m.group(1).split()


def _flag(flags: list[str], name: str) -> int:
    return int(flags[flags.index(name) + 1])


def _eval_caps() -> tuple[int, int]:
    flags = _run_all_sizes("EVAL_SIZE")
    return _flag(flags, "--max-new-tokens"), _flag(flags, "--max-turns")


def _grpo_caps() -> list[tuple[str, int, int, int]]:
    out = []
    for name in ("grpo.yaml", "grpo_standard.yaml"):
        r = yaml.safe_load((REPO / "train" / "recipes" / "smollm2-135m" / name).read_text())
        out.append((name, r["max_turn_tokens"], r["max_turns"], r["max_completion_length"]))
    return out


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from reterm.policies.smollm2 import embedded_model_path

    return AutoTokenizer.from_pretrained(embedded_model_path())


@pytest.fixture(scope="module")
def drills(tmp_path_factory):
    """The embedded run's drills: the same seed and instances as run_all's drills stage (32 per family)."""
    out = tmp_path_factory.mktemp("drills")
    generate_drills(out, 0, 32)
    return sorted(d for d in out.iterdir() if d.is_dir())


@pytest.mark.slow
def test_every_drill_reference_fits_the_runs_caps(tokenizer, drills):
    tokens, turns = _eval_caps()
    bad = unwinnable(drills, tokenizer, max_turn_tokens=tokens, max_turns=turns)
    assert not bad, f"{len(bad)} drills need more than {tokens} tokens x {turns} turns: {bad[:3]}"
    for name, t_tokens, t_turns, _ in _grpo_caps():
        bad = unwinnable(drills, tokenizer, max_turn_tokens=t_tokens, max_turns=t_turns)
        assert not bad, f"{name}: {len(bad)} drills need more than {t_tokens} tokens x {t_turns} turns: {bad[:3]}"
    # the multi-stage drills of the mechanism stage fit its caps too
    flags = _run_all_sizes("MECH_SIZE")
    stages = _flag(flags, "--chain-stages") if "--chain-stages" in flags else 2
    multi = generate_multistage(drills[0].parent.parent / "multi", 0, _flag(flags, "--tasks"), stages=stages)
    bad = unwinnable([t.path for t in multi], tokenizer, max_turn_tokens=_flag(flags, "--max-new-tokens"),
                     max_turns=_flag(flags, "--max-turns"))  # fmt: skip
    assert not bad, bad[:3]


@pytest.mark.slow
def test_the_old_cap_made_items_unwinnable(tokenizer, drills):
    """The measurement itself can fail: under the round-2 evaluation's 56 tokens a turn, whole families were
    unwinnable (issue 24 counted every follow-flag, git-identity and strip-components item)."""
    bad = unwinnable(drills, tokenizer, max_turn_tokens=56, max_turns=5)
    families = {b.task.rsplit("-", 1)[0] for b in bad}
    assert {"follow-flag", "git-identity", "strip-components"} <= families, families
    needs = reference_needs(drills[0], tokenizer)
    assert needs.solution_turns >= 2 and needs.solution_turn_tokens > 20


@pytest.mark.slow
def test_capped_oracle_passes_from_start_and_from_injected_states(tokenizer, tmp_path):
    """In the real sandbox, through the one harness: the oracle cut to the evaluation's caps passes one instance of
    every family from the start, and the reference recovery cut to the caps passes from each injected failure
    state; the attempt's completion (every turn and observation, SmolLM2 tokens) fits GRPO's budget. At 56 tokens
    the same run fails some items."""
    from reterm.data.drills import injected_teacher, mistake_policy
    from reterm.policies.scripted import OraclePolicy, TokenCapped
    from reterm.policies.transformers_policy import template_messages
    from reterm.recovery.attempts import attempt_end_state, release, run_attempts

    tokens, turns = _eval_caps()
    generate_drills(tmp_path, 0, 1)
    dirs = sorted(d for d in tmp_path.iterdir() if d.is_dir())
    assert len(dirs) == len(FAMILIES)

    async def go(cap: int):
        starts = await run_attempts(TokenCapped(OraclePolicy(dirs), tokenizer, cap), dirs, max_turns=turns)
        firsts = await run_attempts(mistake_policy(dirs), dirs, max_turns=2, keep_failed_snapshots=True)
        failed = [a for a in firsts if a.failed]
        recs = await run_attempts(TokenCapped(injected_teacher(dirs), tokenizer, cap), [a.task_dir for a in failed],
                                  states=[attempt_end_state(a) for a in failed],
                                  snapshots=[a.snapshot for a in failed], max_turns=turns)  # fmt: skip
        release(firsts)
        return starts, firsts, recs

    starts, firsts, recs = asyncio.run(go(tokens))
    assert [a.task_dir.name for a in starts if not a.trajectory.passed] == []
    assert all(a.failed for a in firsts), [a.task_dir.name for a in firsts if not a.failed]
    assert [a.task_dir.name for a in recs if not a.trajectory.passed] == []
    budget = min(b for _, _, _, b in _grpo_caps())
    for a in starts + recs:
        k = a.trajectory.prefix_len  # the history's steps (the failed first attempt): prompt, not completion
        prompt = tokenizer.apply_chat_template(template_messages(a.trajectory.to_messages(upto=k)), tokenize=True,
                                               return_dict=False)
        whole = tokenizer.apply_chat_template(template_messages(a.trajectory.to_messages()), tokenize=True, return_dict=False)
        assert len(whole) - len(prompt) <= budget, (a.task_dir.name, len(whole) - len(prompt))
    old_starts, _, old_recs = asyncio.run(go(56))
    assert any(not a.trajectory.passed for a in old_starts + old_recs)


@pytest.mark.parametrize("k", [2, *CHAIN_STAGES])
def test_chain_references_fit_the_turn_budget_with_margin(tokenizer, k):
    """Every chain's whole reference, its recovery after the first mistake, and every failed first attempt and
    resumption the SFT data types on it (:func:`resume_plan`) fit the turns a chain of ``k`` stages gets
    (:func:`turn_budget`) with at least 2 turns to spare, and each tool call fits the mechanism's tokens per turn
    (run_all's MECH_SIZE); a budget of the reference's own length minus one would not (the check can fail)."""
    cap = _flag(_run_all_sizes("MECH_SIZE"), "--max-new-tokens")
    longest = 0
    for i in [*range(48), *range(TRAIN_START, TRAIN_START + 48)]:
        d = make_multistage(0, i, stages=k)
        seqs = [d.solution, d.recovery_commands]
        for kind in record_kinds(k):
            first, teacher, _ = resume_plan(d.parts, kind)
            seqs += [first, teacher]
        turns = max(len(s) + 1 for s in seqs)  # + submit
        longest = max(longest, turns)
        assert turns <= turn_budget(k) - 2, (k, i, turns, turn_budget(k))
        tokens = max(turn_tokens(bash_call(c), tokenizer) for s in seqs for c in s)
        assert tokens <= cap, (k, i, tokens, cap)
    assert longest > k + 1  # some stage needs more than one command: the margin is real
    mech = _run_all_sizes("MECH_SIZE")
    for flag in ("--stages", "--chain-stages"):
        if flag in mech and _flag(mech, flag) == k:  # the run's chains get their budget
            assert _flag(mech, "--max-turns") >= turn_budget(k)


@pytest.mark.slow
def test_four_stage_chain_attempts_fit_the_grpo_budget(tokenizer, tmp_path):
    """In the real sandbox: on four-stage chains (the CPU GRPO recipes' ``seed_tasks``), the oracle cut to GRPO's
    tokens per turn passes from the start, and the teacher passes from each scripted failure state with ``j`` stages
    done (:func:`record_kinds`, every kind), within the recipes' ``max_turns``; every attempt's completion (turns
    and observations, SmolLM2 tokens) fits their ``max_completion_length``, and the reference from the start would
    not fit the old two-stage budget of 768 tokens x 5 turns (the check can fail)."""
    from reterm.agent.episode import load_task
    from reterm.drills.generate import stage_parts
    from reterm.policies.scripted import OraclePolicy, TokenCapped
    from reterm.policies.transformers_policy import template_messages
    from reterm.recovery.attempts import attempt_end_state, release, run_attempts

    caps = _grpo_caps()
    tokens, turns, budget = min(c[1] for c in caps), min(c[2] for c in caps), min(c[3] for c in caps)
    assert turns == turn_budget(4)
    dirs = [c.path for c in generate_multistage(tmp_path, 0, 14, stages=4)]
    kinds = record_kinds(4)
    plans = {d: resume_plan(stage_parts(d), kinds[i % len(kinds)]) for i, d in enumerate(dirs)}

    async def go():
        starts = await run_attempts(TokenCapped(OraclePolicy(dirs), tokenizer, tokens), dirs, max_turns=turns)
        first = OraclePolicy([(load_task(d).instruction, plans[d][0]) for d in dirs])
        teacher = OraclePolicy([(load_task(d).instruction, plans[d][1]) for d in dirs])
        firsts = await run_attempts(first, dirs, max_turns=turns, keep_failed_snapshots=True)
        failed = [a for a in firsts if a.failed]
        recs = await run_attempts(TokenCapped(teacher, tokenizer, tokens), [a.task_dir for a in failed],
                                  states=[attempt_end_state(a) for a in failed],
                                  snapshots=[a.snapshot for a in failed], max_turns=turns)  # fmt: skip
        release(firsts)
        return starts, failed, recs

    starts, failed, recs = asyncio.run(go())
    assert len(failed) == len(dirs)
    assert [a.task_dir.name for a in starts + recs if not a.trajectory.passed] == []

    def completion(a):
        k = a.trajectory.prefix_len
        prompt = tokenizer.apply_chat_template(template_messages(a.trajectory.to_messages(upto=k)), tokenize=True,
                                               return_dict=False)
        whole = tokenizer.apply_chat_template(template_messages(a.trajectory.to_messages()), tokenize=True,
                                              return_dict=False)
        return len(whole) - len(prompt)

    sizes = [completion(a) for a in starts + recs]
    assert max(sizes) <= budget, max(sizes)
    assert max(completion(a) for a in starts) > 768 or max(len(a.trajectory.steps) for a in starts) > 5
