"""``python -m pipeline.drills --tasks DRILLS --output DIR``: a recovery dataset from the recovery drills, in
the release's protocol (attempt-level failure states, ``target_attempt_index = 2``).

Failure states come from two sources, both on the drills' ``train`` split (``DRILLS/splits.json``):

- **own**: the policy's own attempts (``--policy``, default the embedded SmolLM2; after the SFT cold start,
  the SFT checkpoint: the paper's self-improvement loop). Failed attempts are snapshotted before the
  verifier runs (:mod:`reterm.recovery.attempts`).
- **injected**: the drill family's natural first mistake (``[metadata] first_mistake`` of each task), typed
  as a first attempt that then submits.

From each injected failure state there are two records: the release's kind (``target_attempt_index = 2``:
the failed attempt, the feedback, then the second attempt) and a step-level one (``target_attempt_index = 1``:
one attempt that makes the mistake, reads its error and recovers; trained from the first recovery turn, so the
mistake and its error are context only; see :func:`_in_attempt_records`). No record's trained turns contain
the turn the record marks as its mistake (``failure_step``). From each failure state the teacher (offline and scripted: after an injected mistake the drill's verified
recovery commands, after the policy's own attempt the reference solution, on a chain the reference of the
parts its verifier reports left (:func:`resumption_commands`), typed from the state the failed attempt left behind) makes a recovery attempt after the feedback message; the task's
verifier keeps the ones that pass. Records carry the release's six columns first
(:func:`reterm.records.release_columns`), then the kit's metadata. Records of a few train instances form the
``test`` split (SFT's held-out likelihood check); the drills' own ``test``/``test_ood`` instances are never
used here (they are the evaluation's).

Resuming: each finished batch is appended to ``DIR/.drills/journal.jsonl``; a re-run skips what is there.

``--workers N`` runs the batches in N processes (:mod:`reterm.workers`), each with cpus/N threads, taking the
batches one at a time (:class:`reterm.workers.Claims`) and appending them to the one journal under a lock; this
process then writes the folder from it.

Rounds: ``--extends PREV`` makes a new version of the dataset in ``--output`` that starts from ``PREV``'s journal
(copied, never written back) and adds the new policies' records: the second round (the SFT model's own failed
attempts) is its own folder, so the version SFT trained on is never rewritten. ``stats.json`` records the round
(``config.round``), the version it extends (``config.extends``) and a version string with the round
(``0.2.0+round2``).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import sys
import time
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from reterm import workers as workers_mod
from reterm.agent.episode import load_task
from reterm.agent.protocol import PROMPT_VERSION, initial_messages, verifier_progress
from reterm.data.layout import write_dataset_folder
from reterm.drills.families import FAMILIES
from reterm.drills.generate import recovery_commands, stage_parts
from reterm.drills.multistage import record_kinds, resume_plan, turn_budget
from reterm.generation import MAX_TURN_TOKENS, apply_thread_policy
from reterm.policies import load_policy
from reterm.policies.scripted import OraclePolicy
from reterm.records import NO_FAILURE_STEP, trains_on_mistake
from reterm.recovery.attempts import Attempt, attempt_end_state, release, run_attempts
from reterm.recovery.state import State
from reterm.trajectory import Outcome, Step, Trajectory


def read_splits(tasks: Path) -> dict[str, list[str]]:
    """``tasks/splits.json`` as split -> task folder names.

    Raises:
        FileNotFoundError / ValueError: naming the file when it is missing or has no ``train`` list.
    """
    path = tasks / "splits.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no splits.json (make drills with `reterm tasks drills --out {tasks}`)")
    splits = json.loads(path.read_text())
    if not isinstance(splits.get("train"), list):
        raise ValueError(f"{path}: field 'train' must be a list of task folder names")
    return splits


def first_mistake(task_dir: Path) -> str:
    """The drill's natural wrong first command (``[metadata] first_mistake``).

    Raises:
        ValueError: naming the task.toml when the field is missing or empty.
    """
    meta = load_task(task_dir).config.metadata or {}
    cmd = meta.get("first_mistake")
    if not isinstance(cmd, str) or not cmd.strip():
        raise ValueError(f"{task_dir / 'task.toml'}: [metadata] first_mistake is missing")
    return cmd


def injected_teacher(dirs: list[Path]) -> OraclePolicy:
    """The teacher after an injected first mistake: types :func:`recovery_commands`, then submits."""
    return OraclePolicy([(load_task(d).instruction, recovery_commands(d)) for d in dirs], name="oracle-teacher")


def mistake_policy(dirs: list[Path]) -> OraclePolicy:
    """The injected failed first attempt: the drill's first mistake, then submit."""
    return OraclePolicy([(load_task(d).instruction, [first_mistake(d)]) for d in dirs], name="first-mistake")


PARSE_ERRORS_ONLY = "parse_errors_only"
"""The label of a failed attempt without a single valid tool call: not an error category (docs/ERROR_TAXONOMY.md:
parse errors are not failure states), so such records are counted apart from the categories."""

UNLOCALISED = "unlocalised"
"""The label of a failed attempt whose commands show no error the localiser recognises (e.g. it ran commands that
succeeded, then submitted a wrong result): no category is claimed without a failing command to show it."""

NOT_CATEGORIES = (PARSE_ERRORS_ONLY, UNLOCALISED)


def evidence_label(attempt: Attempt, category: str, located: bool, source: str) -> str:
    """The ``failure_category`` a record may claim for a failed attempt, from evidence only.

    Args:
        attempt: the failed first attempt.
        category: the failure state's category (:func:`reterm.recovery.attempts.attempt_end_state`: the
            localiser's, or the task's ``[metadata]`` category when the localiser found no failing step).
        located: whether the localiser found a failing step (``State.localisation.source == "localiser"``).
        source: ``"injected"`` (the drill's first mistake, typed: a failing command by construction, whose
            category the drill declares) or ``"own"``.

    Returns:
        ``category`` when a failing command shows it (located, or the injected mistake); else
        :data:`PARSE_ERRORS_ONLY` when the attempt made no valid tool call, else :data:`UNLOCALISED`.
    """
    if located or source == "injected":
        return category
    if not any(s.action is not None for s in attempt.trajectory.steps):
        return PARSE_ERRORS_ONLY
    return UNLOCALISED


def policy_label(spec: str) -> str:
    """A policy spec as records and ``stats.json`` name it, without a path of this machine: a checkpoint folder
    (``hf:/abs/RUN/sft/merged``, ``./ckpt``) becomes ``checkpoint:<last two path components>``
    (``checkpoint:sft/merged``); other specs (``smollm2``, ``hf:org/name``, ``openai:NAME``) are kept."""
    ref = spec.strip().removeprefix("hf:")
    if ref.startswith(("/", ".", "~")):
        parts = [p for p in Path(ref).expanduser().parts if p not in ("/", ".", "..")]
        return "checkpoint:" + "/".join(parts[-2:] or ["."])
    return spec


def _family(task_dir: Path) -> str:
    """The drill family of a task (``[metadata] family``; empty for a task outside the drills)."""
    return str((load_task(task_dir).config.metadata or {}).get("family", ""))


def _record(state: State, traj: Trajectory, *, failure_step: int, failed: Step | None, source_policy: str,
            family: str, injection: str | None = None) -> dict[str, Any]:
    """One dataset row, written by the one record writer (:meth:`reterm.recovery.state.State.to_record`): the
    release's six columns of the verified trajectory ``traj`` (trained from the end of ``state``'s history; its
    level gives ``target_attempt_index``), then the kit's metadata columns (docs/PROTOCOL.md).

    Args:
        state: the failure state the recovery in ``traj`` starts from (its id is the column ``trajectory_id``).
        traj: the verified trajectory (reward 1) whose messages after the state's history are trained on.
        failure_step: index of the step the record marks as its mistake
            (:data:`reterm.records.NO_FAILURE_STEP` for a reference solution from the task's start).
        failed: the failed step whose command and output the record names, if any.
        source_policy: the policy whose attempt failed.
        family: the drill family (``[metadata] family``).
        injection: the ``injection`` column (default ``"first_mistake"`` for injected failures, else empty).
    """
    if injection is None:
        injection = "first_mistake" if state.source == "injected" else ""
    row = state.to_record(
        traj, task_license="Apache-2.0", failure_step=failure_step, injection=injection,
        failure_command=(failed.command if failed else "") or "", failure_output=(failed.observation if failed else "") or "",
        attempts=1, successful_attempts=1, source_policy=source_policy, family=family)  # fmt: skip
    if trains_on_mistake(row):
        raise ValueError(f"record {row['id']}: train_from_message_index={row['train_from_message_index']} would "
                         f"train on the mistake (failure_step={failure_step})")
    return row


def resumption_commands(task_dir: Path, verifier_output: str | None) -> list[str] | None:
    """The teacher's commands after a policy's own failed attempt on a chain: the reference solutions of the parts
    its verifier reports left (:func:`reterm.agent.protocol.verifier_progress`), in the instruction's order: what
    the feedback names (:func:`reterm.agent.protocol.feedback_message`), so a record trains the recovery to do the
    parts left and nothing else. ``None`` when the task is not a chain (fewer than 3 stages), its verifier reported
    no progress, or no part is left (the caller's teacher types the whole reference then). A part the attempt
    left half done is redone from its reference; the verifier keeps only the recoveries that pass."""
    parts = stage_parts(task_dir)
    progress = verifier_progress(verifier_output) if len(parts) >= 3 else None
    if progress is None or not progress[2]:
        return None
    return [c for n in progress[2] if 1 <= n <= len(parts) for c in parts[n - 1]["solution"]]


def _resuming_teacher(teacher: Any, failed: list[Attempt]) -> Any:
    """``teacher``, except that on a chain each failed attempt's recovery types :func:`resumption_commands`."""
    pairs = []
    for a in failed:
        instruction = load_task(a.task_dir).instruction
        left = resumption_commands(a.task_dir, a.trajectory.metadata.get("verifier_output_tail"))
        pairs.append((instruction, left if left is not None else teacher.steps_for(initial_messages(instruction))))
    return OraclePolicy(pairs, name=teacher.name) if pairs else teacher


async def _batch(policy: Any, teacher: Any, dirs: list[Path], source: str, max_turns: int,
                 label: str | None = None, *, injection: str | None = None, category: str | None = None,
                 in_attempt: bool | None = None, teacher_turns: int = 8, resume_left: bool = False) -> dict[str, Any]:  # fmt: skip
    """First attempts on ``dirs``, then one teacher recovery from each failed one. Returns the journal entry.

    ``injection`` names a scripted first attempt other than the drill's first mistake (the ``injection`` column);
    ``category`` overrides every failure state's category (a scripted failure whose kind is known);
    ``in_attempt`` adds the step-level records of :func:`_in_attempt_records` (default: for injected sources);
    ``teacher_turns`` caps each recovery attempt (a chain's resumption has more to do than one hurdle);
    ``resume_left``: ``teacher`` is an :class:`OraclePolicy` of the tasks, and on a chain the recovery types only
    the parts left (:func:`resumption_commands`; a policy's own attempts on chains)."""
    firsts = await run_attempts(policy, dirs, max_turns=max_turns, keep_failed_snapshots=True)
    failed = [a for a in firsts if a.failed]
    entry: dict[str, Any] = {"tasks": [d.name for d in dirs], "source": source,
                             "outcomes": Counter(a.trajectory.outcome.value for a in firsts), "records": []}
    try:
        if resume_left:
            teacher = _resuming_teacher(teacher, failed)
        states = [attempt_end_state(a) for a in failed]
        for a, st in zip(failed, states):
            st.category = category or evidence_label(a, st.category, st.localisation.source == "localiser", source)
        recs = await run_attempts(teacher, [a.task_dir for a in failed], states=states,
                                  snapshots=[a.snapshot for a in failed], max_turns=teacher_turns)  # fmt: skip
    finally:
        release(firsts)
    entry["recovery_outcomes"] = Counter(r.trajectory.outcome.value for r in recs)
    entry["states"] = [[st.category, r.trajectory.outcome.value] for st, r in zip(states, recs)]
    for a, st, r in zip(failed, states, recs):
        if r.trajectory.outcome is Outcome.SUCCESS:
            traj, state = r.trajectory, a.trajectory
            traj.metadata["failure_category"] = st.category
            failed_step = next((s for s in state.steps if s.action is not None and s.exit_status not in (0, None)), None)
            entry["records"].append(_record(
                st.with_source(source), traj, failure_step=len(state.steps) - 1,
                failed=failed_step, source_policy=label or getattr(policy, "name", source),
                family=_family(a.task_dir), injection=injection))  # fmt: skip
    if (source == "injected") if in_attempt is None else in_attempt:
        entry["records"] += await _in_attempt_records([a for a, st in zip(failed, states)],
                                                      {a.task_dir: st.category for a, st in zip(failed, states)})
    return entry


MULTISTAGE_KINDS = ("part1_submit", "part2_mistake", "part1_mistake")
"""The scripted failed first attempts on a multi-stage train drill, one per instance in turn (instance ``i`` gets
``MULTISTAGE_KINDS[i % 3]``), each recovered by the teacher after the feedback message (attempt-level records):

- ``part1_submit``: part 1's solution, then submit (part 1 done, part 2 not started): the teacher does part 2;
- ``part2_mistake``: part 1's solution, then part 2's natural first mistake, then submit: the teacher recovers
  part 2 (the state an agent that cleared the first hurdle and failed the second leaves: the one ReTerm-GRPO forks
  from);
- ``part1_mistake``: part 1's natural first mistake, then submit: the teacher recovers part 1 and does part 2.

Every instance also gives a whole reference solution from the task's start (``failure_step`` -1, category
``none``): the model sees both parts done in one attempt. The ``part2_mistake`` and ``part1_mistake`` instances
also give a step-level record (:func:`_stage_in_attempt_records`): the mistake, its error, then the recovery and
the rest in the same attempt, trained from the first recovery turn: the model learns to fix a part's error before
it submits (measured on the SFT start without it: after part 2's error it submitted at once)."""

OWN_MULTISTAGE_TURNS = 8
"""Turns of a policy's own attempt on a two-stage drill at least (the mechanism stage's default too)."""

IN_ATTEMPT_KINDS = ("part2_mistake", "part1_mistake")
"""The :data:`MULTISTAGE_KINDS` whose instances also give a step-level (in-attempt) record (for a chain: every
``part<j>_mistake`` kind of :func:`reterm.drills.multistage.record_kinds`)."""


def _stage_plan(task_dir: Path, kind: str) -> tuple[list[str], list[str], str]:
    """``(first attempt's commands, teacher's commands, category)`` of a multi-stage drill (two stages or a chain)
    for a :func:`reterm.drills.multistage.record_kinds` entry (commands from
    :func:`reterm.drills.multistage.resume_plan`; the category is ``premature_completion`` after a submit, else the
    failed part's family's).

    Raises:
        ValueError: naming the task when it is not a multi-stage drill or ``kind`` is unknown.
    """
    parts = stage_parts(task_dir)
    if len(parts) < 2:
        raise ValueError(f"{task_dir}: not a multi-stage drill (no [metadata] stage_families)")
    first, teacher, done = resume_plan(parts, kind)
    if kind.endswith("_submit"):
        return first, teacher, "premature_completion"
    return first, teacher, FAMILIES[parts[done]["family"]].category.value


def _stage_in_attempt_plan(task_dir: Path, kind: str) -> tuple[list[str], int, str]:
    """``(commands of one attempt, index of its mistake step, category)`` of the step-level record of a two-stage
    drill for an :data:`IN_ATTEMPT_KINDS` entry: :func:`_stage_plan`'s failed attempt (ending with the mistake)
    followed in the same attempt by its teacher's commands (the recovery and every later part's solution).

    Raises:
        ValueError: naming the task or the kind when either does not fit.
    """
    if not kind.endswith("_mistake"):
        raise ValueError(f"no step-level record for multi-stage kind {kind!r} (one of {IN_ATTEMPT_KINDS})")
    failed, teacher, category = _stage_plan(task_dir, kind)
    return [*failed, *teacher], len(failed) - 1, category


async def _stage_in_attempt_records(dirs: list[Path], kind: str) -> dict[str, Any]:
    """Step-level records (``target_attempt_index`` 1) of two-stage drills (:func:`_stage_in_attempt_plan`): one
    scripted attempt makes a part's mistake, reads its error, recovers and finishes; the history up to and
    including the mistake's step is the failure state (context only), training starts at the first recovery
    turn. Only attempts the verifier passes are kept. Returns the journal entry (its ``states`` is empty: as for
    :func:`_in_attempt_records`, these attempts pass, so they add records but no failed attempt to the counts)."""
    plans = {d: _stage_in_attempt_plan(d, kind) for d in dirs}
    policy = OraclePolicy([(load_task(d).instruction, plans[d][0]) for d in dirs], name=f"scripted:{kind}:in-attempt")
    runs = await run_attempts(policy, dirs, max_turns=max(12, max(len(p[0]) + 1 for p in plans.values())))
    entry: dict[str, Any] = {"tasks": [d.name for d in dirs], "source": "injected",
                             "outcomes": Counter(r.trajectory.outcome.value for r in runs), "records": [], "states": []}
    for r in runs:
        traj, (_, k, category) = r.trajectory, plans[r.task_dir]
        if traj.outcome is not Outcome.SUCCESS or len(traj.steps) <= k + 1:
            continue
        history = [s.model_copy(update={"from_history": True}) for s in traj.steps[: k + 1]]
        state = State.from_history(traj, history, category=category, source="injected", level="in_attempt")
        entry["records"].append(_record(state, traj, failure_step=k, failed=traj.steps[k], source_policy=f"scripted:{kind}",
                                        family=_family(r.task_dir), injection=kind))  # fmt: skip
    return entry


async def _whole_records(dirs: list[Path]) -> dict[str, Any]:
    """Verified reference solutions from the task's start (``target_attempt_index`` 1, trained from the first
    assistant turn, ``failure_step`` :data:`reterm.records.NO_FAILURE_STEP`). Returns the journal entry."""
    runs = await run_attempts(OraclePolicy(dirs, name="oracle"), dirs,
                              max_turns=max([12, *(turn_budget(max(1, len(stage_parts(d)))) for d in dirs)]))
    entry: dict[str, Any] = {"tasks": [d.name for d in dirs], "source": "reference",
                             "outcomes": Counter(r.trajectory.outcome.value for r in runs), "records": [], "states": []}
    for r in runs:
        traj = r.trajectory
        if traj.outcome is not Outcome.SUCCESS:
            continue
        start = State.from_history(traj, [], category="none", source="task_start", level="in_attempt")
        entry["records"].append(_record(start, traj, failure_step=NO_FAILURE_STEP, failed=None, source_policy="oracle",
                                        family=_family(r.task_dir), injection=""))  # fmt: skip
    return entry


def recovery_start(traj: Trajectory, failure_step: int = 0) -> int:
    """``train_from_message_index`` of a step-level record: the index in ``traj.to_messages()`` of the first
    message of step ``failure_step + 1`` (the first recovery turn), i.e. after the mistake's call and its
    observation.

    Raises:
        ValueError: naming the task when no step follows ``failure_step``.
    """
    if len(traj.steps) <= failure_step + 1:
        raise ValueError(f"trajectory of task {traj.task_id}: no step after failure_step={failure_step}")
    return len(traj.to_messages(upto=failure_step + 1))


async def _in_attempt_records(failed: list[Attempt], categories: dict[Path, str]) -> list[dict[str, Any]]:
    """Step-level records (``target_attempt_index = 1``): one attempt that makes the drill's first mistake, reads
    its error and recovers in the same attempt (the mistake, then the verified recovery commands, then submit).

    Training starts at the first recovery turn (``train_from_message_index`` = the assistant message of step 1,
    after the mistake's call and its observation): the mistake (``failure_step`` 0) and its error are the
    prompt, never a target, so a model trained on the record learns to read the error and fix it, not to make
    the mistake. Only attempts the verifier passes are kept.
    """
    dirs = [a.task_dir for a in failed]
    if not dirs:
        return []
    policy = OraclePolicy([(load_task(d).instruction, [first_mistake(d), *recovery_commands(d)]) for d in dirs],
                          name="first-mistake+recovery")  # fmt: skip
    runs = await run_attempts(policy, dirs, max_turns=8)
    rows = []
    for a, r in zip(failed, runs):
        traj = r.trajectory
        if traj.outcome is not Outcome.SUCCESS or len(traj.steps) < 2:
            continue
        state = State.from_history(traj, [s.model_copy(update={"from_history": True}) for s in traj.steps[:1]],
                                   category=categories[r.task_dir], source="injected", level="in_attempt")
        rows.append(_record(state, traj, failure_step=0, failed=traj.steps[0], source_policy="first-mistake",
                            family=_family(r.task_dir)))  # fmt: skip
    return rows


def per_family(dirs: list[Path], n: int | None, *, from_end: bool = False) -> list[Path]:
    """The first ``n`` of ``dirs`` (in order) of each drill family (``[metadata] family``); all when ``n`` is None.

    ``from_end``: the last ``n`` of each family instead (returned in ``dirs``' order), so that two selections of
    the same list (the injected mistakes' instances and the reference solutions') overlap only when a family has
    fewer than the two ``n`` together.
    """
    if n is None:
        return list(dirs)
    count: Counter = Counter()
    out = []
    for d in (reversed(dirs) if from_end else dirs):
        fam = _family(d)
        if count[fam] < n:
            count[fam] += 1
            out.append(d)
    return out[::-1] if from_end else out


def own_multistage_dirs(multi: list[Path], n: int) -> list[Path]:
    """The ``n`` multi-stage train drills a policy's own attempts go to (``--own-multistage N``): the longest
    chains first (``chain4-*``, the CPU GRPO recipes' ``seed_tasks``), then shorter chains, then two-stage drills;
    within a length in the given (``splits.json``) order. ``multi``: task folders with
    :func:`reterm.drills.generate.stage_parts`."""
    return sorted(multi, key=lambda d: -len(stage_parts(d)))[: max(0, n)]


def build(tasks: Path, output: Path, *, policies: list[str] | tuple[str, ...] = (), max_turns: int, batch: int,
          held_out: float, max_tasks: int | None = None, max_new_tokens: int = MAX_TURN_TOKENS,
          own_tasks: int | None = None, own_multistage: int = 0, injected_per_family: int | None = None,
          reference_per_family: int = 0, extends: Path | None = None,
          worker: tuple[int, int] | None = None) -> dict[str, Any] | None:  # fmt: skip
    """Build the dataset folder (see the module docstring). Returns its ``stats.json`` content.

    Args:
        policies: policy specs (:func:`reterm.policies.load_policy`) whose own failed attempts are mined, in
            order; the i-th attempts the train instances ``i, i + step, ...`` (``own_tasks`` of them, spread
            over every family). Re-running with one more policy (the SFT checkpoint after the cold start: the
            paper's second round) keeps what the journal holds and adds that policy's records.
        own_tasks: bound on the train instances each policy attempts (default all).
        own_multistage: each policy also attempts N multi-stage train instances, the longest chains first (the
            ``chain4-*`` the CPU recipes train on), then shorter chains and two-stage drills, in ``splits.json``
            order within a length, with at least :data:`OWN_MULTISTAGE_TURNS` turns and the drill's
            :func:`reterm.drills.multistage.turn_budget`: its own failed attempts there are recorded states of the
            tasks ReTerm-GRPO forks from.
        max_new_tokens: tokens a turn of the policies' own attempts (default the harness's
            :data:`reterm.generation.MAX_TURN_TOKENS`, which every drill's reference fits: a lower cap cuts
            commands and makes failures the model did not make).
        injected_per_family: bound on the single-stage train instances of each family whose first mistake is
            injected (default all). Multi-stage train instances (:func:`reterm.drills.generate.stage_parts`) give a
            whole reference solution each and one scripted failed attempt of :data:`MULTISTAGE_KINDS` each.
        reference_per_family: whole reference solutions from the task's start (trained from the first assistant
            turn) on the last N single-stage train instances of each family (the injected mistakes take the first
            ones: the two differ while a family has enough): the only records whose trained turns start from the
            task's start, which the model otherwise sees only after a history of tool calls (a model trained on
            recoveries alone keeps its base behaviour at the first turn; measured on SmolLM2). Many distinct
            instances, not many records of a few: an SFT start trained on 1-3 instances per family repeated the
            instance's own strings on held-out instances (issue 30).
        extends: a dataset folder this build makes the next round of (see the module docstring): its journal
            seeds ``output``'s when ``output`` has none yet (:func:`seed_journal`); ``extends`` itself is only read.
        worker: ``(I, N)``: this is worker I of N (``--workers``): run only the batches it claims
            (:class:`reterm.workers.Claims` in ``output/.drills/claims``), append them to the journal and write no
            folder (returns ``None``); the folder is written by a run without ``worker``.

    Raises:
        FileNotFoundError: ``extends`` has no journal or no ``stats.json`` (not a folder this module wrote).
        ValueError: ``extends`` is ``output`` (a round must not rewrite the version it extends).
    """
    t0 = time.monotonic()
    splits = read_splits(tasks)
    every = [tasks / n for n in splits["train"]]
    two_stage = {d for d in every if stage_parts(d)}
    multi = [d for d in every if d in two_stage]
    single = [d for d in every if d not in two_stage][:max_tasks]
    dirs = single + multi
    journal_path = output / ".drills" / "journal.jsonl"
    previous = seed_journal(output, extends)
    done: list[dict[str, Any]]
    done, torn = workers_mod.read_lines(journal_path)
    if torn:
        print(f"[drills-data] {journal_path}: {torn} line(s) torn by a killed run skipped (their batches run again)",
              flush=True)  # fmt: skip
    seen = {(e.get("key", e["source"]), t) for e in done for t in e["tasks"]}
    injected = per_family(single, injected_per_family)
    own_teacher = OraclePolicy(dirs, name="oracle-teacher")
    # (journal key, task folders, attempts generated together, chunk -> journal entry); policies load lazily
    work: list[tuple[str, list[Path], int, Any]] = []
    if injected:
        mistakes, teacher = mistake_policy(injected), injected_teacher(injected)
        work.append(("injected", injected, 16, lambda chunk: _batch(mistakes, teacher, chunk, "injected", 2)))
    whole_single = per_family(single, reference_per_family, from_end=True) if reference_per_family else []
    if whole_single:
        work.append(("single:whole", whole_single, 16, _whole_records))
    if multi:
        work.append(("multi:whole", multi, 16, _whole_records))
        by_stages: dict[int, list[Path]] = {}  # two-stage drills and chains of each length: kinds in turn
        for d in multi:
            by_stages.setdefault(len(stage_parts(d)), []).append(d)
        for n_stages, same in sorted(by_stages.items()):
            kinds = record_kinds(n_stages)
            tag = "multi" if n_stages == 2 else f"chain{n_stages}"  # the two-stage journal keys as they were
            for k, kind in enumerate(kinds):
                mine = same[k :: len(kinds)]
                if not mine:
                    continue
                plans = {d: _stage_plan(d, kind) for d in mine}
                def run(chunk, plans=plans, kind=kind, n_stages=n_stages):  # fmt: skip
                    first = OraclePolicy([(load_task(d).instruction, plans[d][0]) for d in chunk],
                                         name=f"scripted:{kind}")  # fmt: skip
                    teacher = OraclePolicy([(load_task(d).instruction, plans[d][1]) for d in chunk],
                                           name="oracle-teacher")  # fmt: skip
                    cats = {plans[d][2] for d in chunk}
                    return _batch(first, teacher, chunk, "injected", max(6, max(len(plans[d][0]) + 1 for d in chunk)),
                                  injection=kind, in_attempt=False, category=cats.pop() if len(cats) == 1 else None,
                                  teacher_turns=max(8, turn_budget(n_stages)))  # fmt: skip
                # one category per batch: batches of one kind grouped by the category the plan names
                by_cat: dict[str, list[Path]] = {}
                for d in mine:
                    by_cat.setdefault(plans[d][2], []).append(d)
                for cat, ds in sorted(by_cat.items()):
                    work.append((f"{tag}:{kind}:{cat}", ds, 16, run))
                if kind.endswith("_mistake"):
                    work.append((f"{tag}:{kind}:in-attempt", mine, 16,
                                 lambda chunk, kind=kind: _stage_in_attempt_records(chunk, kind)))
    own_multi = own_multistage_dirs(multi, own_multistage)
    step = max(1, len(dirs) // own_tasks) if own_tasks else 1
    loaded: dict[str, Any] = {}
    for j, spec in enumerate(policies):
        key = f"own:{spec}"
        def run_own(chunk, spec=spec, key=key):  # fmt: skip
            if key not in loaded:
                loaded[key] = load_policy(spec, temperature=0.7, top_p=0.95, max_new_tokens=max_new_tokens, seed=0)
            return _batch(loaded[key], own_teacher, chunk, "own", max_turns, policy_label(spec))
        work.append((key, dirs[j % step :: step][:own_tasks], batch, run_own))
        if own_multistage and multi:
            def run_own_multi(chunk, spec=spec, key=key):  # fmt: skip
                if key not in loaded:
                    loaded[key] = load_policy(spec, temperature=0.7, top_p=0.95, max_new_tokens=max_new_tokens, seed=0)
                budget = max(turn_budget(len(stage_parts(d))) for d in chunk)  # 8 for two stages, more for chains
                return _batch(loaded[key], own_teacher, chunk, "own", max(max_turns, OWN_MULTISTAGE_TURNS, budget),
                              policy_label(spec), teacher_turns=max(8, budget), resume_left=True)  # fmt: skip
            work.append((f"own-multi:{spec}", own_multi, batch, run_own_multi))
    tag = f"worker {worker[0]}/{worker[1]}: " if worker else ""
    claims = workers_mod.Claims(journal_path.parent / "claims") if worker else None
    for key, key_dirs, size, run_chunk in work:
        # batches are cut from the kind's whole task list, so that they are the same in every worker
        chunks = [(f"{key}#{i}", key_dirs[i : i + size]) for i in range(0, len(key_dirs), size)]
        todo = [(name, c) for name, c in ((n, [d for d in c if (key, d.name) not in seen]) for n, c in chunks) if c]
        for i, (name, chunk) in enumerate(todo):
            if claims is not None and not claims.take(name):
                continue
            workers_mod.reseed(0, name)  # the policies' own seed (0), mixed with the batch: whichever worker runs it
            entry = asyncio.run(run_chunk(chunk))
            entry["key"] = key
            workers_mod.append_lines(journal_path, [json.dumps(entry, ensure_ascii=False)])
            done.append(entry)
            n = sum(len(e["records"]) for e in done)
            print(f"[drills-data] {tag}{key}: batch {i + 1}/{len(todo)} ({len(chunk)} tasks), {n} records, "
                  f"{time.monotonic() - t0:.0f}s", flush=True)  # fmt: skip
    if worker:
        return None
    rows = [{**r, "source_policy": policy_label(r["source_policy"])} for e in done for r in e["records"]]  # older journals
    uniq: dict[str, dict[str, Any]] = {}
    for r in rows:
        uniq.setdefault(r["id"], r)
    rows = sorted(uniq.values(), key=lambda r: r["id"])
    # held-out test split: the records of a fixed share of train tasks (by a hash of the task id)
    def held(task_id: str) -> bool:
        return int(hashlib.sha256(task_id.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF < held_out

    split_rows = {"train": [r for r in rows if not held(r["task_id"])], "test": [r for r in rows if held(r["task_id"])]}
    if not split_rows["test"]:
        split_rows["test"] = split_rows["train"][-1:]
        split_rows["train"] = split_rows["train"][:-1]
    by_cat = Counter(r["failure_category"] for r in rows)
    per_cat: dict[str, Counter] = {}
    for e in done:
        for cat, outcome in e["states"]:
            c = per_cat.setdefault(cat, Counter())
            c["failure_states"] += 1
            c["attempts"] += int(outcome in ("success", "failure"))
            c["successful_attempts"] += int(outcome == "success")
        if e["source"] == "reference":  # whole reference solutions: attempts without a failure state (category none)
            c = per_cat.setdefault("none", Counter())
            c["failure_states"] += 0
            c["attempts"] += len(e["tasks"])
            c["successful_attempts"] += len(e["records"])
    episodes = sum(len(e["tasks"]) for e in done)
    failed = sum(len(e["states"]) for e in done)
    verified = sum(len(e["records"]) for e in done)  # verified recoveries of both kinds, before deduplication
    infra = sum(v for e in done for k, v in e["outcomes"].items() if k not in ("success", "failure"))
    prev_config = (previous or {}).get("config") or {}
    round_ = int(prev_config.get("round") or 1) + 1 if previous is not None else 1
    stats = {
        "name": "ReTerm-drills", "version": "0.2.0" if round_ == 1 else f"0.2.0+round{round_}", "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "license": "apache-2.0", "splits": {k: len(v) for k, v in split_rows.items()},
        "categories": {c: {"failure_states": v["failure_states"], "attempts": v["attempts"],
                           "successful_attempts": v["successful_attempts"], "records": by_cat.get(c, 0)}
                       for c, v in sorted(per_cat.items())},
        "failure_sources": dict(Counter(r["failure_source"] for r in rows)),
        "rollouts": {"episodes": episodes, "failed": failed, "infra_faults": infra},
        "attempts_per_state": 1,
        # only deduplication runs here (config.filters_run): the schema's other filter counts are 0 because no such
        # filter ran, and the card leaves them out
        "filters": {"verified_recoveries": verified, "quality": 0, "dedup": verified - len(rows),
                    "decontamination": 0, "kept": len(rows)},
        "decontamination": {"benchmarks": ["drills test/test_ood"],
                            "method": "held-out drill instances and families are never rolled out for data"},
        "sources": [{"name": "ReTerm recovery drills", "license": "Apache-2.0", "tasks": len(dirs), "records": len(rows)}],
        "policy": ", ".join(policy_label(p) for p in policies) or "first-mistake",
        "teacher": ", ".join(sorted({r["teacher"] for r in rows})) or "oracle-teacher",
        "config": {"tasks": Path(tasks).name, "max_turns": max_turns,
                   "episodes_by_policy": dict(Counter(
                       e.get("key", "") if e.get("key", "").startswith(("multi:", "single:", "chain")) else "first-mistake"
                       if e["source"] == "injected" else policy_label(e.get("key", "own:").split(":", 1)[-1])
                       for e in done for _ in e["tasks"])), "batch": batch, "held_out": held_out,
                   "prompt_version": PROMPT_VERSION, "round": round_, "filters_run": ["dedup"],
                   "extends": None if previous is None else {
                       "folder": Path(extends).name, "version": previous.get("version"),
                       "records": (previous.get("filters") or {}).get("kept"), "created": previous.get("created")},
                   "records_by_source_policy": dict(Counter(f"{r['failure_source']}:{r['source_policy']}" for r in rows))},
    }  # fmt: skip
    write_dataset_folder(output, split_rows, stats)
    print(f"[drills-data] {len(rows)} records ({dict(by_cat)}), sources {stats['failure_sources']}, "
          f"{time.monotonic() - t0:.0f}s -> {output}", flush=True)  # fmt: skip
    return stats


def seed_journal(output: Path, extends: Path | None) -> dict[str, Any] | None:
    """Make ``output``'s journal folder; with ``extends`` (an earlier round's dataset folder), copy its journal
    there when ``output`` has none yet (atomically). Returns ``extends``'s ``stats.json`` content, or ``None``
    without ``extends``.

    Raises:
        FileNotFoundError: ``extends`` has no journal or no ``stats.json`` (the path named).
        ValueError: ``extends`` is ``output``.
    """
    journal_path = Path(output) / ".drills" / "journal.jsonl"
    journal_path.parent.mkdir(parents=True, exist_ok=True)
    if extends is None:
        return None
    extends = Path(extends)
    if extends.resolve() == Path(output).resolve():
        raise ValueError(f"--extends {extends} is the output folder: a new round needs its own folder")
    prev_journal, prev_stats = extends / ".drills" / "journal.jsonl", extends / "stats.json"
    for path in (prev_journal, prev_stats):
        if not path.is_file():
            raise FileNotFoundError(f"{path}: missing; --extends needs a dataset folder written by pipeline.drills")
    if not journal_path.exists():
        tmp = journal_path.with_name(journal_path.name + ".tmp")
        tmp.write_bytes(prev_journal.read_bytes())
        tmp.replace(journal_path)
    return json.loads(prev_stats.read_text())


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # no abbreviations: the --workers processes get this command line with --workers replaced
    p = argparse.ArgumentParser(prog="python -m pipeline.drills", description=__doc__.split("\n\n")[0],
                                allow_abbrev=False)  # fmt: skip
    p.add_argument("--tasks", required=True, type=Path, help="a drills folder (reterm tasks drills --out ...)")
    p.add_argument("--output", required=True, type=Path)
    p.add_argument("--policy", action="append", default=None,
                   help="whose own failed attempts to mine (repeatable, in order; default smollm2; '' for none)")
    p.add_argument("--max-turns", type=int, default=3)
    p.add_argument("--max-new-tokens", type=int, default=MAX_TURN_TOKENS,
                   help=f"tokens a turn of the policies' own attempts (default {MAX_TURN_TOKENS}, the harness's)")
    p.add_argument("--batch", type=int, default=16, help="attempts generated together")
    p.add_argument("--held-out", type=float, default=0.08, help="share of train tasks whose records form `test`")
    p.add_argument("--max-tasks", type=int, default=None, help="use only the first N single-stage train instances (every two-stage one is used)")
    p.add_argument("--own-tasks", type=int, default=None, help="the policy attempts at most N train instances")
    p.add_argument("--own-multistage", type=int, default=0,
                   help=f"each policy also attempts N multi-stage train instances, the longest chains first "
                        f"({OWN_MULTISTAGE_TURNS}+ turns, a chain's turn budget)")
    p.add_argument("--injected-per-family", type=int, default=None,
                   help="inject the first mistake on at most N single-stage train instances per family (default all)")
    p.add_argument("--reference-per-family", type=int, default=0,
                   help="also a whole reference solution on N single-stage train instances per family, the last N "
                        "(the injected mistakes take the first ones; default 0)")
    p.add_argument("--extends", type=Path, default=None,
                   help="a dataset folder (an earlier round) this one extends; it is read, never rewritten")
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="processes that run the batches side by side, each with cpus/N threads (reterm.workers; "
                        "default: RETERM_GEN_WORKERS, else 1). On 2 cores two single-thread processes generate "
                        "1.33-1.35x the rows a second of one two-thread process (bench/decode.py), with the policies "
                        "in memory in each")
    p.add_argument("--worker", default=None, metavar="I/N",
                   help="be worker I of N: run the batches no other worker has claimed and write no folder (what "
                        "each --workers process runs)")
    a = p.parse_args(argv)
    apply_thread_policy()  # before a policy loads torch (reterm.generation)
    try:
        a.workers, worker = workers_mod.resolve_workers(a.workers, a.worker)
        if worker is None and a.workers > 1:
            read_splits(a.tasks)  # a bad --tasks is named once, here, not by every worker
            seed_journal(a.output, a.extends)  # once, before the workers share the journal
            failed = workers_mod.run_chunk_workers("reterm.data.drills", argv, a.workers, a.output / ".drills" / "claims",
                                                   say=lambda m: print(f"[drills-data] {m}", flush=True))  # fmt: skip
            if failed:
                print(f"pipeline.drills: {sorted(failed)} failed (exit codes {failed}); a re-run resumes from the "
                      "journal", file=sys.stderr)  # fmt: skip
                return 1
        policies = [p for p in (a.policy if a.policy is not None else ["smollm2"]) if p]
        build(a.tasks, a.output, policies=policies, max_turns=a.max_turns, batch=a.batch,
              held_out=a.held_out, max_tasks=a.max_tasks, max_new_tokens=a.max_new_tokens,
              own_tasks=a.own_tasks, own_multistage=a.own_multistage, injected_per_family=a.injected_per_family,
              reference_per_family=a.reference_per_family, extends=a.extends, worker=worker)
    except (FileNotFoundError, ValueError) as exc:
        print(f"pipeline.drills: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
