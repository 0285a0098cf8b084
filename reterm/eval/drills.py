"""``python -m eval.drills --tasks DRILLS --model NAME=SPEC ... --output DIR``: models on the recovery drills,
in the release's protocol, with 95% intervals.

For each model (greedy decoding, the kit's one harness and prompt):

- **Pass@1** on the held-out instances of the training families (``test``: in-distribution) and on the
  held-out families (``test_ood``): one attempt per instance from the task's start.
- **valid_tool_call_rate**: share of the model's generated turns (Pass@1 attempts) that parse into a tool call.
- **Recovery@1 from injected failure states**: on every ``test`` and ``test_ood`` instance, the family's
  natural first mistake is typed as a failed first attempt (built once, shared by all models); the model
  makes the second attempt from a fork of the snapshot taken when that attempt ended, after the feedback
  message (:mod:`reterm.recovery.attempts`). Same items for every model, so differences are paired.
- **Recovery@k (k = 1..3) on the model's own failed attempts** (the paper's definition): up to k sequential
  attempts, each inheriting the state the previous one left. **Fatal Attempt Rate**: share of those failed
  attempts from which the task's reference solution, typed from a fork of the failure state, no longer
  passes (an upper bound on recoverability: the solution may not be the only way); **Conditional
  Recovery@k**: Recovery@k among the non-fatal ones.
- **Recovery@1 from own multi-stage failure states** (``--multistage-states N``): the ``--states-from`` model
  (default ``sft``) attempts held-out two-stage drills, or chains of K stages (``--chain-stages K``), from the
  start until N attempts failed; each failed attempt (on a chain: the failed attempt with the most stages done,
  :mod:`reterm.eval.failure_choice`, the mechanism's rule) is a failure state every model recovers from once.
  On chains every model also gets **Pass@1 from the chain's start** on the same tasks, and the attempts get the
  chain's turns (:func:`reterm.drills.multistage.turn_budget`: ``3K + 2``) unless ``--chain-max-turns`` says less.

Every rate is ``{"value", "ci95", "n"}`` (Wilson, :mod:`reterm.stats`); every difference between two models
on the same items is a paired bootstrap interval. Infrastructure faults are counted apart and leave the
denominators; a sandbox fault that followed the attempt's own command is the agent's failure
(:func:`agent_broke_sandbox`), so breaking the sandbox cannot hide one. Results: ``DIR/results.json``, ``DIR/report.md`` and ``DIR/rates.png``; each model's attempts in
``DIR/<model>/attempts.jsonl``. A re-run skips models whose ``DIR/<model>/metrics.json`` exists, and a model
interrupted midway resumes from its journal (``DIR/<model>/journal.jsonl``: its scored attempts so far; a
failed one whose snapshot a later step forks is reused while that snapshot is kept, else attempted again), and so
does the building of the multi-stage failure states (``DIR/multistage/start_journal.jsonl``).

``--workers N`` evaluates N models at a time, each in its own process (:func:`run_workers`): the multi-stage
failure states are built first, in this process, and every worker recovers from those same states.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from reterm import workers as workers_mod
from reterm.data.drills import injected_teacher, mistake_policy, read_splits
from reterm.drills.caps import unwinnable as find_unwinnable
from reterm.drills.multistage import (
    DEFAULT_STAGE_FAMILIES,
    chain_name,
    generate_multistage,
    stage_families,
    turn_budget,
)
from reterm.eval.failure_choice import attempt_stages_done, chain_most_progress
from reterm.generation import MAX_CONSECUTIVE_PARSE_ERRORS, MAX_TURN_TOKENS, apply_thread_policy, policy_defaults
from reterm.io import write_text_atomic
from reterm.policies import is_local_path, load_policy
from reterm.policies.scripted import OraclePolicy
from reterm.recovery.attempts import Attempt, attempt_end_state, release, run_attempts
from reterm.recovery.state import State
from reterm.sandbox.snapshot import Snapshot
from reterm.stats import paired_bootstrap, paired_power, rate
from reterm.trajectory import Outcome, Trajectory, write_json_atomic

PAIRS = [("sft", "base"), ("grpo-standard", "sft"), ("grpo-reterm", "sft"), ("grpo-reterm", "grpo-standard")]
"""(model, baseline) pairs whose paired differences the report gives, when both were evaluated."""

MULTISTAGE_SEED = 0
"""Seed of the held-out two-stage drills of ``--multistage-states`` (instances ``multi-000``, ... of
:func:`reterm.drills.multistage.generate_multistage`; a drills folder's two-stage ``train`` instances start at
index :data:`reterm.drills.multistage.TRAIN_START`, so the two never share an instance)."""

MULTISTAGE_KEY = "multistage_own"
"""The key of Recovery@1 from the state model's own multi-stage failure states (two-stage drills, or chains with
``--chain-stages K``) (``recovery_at_1``, ``infra_faults``; ``per_item.json``: ``recovery_at_1/multistage_own``)."""

MULTISTAGE_START_KEY = "multistage_start"
"""The key of Pass@1 from the start of the held-out multi-stage drills the states came from (``pass_at_1``,
``infra_faults``; ``per_item.json``: ``pass_at_1/multistage_start``, keyed by task, paired across models)."""


def _say(msg: str) -> None:
    print(f"[eval-drills] {msg}", flush=True)


JOURNAL = "journal.jsonl"
"""A model's finished attempts while it is being evaluated (``DIR/<model>/journal.jsonl``): one line per scored
attempt, appended and flushed after each batch; removed once the model's ``metrics.json`` is written."""


START_JOURNAL = "start_journal.jsonl"
"""The state model's attempts from the held-out multi-stage drills' start while their failure states are built
(``DIR/multistage/start_journal.jsonl``, :func:`build_multistage_states`): the journal of :func:`_attempts`."""


def _read_journal(path: Path | None) -> dict[str, dict[str, Any]]:
    """The journal's rows by key (``{}`` without one): ``{"key", "trajectory", "snapshot"}`` (``snapshot``: the id
    of a failed attempt's kept snapshot, absent in older journals); a last line cut by a kill is skipped."""
    if path is None or not path.is_file():
        return {}
    done: dict[str, dict[str, Any]] = {}
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
            if isinstance(row["trajectory"], dict):
                done[row["key"]] = row
        except (ValueError, KeyError, TypeError):
            continue
    return done


def _kept_snapshot(snapshot_id: Any) -> Snapshot | None:
    """The snapshot ``snapshot_id`` when it is still on disk and not released, else ``None``."""
    if not isinstance(snapshot_id, str) or not snapshot_id:
        return None
    try:
        snap = Snapshot.load(snapshot_id)
    except (OSError, ValueError, KeyError):
        return None
    return None if snap.released else snap


async def _attempts(policy: Any, dirs: list[Path], batch: int, label: str, *, states: list[Any] | None = None,
                    snapshots: list[Any] | None = None, journal: Path | None = None, journal_tag: str = "",
                    **kw: Any) -> list[Attempt]:  # fmt: skip
    """:func:`run_attempts` over ``dirs`` (with their ``states``/``snapshots``) ``batch`` at a time.

    With ``journal`` (a JSONL file), every scored attempt is appended to it after its batch, keyed by
    ``journal_tag`` (the model and the caps), ``label``, its index, task and state id, with the id of its kept
    snapshot when ``keep_failed_snapshots`` kept one; a re-run with the same file reuses the journaled attempts
    instead of attempting them again. A failed one, when ``keep_failed_snapshots`` is asked, is reused with its
    snapshot (the failure state a later step forks) only while that snapshot is on disk and not released (what a
    killed process held stays there; a caller that releases on an exception or SIGTERM frees it), else attempted
    again; one that broke its sandbox
    (:func:`_blame`) never had a snapshot and is reused as it is. Infrastructure faults are never journaled
    (retried).
    """
    keys = [f"{journal_tag}|{label}|{i}|{d.name}|{getattr(states[i], 'id', '') if states is not None else ''}"
            for i, d in enumerate(dirs)]  # fmt: skip
    done = _read_journal(journal)
    out: dict[int, Attempt] = {}
    for i, key in enumerate(keys):
        if key in done:
            traj = Trajectory.model_validate(done[key]["trajectory"])
            if not (kw.get("keep_failed_snapshots") and traj.outcome is Outcome.FAILURE):
                out[i] = Attempt(dirs[i], traj)
            elif (snap := _kept_snapshot(done[key].get("snapshot"))) is not None:
                out[i] = Attempt(dirs[i], traj, snap)
            elif traj.metadata.get("broken_by_agent"):  # never had a snapshot: nothing to fork either way
                out[i] = Attempt(dirs[i], traj)
    todo = [i for i in range(len(dirs)) if i not in out]
    if out:
        _say(f"  {label}: {len(out)}/{len(dirs)} attempts from the journal, {len(todo)} to run")
    t0 = time.monotonic()
    for b in range(0, len(todo), batch):
        idx = todo[b : b + batch]
        got = await run_attempts(policy, [dirs[i] for i in idx],
                                 states=[states[i] for i in idx] if states is not None else None,
                                 snapshots=[snapshots[i] for i in idx] if snapshots is not None else None, **kw)  # fmt: skip
        out.update(zip(idx, _blame(got)))
        if journal is not None:
            rows = [json.dumps({"key": keys[i], "trajectory": a.trajectory.model_dump(mode="json"),
                                "snapshot": a.snapshot.id if a.snapshot is not None else None})
                    for i, a in zip(idx, got) if _scored(a)]  # fmt: skip
            with open(journal, "a") as fh:
                fh.write("".join(r + "\n" for r in rows))
                fh.flush()
                os.fsync(fh.fileno())
        _say(f"  {label}: {len(out)}/{len(dirs)} attempts, {time.monotonic() - t0:.0f}s")
    return [out[i] for i in range(len(dirs))]


def spread(items: list[Any], n: int | None) -> list[Any]:
    """At most ``n`` of ``items``, evenly spaced (splits list instances family by family, so a prefix would
    drop whole families)."""
    if n is None or n >= len(items):
        return list(items)
    if n <= 0:
        return []
    return [items[(i * len(items)) // n] for i in range(n)]


# What the episode loop says when the sandbox's own init is gone: the one sandbox fault after the agent's commands
# that the host did (reterm.agent.episode.blame_breakage).
_HOST_ENDED = "the sandbox itself ended"
# What it says when the sandbox stopped working once one of the agent's commands had started (the command is then
# not recorded as a step when the loop blamed the host).
_AFTER_COMMAND = "the terminal failed after this command"


def agent_broke_sandbox(traj: Trajectory) -> str | None:
    """Why a sandbox fault of an attempt is the agent's failure, or ``None``.

    The rule of docs/SCORING.md ("what the agent breaks is its failure"), applied to what an attempt
    records: a ``SANDBOX_ERROR`` that came after at least one of the attempt's own commands had run (a step of
    its own, past the copied history, with a command) or while one ran (the loop's "the terminal failed after
    this command"; that command is not kept as a step then) is the agent's doing, unless the sandbox's own init
    was gone (``"the sandbox itself ended"``: the host or harness ended it). The episode loop blames the host
    when the host was short of memory and the sandbox's limits showed nothing, which an agent's fork bomb can
    also bring about on a loaded host; counting such an attempt as a fault would let an agent hide a failure
    by breaking its sandbox. Faults before any command (the sandbox or terminal did not start, the failure
    state could not be rebuilt) stay faults.
    """
    if traj.outcome is not Outcome.SANDBOX_ERROR or _HOST_ENDED in (traj.error or ""):
        return None
    own = [s for s in traj.steps[traj.prefix_len :] if not s.from_history and s.action is not None and s.command]
    if _AFTER_COMMAND in (traj.error or ""):
        return f"the sandbox stopped working during the attempt's next command: {traj.error}"[:500]
    if not own:
        return None
    return f"the sandbox stopped working after the attempt's command {own[-1].command!r}: {traj.error or ''}"[:500]


def _blame(attempts: list[Attempt]) -> list[Attempt]:
    """Score the attempts whose sandbox fault the agent caused (:func:`agent_broke_sandbox`) as failures with
    reward 0 and ``metadata["broken_by_agent"]``, as the episode loop scores what the agent breaks."""
    for a in attempts:
        why = agent_broke_sandbox(a.trajectory)
        if why is not None:
            t = a.trajectory
            t.metadata["sandbox_error"] = t.error
            t.reward, t.outcome, t.error, t.stop_reason = 0.0, Outcome.FAILURE, None, "sandbox_broken"
            t.metadata["broken_by_agent"] = why
    return attempts


def _scored(a: Attempt) -> bool:
    return a.trajectory.outcome in (Outcome.SUCCESS, Outcome.FAILURE)


def _turn_stats(attempts: list[Attempt]) -> tuple[int, int]:
    """(turns generated, turns that parsed into a tool call) over the attempts' own steps."""
    turns = valid = 0
    for a in attempts:
        for s in a.trajectory.steps[a.trajectory.prefix_len :]:
            turns += 1
            valid += int(s.action is not None)
    return turns, valid


async def _injected_states(dirs: list[Path], batch: int) -> tuple[list[Attempt], list[Any], list[bool]]:
    """The injected failed first attempts of ``dirs`` (snapshots kept), their states, and whether the
    reference solution still passes from each (recoverable)."""
    mistakes = mistake_policy(dirs)
    firsts = await _attempts(mistakes, dirs, batch, "injected first attempts", max_turns=2, keep_failed_snapshots=True)
    failed = [a for a in firsts if a.failed]
    release([a for a in firsts if not a.failed])
    states = [attempt_end_state(a) for a in failed]
    checks = await run_attempts(injected_teacher(dirs), [a.task_dir for a in failed], states=states,
                                snapshots=[a.snapshot for a in failed], max_turns=8)  # fmt: skip
    return failed, states, [c.trajectory.outcome is Outcome.SUCCESS for c in checks]


def multistage_families(tasks: Path) -> tuple[str, ...]:
    """The stage families of the held-out two-stage drills: the drills folder's in-distribution families that
    may be a stage (as for its two-stage ``train`` instances), else the default ones."""
    try:
        meta = read_splits(tasks).get("drills")
    except (FileNotFoundError, ValueError):
        meta = None
    if isinstance(meta, dict) and meta.get("families"):
        fams = stage_families([f for f in meta["families"] if f not in meta.get("ood_families", [])])
        if len(fams) >= 2:
            return fams
    return DEFAULT_STAGE_FAMILIES


def load_multistage_states(folder: Path, state_model: str, n: int, stages: int = 2,
                           max_turns: int | None = None) -> dict[str, Any] | None:  # fmt: skip
    """``folder/states.json`` when it holds ``n`` states of ``state_model`` on drills of ``stages`` stages (made
    with ``max_turns`` turns, when given) whose snapshots still exist, else ``None`` (the states are then built
    again)."""
    path = folder / "states.json"
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
        if (
            data.get("state_model") != state_model
            or data.get("n_requested") != n
            or data.get("released")
            or data.get("stages", 2) != stages
            or (max_turns is not None and data.get("max_turns") != max_turns)
        ):
            return None
        if any(_kept_snapshot(item["snapshot"]) is None for item in data["items"]):
            return None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return data


def multistage_items(data: dict[str, Any], folder: Path) -> list[tuple[Path, State, str]]:
    """(task folder, state, snapshot id) of each item of a ``states.json``."""
    return [(folder / "tasks" / it["task"], State.from_json(it["state"]), it["snapshot"]) for it in data["items"]]


def multistage_start_dirs(data: dict[str, Any], folder: Path) -> list[Path]:
    """The task folders of every drill the state model attempted from the start while building a ``states.json``
    (``n_tasks`` of them, in index order): the items of Pass@1 from the multi-stage drills' start."""
    return [folder / "tasks" / chain_name(int(data.get("stages", 2)), i) for i in range(int(data["n_tasks"]))]


def release_multistage(folder: Path) -> None:
    """Release the snapshots of ``folder/states.json`` and mark the file (its states can no longer be forked)."""
    path = folder / "states.json"
    if not path.is_file():
        return
    data = json.loads(path.read_text())
    for item in data.get("items", []):
        try:
            Snapshot.load(item["snapshot"]).release()
        except FileNotFoundError:
            pass
    write_json_atomic(path, data | {"released": True})


async def build_multistage_states(policy: Any, state_model: str, folder: Path, n: int, *, families: tuple[str, ...],
                                  batch: int, max_tasks: int | None = None, stages: int = 2, journal_tag: str = "",
                                  **kw: Any) -> dict[str, Any]:  # fmt: skip
    """The items of Recovery@1 from own multi-stage failure states: ``policy`` (the model named ``state_model``)
    makes one attempt from the start of each held-out drill of ``stages`` stages (two-stage drills
    ``multi-000``, ..., or chains ``chain<K>-000``, ...), in order, until ``n`` attempts failed (scored, at least
    one step) or ``max_tasks`` (default ``4 n``) were tried; tasks are written in chunks (``1.1 n`` first, then 1.1 times
    what is missing over the failure share so far: every task attempted here is an item of every model's Pass@1 from
    the start, so the set stays just above ``n``; chains nearly always fail from the start). The
    failure state of a task is its failed attempt chosen by
    :func:`reterm.eval.failure_choice.chain_most_progress` (the mechanism's rule: the most stages done; with
    greedy decoding a task has one attempt). Writes ``folder/tasks``, ``folder/start_attempts.jsonl`` and
    ``folder/states.json`` (``state_model``, ``stages``, ``max_turns``, ``n_requested``, ``n_tasks`` attempted,
    ``n_states``, ``pass_at_1_from_start`` over every attempted task and ``start_passed`` per task (``None``: an
    infrastructure fault), ``infra_faults``, ``stages_done`` (failure states per stages done, chains only),
    ``items``: ``{"task", "state", "snapshot", "stages_done"}``), and returns the latter. The items' snapshots are
    kept (:func:`release_multistage`). ``kw``: :func:`reterm.recovery.attempts.run_attempts`'s caps.

    The attempts are journaled in ``folder/start_journal.jsonl`` under ``journal_tag`` (the model's spec),
    the drills and the caps in ``kw`` as they finish (:func:`_attempts`): a build interrupted midway resumes from
    its last batch, reusing the failed attempts whose snapshots are still kept (an interrupted build keeps them;
    the journal is removed once ``states.json`` is written). An attempt that broke its sandbox is a failure from
    the start but not an item (nothing to fork).

    Raises:
        ValueError: fewer stage ``families`` than ``stages`` (named).
    """
    t0 = time.monotonic()
    old = folder / "states.json"
    if old.is_file():  # a stale set (other model or size, or snapshots gone): free what is left of it
        try:
            release_multistage(folder)
        except (OSError, ValueError):
            pass
    cap = max_tasks if max_tasks is not None else 4 * n
    # what makes a journaled attempt this build's: the model, the drills and every cap it ran under
    tag = "|".join([journal_tag, str(MULTISTAGE_SEED), str(stages), ",".join(families),
                    json.dumps(kw, sort_keys=True, default=str)])  # fmt: skip
    kept: list[tuple[Any, Attempt]] = []
    scored: list[bool] = []
    start_passed: dict[str, float | None] = {}
    what = "two-stage" if stages == 2 else f"{stages}-stage chain"
    lines: list[str] = []
    tried = infra = 0
    # an interruption leaves the kept snapshots: the journal names them, and a re-run forks them instead of
    # attempting those tasks again (`reterm sandbox sweep --snapshots` frees those of a build never resumed)
    while len(kept) < n and tried < cap:
        need = n - len(kept)
        fail_share = (len(scored) - sum(scored)) / len(scored) if scored else 1.0
        more = -(-11 * need // 10) if not scored else int(1.1 * need / max(fail_share, 0.2)) + 1
        chunk = min(cap - tried, more)
        tasks = generate_multistage(folder / "tasks", MULTISTAGE_SEED, tried + chunk, families=families,
                                    stages=stages)[tried:]  # fmt: skip
        atts = await _attempts(policy, [t.path for t in tasks], batch, f"{state_model} {what} from start",
                               keep_failed_snapshots=True, journal=folder / START_JOURNAL, journal_tag=tag,
                               **kw)  # fmt: skip
        tried += len(tasks)
        for a in atts:
            lines.append(json.dumps({"kind": "multistage_start", **a.trajectory.model_dump(mode="json")}))
            if not _scored(a):
                infra += 1
                start_passed[a.task_dir.name] = None
                release([a])
                continue
            scored.append(bool(a.trajectory.passed))
            start_passed[a.task_dir.name] = float(a.trajectory.passed)
            chosen = chain_most_progress([a])  # the task's attempts: one under greedy decoding
            # an attempt that broke its sandbox (the agent's failure, counted above) has no snapshot to fork
            if chosen is not None and chosen.snapshot is not None and len(kept) < n:
                kept.append((attempt_end_state(chosen), chosen))
            else:
                release([a])
        _say(f"  {state_model}: {len(kept)}/{n} {what} failure states from {tried} tasks")
    done_of = [attempt_stages_done(a) for _, a in kept]
    by_done: dict[str, int] = defaultdict(int)
    for d in done_of:
        if d is not None:
            by_done[str(d)] += 1
    data = {"state_model": state_model, "seed": MULTISTAGE_SEED, "families": list(families), "stages": stages,
            "max_turns": kw.get("max_turns"), "n_requested": n,
            "n_tasks": tried, "n_states": len(kept), "pass_at_1_from_start": rate(scored), "infra_faults": infra,
            "start_passed": start_passed, "stages_done": dict(sorted(by_done.items(), key=lambda kv: int(kv[0]))),
            "items": [{"task": a.task_dir.name, "state": st.to_json(), "snapshot": a.snapshot.id, "stages_done": d}
                      for (st, a), d in zip(kept, done_of)],
            "wall_s": round(time.monotonic() - t0, 1)}  # fmt: skip
    write_text_atomic(folder / "start_attempts.jsonl", "".join(line + "\n" for line in lines))
    write_json_atomic(folder / "states.json", data)
    (folder / START_JOURNAL).unlink(missing_ok=True)  # states.json holds what it kept
    _say(f"  {state_model}: {len(kept)} {what} failure states from {tried} tasks; {what} pass rate from task "
         f"start {_fmt(data['pass_at_1_from_start'])}, {data['wall_s']:.0f}s")  # fmt: skip
    return data


def _per_category(items: list[tuple[str, bool]]) -> dict[str, Any]:
    by: dict[str, list[bool]] = defaultdict(list)
    for cat, ok in items:
        by[cat].append(ok)
    return {c: rate(v) for c, v in sorted(by.items())}


async def evaluate_model(name: str, policy: Any, id_dirs: list[Path], ood_dirs: list[Path],
                         injected: tuple[list[Attempt], list[Any], list[bool]], out: Path, *,
                         max_turns: int, batch: int, own_items: int, k_max: int,
                         multistage: list[tuple[Path, State, str]] | None = None,
                         multistage_turns: int | None = None, multistage_start: list[Path] | None = None,
                         multistage_start_known: dict[str, float | None] | None = None,
                         journal_tag: str = "", unwinnable: list[str] | None = None) -> dict[str, Any]:  # fmt: skip
    """One model's metrics (see the module docstring); writes ``out/<name>/attempts.jsonl``. ``multistage``:
    the items of Recovery@1 from own multi-stage failure states (:func:`multistage_items`), if any;
    ``multistage_start``: the drills whose start Pass@1 is measured on (:func:`multistage_start_dirs`), with
    ``multistage_start_known`` the per-task outcomes already measured (the state model's own start attempts:
    greedy, the same caps, so not run again); ``multistage_turns``: the turns of those attempts (default
    ``max_turns``; a chain's :func:`reterm.drills.multistage.turn_budget`); ``unwinnable``: the items this
    model's caps make unwinnable (:func:`_unwinnable_items`), recorded in its metrics.

    Its attempts are journaled in ``out/<name>/journal.jsonl`` (:data:`JOURNAL`) while it runs, under
    ``journal_tag`` (what makes attempts comparable: the model's spec and the caps), so that an interrupted
    evaluation of this model resumes where it stopped."""
    t0 = time.monotonic()
    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    lines: list[str] = []
    kw = dict(max_turns=max_turns, max_consecutive_parse_errors=MAX_CONSECUTIVE_PARSE_ERRORS,
              journal=folder / JOURNAL, journal_tag=journal_tag)  # fmt: skip
    res: dict[str, Any] = {"model": name, "unwinnable_items": unwinnable}
    own_failed: list[Attempt] = []
    held: list[Attempt] = []  # every attempt whose snapshot this keeps (release is idempotent)
    per_item: dict[str, dict[str, float | None]] = {}
    try:
        for split, dirs in (("drills_id", id_dirs), ("drills_ood", ood_dirs)):
            # failure-state snapshots only while own items are still wanted: without them a resumed run reuses
            # its journaled failures as they are; with them it re-attempts those whose snapshot is gone
            atts = await _attempts(policy, dirs, batch, f"{name} pass@1 {split}",
                                   keep_failed_snapshots=own_items > len(own_failed), **kw)  # fmt: skip
            scored = [a for a in atts if _scored(a)]
            res.setdefault("pass_at_1", {})[split] = rate([a.trajectory.passed for a in scored])
            res.setdefault("infra_faults", {})[split] = len(atts) - len(scored)
            per_item[f"pass_at_1/{split}"] = {a.task_dir.name: (float(a.trajectory.passed) if _scored(a) else None)
                                              for a in atts}  # fmt: skip
            turns, valid = _turn_stats(atts)
            res.setdefault("turns", {})[split] = {"turns": turns, "valid_tool_calls": valid}
            lines += [json.dumps({"split": split, "kind": "pass_at_1", **a.trajectory.model_dump(mode="json")}) for a in atts]
            keep = [a for a in atts if a.failed][: max(0, own_items - len(own_failed))]
            release([a for a in atts if a not in keep])
            own_failed += keep
            held += keep
        t_turns = sum(v["turns"] for v in res["turns"].values())
        t_valid = sum(v["valid_tool_calls"] for v in res["turns"].values())
        res["valid_tool_call_rate"] = rate([True] * t_valid + [False] * (t_turns - t_valid))

        # Recovery@1 from the shared injected failure states
        failed, states, recoverable = injected
        recs = await _attempts(policy, [a.task_dir for a in failed], batch, f"{name} recovery@1 (injected)", states=states,
                               snapshots=[a.snapshot for a in failed], **kw)  # fmt: skip
        split_of = {d.name: "drills_id" for d in id_dirs} | {d.name: "drills_ood" for d in ood_dirs}
        res["recovery_at_1"] = {}
        for split in ("drills_id", "drills_ood"):
            items = [r for r in recs if split_of[r.task_dir.name] == split and _scored(r)]
            res["recovery_at_1"][split] = rate([r.trajectory.passed for r in items])
            per_item[f"recovery_at_1/{split}"] = {r.task_dir.name: float(r.trajectory.passed) for r in items}
        res["recovery_at_1_by_category"] = _per_category(
            [(s.category, r.trajectory.passed) for s, r in zip(states, recs) if _scored(r)])
        lines += [json.dumps({"kind": "recovery_injected", "category": s.category, "state_id": s.id,
                              **r.trajectory.model_dump(mode="json")}) for s, r in zip(states, recs)]  # fmt: skip
        state_items = [s.with_source("injected").eval_item(r.trajectory) for s, r in zip(states, recs)]
        release(recs)

        # Pass@1 from the start of the multi-stage drills the states came from (paired by task)
        ms_kw = kw | {"max_turns": multistage_turns or max_turns}
        if multistage_start:
            if multistage_start_known is not None:
                got = {d.name: multistage_start_known.get(d.name) for d in multistage_start}
            else:
                starts = await _attempts(policy, multistage_start, batch, f"{name} pass@1 (multi-stage start)", **ms_kw)
                got = {a.task_dir.name: (float(a.trajectory.passed) if _scored(a) else None) for a in starts}
                lines += [json.dumps({"kind": "pass_at_1_multistage", **a.trajectory.model_dump(mode="json")})
                          for a in starts]  # fmt: skip
                release(starts)
            res["pass_at_1"][MULTISTAGE_START_KEY] = rate([bool(v) for v in got.values() if v is not None])
            res["infra_faults"][MULTISTAGE_START_KEY] = sum(v is None for v in got.values())
            per_item[f"pass_at_1/{MULTISTAGE_START_KEY}"] = got

        # Recovery@1 from the state model's own multi-stage failure states (shared by every model)
        if multistage is not None:
            ms = await _attempts(policy, [d for d, _, _ in multistage], batch, f"{name} recovery@1 (multi-stage states)",
                                 states=[s for _, s, _ in multistage], snapshots=[i for _, _, i in multistage], **ms_kw)
            ok = [r for r in ms if _scored(r)]
            res["recovery_at_1"][MULTISTAGE_KEY] = rate([r.trajectory.passed for r in ok])
            res["infra_faults"][MULTISTAGE_KEY] = len(ms) - len(ok)
            # keyed by the state's id: only recoveries from the very same state pair up (a rebuilt set may differ)
            per_item[f"recovery_at_1/{MULTISTAGE_KEY}"] = {s.id: (float(r.trajectory.passed) if _scored(r) else None)
                                                           for (_, s, _), r in zip(multistage, ms)}  # fmt: skip
            lines += [json.dumps({"kind": f"recovery_{MULTISTAGE_KEY}", "category": s.category, "state_id": s.id,
                                  **r.trajectory.model_dump(mode="json")}) for (_, s, _), r in zip(multistage, ms)]  # fmt: skip
            state_items += [s.eval_item(r.trajectory) | {"kind": f"recovery_{MULTISTAGE_KEY}"}
                            for (_, s, _), r in zip(multistage, ms)]  # fmt: skip
            release(ms)

        # Recovery@k on the model's own failed attempts (sequential attempts inheriting the state)
        own_states = [attempt_end_state(a) for a in own_failed]
        cats = [s.category for s in own_states]
        fatal_checks = await _attempts(OraclePolicy([a.task_dir for a in own_failed], name="oracle"),
                                       [a.task_dir for a in own_failed], batch, f"{name} reference from own failures",
                                       states=own_states, snapshots=[a.snapshot for a in own_failed], max_turns=8,
                                       journal=kw["journal"], journal_tag=journal_tag) if own_failed else []  # fmt: skip
        fatal = [not c.trajectory.passed if _scored(c) else None for c in fatal_checks]
        recovered_at: list[int | None] = [None] * len(own_failed)  # the k at which each item recovered
        current = list(own_failed)
        alive = list(range(len(own_failed)))
        for k in range(1, k_max + 1):
            if not alive:
                break
            sts = [attempt_end_state(current[i]) for i in alive]
            nxt = await _attempts(policy, [current[i].task_dir for i in alive], batch, f"{name} own Recovery@{k}",
                                  states=sts, snapshots=[current[i].snapshot for i in alive], keep_failed_snapshots=True,
                                  **kw)  # fmt: skip
            release([current[i] for i in alive])
            still = []
            for i, st, a in zip(alive, sts, nxt):
                lines.append(json.dumps({"kind": f"recovery_own_k{k}", "state_id": st.id,
                                         **a.trajectory.model_dump(mode="json")}))
                state_items.append(st.eval_item(a.trajectory)
                             | {"kind": f"recovery_own_k{k}"})
                current[i] = a
                held.append(a)
                if a.trajectory.passed:
                    recovered_at[i] = k
                elif a.failed:
                    still.append(i)
            alive = still
            _say(f"  {name} own failures: Recovery@{k} {sum(r is not None for r in recovered_at)}/{len(own_failed)}")
        release([current[i] for i in alive])
    except BaseException:  # interrupted (SIGTERM in a worker, Ctrl-C): no snapshot it kept outlives it
        release(held)
        raise
    res["recovery_own"] = {"n_failed_attempts": len(own_failed)}
    for k in range(1, k_max + 1):
        ok = [r is not None and r <= k for r in recovered_at]
        res["recovery_own"][f"recovery_at_{k}"] = rate(ok)
        res["recovery_own"][f"conditional_recovery_at_{k}"] = rate([o for o, f in zip(ok, fatal) if f is False])
        res["recovery_own"][f"recovery_at_{k}_by_category"] = _per_category(list(zip(cats, ok)))
    res["recovery_own"]["fatal_attempt_rate"] = rate([f for f in fatal if f is not None])
    res["injected_states"] = {"n": len(states), "recoverable_by_reference": sum(recoverable)}
    res["wall_s"] = round(time.monotonic() - t0, 1)
    (folder / "attempts.jsonl").write_text("\n".join(lines) + "\n")
    write_json_atomic(folder / "per_item.json", per_item)
    # one line per recovery attempt, keyed by the failure state's id (the dataset's trajectory_id, GRPO's state_id)
    write_text_atomic(folder / "recovery_items.jsonl", "".join(json.dumps(i) + "\n" for i in state_items))
    write_json_atomic(folder / "metrics.json", res)
    (folder / JOURNAL).unlink(missing_ok=True)
    return res


def compare(out: Path, names: list[str], pairs: list[tuple[str, str]] | None = None) -> dict[str, Any]:
    """Paired bootstrap differences ``model - base`` for :data:`PAIRS` and the extra ``pairs``, over the items
    both models scored, each with its power (:func:`reterm.stats.paired_power`: the smallest difference
    detectable with 80% power at that n). Returns ``{"model - base": {metric key: difference}}``."""
    per = {n: json.loads((out / n / "per_item.json").read_text()) for n in names if (out / n / "per_item.json").exists()}
    diffs: dict[str, Any] = {}
    for model, base in dict.fromkeys([*PAIRS, *(pairs or [])]):
        if model not in per or base not in per:
            continue
        for key in per[model]:
            a, b = per[base].get(key, {}), per[model][key]
            common = sorted(t for t in b if t in a and a[t] is not None and b[t] is not None)
            xa, xb = [a[t] for t in common], [b[t] for t in common]
            diffs.setdefault(f"{model} - {base}", {})[key] = paired_bootstrap(xa, xb) | paired_power(xa, xb)
    return diffs


def _fmt(r: dict[str, Any] | None) -> str:
    if not r or r.get("value") is None:
        return "n/a"
    return f"{r['value']:.3f} [{r['ci95'][0]:.3f}, {r['ci95'][1]:.3f}] (n={r['n']})"


def multistage_drills_name(ms: dict[str, Any] | None) -> str:
    """What the multi-stage states were made on, for headers: ``two-stage`` or ``4-stage chain`` (``ms``:
    ``results["multistage_states"]``; older results without ``stages`` were two-stage)."""
    k = int((ms or {}).get("stages") or 2)
    return "two-stage" if k == 2 else f"{k}-stage chain"


def multistage_states_line(ms: dict[str, Any], fmt: Any) -> str:
    """The sentence that says where Recovery@1 from own multi-stage states comes from, for the evaluation
    report, the run summary and the README. ``ms``: ``results["multistage_states"]`` (``n_states``,
    ``state_model``, ``n_tasks``, ``pass_at_1_from_start``; on chains ``stages``, ``max_turns`` and
    ``stages_done``: failure states per stages done); ``fmt`` formats a ``{"value", "ci95", "n"}`` rate."""
    what = multistage_drills_name(ms)
    line = (f"Recovery@1 own {what} states: every model recovers from the same {ms.get('n_states')} failure "
            f"states of `{ms.get('state_model')}` on held-out {what} drills ({ms.get('n_tasks')} tasks it "
            f"attempted from the start; its {what} pass rate from task start {fmt(ms.get('pass_at_1_from_start'))})")
    if what != "two-stage":
        done = ", ".join(f"{j}: {c}" for j, c in (ms.get("stages_done") or {}).items()) or "-"
        line += (f"; {ms.get('max_turns')} turns per attempt; the failure state of a task is its failed attempt with "
                 f"the most stages done (failure states per stages done: {done})")
    return line + "."


def report(results: dict[str, Any]) -> str:
    """``report.md``: the metrics table, the paired differences in words, and the definitions."""
    lines = ["# Recovery drills: evaluation", "",
             "Greedy decoding, the kit's harness and prompt. Rates: value [Wilson 95% interval] (n items).", "",
             "| model | Pass@1 ID | Pass@1 OOD | Recovery@1 ID (injected) | Recovery@1 OOD (injected) | "
             f"valid tool calls | own Recovery@1 | Fatal Attempt Rate | Recovery@1 (own "
             f"{multistage_drills_name(results.get('multistage_states'))} states) | Pass@1 (multi-stage start) |",
             "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for name, m in results["models"].items():
        own = m["recovery_own"]
        lines.append(f"| {name} | {_fmt(m['pass_at_1']['drills_id'])} | {_fmt(m['pass_at_1']['drills_ood'])} | "
                     f"{_fmt(m['recovery_at_1']['drills_id'])} | {_fmt(m['recovery_at_1']['drills_ood'])} | "
                     f"{_fmt(m['valid_tool_call_rate'])} | {_fmt(own.get('recovery_at_1'))} | "
                     f"{_fmt(own.get('fatal_attempt_rate'))} | {_fmt(m['recovery_at_1'].get(MULTISTAGE_KEY))} | "
                     f"{_fmt(m['pass_at_1'].get(MULTISTAGE_START_KEY))} |")  # fmt: skip
    if results.get("multistage_states"):
        lines += ["", multistage_states_line(results["multistage_states"], _fmt)]
    lines += ["", "## Paired differences (model - baseline, same items; bootstrap 95% interval)", ""]
    for pair, per in results.get("differences", {}).items():
        for key, d in per.items():
            if d["diff"] is None:
                continue
            verdict = ("better" if d["diff"] > 0 else "worse") if d["excludes_zero"] else "no difference shown (interval includes 0)"
            lines.append(f"- {pair}, {key}: {d['diff']:+.3f} [{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}] "
                         f"(n={d['n']}): {verdict}")  # fmt: skip
    lines += ["", "## Definitions", "", __doc__.split("\n\n", 1)[1].split("Every rate")[0].strip()]
    return "\n".join(lines) + "\n"


def plot(results: dict[str, Any], path: Path) -> Path:
    """``rates.png``: Pass@1 and Recovery@1 (in- and out-of-distribution) per model, with Wilson 95% intervals."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results["models"])
    panels = [("pass_at_1", "drills_id", "Pass@1, held-out instances"), ("pass_at_1", "drills_ood", "Pass@1, held-out families"),
              ("recovery_at_1", "drills_id", "Recovery@1, held-out instances"),
              ("recovery_at_1", "drills_ood", "Recovery@1, held-out families")]  # fmt: skip
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.4), sharey=True)
    for ax, (metric, split, title) in zip(axes, panels):
        vals, lo, hi = [], [], []
        for n in names:
            r = results["models"][n][metric][split]
            v = r["value"] if r["value"] is not None else 0.0
            vals.append(v)
            lo.append(v - r["ci95"][0])
            hi.append(r["ci95"][1] - v)
        ax.bar(range(len(names)), vals, yerr=[lo, hi], capsize=4, color="#4c72b0")
        ax.set_xticks(range(len(names)), names, rotation=30, ha="right")
        ax.set_title(title, fontsize=9)
        ax.set_ylim(0, 1)
    axes[0].set_ylabel("rate (Wilson 95% interval)")
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)
    return path


def build_parser() -> argparse.ArgumentParser:
    """The ``python -m eval.drills`` argument parser (generation defaults from :mod:`reterm.generation`)."""
    # no abbreviations: the --workers processes get this command line with its --only options replaced
    p = argparse.ArgumentParser(prog="python -m eval.drills", description=__doc__.split("\n\n")[0],
                                allow_abbrev=False)  # fmt: skip
    p.add_argument("--tasks", required=True, type=Path)
    p.add_argument("--model", action="append", required=True, metavar="NAME=SPEC",
                   help="a model to evaluate: NAME=smollm2 or NAME=hf:PATH (repeatable, in order). Paired "
                        "differences are reported for the names base, sft, grpo-standard and grpo-reterm (PAIRS) "
                        "and for each --pair")
    p.add_argument("--pair", action="append", default=[], metavar="MODEL:BASE",
                   help="also report the paired difference MODEL - BASE of two --model names (repeatable)")
    p.add_argument("--output", required=True, type=Path)
    p.add_argument("--max-turns", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=MAX_TURN_TOKENS,
                   help=f"tokens per turn at most (default {MAX_TURN_TOKENS}: reterm.generation.MAX_TURN_TOKENS; "
                        "every drill's reference fits, reterm.drills.caps)")
    p.add_argument("--batch", type=int, default=32, help="attempts generated together")
    p.add_argument("--max-id", type=int, default=None,
                   help="at most N in-distribution test instances (evenly spread over the families)")
    p.add_argument("--max-ood", type=int, default=None)
    p.add_argument("--max-states", type=int, default=None,
                   help="injected failure states for Recovery@1: at most N of the evaluated instances per split")
    p.add_argument("--own-items", type=int, default=32, help="own failed attempts followed for Recovery@k")
    p.add_argument("--k-max", type=int, default=3)
    p.add_argument("--multistage-states", type=int, default=0, metavar="N",
                   help="Recovery@1 from N own failure states of the --states-from model on held-out two-stage drills "
                        "(0: off). Cost: the state model's attempts from the task start until N failed (1.3 N "
                        "tasks first, more when it passes many, at most 4 N), once, plus N recovery attempts per model")
    p.add_argument("--chain-stages", type=int, default=2, metavar="K",
                   help="stages of the held-out drills of --multistage-states: 2 (two-stage drills, the default) or a "
                        "chain of K >= 3 stages (chain<K>-000, ...): the failure state of a task is its failed attempt "
                        "with the most stages done (reterm.eval.failure_choice), and every model also gets Pass@1 "
                        "from the start of the chains the states came from (paired by task)")
    p.add_argument("--chain-max-turns", type=int, default=None, metavar="T",
                   help="turns of the attempts on those drills (default: reterm.drills.multistage.turn_budget(K), "
                        "3K + 2; fewer is run as asked, with a note, as a CI run keeps its turns small)")
    p.add_argument("--keep-states", action="store_true",
                   help="keep the two-stage failure states' snapshots when every model is done (by default they are "
                        "released to free the disk; kept, a later run that adds a --model recovers from the very same "
                        "states instead of building them again)")
    p.add_argument("--workers", type=int, default=1, metavar="N",
                   help="models evaluated at once, each in its own process with cpus/N threads (default 1: one after "
                        "the other in this process). A process leaves cores idle while it waits for sandboxes between "
                        "turns; on 2 cores, 2 workers ran the same evaluation 1.22x faster (bench/eval_workers.py) "
                        "with twice the memory")
    p.add_argument("--only", action="append", default=[], metavar="NAME",
                   help="evaluate only these --model names (repeatable) and write no results.json: what each "
                        "--workers process runs; the other --model names still name the state model and the pairs")
    p.add_argument("--states-from", default="sft", metavar="NAME",
                   help="the evaluated model whose own failed attempts make the two-stage states (default sft; "
                        "if no model has that name, the first --model)")
    return p


def _unwinnable_items(policy: Any, dirs: list[Path], max_new_tokens: int, max_turns: int) -> list[str] | None:
    """The evaluated items whose own reference solution does not fit ``max_new_tokens`` x ``max_turns`` under
    ``policy``'s tokenizer (they confound every comparison: issue 24), warned about; ``None`` for a policy
    without a tokenizer (an endpoint, a script)."""
    if getattr(policy, "tokenizer", None) is None:
        return None
    items = sorted({n.task for n in find_unwinnable(dirs, policy.tokenizer, max_turn_tokens=max_new_tokens,
                                                     max_turns=max_turns)})  # fmt: skip
    if items:
        _say(f"WARNING: {len(items)} items cannot be passed under {max_new_tokens} tokens x {max_turns} turns even "
             f"by their reference solution: {items[:5]}...")  # fmt: skip
    return items


def _without_only(argv: list[str]) -> list[str]:
    """``argv`` without its ``--only NAME`` / ``--only=NAME`` options (:func:`reterm.workers.without_options`)."""
    return workers_mod.without_options(argv, "--only")


def run_workers(argv: list[str], names: list[str], workers: int) -> dict[str, int]:
    """Evaluate ``names`` in separate processes, at most ``workers`` at a time, in order
    (:func:`reterm.workers.run_workers`): each runs this command line (``argv``) with ``--only NAME --workers 1
    --keep-states`` and ``cpus / workers`` threads (unless ``OMP_NUM_THREADS`` is set), so it writes
    ``DIR/NAME/metrics.json`` and nothing shared.

    A process leaves cores idle while it waits for the sandboxes between turns; on 2 cores two workers ran the same
    evaluation 1.22x faster than one process (``bench/eval_workers.py``: 96 attempts, 204 s against 249 s), with
    a model in memory per worker. The two-stage failure states must exist already (``main`` builds them
    first): the workers only read ``states.json``.

    Returns:
        ``{name: exit code}`` of every worker that ended with a non-zero code (empty: all succeeded).
    """
    base = ["-m", "reterm.eval.drills", *_without_only(argv), "--workers", "1", "--keep-states"]
    return workers_mod.run_workers([(name, [*base, "--only", name]) for name in names], workers,
                                   say=_say, what="models")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    apply_thread_policy()  # before a policy loads torch (reterm.generation)
    argv = list(sys.argv[1:] if argv is None else argv)
    a = build_parser().parse_args(argv)
    if a.only:
        workers_mod.follow_parent()
    models: dict[str, str] = {}
    for m in a.model:
        name, sep, spec = m.partition("=")
        if not sep or not name or not spec:
            print(f"eval.drills: --model {m!r}: expected NAME=SPEC", file=sys.stderr)
            return 2
        models[name] = spec
    pairs: list[tuple[str, str]] = []
    for pair in a.pair:
        model, sep, base = pair.partition(":")
        if not sep or model not in models or base not in models:
            print(f"eval.drills: --pair {pair!r}: expected MODEL:BASE, two of the --model names {list(models)}",
                  file=sys.stderr)  # fmt: skip
            return 2
        pairs.append((model, base))
    for name, spec in models.items():  # a checkpoint that is not there fails now, not hours into the run
        ref = spec[3:].strip() if spec.startswith("hf:") else spec
        if is_local_path(ref) and not Path(ref).expanduser().is_dir():
            print(f"eval.drills: --model {name}={spec}: no checkpoint folder {ref}", file=sys.stderr)
            return 2
    unknown = [n for n in a.only if n not in models]
    if unknown or a.workers < 1:
        what = f"--only {unknown[0]!r}: not one of the --model names {list(models)}" if unknown else \
            f"--workers {a.workers}: expected 1 or more"
        print(f"eval.drills: {what}", file=sys.stderr)
        return 2
    try:
        splits = read_splits(a.tasks)
    except (FileNotFoundError, ValueError) as exc:
        print(f"eval.drills: {exc}", file=sys.stderr)
        return 2
    id_dirs = spread([a.tasks / n for n in splits.get("test", [])], a.max_id)
    ood_dirs = spread([a.tasks / n for n in splits.get("test_ood", [])], a.max_ood)
    try:
        a.output.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        print(f"eval.drills: --output {a.output}: cannot make the folder ({exc.strerror})", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    _say(f"{len(id_dirs)} in-distribution and {len(ood_dirs)} out-of-distribution instances, models {list(models)}")

    todo = [n for n in models if (not a.only or n in a.only) and not (a.output / n / "metrics.json").exists()]
    parallel = a.workers > 1 and len(todo) > 1
    state_model = a.states_from if a.states_from in models else next(iter(models))
    ms_dir = a.output / "multistage"
    if a.chain_stages < 2:
        print(f"eval.drills: --chain-stages {a.chain_stages}: expected 2 or more", file=sys.stderr)
        return 2
    chain = a.chain_stages > 2
    ms_turns = (a.chain_max_turns or turn_budget(a.chain_stages)) if chain else a.max_turns
    if chain and ms_turns < turn_budget(a.chain_stages):
        _say(f"note: --chain-max-turns {ms_turns} is below the {turn_budget(a.chain_stages)} turns a chain of "
             f"{a.chain_stages} stages gets (reterm.drills.multistage.turn_budget): some references do not fit")
    ms_families = multistage_families(a.tasks)
    if len(ms_families) < a.chain_stages:
        print(f"eval.drills: --chain-stages {a.chain_stages}: {a.tasks} has {len(ms_families)} in-distribution stage "
              f"families {list(ms_families)}; a chain needs one per stage", file=sys.stderr)  # fmt: skip
        return 2
    ms_kw = dict(families=ms_families, batch=a.batch, max_turns=ms_turns, stages=a.chain_stages,
                 journal_tag=f"{models[state_model]}|{a.max_new_tokens}",
                 max_consecutive_parse_errors=MAX_CONSECUTIVE_PARSE_ERRORS)  # fmt: skip
    need_ms = a.multistage_states > 0 and bool(todo)
    ms_data = load_multistage_states(ms_dir, state_model, a.multistage_states, a.chain_stages,
                                     ms_turns) if need_ms else None  # fmt: skip
    if need_ms and ms_data is None and a.only and os.environ.get(workers_mod.PARENT_ENV):
        print(f"eval.drills: --only {a.only}: no usable two-stage failure states of {state_model} in {ms_dir} (the "
              "evaluation that started this worker builds them first)", file=sys.stderr)  # fmt: skip
        return 2
    if need_ms and ms_data is None:
        if state_model in todo and not parallel:  # it builds the states at its turn, first
            todo.sort(key=lambda n: n != state_model)
        else:
            _say(f"{'two-stage' if not chain else f'{a.chain_stages}-stage chain'} failure states from {state_model} = "
                 f"{models[state_model]}")
            policy = load_policy(models[state_model], **policy_defaults(models[state_model],
                                                                          max_new_tokens=a.max_new_tokens), seed=0)
            ms_data = asyncio.run(build_multistage_states(policy, state_model, ms_dir, a.multistage_states,
                                                          **ms_kw))  # fmt: skip
            del policy
            gc.collect()
    state_dirs = spread(id_dirs, a.max_states) + spread(ood_dirs, a.max_states)
    injected = asyncio.run(_injected_states(state_dirs, a.batch)) if todo and state_dirs and not parallel else \
        ([], [], [])  # workers make their own (the same ones: the injected mistakes are scripted)
    if parallel:
        failed = run_workers(argv, todo, a.workers)
        if failed:
            print(f"eval.drills: the evaluation of {sorted(failed)} failed (exit codes {failed}); a re-run resumes "
                  "it", file=sys.stderr)  # fmt: skip
            return 1
    try:
        for name in [] if parallel else todo:  # in parallel the workers evaluated them
            _say(f"model {name} = {models[name]}")
            policy = load_policy(models[name], **policy_defaults(models[name], max_new_tokens=a.max_new_tokens), seed=0)
            unwinnable = _unwinnable_items(policy, [*id_dirs, *ood_dirs], a.max_new_tokens, a.max_turns)
            if need_ms and ms_data is None:  # name is the state model
                ms_data = asyncio.run(build_multistage_states(policy, state_model, ms_dir, a.multistage_states,
                                                              **ms_kw))  # fmt: skip
            m = asyncio.run(evaluate_model(name, policy, id_dirs, ood_dirs, injected, a.output,
                                           max_turns=a.max_turns, batch=a.batch, own_items=a.own_items,
                                           k_max=a.k_max, journal_tag=f"{models[name]}|{a.max_turns}|{a.max_new_tokens}",
                                           multistage=multistage_items(ms_data, ms_dir) if ms_data else None,
                                           multistage_turns=ms_turns,
                                           multistage_start=multistage_start_dirs(ms_data, ms_dir)
                                           if ms_data and chain else None,
                                           multistage_start_known=ms_data.get("start_passed")
                                           if ms_data and name == state_model else None,
                                           unwinnable=unwinnable))  # fmt: skip
            _say(f"{name}: Pass@1 ID {_fmt(m['pass_at_1']['drills_id'])}, Recovery@1 ID "
                 f"{_fmt(m['recovery_at_1']['drills_id'])}, {m['wall_s']:.0f}s")  # fmt: skip
            del policy
            gc.collect()
    finally:
        release(injected[0])
    if not a.keep_states and all((a.output / n / "metrics.json").exists() for n in models):
        release_multistage(ms_dir)  # every model recovered from them: their snapshots go
    if a.only:  # a part of an evaluation (a --workers process): the whole one writes the results
        _say(f"{a.only} done; results.json is written by a run without --only")
        return 0
    ms_file = ms_dir / "states.json"
    ms_info = None
    if a.multistage_states > 0 and ms_file.is_file():
        ms_info = {k: v for k, v in json.loads(ms_file.read_text()).items() if k not in ("items", "released")}
    metrics = {n: json.loads((a.output / n / "metrics.json").read_text()) for n in models}
    n_injected = {n: m["injected_states"]["n"] for n, m in metrics.items() if "injected_states" in m}
    if len(set(n_injected.values())) > 1:  # an infrastructure fault lost an item in one model's run
        _say(f"WARNING: the models were evaluated on different numbers of injected states {n_injected}; the paired "
             "differences use the items both scored")  # fmt: skip
    unwinnable = next((m["unwinnable_items"] for m in metrics.values() if m.get("unwinnable_items") is not None), None)
    results = {"models": metrics,
               "differences": compare(a.output, list(models), pairs),
               "items": {"drills_id": len(id_dirs), "drills_ood": len(ood_dirs),
                         "injected_states": max(n_injected.values(), default=None)},
               "multistage_states": ms_info,
               "settings": {"max_turns": a.max_turns, "max_new_tokens": a.max_new_tokens, "decoding": "greedy",
                            "unwinnable_items": unwinnable,
                            "own_items": a.own_items, "k_max": a.k_max,
                            "multistage_states": a.multistage_states, "states_from": state_model,
                            "chain_stages": a.chain_stages, "multistage_max_turns": ms_turns,
                            "workers": min(a.workers, max(1, len(todo)))},
               "wall_s": round(time.monotonic() - t0, 1)}  # fmt: skip
    write_json_atomic(a.output / "results.json", results)
    (a.output / "report.md").write_text(report(results))
    plot(results, a.output / "rates.png")
    _say(f"done in {time.monotonic() - t0:.0f}s: {a.output / 'report.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
