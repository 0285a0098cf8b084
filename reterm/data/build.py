"""``python -m pipeline.build --config pipeline/configs/smoke.yaml --output DIR`` (or ``reterm data build``).

Builds a ReTerm-10K-style recovery dataset in ``DIR``:

1. **rollout** (:mod:`reterm.data.rollout`): the policy on the train tasks, k attempts each, as a Harbor job;
2. **failures** (:mod:`reterm.data.failures`): the attempt-level failure state of each failed trial
   (infrastructure faults set apart; :func:`reterm.recovery.attempts.attempt_end_state`: the whole attempt, then
   the feedback message, as in the drills pipeline), its category from :mod:`reterm.recovery`'s localiser;
   **injection** (:mod:`reterm.data.inject`): more failure states from perturbed successful trajectories;
3. **recovery** (:mod:`reterm.data.recover`): the state rebuilt by
   :func:`reterm.recovery.materialize.materialize` (the attempt's commands typed again, then forks), N recovery
   attempts with the recovery policy (:mod:`reterm.data.teacher`) through the kit's harness; records are
   attempt-level (``target_attempt_index`` 2, trained from the first assistant turn after the feedback);
4. the verifier on each attempt (same stage): verified recoveries become candidate records, failed
   attempts are kept apart;
5. **filters** (:mod:`reterm.data.filters`, :mod:`reterm.data.replay_check`): quality (incl. a replay check in a fresh
   sandbox), exact/near duplicates, decontamination;
6. **write** (:mod:`reterm.data.write`, :mod:`reterm.data.build_report`): parquet shards in the Hub layout,
   ``stats.json``, ``failed_attempts/``, ``report.md`` + ``plots/*.png``, ``run_config.yaml``,
   ``versions.json``.

Every stage journals what it finished (:mod:`reterm.data.state`): ``kill -9`` at any point and the same
command resumes without losing or duplicating records.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from tqdm import tqdm

from reterm.data import inject
from reterm.data.build_report import markdown, plots
from reterm.data.config import ConfigError, PipelineConfig, load_config, resolve_path
from reterm.data.failures import mine_states
from reterm.data.filters import Decontaminator, EvalTask, apply_filters, eval_task_from_folder
from reterm.data.recover import WorkItem, read_state, recover_all
from reterm.data.replay_check import replay_record
from reterm.data.rollout import RolloutFault
from reterm.data.state import ConfigMismatchError, Journal
from reterm.data.tasks import TaskInfo, benchmark_tasks, check_tasks, eval_tasks, select_tasks
from reterm.data.teacher import OracleGuidedTeacher, load_recovery_policy
from reterm.io import write_text_atomic
from reterm.recovery.state import Source
from reterm.trajectory import Outcome, Trajectory

logger = logging.getLogger("pipeline")


class BuildError(RuntimeError):
    """The build ran but produced nothing usable (the message says why and where to look)."""


@dataclass
class BuildResult:
    """What a build produced: the output folder, the kept records and the report's numbers."""

    output: Path
    records: list[dict[str, Any]] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)


def _say(msg: str) -> None:
    print(f"[pipeline] {msg}", flush=True)


class _Stage:
    """Times a stage and records it in the journal when it finishes."""

    def __init__(self, journal: Journal, name: str) -> None:
        self.journal, self.name, self.t0 = journal, name, time.monotonic()

    def finish(self, summary: dict[str, Any]) -> dict[str, Any]:
        summary = {**summary, "wall_s": round(time.monotonic() - self.t0, 1)}
        self.journal.finish(self.name, summary)
        return summary


# ----------------------------------------------------------------------------------- stages
def stage_rollout(cfg: PipelineConfig, journal: Journal, tasks: list[TaskInfo]) -> Any:
    from reterm.data.rollout import JOB_NAME, check_rollouts, load_rollouts, run_rollouts

    allowed = {t.id for t in tasks}
    job_dir = journal.root / "jobs" / JOB_NAME
    if not journal.done("rollout"):
        st = _Stage(journal, "rollout")
        _say(f"stage 1/6 rollout: {cfg.rollout.policy} on {len(tasks)} tasks x {cfg.rollout.attempts} attempts "
             f"(Harbor job, concurrency {cfg.rollout.concurrency}, environment {cfg.rollout.environment.type})")
        run_rollouts(cfg, tasks, journal.root / "jobs")
        rollouts = load_rollouts(job_dir, allowed)
        check_rollouts(job_dir, rollouts)
        st.finish(rollouts.summary())
    return load_rollouts(job_dir, allowed)


def stage_failures(cfg: PipelineConfig, journal: Journal, rollouts: Any, tasks: list[TaskInfo]) -> list[Any]:
    if not journal.done("failures"):
        st = _Stage(journal, "failures")
        _say(f"stage 2/6 failures: the attempt-level failure states of {len(rollouts.failed)} failed trials")
        mined = mine_states(rollouts.failed, cfg.failures, {t.id: t.path for t in tasks})
        by_traj = {t.metadata["rollout_id"]: t for t in rollouts.failed}
        items = []
        for s in mined.states:
            traj = by_traj[s.localisation.origin_id]
            items.append(WorkItem(s, traj.instruction, "own",
                                  traj.policy or cfg.rollout.policy, cfg.rollout.command_timeout).to_json())  # fmt: skip
        journal.write_unit("failures", "states", {"items": items})
        st.finish(mined.summary())
    return [WorkItem.from_json(d) for d in journal.read_unit("failures", "states")["items"]]


async def _gather_limited(jobs: list[Any], limit: int) -> None:
    sem = asyncio.Semaphore(limit)

    async def one(job: Any) -> None:
        async with sem:
            await job()

    await asyncio.gather(*(one(j) for j in jobs))


def stage_injection(cfg: PipelineConfig, journal: Journal, tasks: list[TaskInfo], rollouts: Any) -> list[Any]:
    from reterm.data.rollout import with_id

    ic = cfg.injection
    if not ic.enabled:
        return []
    env = cfg.recovery_environment
    if not journal.done("injection"):
        st = _Stage(journal, "injection")
        _say(f"stage 2/6 injection: perturbing successful trajectories ({', '.join(ic.sources)}), "
             f"{ic.per_task} per task")
        # the reference solutions, run through the harness
        sources: dict[str, list[Trajectory]] = defaultdict(list)
        if "reference" in ic.sources:
            todo = [t for t in tasks if not journal.has_unit("reference", t.id)]
            bar = tqdm(total=len(tasks), initial=len(tasks) - len(todo), desc="reference runs", unit="task")

            def ref_job(task: TaskInfo) -> Any:
                async def run() -> None:
                    from reterm.tasks import solution_steps

                    try:
                        steps = solution_steps(task.path)
                    except (FileNotFoundError, ValueError) as exc:
                        journal.write_unit("reference", task.id, {"skipped": str(exc)})
                    else:
                        traj = await inject.run_commands(task.path, steps, env, ic.command_timeout, "oracle")
                        journal.write_unit("reference", task.id, {"trajectory": traj.model_dump(mode="json")})
                    bar.update(1)

                return run

            asyncio.run(_gather_limited([ref_job(t) for t in todo], cfg.sandbox_concurrency))
            bar.close()
            for t in tasks:
                unit = journal.read_unit("reference", t.id)
                if "trajectory" in unit:
                    traj = with_id(Trajectory.model_validate(unit["trajectory"]))
                    if traj.outcome is Outcome.SUCCESS:
                        sources[t.id].append(traj)
        if "rollouts" in ic.sources:
            for traj in rollouts.succeeded:
                sources[traj.task_id].append(traj)
        # the perturbations, spread over each task's sources
        plan: list[tuple[Trajectory, Any]] = []
        for t in tasks:
            per_source = [inject.choose(s, ic.kinds, ic.per_task, cfg.seed) for s in sources.get(t.id, [])]
            chosen = 0
            while chosen < ic.per_task and any(per_source):
                for src, ps in zip(sources[t.id], per_source):
                    if ps and chosen < ic.per_task:
                        plan.append((src, ps.pop(0)))
                        chosen += 1
        keys = [p.key(src.metadata["rollout_id"]) for src, p in plan]
        todo = [(k, src, p) for k, (src, p) in zip(keys, plan) if not journal.has_unit("injected", k)]
        bar = tqdm(total=len(plan), initial=len(plan) - len(todo), desc="injected runs", unit="run")
        task_dirs = {t.id: t.path for t in tasks}

        def inj_job(key: str, src: Trajectory, p: Any) -> Any:
            async def run() -> None:
                traj = await inject.run_commands(task_dirs[src.task_id], list(p.commands), env, ic.command_timeout,
                                                 "scripted", instruction=src.instruction)  # fmt: skip
                with_id(traj)
                fs, why = inject.injected_state(traj, p, task_dirs[src.task_id])
                state = fs.with_source(Source.INJECTED) if fs is not None else None
                origin = "the reference solution" if src.policy == "oracle" else f"a successful rollout of {src.policy}"
                journal.write_unit("injected", key, {
                    "perturbation": p.to_json(), "source_trajectory": src.metadata["rollout_id"],
                    "source_policy": src.policy, "origin": origin, "instruction": src.instruction,
                    "trajectory": traj.model_dump(mode="json"),
                    "state": state.to_json() if state is not None else None, "reason": why,
                    "infra": traj.outcome.is_infra_fault,
                })  # fmt: skip
                bar.update(1)

            return run

        asyncio.run(_gather_limited([inj_job(*x) for x in todo], cfg.sandbox_concurrency))
        bar.close()
        journal.write_unit("injection", "plan", {"keys": keys, "sources": sum(len(v) for v in sources.values())})
        kinds: dict[str, dict[str, Any]] = {}
        for k in keys:
            u = journal.read_unit("injected", k)
            kd = kinds.setdefault(u["perturbation"]["kind"], {"tried": 0, "kept": 0, "categories": Counter()})
            kd["tried"] += 1
            if u["state"]:
                kd["kept"] += 1
                kd["categories"][u["state"]["category"]] += 1
        infra = sum(1 for k in keys if journal.read_unit("injected", k).get("infra"))
        st.finish({"sources": sum(len(v) for v in sources.values()), "tried": len(keys),
                   "kept": sum(v["kept"] for v in kinds.values()), "infra_faults": infra,
                   "kinds": {k: {**v, "categories": dict(v["categories"])} for k, v in sorted(kinds.items())}})  # fmt: skip
    items = []
    for k in journal.read_unit("injection", "plan")["keys"]:
        u = journal.read_unit("injected", k)
        if u["state"]:
            state = read_state(u["state"], u["instruction"], "injected")
            items.append(WorkItem(state, u["instruction"], "injected", u["source_policy"], ic.command_timeout,
                                  f"{u['perturbation']['description']} (perturbed {u['origin']})"))  # fmt: skip
    return items


def choose_items(items: list[Any], max_states: int | None) -> list[Any]:
    """Unique failure states (by id; the policy's own before injected ones), at most ``max_states``,
    taken round-robin over (category, source) groups in a stable order so every category is represented."""
    unique: dict[str, Any] = {}
    for it in sorted(items, key=lambda i: (i.source != "own", i.state.task_id, i.state.id)):
        unique.setdefault(it.state.id, it)
    groups: dict[tuple[str, str], list[Any]] = defaultdict(list)
    for it in unique.values():
        groups[(it.state.category, it.source)].append(it)
    queues = [groups[k] for k in sorted(groups)]
    out: list[Any] = []
    while any(queues) and (max_states is None or len(out) < max_states):
        for q in queues:
            if q and (max_states is None or len(out) < max_states):
                out.append(q.pop(0))
    return sorted(out, key=lambda i: (i.state.task_id, i.state.id))


def stage_recovery(cfg: PipelineConfig, journal: Journal, items: list[Any], tasks: list[TaskInfo]) -> dict[str, Any]:
    task_dirs = {t.id: t.path for t in tasks}
    if not journal.done("recovery"):
        st = _Stage(journal, "recovery")
        todo = [i for i in items if not journal.has_unit("recovery", i.state.id)]
        _say(f"stage 3-4/6 recovery: {cfg.recovery.attempts} attempts x {len(items)} failure states "
             f"({len(items) - len(todo)} done before) with {cfg.recovery.policy}, then the verifier")
        if todo:
            policy = load_recovery_policy(cfg.recovery.policy, dict(cfg.recovery.policy_kwargs), task_dirs,
                                          cfg.rollout.policy, dict(cfg.rollout.policy_kwargs))  # fmt: skip
            if isinstance(policy, OracleGuidedTeacher):
                ready = []
                for it in todo:
                    try:
                        policy.register(it.state, it.instruction)
                        ready.append(it)
                    except (FileNotFoundError, ValueError) as exc:  # no usable reference solution
                        journal.write_unit("recovery", it.state.id, {"state_id": it.state.id, "status": "skipped",
                                                                     "rebuild": "", "detail": str(exc)[:500],
                                                                     "diverged_attempts": 0, "attempts": []})  # fmt: skip
                todo = ready
            bar = tqdm(total=len(items), initial=len(items) - len(todo), desc="failure states", unit="state")
            asyncio.run(recover_all(todo, policy, cfg.recovery, cfg.recovery_environment, task_dirs,
                                lambda it, unit: journal.write_unit("recovery", it.state.id, unit), cfg.seed, bar))  # fmt: skip
            bar.close()
        units = {i.state.id: journal.read_unit("recovery", i.state.id) for i in items}
        statuses = Counter(u["status"] for u in units.values())
        st.finish({"states": len(items), **{f"status_{k}": v for k, v in sorted(statuses.items())}})
    return {i.state.id: journal.read_unit("recovery", i.state.id) for i in items}


def _replay_checks(cfg: PipelineConfig, journal: Journal, records: list[dict[str, Any]], items: dict[str, Any],
                   tasks: dict[str, Path]) -> None:  # fmt: skip

    todo = [r for r in records if not journal.has_unit("replay", r["id"])]
    if not todo:
        return
    bar = tqdm(total=len(todo), desc="replay checks", unit="record")

    def job(r: dict[str, Any]) -> Any:
        async def run() -> None:
            item = items[r["id"]]
            res = await replay_record(r, tasks[r["task_id"]], cfg.recovery_environment, item.default_timeout,
                                      cfg.recovery.command_timeout)  # fmt: skip
            if res["reward"] is None:  # an infrastructure fault: try once more before giving up
                res = await replay_record(r, tasks[r["task_id"]], cfg.recovery_environment, item.default_timeout,
                                          cfg.recovery.command_timeout)  # fmt: skip
            journal.write_unit("replay", r["id"], res)
            bar.update(1)

        return run

    asyncio.run(_gather_limited([job(r) for r in todo], cfg.sandbox_concurrency))
    bar.close()


# ------------------------------------------------------------------------------------ build
def build(cfg: PipelineConfig, output: str | Path, *, fresh: bool = False) -> BuildResult:
    """Run (or resume) every stage of a build into ``output`` (see the module docstring).

    Raises:
        ConfigError: a config that cannot be used (tasks, splits, policies...).
        ConfigMismatchError: ``output`` holds a build made with another config (use ``fresh``).
    """
    from reterm.data.write import build_stats, per_category_counts, records_from_unit, split_records, write_output

    t0 = time.monotonic()
    output = Path(output)
    tasks = select_tasks(cfg.tasks)  # a config that names no usable tasks fails before anything is written
    local = "local" in (cfg.rollout.environment.type, cfg.recovery_environment.type)
    check_tasks(tasks, local=local)  # so does a bad task (named with its file)
    journal = Journal(output)
    resumed = journal.bind_config(cfg.resolved(), cfg.fingerprint(), fresh=fresh)
    if resumed:
        done = [s for s, v in journal.stages().items() if v.get("done")]
        _say(f"resuming the build in {output} (finished stages: {', '.join(done) or 'none'})")
    task_by_id = {t.id: t for t in tasks}

    rollouts = stage_rollout(cfg, journal, tasks)
    own = stage_failures(cfg, journal, rollouts, tasks)
    injected = stage_injection(cfg, journal, tasks, rollouts)
    items = choose_items(own + injected, cfg.recovery.max_states)
    units = stage_recovery(cfg, journal, items, tasks)

    # candidate records and failed attempts
    candidates, failed, item_of = [], [], {}
    for it in items:
        unit = units[it.state.id]
        if unit["status"] != "ok":
            continue
        ok, bad = records_from_unit(it, unit, task_by_id[it.state.task_id], cfg.recovery.records_per_state)
        for r in ok + bad:
            item_of[r["id"]] = it
        candidates += ok
        failed += bad
    failed.sort(key=lambda r: r["id"])

    # filters, with the replay check on the records the other filters keep
    _say(f"stage 5/6 filters: {len(candidates)} verified recoveries")
    evals = [EvalTask(f"reterm-tasks:{cfg.tasks.eval_split}", t.id, t.instruction,
                      (t.path / "solution" / "solve.sh").read_text() if (t.path / "solution" / "solve.sh").is_file() else "")
             for t in (eval_tasks(cfg.tasks) if cfg.filters.decontamination.eval_split else [])]  # fmt: skip
    for folder in cfg.filters.decontamination.terminal_bench:
        evals += [eval_task_from_folder(f"terminal-bench:{resolve_path(folder).name}", t.path) for t in benchmark_tasks(folder)]
    dc = cfg.filters.decontamination
    decon = Decontaminator(evals, dc.ngram, dc.threshold)
    decon_method = (f"task-name match; >= {dc.threshold:.0%} of the record's {dc.ngram}-word n-grams of the instruction "
                    "(or of its commands) found in one evaluation task's instruction (or reference solution)")
    replay_failed: dict[str, str] = {}
    checked: set[str] = set()
    while True:
        result = apply_filters(candidates, cfg.filters, decon, replay_failed)
        unchecked = [r for r in result.kept if r["id"] not in checked] if cfg.filters.replay_check else []
        if not unchecked:
            break
        _replay_checks(cfg, journal, unchecked, item_of, {t.id: t.path for t in tasks})
        for r in unchecked:
            checked.add(r["id"])
            res = journal.read_unit("replay", r["id"])
            if res["reward"] is None or res["reward"] < 1.0:
                replay_failed[r["id"]] = f"reward {res['reward']}" + (f", {res['error']}" if res.get("error") else "")
    kept = result.kept
    funnel = {"verified_recoveries": len(candidates), **result.counts, "kept": len(kept)}

    # stats, dataset folder, report
    _say(f"stage 6/6 write: {len(kept)} records, {len(failed)} failed attempts")
    splits = split_records(kept, cfg)  # once: stats.json's counts and the written shards come from it
    if cfg.dataset.held_out_tasks:
        held = sorted({r["task_id"] for r in splits.get("test", [])})
        _say(f"held-out test split: the records of {len(held)} task(s) ({', '.join(held) or 'none'})"
             + (f"; dataset.held_out_tasks asked for {cfg.dataset.held_out_tasks}, but at least one of the "
                f"{len({r['task_id'] for r in kept})} task(s) with records stays in train"
                if len(held) < cfg.dataset.held_out_tasks else ""))  # fmt: skip
    per_category = per_category_counts(items, units)
    ro = rollouts.summary()
    infra = ro["infra_faults"] + sum(c.get("infra_attempts", 0) + c.get("rebuild_infra", 0) for c in per_category.values())
    infra += journal.summary("injection").get("infra_faults", 0)
    teacher = cfg.recovery.policy if cfg.recovery.policy != "self" else cfg.rollout.policy
    stats = build_stats(cfg, kept, splits, per_category, ro, infra, funnel, decon.benchmarks, decon_method, tasks,
                        cfg.rollout.policy, teacher)  # fmt: skip
    paths = write_output(output, splits, failed, stats, cfg) if kept else {}
    state_sources: dict[str, Counter] = defaultdict(Counter)
    for it in items:
        state_sources[it.state.category][it.source] += 1
    stages = {k: v.get("summary", {}) for k, v in journal.stages().items()}
    info = {
        "name": cfg.dataset.name, "policy": cfg.rollout.policy, "teacher": teacher, "n_tasks": len(tasks),
        "split": cfg.tasks.split, "environment": cfg.rollout.environment.type, "kept": kept,
        "categories_kept": sorted({r["failure_category"] for r in kept}), "rollouts": ro,
        "failures": journal.summary("failures"), "injection": journal.summary("injection"),
        "per_category": per_category, "state_sources": {k: dict(v) for k, v in state_sources.items()},
        "funnel": funnel, "filter_reasons": dict(result.reasons), "benchmarks": decon.benchmarks,
        "decon_method": decon_method, "stages": stages, "failed_attempts": len(failed),
        "wall_s": time.monotonic() - t0, "resumed": resumed,
        "records_by_source": {f"{c}/{s}": n for (c, s), n in sorted(Counter((r["failure_category"], r["failure_source"]) for r in kept).items())},
    }  # fmt: skip
    plots(output / "plots", kept, per_category)
    write_text_atomic(output / "report.md", markdown(info))
    info["paths"] = paths
    if not kept:
        raise BuildError(f"the build kept no records (funnel: {funnel}); see {output / 'report.md'}")
    return BuildResult(output, kept, info)


def _parse_set(values: list[str]) -> dict[str, Any]:
    out = {}
    for v in values:
        key, sep, raw = v.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set {v!r}: use KEY=VALUE, e.g. --set rollout.attempts=1")
        try:
            out[key.strip()] = yaml.safe_load(raw)
        except yaml.YAMLError as exc:
            raise ConfigError(f"--set {key.strip()}: the value {raw!r} is not a YAML value ({exc.problem or exc})") from None
    return out


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m pipeline.build`` and ``reterm data build``. Returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="reterm data build",
        description="Build the ReTerm-10K recovery dataset: rollouts -> failure states -> forked recovery "
                    "attempts -> verifier -> filters -> Hub-layout parquet + stats.json + report (reterm/data/build.py).")
    parser.add_argument("--config", "-c", type=Path, default=None,
                        help="pipeline config YAML (default: pipeline/configs/smoke.yaml)")
    parser.add_argument("--output", "-o", type=Path, required=True, help="output folder (resumed if it exists)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config field, e.g. --set tasks.max_tasks=2 (repeatable)")
    parser.add_argument("--fresh", action="store_true", help="discard earlier work in --output instead of resuming")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        cfg = load_config(args.config, _parse_set(args.set))
        result = build(cfg, args.output, fresh=args.fresh)
    except (ConfigError, ConfigMismatchError) as exc:
        print(f"reterm data build: {exc}", file=sys.stderr)
        return 2
    except (RolloutFault, BuildError) as exc:
        print(f"reterm data build: {exc}", file=sys.stderr)
        return 1
    info = result.info
    print(f"\n{len(result.records)} records from {len(info['categories_kept'])} error categories "
          f"({', '.join(info['categories_kept'])}) in {info['wall_s']:.0f} s")
    print(f"by category/source: {info['records_by_source']}")
    print(f"funnel: {info['funnel']}")
    print(f"dataset: {result.output} (datasets.load_dataset({str(result.output)!r})); report: {result.output / 'report.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
