"""``python -m eval.mechanism --model SPEC --output DIR``: the ReTerm-GRPO mechanism measured without training.

The paper's claim is that groups forked from the agent's *own* failure states carry more learning signal than
groups that start over. A GRPO group has a gradient only when its rewards differ (equal rewards give zero
advantages), so the quantity is ``signal_attempt_share``: the share of attempts that sit in groups whose
rewards are not all equal. This experiment measures it for one fixed policy on the same tasks in two arms:

- **task_start** (standard GRPO's groups): G attempts from each task's start;
- **failure_state** (ReTerm-GRPO's groups): the failed attempt among those G that got furthest
  (:func:`reterm.recovery.attempts.most_progress`: fewest failed verifier checks, then more commands that
  exited 0, fewer parse errors, the earliest) is the policy's own failure state (the release's protocol: its
  files snapshotted when the attempt ended, before the verifier, then the feedback message;
  :mod:`reterm.recovery.attempts`), and G recovery attempts start from forks of it. Forking where the agent
  got furthest is the ReTerm recipe, and it raises the failure_state arm's pass rate by design (the first
  failed attempt, the earlier choice, was often a degenerate one, e.g. submitted at once or parse errors
  only, while another failed attempt of the group had cleared part 1 of the task). The task_start arm is
  unchanged.

Same policy, G, caps, sampling and tasks in both arms, so the difference is paired by task; the choice of the
failure state uses only the task's own start group (its attempts' verifier output and steps, never the
recovery attempts), so it cannot favour the failure_state arm with information the task_start arm lacks. A
task whose G start attempts all passed has no failure state: it counts in the task-start arm (a zero-signal
group) and is left out of the paired difference (reported as ``no_failure_state``); choosing the failure
state from the start group makes the start groups of paired tasks hold at least one failure, which can only
raise the task-start arm's share (the comparison is conservative for ReTerm). Infrastructure faults are
counted apart and leave the groups (a group needs two scored attempts). Each ``groups.jsonl`` row's
``failure_state`` records the chosen attempt (``from_attempt``, its index in the start group) and its
``failed_checks`` (``None``: no verifier output).

Tasks are multi-stage drills (:mod:`reterm.drills.multistage`): two chained hurdles (``--stages 2``) or a chain
of three or four (``--chain-stages 3``), so a failed attempt can keep real progress. A chain's verifier reports
its stages done (:func:`reterm.drills.multistage.stages_done`): there the failure state is the failed attempt with
the most stages done (ties, and drills without the report: :func:`most_progress`), each row records the stages
done of every start attempt and of the chosen one, and ``by_stages_done`` gives both arms' pass rate and share
by the failure state's stages done (paired by task). A ``--max-turns`` below the chain's
:func:`reterm.drills.multistage.turn_budget` is run as asked, with a note (a CI run keeps its turns small). Power: with ``psi`` the share of paired tasks on which the two arms disagree (one group
has signal, the other not), a paired difference ``delta`` is detected with 80% power at 95% (two-sided) with
about ``n = 7.85 (psi - delta^2) / delta^2`` tasks (the normal approximation of McNemar's test); the smallest
detectable difference at ``n`` is ``sqrt(7.85 psi / (n + 7.85))``, reported next to the difference. Before it
runs, the command prints the calculation for the assumed ``psi`` and ``delta`` (``--assumed-discordance``,
``--planned-delta``) and the tasks it will run; ``mechanism.json`` keeps it (``power_plan``).

Outputs in ``DIR``: ``tasks/`` (the drills), ``groups.jsonl`` (one line per task, appended as chunks finish:
a rerun runs the chunks it lacks and never counts a task twice), ``attempts.jsonl`` (every
attempt's trajectory), ``mechanism.json``, ``report.md`` and ``signal.png``.

``--workers N`` runs the chunks in N processes of cpus/N threads (:mod:`reterm.workers`): each takes the next
chunk no other has claimed (``DIR/claims``) and appends to the same journals; this process then summarizes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from reterm import workers as workers_mod
from reterm.data.drills import read_splits
from reterm.drills.multistage import DEFAULT_STAGE_FAMILIES, MultiStageInstance, generate_multistage, turn_budget
from reterm.eval.drills import spread
from reterm.eval.failure_choice import attempt_stages_done as _done
from reterm.eval.failure_choice import chain_most_progress
from reterm.generation import apply_thread_policy
from reterm.policies import load_policy
from reterm.recovery.attempts import attempt_end_state, failed_checks, release, run_attempts
from reterm.stats import group_signal, items_needed, min_detectable, paired_bootstrap, rate
from reterm.stats import signal_attempt_share as share_with_interval
from reterm.trajectory import Outcome, write_json_atomic

ARMS = ("task_start", "failure_state")


def _say(msg: str) -> None:
    print(f"[mechanism] {msg}", flush=True)


def power_plan(n_tasks: int, psi: float, delta: float) -> dict[str, Any]:
    """The calculation stated before a run: paired tasks needed for 80% power at 95% (two-sided) to detect
    ``delta`` at discordance ``psi`` (``n = 7.85 (psi - delta^2) / delta^2``), the tasks planned, and the smallest
    difference detectable at that many (``sqrt(7.85 psi / (n + 7.85))``; tasks without a failure state drop out of
    the pairs, so the real n can be lower)."""
    return {"psi_assumed": psi, "delta": delta, "n_needed": items_needed(psi, delta), "n_planned": n_tasks,
            "min_detectable_at_planned": min_detectable(psi, n_tasks)}  # fmt: skip


def _paired_signal(rows: list[dict[str, Any]]) -> tuple[list[float], list[float]]:
    """Per task, whether its group from the task start and its group from the failure state had signal (1.0/0.0),
    over the tasks whose two groups each scored at least 2 attempts: the pairs :func:`paired_bootstrap` compares."""
    a, b = [], []
    for r in rows:
        ka, sa = group_signal(r["task_start"]["rewards"])
        kb, sb = group_signal(r["failure_state"]["rewards"])
        if ka >= 2 and kb >= 2:
            a.append(float(sa))
            b.append(float(sb))
    return a, b


def summarize(rows: list[dict[str, Any]], *, planned_delta: float = 0.2) -> dict[str, Any]:
    """The experiment's metrics from its ``groups.jsonl`` rows (see the module docstring).

    Each row: ``{"task", "family", "category", "task_start": {"rewards": [...]}, "failure_state":
    {"rewards": [...], "category", "state_id", "from_attempt", "failed_checks"} | None}`` (rewards ``None`` for
    infrastructure faults).
    """
    out: dict[str, Any] = {"n_tasks": len(rows)}
    start_groups = [r["task_start"]["rewards"] for r in rows]
    fail_rows = [r for r in rows if r.get("failure_state")]
    out["signal_attempt_share"] = {
        "task_start": share_with_interval(start_groups),
        "failure_state": share_with_interval([r["failure_state"]["rewards"] for r in fail_rows]),
    }
    out["pass_rate"] = {
        "task_start": rate([x for g in start_groups for x in g if x is not None]),
        "failure_state": rate([x for r in fail_rows for x in r["failure_state"]["rewards"] if x is not None]),
    }
    out["no_failure_state"] = len(rows) - len(fail_rows)
    out["infra_faults"] = sum(x is None for r in rows for x in r["task_start"]["rewards"]) + sum(
        x is None for r in fail_rows for x in r["failure_state"]["rewards"])
    # paired over tasks whose both groups were scored
    a, b = _paired_signal(fail_rows)
    diff = paired_bootstrap(a, b)
    psi = (sum(x != y for x, y in zip(a, b)) / len(a)) if a else 0.0
    diff.update(discordance=round(psi, 4), min_detectable_80=min_detectable(psi, len(a)),
                items_for_planned_delta={"delta": planned_delta, "n": items_needed(max(psi, 0.4), planned_delta),
                                         "psi_assumed": max(psi, 0.4)})  # fmt: skip
    out["difference"] = {"failure_state - task_start": diff}
    by_cat: dict[str, dict[str, list]] = defaultdict(lambda: {"task_start": [], "failure_state": []})
    for r in fail_rows:
        cat = r["failure_state"].get("category") or "unknown"
        by_cat[cat]["task_start"].append(r["task_start"]["rewards"])
        by_cat[cat]["failure_state"].append(r["failure_state"]["rewards"])
    out["by_category"] = {c: {arm: share_with_interval(v[arm]) for arm in ARMS} for c, v in sorted(by_cat.items())}
    by_done: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in fail_rows:
        if r["failure_state"].get("stages_done") is not None:
            by_done[str(r["failure_state"]["stages_done"])].append(r)
    out["by_stages_done"] = {}
    for j, rs in sorted(by_done.items(), key=lambda kv: int(kv[0])):
        pa, pb = _paired_signal(rs)
        out["by_stages_done"][j] = {
            "tasks": len(rs),
            "pass_rate": {arm: rate([x for r in rs for x in r[arm]["rewards"] if x is not None]) for arm in ARMS},
            "signal_attempt_share": {arm: share_with_interval([r[arm]["rewards"] for r in rs]) for arm in ARMS},
            "difference": paired_bootstrap(pa, pb),
        }
    return out


def _rewards(attempts: list[Any]) -> list[float | None]:
    return [None if a.trajectory.outcome not in (Outcome.SUCCESS, Outcome.FAILURE) else float(a.trajectory.passed)
            for a in attempts]  # fmt: skip


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The finished rows of ``groups.jsonl``, one per task (the first; a line torn by a kill is skipped:
    :func:`reterm.workers.read_lines`)."""
    rows, seen = [], set()
    for r in workers_mod.read_lines(path)[0]:
        if isinstance(r, dict) and r.get("task") not in seen:
            seen.add(r.get("task"))
            rows.append(r)
    return rows


async def run_chunk(policy: Any, tasks: list[Any], group_size: int, *, context_steps: int | None = None,
                    **kw: Any) -> tuple[list[dict], list[str]]:  # fmt: skip
    """Both arms on a few tasks: G start attempts each, then G recovery attempts from each task's failed start
    attempt with the most progress (:func:`most_progress`), that attempt's last ``context_steps`` steps in their
    context (``None``: all; :func:`reterm.recovery.attempts.attempt_end_state`). Returns ``(groups.jsonl rows,
    attempts.jsonl lines)``."""

    g = group_size
    dirs = [t.path for t in tasks for _ in range(g)]
    starts = await run_attempts(policy, dirs, keep_failed_snapshots=True, **kw)
    rows, lines, states, snaps, owners = [], [], [], [], []
    for i, t in enumerate(tasks):
        group = starts[i * g : (i + 1) * g]
        row = {"task": t.name, "family": t.family, "category": t.category,
               "task_start": {"rewards": _rewards(group)}, "failure_state": None}  # fmt: skip
        row["task_start"]["stages_done"] = [_done(a) for a in group]
        failed = chain_most_progress(group)
        release([a for a in group if a is not failed])
        if failed is not None:
            st = attempt_end_state(failed, context_steps=context_steps)
            row["failure_state"] = {"state_id": st.id, "category": st.category,
                                    "from_attempt": [a is failed for a in group].index(True),
                                    "failed_checks": failed_checks(failed), "stages_done": _done(failed),
                                    "context_steps": context_steps}  # fmt: skip
            states.append(st)
            snaps.append(failed)
            owners.append(i)
        rows.append(row)
        lines += [json.dumps({"task": t.name, "arm": "task_start", **a.trajectory.model_dump(mode="json")})
                  for a in group]  # fmt: skip
    _say(f"  {len(tasks)} tasks: {len(starts)} start attempts done, {len(states)} failure states; recovering")
    try:
        if states:
            rec_dirs = [tasks[i].path for i in owners for _ in range(g)]
            recs = await run_attempts(policy, rec_dirs, states=[s for s in states for _ in range(g)],
                                      snapshots=[a.snapshot for a in snaps for _ in range(g)], **kw)  # fmt: skip
            for j, i in enumerate(owners):
                group = recs[j * g : (j + 1) * g]
                rows[i]["failure_state"]["rewards"] = _rewards(group)
                lines += [json.dumps({"task": tasks[i].name, "arm": "failure_state", "state_id": states[j].id,
                                      **a.trajectory.model_dump(mode="json")}) for a in group]  # fmt: skip
            release(recs)
    finally:
        release(snaps)
    return rows, lines


def single_stage_tasks(drills: Path, split: str, n: int) -> list[Any]:
    """``n`` instances of a drills folder's ``split``, evenly spread over its families (the single-hurdle control).

    Raises:
        FileNotFoundError / ValueError: no ``splits.json``, or the split is empty (named).
    """
    import tomllib

    # the folder's multi-stage train instances (``multi-10000``, ...) are not single-stage
    names = [n for n in read_splits(drills).get(split) or [] if not n.startswith(("multi-", "chain"))]
    if not names:
        raise ValueError(f"{drills}/splits.json: split {split!r} has no single-stage instance")
    out = []
    for name in spread(sorted(names), n):
        meta = tomllib.loads((drills / name / "task.toml").read_text()).get("metadata") or {}
        out.append(MultiStageInstance(name, str(meta.get("family", "")), str((meta.get("error_categories") or
                                                                              ["other"])[0]), drills / name))  # fmt: skip
    return out


def report(m: dict[str, Any]) -> str:
    """``report.md``: the two arms' shares, the paired difference with its power, per category."""
    def fmt(r: dict[str, Any] | None) -> str:
        if not r or r.get("value") is None:
            return "-"
        return f"{r['value']:.3f} [{r['ci95'][0]:.3f}, {r['ci95'][1]:.3f}] (n={r['n']})"

    s, p = m["signal_attempt_share"], m["pass_rate"]
    d = m["difference"]["failure_state - task_start"]
    lines = ["# ReTerm-GRPO mechanism: learning signal from failure states vs task starts", "",
             f"Policy `{m['settings']['model']}`, {m['n_tasks']} tasks ({m['settings'].get('tasks')}), "
             f"G = {m['settings']['group_size']}, "
             f"temperature {m['settings']['temperature']}, {m['settings']['max_turns']} turns x "
             f"{m['settings']['max_new_tokens']} tokens"
             + ("" if m["settings"].get("context_steps") is None else
                f"; recoveries see only the failed attempt's last {m['settings']['context_steps']} steps (an ablation)")
             + ". Rates: value [95% interval] (n attempts).", "",
             "| arm | signal_attempt_share | groups with signal | pass rate |", "|---|---|---|---|"]  # fmt: skip
    for arm in ARMS:
        lines.append(f"| {arm} | {fmt(s[arm])} | {s[arm]['signal_groups']}/{s[arm]['groups']} | {fmt(p[arm])} |")
    verdict = ("the interval excludes 0" if d.get("excludes_zero") else "the interval includes 0: no difference shown")
    lines += ["", f"Paired difference (failure_state - task_start, group has signal, over {d['n']} tasks): "
              + ("-" if d["diff"] is None else f"{d['diff']:+.3f} [{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}]")
              + f"; {verdict}. Discordant tasks {d['discordance']}; smallest difference detectable with 80% power "
              f"at this n: {d['min_detectable_80']}.", "",
              f"Tasks without a failure state (every start attempt passed): {m['no_failure_state']}; "
              f"infrastructure faults: {m['infra_faults']}.", "", "## By the failure state's category", "",
              "| category | task_start | failure_state |", "|---|---|---|"]  # fmt: skip
    for c, v in m["by_category"].items():
        lines.append(f"| {c} | {fmt(v['task_start'])} | {fmt(v['failure_state'])} |")
    if m.get("by_stages_done"):
        lines += ["", "## By the failure state's stages done", "",
                  "| stages done | tasks | pass rate task_start | pass rate failure_state | share task_start | "
                  "share failure_state | paired difference in share |", "|---|---|---|---|---|---|---|"]  # fmt: skip
        for j, v in m["by_stages_done"].items():
            d = v["difference"]
            diff = "-" if d["diff"] is None else f"{d['diff']:+.3f} [{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}] (n={d['n']})"
            lines.append(f"| {j} | {v['tasks']} | {fmt(v['pass_rate']['task_start'])} | "
                         f"{fmt(v['pass_rate']['failure_state'])} | {fmt(v['signal_attempt_share']['task_start'])} | "
                         f"{fmt(v['signal_attempt_share']['failure_state'])} | {diff} |")  # fmt: skip
    if m.get("power_plan"):
        pp = m["power_plan"]
        lines += ["", f"Planned before the run: assumed discordance {pp['psi_assumed']}, difference {pp['delta']}: "
                  f"n = 7.85 (psi - delta^2) / delta^2 = {pp['n_needed']} paired tasks for 80% power at 95% "
                  f"(two-sided); planned {pp['n_planned']} (smallest detectable there: "
                  f"{pp['min_detectable_at_planned']})."]  # fmt: skip
    return "\n".join(lines) + "\n"


def plot(m: dict[str, Any], path: Path) -> Path | None:
    """``signal.png``: each arm's share with its interval."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    s = m["signal_attempt_share"]
    vals = [s[a]["value"] or 0.0 for a in ARMS]
    errs = [[v - (s[a]["ci95"] or [v, v])[0] for a, v in zip(ARMS, vals)],
            [(s[a]["ci95"] or [v, v])[1] - v for a, v in zip(ARMS, vals)]]  # fmt: skip
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.bar(["from task start\n(standard GRPO)", "from own failure state\n(ReTerm-GRPO)"], vals, yerr=errs, capsize=6,
           color=["#999999", "#2b7bba"])  # fmt: skip
    ax.set_ylabel("signal_attempt_share")
    ax.set_ylim(0, 1)
    ax.set_title(f"Attempts in groups with reward variance (n={m['n_tasks']} tasks)", fontsize=9)
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    os.replace(tmp, path)
    return path


def build_parser() -> argparse.ArgumentParser:
    """The command line's parser (``python -m eval.mechanism --help``)."""
    # no abbreviations: the --workers processes get this command line with --workers replaced
    p = argparse.ArgumentParser(prog="python -m eval.mechanism", description=__doc__.split("\n\n")[0],
                                allow_abbrev=False)  # fmt: skip
    p.add_argument("--model", required=True, help="policy spec: hf:PATH, smollm2, ...")
    p.add_argument("--output", required=True, type=Path)
    p.add_argument("--tasks", type=int, default=48, help="multi-stage drills (paired items)")
    p.add_argument("--stages", "--chain-stages", dest="stages", type=int, default=2,
                   help="stages of each drill: 2 (two-stage drills) or a chain of 3 or 4")
    p.add_argument("--assumed-discordance", type=float, default=0.4,
                   help="psi of the power calculation printed before the run (share of tasks whose arms disagree)")
    p.add_argument("--planned-delta", type=float, default=0.2,
                   help="difference in signal share the power calculation is for")
    p.add_argument("--group-size", type=int, default=4, help="G attempts per group in each arm")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--temperature", type=float, default=0.7,
                   help="sampling temperature (default 0.7, the CPU GRPO recipes' and run_all's: at 0.9 the SFT "
                        "start wrote tool-schema debris on two-part tasks, at 0.7 729 of 732 turns were valid tool calls)")
    p.add_argument("--max-turns", type=int, default=8, help="turns an attempt gets (at least the chain's "
                   "reterm.drills.multistage.turn_budget: 8 for 2 stages, 11 for 3, 14 for 4)")
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--context-steps", type=int, default=None, metavar="K",
                   help="a recovery attempt sees only the failed attempt's last K steps (default: the whole attempt, "
                        "the release's protocol)")
    p.add_argument("--batch", type=int, default=32, help="attempts generated together (a multiple of G is best)")
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="processes that run the chunks of tasks side by side, each with cpus/N threads, taking the "
                        "chunks one at a time (reterm.workers; default: RETERM_GEN_WORKERS, else 1). On 2 cores two "
                        "single-thread processes generate 1.33-1.35x the rows a second of one two-thread process "
                        "(bench/decode.py), with a model in memory each. Each chunk samples with its own seed "
                        "(reterm.workers.reseed), whichever process runs it")
    p.add_argument("--worker", default=None, metavar="I/N",
                   help="be worker I of N: run the chunks no other worker has claimed and write no summary (what "
                        "each --workers process runs)")
    p.add_argument("--families", default=None, help="comma-separated stage families (default: all in-distribution)")
    p.add_argument("--drills", type=Path, default=None,
                   help="use this drills folder's single-stage instances (--split) instead of multi-stage drills")
    p.add_argument("--split", default="train", help="with --drills: the split whose instances are used")
    return p


def _chunks(tasks: list[Any], done: set[str], per_chunk: int) -> list[tuple[int, list[Any]]]:
    """``(first index, tasks not done)`` of each chunk of ``per_chunk`` tasks cut from the whole list (so every
    worker cuts the same ones), leaving out the chunks with nothing left to do."""
    chunks = [(k, [t for t in tasks[k : k + per_chunk] if t.name not in done]) for k in range(0, len(tasks), per_chunk)]
    return [(k, c) for k, c in chunks if c]


def run_chunks(a: argparse.Namespace, tasks: list[Any], max_turns: int, *, worker: tuple[int, int] | None = None,
               policy: Any = None, t0: float | None = None) -> int:  # fmt: skip
    """Run the tasks that ``groups.jsonl`` does not hold yet, in chunks of ``--batch / G`` tasks (:func:`_chunks`),
    appending each chunk's attempts, then its rows, under a lock (:func:`reterm.workers.append_lines`; a kill
    between the two leaves that chunk's attempts logged twice after the re-run, its rows once). Each chunk samples
    with torch seeded from ``--seed`` and its first index (:func:`reterm.workers.reseed`). As worker ``(I, N)`` of a
    ``--workers`` run: only the chunks it claims (:class:`reterm.workers.Claims` in ``DIR/claims``). Returns 0."""
    t0 = time.monotonic() if t0 is None else t0
    journal = a.output / "groups.jsonl"
    chunks = _chunks(tasks, {r["task"] for r in read_rows(journal)}, max(1, a.batch // a.group_size))
    claims = workers_mod.Claims(a.output / "claims") if worker else None
    tag = f"worker {worker[0]}/{worker[1]}: " if worker else ""
    for k, chunk in chunks:
        if claims is not None and not claims.take(f"chunk-{k}"):
            continue
        if policy is None:
            policy = load_policy(a.model, temperature=a.temperature, max_new_tokens=a.max_new_tokens, seed=a.seed)
        workers_mod.reseed(a.seed, k)
        rows, lines = asyncio.run(run_chunk(policy, chunk, a.group_size, context_steps=a.context_steps,
                                            max_turns=max_turns, max_consecutive_parse_errors=2))  # fmt: skip
        workers_mod.append_lines(a.output / "attempts.jsonl", lines)
        workers_mod.append_lines(journal, [json.dumps(r) for r in rows])
        _say(f"  {tag}{len(read_rows(journal))}/{len(tasks)} tasks done, {time.monotonic() - t0:.0f}s")
    return 0


def main(argv: list[str] | None = None, *, policy: Any = None) -> int:
    """The command line (see the module docstring); ``policy`` replaces ``--model``'s (tests)."""
    apply_thread_policy()  # before a policy loads torch (reterm.generation)
    argv = list(sys.argv[1:] if argv is None else argv)
    a = build_parser().parse_args(argv)
    if a.group_size < 2 or a.tasks < 1 or a.stages < 2 or (a.context_steps is not None and a.context_steps < 1):
        print("eval.mechanism: --group-size must be >= 2, --tasks >= 1, --stages >= 2, --context-steps >= 1",
              file=sys.stderr)  # fmt: skip
        return 2
    try:
        a.workers, worker = workers_mod.resolve_workers(a.workers, a.worker)
    except ValueError as exc:
        print(f"eval.mechanism: {exc}", file=sys.stderr)
        return 2

    families = tuple(a.families.split(",")) if a.families else DEFAULT_STAGE_FAMILIES
    try:
        if a.drills is not None:
            tasks = single_stage_tasks(a.drills, a.split, a.tasks)
        else:
            tasks = generate_multistage(a.output / "tasks", a.seed, a.tasks, families=families, stages=a.stages,
                                        write=worker is None)  # a worker reads the drills its parent wrote
    except (FileNotFoundError, KeyError, ValueError) as exc:
        print(f"eval.mechanism: {exc}", file=sys.stderr)
        return 2

    max_turns = a.max_turns
    if a.drills is None and max_turns < turn_budget(a.stages) and worker is None:
        _say(f"note: --max-turns {max_turns} is below the {turn_budget(a.stages)} turns a drill of {a.stages} stages "
             "gets (reterm.drills.multistage.turn_budget): some references do not fit")
    if not 0 < a.planned_delta < 1 or not 0 < a.assumed_discordance <= 1:
        print("eval.mechanism: --planned-delta must be in (0, 1), --assumed-discordance in (0, 1]", file=sys.stderr)
        return 2
    if worker is not None:
        return run_chunks(a, tasks, max_turns, worker=worker, policy=policy)
    plan = power_plan(len(tasks), a.assumed_discordance, a.planned_delta)
    _say(f"power: assumed discordance psi={plan['psi_assumed']}, difference delta={plan['delta']}: "
         f"n = 7.85*(psi - delta^2)/delta^2 = {plan['n_needed']} paired tasks for 80% power at 95% (two-sided); "
         f"running {plan['n_planned']} tasks (smallest detectable there: {plan['min_detectable_at_planned']})")
    t0 = time.monotonic()
    journal = a.output / "groups.jsonl"
    other = {(r.get("failure_state") or {}).get("context_steps", a.context_steps) for r in read_rows(journal)}
    if other - {a.context_steps}:
        print(f"eval.mechanism: {journal} holds rows made with --context-steps {sorted(other, key=str)}, not "
              f"{a.context_steps}: use another --output", file=sys.stderr)  # fmt: skip
        return 2
    done = {r["task"] for r in read_rows(journal)}
    todo = [t for t in tasks if t.name not in done]
    _say(f"{len(tasks)} tasks ({len(done)} done before), G={a.group_size}, model {a.model}")
    workers = min(a.workers, len(_chunks(tasks, done, max(1, a.batch // a.group_size)))) if policy is None else 1
    if workers > 1:
        failed = workers_mod.run_chunk_workers("reterm.eval.mechanism", argv, workers, a.output / "claims", say=_say)
        if failed:
            print(f"eval.mechanism: {sorted(failed)} failed (exit codes {failed}); a re-run runs the chunks "
                  "groups.jsonl lacks", file=sys.stderr)  # fmt: skip
            return 1
    elif todo:
        run_chunks(a, tasks, max_turns, policy=policy, t0=t0)
    order = {t.name: i for i, t in enumerate(tasks)}
    rows = sorted((r for r in read_rows(journal) if r["task"] in order), key=lambda r: order[r["task"]])
    missing = [t.name for t in tasks if t.name not in {r["task"] for r in rows}]
    if missing:  # a worker skipped a chunk it could not claim, or ended early
        print(f"eval.mechanism: {len(missing)} tasks have no row in {journal} after the run: {missing[:8]}; a "
              "re-run runs them", file=sys.stderr)  # fmt: skip
        return 1
    m = summarize(rows)  # in task order, so that the bootstrap's intervals do not depend on which chunk ended first
    m["settings"] = {"model": a.model, "group_size": a.group_size, "temperature": a.temperature,
                     "tasks": f"{a.drills.name}/{a.split} (single-stage)" if a.drills else
                     "multi-stage drills" if a.stages == 2 else f"chains of {a.stages} stages",
                     "max_turns": max_turns, "max_new_tokens": a.max_new_tokens, "stages": a.stages,
                     "seed": a.seed, "families": list(families), "context_steps": a.context_steps}  # fmt: skip
    m["power_plan"] = plan
    m["wall_s"] = round(time.monotonic() - t0, 1)
    m["workers"] = max(1, workers)  # processes that generated in this invocation
    write_json_atomic(a.output / "mechanism.json", m)
    (a.output / "report.md").write_text(report(m))
    plot(m, a.output / "signal.png")
    s = m["signal_attempt_share"]
    _say(f"signal_attempt_share: task_start {s['task_start']['value']}, failure_state {s['failure_state']['value']}; "
         f"{a.output / 'report.md'}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
