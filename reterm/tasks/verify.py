"""``reterm tasks verify``: run the oracle and a do-nothing agent on each task through Harbor's Trial
API on the local sandbox, and report oracle reward, null reward and wall time per task.

A sound task gives reward 1.0 with its reference solution (Harbor's ``oracle`` agent runs
``solution/solve.sh``) and 0.0 when nothing is done (Harbor's ``nop`` agent). Trials run with
``reterm.sandbox.local:LocalEnvironment``; tasks whose verifier needs the network get the offline
verifier shim (:mod:`reterm.tasks.shim`). Trials are classified by the evaluation's rule
(:func:`reterm.agent.trial_outcome.score_trial`): a trial that ends in an infrastructure fault (sandbox, build,
verifier crash or timeout, a reward that cannot be scored), or whose verifier lacked a package the
shim could not provide, has its reward reported as missing, never as 0; an agent timeout keeps the
verifier's reward.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from reterm.agent.trial_outcome import score_trial
from reterm.tasks.loader import LoadedTask
from reterm.tasks.shim import MISSING_LOG, needs_shim, shim_trial_settings

LOCAL_ENV = "reterm.sandbox.local:LocalEnvironment"
AGENTS = ("oracle", "nop")


@dataclass
class TrialOutcome:
    """One trial: ``reward`` (None on an infrastructure fault), wall seconds, the fault if any."""

    agent: str
    reward: float | None
    wall_s: float
    error: str | None = None
    trial_dir: str | None = None


@dataclass
class TaskVerification:
    """Oracle and null (nop) trials of one task."""

    name: str
    task_dir: str
    shim: bool
    has_solution: bool = True
    trials: dict[str, TrialOutcome] = field(default_factory=dict)

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
        oracle_ok = not self.has_solution or self.oracle.reward == 1.0
        return oracle_ok and self.nop.reward == 0.0

    @property
    def wall_s(self) -> float:
        return sum(t.wall_s for t in self.trials.values())


async def run_trial(loaded: LoadedTask, agent: str, trials_dir: Path, *, environment_kwargs: dict | None = None
                    ) -> TrialOutcome:  # fmt: skip
    """Run one Harbor trial of ``agent`` (``oracle`` or ``nop``, or any Harbor agent name) on the local sandbox.

    Returns:
        :class:`TrialOutcome` with the verifier's ``reward`` (None on an infrastructure fault or when
        the shim reported a missing package), the wall time in seconds and the trial folder.
    """
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network fetch at import
    from harbor.models.trial.config import AgentConfig, EnvironmentConfig, TaskConfig, TrialConfig, VerifierConfig
    from harbor.trial.trial import Trial

    mounts, verifier_env = shim_trial_settings() if needs_shim(loaded.task_dir) else (None, {})
    name = f"{loaded.name}__{agent}__{os.urandom(3).hex()}"
    config = TrialConfig(
        task=TaskConfig(path=loaded.task_dir),
        trial_name=name,
        trials_dir=trials_dir,
        agent=AgentConfig(name=agent),
        environment=EnvironmentConfig(import_path=LOCAL_ENV, mounts=mounts, kwargs=environment_kwargs or {}),
        verifier=VerifierConfig(env=verifier_env),
    )
    t0 = time.monotonic()
    try:
        trial = await Trial.create(config)
        result = await trial.run()
    except Exception as exc:  # harness-level failure: an infrastructure fault, not a reward
        return TrialOutcome(agent, None, time.monotonic() - t0, f"{type(exc).__name__}: {exc}",
                            str(trials_dir / name))  # fmt: skip
    wall = time.monotonic() - t0
    trial_dir = trials_dir / name
    score = score_trial(result, trial_dir)  # the one rule: agent timeouts keep their reward
    if score.outcome.is_infra_fault:
        rewards = result.verifier_result.rewards if result.verifier_result else None
        why = (f"{score.exception_type}: {score.exception_message}" if score.exception_type
               else f"no reward in the verifier result: {rewards!r}")  # fmt: skip
        return TrialOutcome(agent, None, wall, why, str(trial_dir))
    missing = trial_dir / "verifier" / MISSING_LOG
    if missing.is_file() and missing.read_text().strip():
        names = ", ".join(sorted(set(missing.read_text().split())))
        return TrialOutcome(agent, None, wall, f"verifier needs what it cannot install offline: {names}",
                            str(trial_dir))  # fmt: skip
    return TrialOutcome(agent, score.reward, wall, None, str(trial_dir))


async def verify_tasks(tasks: list[LoadedTask], out_dir: Path, *, n_concurrent: int = 2, progress: bool = True,
                       agents: tuple[str, ...] = AGENTS) -> list[TaskVerification]:  # fmt: skip
    """Run ``agents`` (default oracle and nop) on every task, ``n_concurrent`` trials at a time.

    Trial folders go to ``out_dir/trials``. Returns one :class:`TaskVerification` per task, in input order.
    """
    from tqdm import tqdm

    logging.getLogger("harbor").setLevel(logging.WARNING)
    trials_dir = Path(out_dir) / "trials"
    trials_dir.mkdir(parents=True, exist_ok=True)
    results = [TaskVerification(t.name, str(t.task_dir), needs_shim(t.task_dir), t.has_solution) for t in tasks]
    sem = asyncio.Semaphore(n_concurrent)
    bar = tqdm(total=len(tasks) * len(agents), desc="verify", unit="trial", disable=not progress)

    async def one(i: int, agent: str) -> None:
        if agent == "oracle" and not tasks[i].has_solution:
            outcome = TrialOutcome(agent, None, 0.0, None)  # nothing to run: reported as "no solution"
        else:
            async with sem:
                outcome = await run_trial(tasks[i], agent, trials_dir)
        results[i].trials[agent] = outcome
        bar.set_postfix_str(f"{tasks[i].name} {agent}={outcome.reward}")
        bar.update()

    try:
        await asyncio.gather(*(one(i, a) for i in range(len(tasks)) for a in agents))
    finally:
        bar.close()
    return results


def verification_markdown(results: list[TaskVerification], total_wall_s: float | None = None) -> str:
    """Markdown table: task, oracle reward, null reward, wall seconds of each trial, shim, status."""
    def fmt(t: TrialOutcome) -> str:
        return ("fault" if t.error else "no solution") if t.reward is None else f"{t.reward:.1f}"

    rows = ["| task | oracle reward | null reward | oracle s | null s | shim | status |",
            "|---|---|---|---|---|---|---|"]
    for v in results:
        o, n = v.trials.get("oracle"), v.trials.get("nop")
        rows.append(
            f"| {v.name} | {fmt(o)} | {fmt(n)} | "
            f"{o.wall_s:.1f} | {n.wall_s:.1f} | {'yes' if v.shim else '-'} | {'ok' if v.ok else 'FAIL'} |"
            if o and n else f"| {v.name} | - | - | - | - | - | FAIL |"
        )
    ok = sum(v.ok for v in results if "oracle" in v.trials and "nop" in v.trials)
    out = "\n".join(rows) + "\n\n"
    out += f"{ok}/{len(results)} tasks: oracle 1.0 and null 0.0."
    if total_wall_s is not None:
        out += f" Total wall time {total_wall_s:.0f} s."
    out += "\n"
    faults = [(v.name, t) for v in results for t in v.trials.values() if t.error]
    if faults:
        out += "\nInfrastructure faults (not rewards):\n" + "".join(
            f"- {name} {t.agent}: {t.error}\n" for name, t in faults
        )
    return out


def verification_json(results: list[TaskVerification], total_wall_s: float | None = None) -> dict:
    """JSON-ready form of the results."""
    return {
        "total_wall_s": total_wall_s,
        "tasks": [{"name": v.name, "task_dir": v.task_dir, "shim": v.shim, "has_solution": v.has_solution, "ok": v.ok,
                   "trials": {a: asdict(t) for a, t in v.trials.items()}} for v in results],
    }
