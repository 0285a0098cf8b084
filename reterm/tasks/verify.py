"""``reterm tasks verify``: build each task on the local sandbox, run the oracle and a do-nothing agent through
Harbor's Trial API, and report build, oracle reward, null reward, wall time and the infrastructure fault's
reason per task, with totals (docs/SANDBOX.md gives the table for Terminal-Bench 2.0 tasks).

A sound task gives reward 1.0 with its reference solution (Harbor's ``oracle`` agent runs
``solution/solve.sh``) and 0.0 when nothing is done (Harbor's ``nop`` agent). Trials run with
``reterm.sandbox.local:LocalEnvironment`` and its options (``environment_kwargs``, the CLI's ``--ek``:
``public_network=host`` gives public phases the host's network); the sandbox applies the offline verifier
shim itself (:mod:`reterm.sandbox.shim`). Trials are classified by the evaluation's rule
(:func:`reterm.agent.trial_outcome.score_trial`): a trial that ends in an infrastructure fault (sandbox, build,
verifier crash or timeout, a reward that cannot be scored, a verifier or solution that could not reach a
host: ``network_error``) has its reward reported as missing with the reason, never as 0; an agent timeout
keeps the verifier's reward.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from reterm.agent.trial_outcome import score_trial
from reterm.sandbox.base_image import ensure_base
from reterm.sandbox.build import base_suite, ensure_layer
from reterm.tasks.loader import LoadedTask
from reterm.tasks.shim import needs_shim

LOCAL_ENV = "reterm.sandbox.local:LocalEnvironment"
AGENTS = ("oracle", "nop")


@dataclass
class TrialOutcome:
    """One trial: ``reward`` (None on an infrastructure fault), wall seconds, the fault if any
    (``error``: the reason; ``outcome``: the :class:`reterm.trajectory.Outcome` value)."""

    agent: str
    reward: float | None
    wall_s: float
    error: str | None = None
    trial_dir: str | None = None
    outcome: str | None = None


@dataclass
class TaskVerification:
    """Oracle and null (nop) trials of one task."""

    name: str
    task_dir: str
    shim: bool
    has_solution: bool = True
    trials: dict[str, TrialOutcome] = field(default_factory=dict)
    build_s: float | None = None  # seconds to build (or find) the task's layer; None when not built first
    build_error: str | None = None  # why the build failed (then no trial ran)
    load_error: str | None = None  # why the task was not loaded (refused before any build; then nothing ran)

    @property
    def oracle(self) -> TrialOutcome:
        return self.trials["oracle"]

    @property
    def nop(self) -> TrialOutcome:
        return self.trials["nop"]

    @property
    def ok(self) -> bool:
        """Oracle reward 1.0 and null reward 0.0 (both trials without infrastructure fault); for a task
        without reference solution, null reward 0.0."""
        if self.load_error or self.build_error or "nop" not in self.trials:
            return False
        oracle_ok = not self.has_solution or self.trials.get("oracle", TrialOutcome("oracle", None, 0)).reward == 1.0
        return oracle_ok and self.nop.reward == 0.0

    @property
    def infra_reason(self) -> str | None:
        """The infrastructure fault of this task's build or trials (``agent: reason`` joined), or None."""
        if self.load_error:
            return f"not loaded: {self.load_error}"
        if self.build_error:
            return f"build: {self.build_error}"
        why = [f"{a}: {t.error}" for a, t in self.trials.items() if t.error]
        return "; ".join(why) or None

    @property
    def status(self) -> str:
        """``ok`` (oracle 1, null 0), ``refused`` (not loaded: a base image or layout the local sandbox cannot
        run, with the reason), ``infra`` (a build or trial fault with its reason, nothing scored 0 silently) or
        ``FAIL`` (scored, but not oracle 1 / null 0: the task or the sandbox is wrong)."""
        if self.ok:
            return "ok"
        if self.load_error:
            return "refused"
        return "infra" if self.infra_reason else "FAIL"

    @property
    def cause(self) -> str | None:
        """The kind of infrastructure fault, for the totals: ``refused``, ``build``, or the trials' fault
        outcomes (``network_error``, ``sandbox_error``, ``verifier_error``...) joined by ``+``; ``None`` without."""
        if self.load_error:
            return "refused"
        if self.build_error:
            return "build"
        kinds = sorted({t.outcome or "fault" for t in self.trials.values() if t.error})
        return "+".join(kinds) or None

    @property
    def wall_s(self) -> float:
        return (self.build_s or 0.0) + sum(t.wall_s for t in self.trials.values())


async def run_trial(loaded: LoadedTask, agent: str, trials_dir: Path, *, environment_kwargs: dict | None = None
                    ) -> TrialOutcome:  # fmt: skip
    """Run one Harbor trial of ``agent`` (``oracle`` or ``nop``, or any Harbor agent name) on the local sandbox.

    Args:
        environment_kwargs: :class:`reterm.sandbox.local.LocalOptions` values (``public_network``, ...).

    Returns:
        :class:`TrialOutcome` with the verifier's ``reward`` (None on an infrastructure fault, whose reason is
        ``error``), the wall time in seconds and the trial folder.
    """
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network fetch at import
    from harbor.models.trial.config import AgentConfig, EnvironmentConfig, TaskConfig, TrialConfig
    from harbor.trial.trial import Trial

    name = f"{loaded.name}__{agent}__{os.urandom(3).hex()}"
    config = TrialConfig(
        task=TaskConfig(path=loaded.task_dir),
        trial_name=name,
        trials_dir=trials_dir,
        agent=AgentConfig(name=agent),
        environment=EnvironmentConfig(import_path=LOCAL_ENV, kwargs=environment_kwargs or {}),
    )
    t0 = time.monotonic()
    try:
        trial = await Trial.create(config)
        result = await trial.run()
    except Exception as exc:  # harness-level failure: an infrastructure fault, not a reward
        return TrialOutcome(agent, None, time.monotonic() - t0, f"{type(exc).__name__}: {exc}",
                            str(trials_dir / name), "harness_error")  # fmt: skip
    wall = time.monotonic() - t0
    trial_dir = trials_dir / name
    score = score_trial(result, trial_dir)  # the one rule: agent timeouts keep their reward
    if score.outcome.is_infra_fault:
        rewards = result.verifier_result.rewards if result.verifier_result else None
        why = (f"{score.exception_type}: {score.exception_message}" if score.exception_type
               else f"no reward in the verifier result: {rewards!r}")  # fmt: skip
        return TrialOutcome(agent, None, wall, why, str(trial_dir), score.outcome.value)
    return TrialOutcome(agent, score.reward, wall, None, str(trial_dir), score.outcome.value)


async def build_task(loaded: LoadedTask) -> tuple[float, str | None]:
    """Build (or find cached) the task's layer on the local sandbox as a trial would.

    Returns:
        ``(seconds, None)``, or ``(seconds, reason)`` when the Dockerfile is refused or a step failed (the
        message names the file and line).
    """
    t0 = time.monotonic()
    try:
        image = loaded.task.config.environment.docker_image
        suite = base_suite(loaded.task_dir / "environment", image)
        base = await asyncio.to_thread(ensure_base, suite=suite)
        await ensure_layer(loaded.task_dir / "environment", base, docker_image=image)
    except Exception as exc:  # DockerfileError, SandboxBuildFailedError, FileNotFoundError
        return time.monotonic() - t0, f"{type(exc).__name__}: {str(exc)[:1500]}"
    return time.monotonic() - t0, None


async def verify_tasks(tasks: list[LoadedTask], out_dir: Path, *, n_concurrent: int = 2, progress: bool = True,
                       agents: tuple[str, ...] = AGENTS, environment_kwargs: dict | None = None,
                       build_first: bool = False, rerun: tuple[str, ...] = ()) -> list[TaskVerification]:  # fmt: skip
    """Run ``agents`` (default oracle and nop) on every task, ``n_concurrent`` trials at a time.

    Args:
        environment_kwargs: local-sandbox options for every trial (:class:`reterm.sandbox.local.LocalOptions`).
        build_first: build each task's layer before its trials (one at a time, timed in ``build_s``); a task
            whose build fails runs no trial and reports ``build_error``.
        rerun: names of tasks to run even when :data:`PROGRESS` holds them (their new record is appended and
            wins over the old one, :func:`read_progress`).

    Trial folders go to ``out_dir/trials``. Every finished task is appended to ``out_dir/`` :data:`PROGRESS`;
    a later call with the same ``out_dir`` (and the same ``agents``) takes those tasks from there instead of
    running them again, so an interrupted run resumes where it stopped. Returns one :class:`TaskVerification`
    per task, in input order.
    """
    from tqdm import tqdm

    logging.getLogger("harbor").setLevel(logging.WARNING)
    trials_dir = Path(out_dir) / "trials"
    trials_dir.mkdir(parents=True, exist_ok=True)
    progress_path = Path(out_dir) / PROGRESS
    done = {k: v for k, v in read_progress(progress_path, agents).items() if k not in set(rerun)}
    results = [done.get(t.name) or TaskVerification(t.name, str(t.task_dir), needs_shim(t.task_dir), t.has_solution)
               for t in tasks]  # fmt: skip
    todo = [i for i, t in enumerate(tasks) if t.name not in done]
    sem = asyncio.Semaphore(n_concurrent)
    build_lock = asyncio.Lock()  # builds download and compile: one at a time
    bar = tqdm(total=len(todo) * len(agents), desc="verify", unit="trial", disable=not progress)

    async def one(i: int, agent: str) -> None:
        if agent == "oracle" and not tasks[i].has_solution:
            outcome = TrialOutcome(agent, None, 0.0, None)  # nothing to run: reported as "no solution"
        else:
            async with sem:
                outcome = await run_trial(tasks[i], agent, trials_dir, environment_kwargs=environment_kwargs)
        results[i].trials[agent] = outcome
        bar.set_postfix_str(f"{tasks[i].name} {agent}={outcome.reward}")
        bar.update()

    async def task(i: int) -> None:
        if build_first:
            async with build_lock:
                results[i].build_s, results[i].build_error = await build_task(tasks[i])
            if results[i].build_error:
                bar.update(len(agents))
                _append_progress(progress_path, results[i])
                return
        await asyncio.gather(*(one(i, a) for a in agents))
        _append_progress(progress_path, results[i])

    try:
        await asyncio.gather(*(task(i) for i in todo))
    finally:
        bar.close()
    return results


PROGRESS = "verify-progress.jsonl"  # one finished task a line (verification_json's task record)


def _task_json(v: TaskVerification) -> dict:
    return {"name": v.name, "task_dir": v.task_dir, "shim": v.shim, "has_solution": v.has_solution, "ok": v.ok,
            "status": v.status, "build_s": v.build_s, "build_error": v.build_error, "load_error": v.load_error,
            "infra_reason": v.infra_reason, "cause": v.cause, "trials": {a: asdict(t) for a, t in v.trials.items()}}


def _append_progress(path: Path, v: TaskVerification) -> None:
    with open(path, "a") as fh:
        fh.write(json.dumps(_task_json(v)) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def read_progress(path: Path, agents: tuple[str, ...] = AGENTS) -> dict[str, TaskVerification]:
    """The tasks a previous run into the same folder finished (``PROGRESS``), by name; a task whose record lacks
    one of ``agents`` (and did not fail its build) is left out, to be run again. A line that is not a task
    record (a run killed while writing) is skipped."""
    out: dict[str, TaskVerification] = {}
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        try:
            rec = json.loads(line)
            trials = {a: TrialOutcome(**t) for a, t in rec["trials"].items()}
            v = TaskVerification(rec["name"], rec["task_dir"], rec["shim"], rec["has_solution"], trials,
                                 rec["build_s"], rec["build_error"], rec["load_error"])  # fmt: skip
        except (ValueError, KeyError, TypeError):
            continue
        if v.build_error or all(a in trials for a in agents):
            out[v.name] = v
    return out


def verification_markdown(results: list[TaskVerification], total_wall_s: float | None = None) -> str:
    """Markdown table: task, build, oracle reward, null reward, seconds (build + trials), shim, status, reason;
    then totals."""
    def fmt(t: TrialOutcome | None) -> str:
        if t is None:
            return "-"
        return ("fault" if t.error else "no solution") if t.reward is None else f"{t.reward:.1f}"

    def cell(text: str | None) -> str:
        return (text or "").replace("|", "\\|").replace("\n", " ")[:300]

    rows = ["| task | build | oracle | null | s | shim | status | infra-fault reason |",
            "|---|---|---|---|---|---|---|---|"]
    for v in results:
        build = "refused" if v.load_error else "FAIL" if v.build_error else ("-" if v.build_s is None else f"ok {v.build_s:.0f}s")
        rows.append(f"| {v.name} | {build} | {fmt(v.trials.get('oracle'))} | {fmt(v.trials.get('nop'))} | "
                    f"{v.wall_s:.0f} | {'yes' if v.shim else '-'} | {v.status} | {cell(v.infra_reason)} |")
    n = len(results)
    ok = sum(v.status == "ok" for v in results)
    infra = sum(v.status == "infra" for v in results)
    refused = sum(v.status == "refused" for v in results)
    built = sum(not v.build_error and not v.load_error for v in results)
    out = "\n".join(rows) + "\n\n"
    out += (f"{n} tasks: {refused} refused before building, {built} built; {ok} oracle 1.0 and null 0.0; {infra} "
            f"infrastructure faults (reason given); {n - ok - infra - refused} FAIL (scored, not oracle 1.0 / null 0.0).")
    if total_wall_s is not None:
        out += f" Total wall time {total_wall_s:.0f} s."
    causes: dict[str, int] = {}
    for v in results:
        if v.status != "ok" and v.cause:
            causes[v.cause] = causes.get(v.cause, 0) + 1
    if causes:
        out += " Faults by cause: " + ", ".join(f"{k} {n}" for k, n in sorted(causes.items())) + "."
    return out + "\n"


def verification_json(results: list[TaskVerification], total_wall_s: float | None = None) -> dict:
    """JSON-ready form of the results."""
    return {
        "total_wall_s": total_wall_s,
        "tasks": [_task_json(v) for v in results],
    }
