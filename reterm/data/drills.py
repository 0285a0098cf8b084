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
recovery commands, after the policy's own attempt the reference solution, typed from the state the failed
attempt left behind) makes a recovery attempt after the feedback message; the task's
verifier keeps the ones that pass. Records carry the release's six columns first
(:func:`reterm.records.release_columns`), then the kit's metadata. Records of a few train instances form the
``test`` split (SFT's held-out likelihood check); the drills' own ``test``/``test_ood`` instances are never
used here (they are the evaluation's).

Resuming: each finished batch is appended to ``DIR/.drills/journal.jsonl``; a re-run skips what is there.

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

from reterm.agent.episode import load_task
from reterm.agent.protocol import PROMPT_VERSION, TOOLS
from reterm.drills.generate import recovery_commands
from reterm.policies.scripted import OraclePolicy
from reterm.records import release_columns, trains_on_mistake
from reterm.recovery.attempts import Attempt, attempt_end_state, release, run_attempts
from reterm.recovery.state import state_id_of
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
        located: whether the localiser found a failing step (``FailureState.source == "localiser"``).
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


def _record(traj: Trajectory, train_from: int, target: int, *, failure_step: int, failed: Step | None,
            recovery_turns: int, category: str, source: str, source_policy: str, replay: list[str], state_id: str,
            family: str) -> dict[str, Any]:
    """One dataset row: the release's six columns (:func:`reterm.records.release_columns`) of the verified
    trajectory ``traj``, then the kit's metadata columns (docs/PROTOCOL.md).

    Args:
        traj: the verified trajectory (reward 1) whose messages from ``train_from`` on are trained on.
        train_from: ``train_from_message_index``.
        target: ``target_attempt_index`` (2: a recovery attempt after a failed one; 1: a recovery inside the
            first attempt).
        failure_step: index of the last step of the failure state the recovery starts from.
        failed: the failed step whose command and output the record names, if any.
        recovery_turns: steps taken after the failure state.
        replay: the bash commands that rebuild the failure state.
        state_id: the failure state's id (:func:`reterm.recovery.state.state_id`; column ``trajectory_id``).
        family: the drill family (``[metadata] family``).
    """
    row = release_columns(traj.task_id, traj.to_messages(), train_from, target)
    row.update({
        "task_license": "Apache-2.0", "instruction": traj.instruction, "tools": json.dumps(TOOLS, ensure_ascii=False),
        "failure_step": failure_step, "failure_category": category, "failure_source": source,
        "injection": "first_mistake" if source == "injected" else "",
        "failure_command": (failed.command if failed else "") or "",
        "failure_output": (failed.observation if failed else "") or "",
        "replay_commands": replay, "verifier_reward": float(traj.reward or 0.0), "attempts": 1,
        "successful_attempts": 1, "recovery_turns": recovery_turns, "source_policy": source_policy,
        "teacher": traj.policy, "trajectory_id": state_id, "prompt_version": PROMPT_VERSION, "family": family,
    })  # fmt: skip
    if trains_on_mistake(row):
        raise ValueError(f"record {row['id']}: train_from_message_index={train_from} would train on the mistake "
                         f"(failure_step={failure_step})")
    return row


async def _batch(policy: Any, teacher: Any, dirs: list[Path], source: str, max_turns: int,
                 label: str | None = None) -> dict[str, Any]:  # fmt: skip
    """First attempts on ``dirs``, then one teacher recovery from each failed one. Returns the journal entry."""
    firsts = await run_attempts(policy, dirs, max_turns=max_turns, keep_failed_snapshots=True)
    failed = [a for a in firsts if a.failed]
    entry: dict[str, Any] = {"tasks": [d.name for d in dirs], "source": source,
                             "outcomes": Counter(a.trajectory.outcome.value for a in firsts), "records": []}
    try:
        states = [attempt_end_state(a) for a in failed]
        for a, st in zip(failed, states):
            st.category = evidence_label(a, st.category, st.source == "localiser", source)
        recs = await run_attempts(teacher, [a.task_dir for a in failed], states=states,
                                  snapshots=[a.snapshot for a in failed], max_turns=8)  # fmt: skip
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
                traj, len(traj.to_messages(upto=traj.prefix_len)), 2, failure_step=len(state.steps) - 1,
                failed=failed_step, recovery_turns=len(traj.steps) - traj.prefix_len, category=st.category,
                source=source, source_policy=label or getattr(policy, "name", source),
                replay=[s.action.command or "" for s in state.steps if s.action is not None and s.action.tool == "bash"],
                state_id=st.id, family=_family(a.task_dir)))  # fmt: skip
    if source == "injected":
        entry["records"] += await _in_attempt_records([a for a, st in zip(failed, states)],
                                                      {a.task_dir: st.category for a, st in zip(failed, states)})
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
        rows.append(_record(traj, recovery_start(traj), 1, failure_step=0, failed=traj.steps[0], recovery_turns=len(traj.steps) - 1,
                            category=categories[r.task_dir], source="injected", source_policy="first-mistake",
                            replay=[], state_id=state_id_of(traj, traj.steps[:1]), family=_family(r.task_dir)))  # fmt: skip
    return rows


def build(tasks: Path, output: Path, *, policies: list[str] | tuple[str, ...] = (), max_turns: int, batch: int,
          held_out: float, max_tasks: int | None = None, max_new_tokens: int = 48,
          own_tasks: int | None = None, extends: Path | None = None) -> dict[str, Any]:  # fmt: skip
    """Build the dataset folder (see the module docstring). Returns its ``stats.json`` content.

    Args:
        policies: policy specs (:func:`reterm.policies.load_policy`) whose own failed attempts are mined, in
            order; the i-th attempts the train instances ``i, i + step, ...`` (``own_tasks`` of them, spread
            over every family). Re-running with one more policy (the SFT checkpoint after the cold start: the
            paper's second round) keeps what the journal holds and adds that policy's records.
        own_tasks: bound on the train instances each policy attempts (default all); injected first mistakes
            cover every train instance.
        extends: a dataset folder this build makes the next round of (see the module docstring): its journal
            seeds ``output``'s when ``output`` has none yet; ``extends`` itself is only read.

    Raises:
        FileNotFoundError: ``extends`` has no journal or no ``stats.json`` (not a folder this module wrote).
        ValueError: ``extends`` is ``output`` (a round must not rewrite the version it extends).
    """
    from reterm.data.layout import write_dataset_folder

    t0 = time.monotonic()
    splits = read_splits(tasks)
    dirs = [tasks / n for n in splits["train"]][:max_tasks]
    journal_path = output / ".drills" / "journal.jsonl"
    previous: dict[str, Any] | None = None
    if extends is not None:
        extends = Path(extends)
        if extends.resolve() == Path(output).resolve():
            raise ValueError(f"--extends {extends} is the output folder: a new round needs its own folder")
        prev_journal, prev_stats = extends / ".drills" / "journal.jsonl", extends / "stats.json"
        for path in (prev_journal, prev_stats):
            if not path.is_file():
                raise FileNotFoundError(f"{path}: missing; --extends needs a dataset folder written by pipeline.drills")
        previous = json.loads(prev_stats.read_text())
        if not journal_path.exists():
            journal_path.parent.mkdir(parents=True, exist_ok=True)
            tmp = journal_path.with_name(journal_path.name + ".tmp")
            tmp.write_bytes(prev_journal.read_bytes())
            tmp.replace(journal_path)
    journal_path.parent.mkdir(parents=True, exist_ok=True)
    done: list[dict[str, Any]] = []
    if journal_path.exists():
        done = [json.loads(line) for line in journal_path.read_text().splitlines() if line.strip()]
    seen = {(e.get("key", e["source"]), t) for e in done for t in e["tasks"]}
    teachers = {"injected": injected_teacher(dirs), "own": OraclePolicy(dirs, name="oracle-teacher")}
    work: list[tuple[str, str, Any]] = [("injected", "injected", lambda: mistake_policy(dirs))]
    step = max(1, len(dirs) // own_tasks) if own_tasks else 1
    own_dirs: dict[str, list[Path]] = {}
    for j, spec in enumerate(policies):
        from reterm.policies import load_policy

        work.append(("own", f"own:{spec}", lambda spec=spec: load_policy(
            spec, temperature=0.7, top_p=0.95, max_new_tokens=max_new_tokens, seed=0)))  # fmt: skip
        own_dirs[f"own:{spec}"] = dirs[j % step :: step][:own_tasks]
    for source, key, make in work:
        todo = [d for d in own_dirs.get(key, dirs) if (key, d.name) not in seen]
        if not todo:
            continue
        pol = make()
        size = batch if source == "own" else 16
        for i in range(0, len(todo), size):
            chunk = todo[i : i + size]
            entry = asyncio.run(_batch(pol, teachers[source], chunk, source, max_turns if source == "own" else 2,
                                       policy_label(key.split(":", 1)[-1]) if source == "own" else None))
            entry["key"] = key
            with journal_path.open("a") as f:
                f.write(json.dumps(entry, ensure_ascii=False) + "\n")
            done.append(entry)
            n = sum(len(e["records"]) for e in done)
            print(f"[drills-data] {key}: {min(i + size, len(todo))}/{len(todo)} tasks, {n} records, "
                  f"{time.monotonic() - t0:.0f}s", flush=True)  # fmt: skip
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
                       "first-mistake" if e["source"] == "injected" else policy_label(e.get("key", "own:").split(":", 1)[-1])
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pipeline.drills", description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", required=True, type=Path, help="a drills folder (reterm tasks drills --out ...)")
    p.add_argument("--output", required=True, type=Path)
    p.add_argument("--policy", action="append", default=None,
                   help="whose own failed attempts to mine (repeatable, in order; default smollm2; '' for none)")
    p.add_argument("--max-turns", type=int, default=3)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--batch", type=int, default=16, help="attempts generated together")
    p.add_argument("--held-out", type=float, default=0.08, help="share of train tasks whose records form `test`")
    p.add_argument("--max-tasks", type=int, default=None, help="use only the first N train instances")
    p.add_argument("--own-tasks", type=int, default=None, help="the policy attempts at most N train instances")
    p.add_argument("--extends", type=Path, default=None,
                   help="a dataset folder (an earlier round) this one extends; it is read, never rewritten")
    a = p.parse_args(argv)
    try:
        policies = [p for p in (a.policy if a.policy is not None else ["smollm2"]) if p]
        build(a.tasks, a.output, policies=policies, max_turns=a.max_turns, batch=a.batch,
              held_out=a.held_out, max_tasks=a.max_tasks, max_new_tokens=a.max_new_tokens,
              own_tasks=a.own_tasks, extends=a.extends)
    except (FileNotFoundError, ValueError) as exc:
        print(f"pipeline.drills: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
