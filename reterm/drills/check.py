"""Check generated drills in the real local sandbox: the oracle passes, the null agent and the first mistake fail.

Per instance, three fresh sandboxes of the task (``reterm.sandbox.local.LocalEnvironment``, the same
environment Harbor trials use, started directly without a Harbor ``Trial``: a trial's agent and
logging set-up cost more than a drill itself):

- **oracle**: ``bash /solution/solve.sh`` (what Harbor's oracle agent runs), then the verifier: reward 1.0;
- **null**: the verifier on the untouched environment: reward 0.0;
- **mistake**: the task's ``[metadata] first_mistake`` run as one command, then the verifier:
  reward 0.0, the command's output (stdout + stderr) is not empty and contains ``mistake_signal``; a
  family with ``mistake_timeout_sec`` (a hang) must still be running when that time is up, every other
  family's mistake must return on its own. Then, in the same sandbox, ``[metadata] recovery`` (the
  commands that finish the task from the state the mistake left) and the verifier again: reward 1.0.

The mistake's step is also labelled by the kit's rule classifier (:func:`reterm.recovery.classify_step`)
into ``mistake_label``; ``label_agrees`` says whether that is the family's category (``none`` for the
``premature_completion`` families, whose mistake exits 0 and fails only when the task is declared done).
It is reported, not required: the classifier is shared code that may change.

The verifier runs as Harbor's does: ``tests/`` uploaded to ``/tests``, ``bash /tests/test.sh``, the
reward read from ``/logs/verifier/reward.txt``. A sandbox that fails to build or start, or a verifier
that writes no reward, is an infrastructure fault: reported in ``error``, never as a reward.
"""

from __future__ import annotations

import asyncio
import time
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path

from reterm.drills.generate import VERIFIER_TIMEOUT_SEC
from reterm.recovery.classify import StepRecord, classify_step
from reterm.sandbox.box import ExecTimeoutError

SOLUTION_TIMEOUT_SEC = 60
MISTAKE_TIMEOUT_SEC = 30


@dataclass
class DrillCheck:
    """The check of one drill instance (plain data; rewards None on an infrastructure fault)."""

    name: str
    path: str
    family: str = ""
    category: str = ""
    seed: int | None = None
    index: int | None = None
    oracle_reward: float | None = None
    null_reward: float | None = None
    mistake_reward: float | None = None
    recovery_reward: float | None = None
    mistake_output: str = ""
    mistake_timed_out: bool = False
    expect_hang: bool = False
    signal_seen: bool = False
    mistake_exit: int | None = None
    mistake_label: str | None = None
    error: str | None = None
    wall_s: float = 0.0
    problems: list[str] = field(default_factory=list)

    @property
    def label_agrees(self) -> bool:
        """The rule classifier labels the first mistake as the family's category (see the module doc)."""
        want = "none" if self.category == "premature_completion" else self.category
        return self.mistake_label == want

    @property
    def ok(self) -> bool:
        """Oracle 1.0, null 0.0, mistake 0.0 with a non-empty output showing the signal, hang as expected."""
        return not self.problems_found()

    def problems_found(self) -> list[str]:
        """What is wrong with this instance, in words (empty when it is sound)."""
        out = list(self.problems)
        if self.error:
            out.append(f"infrastructure fault: {self.error}")
            return out
        if self.oracle_reward != 1.0:
            out.append(f"oracle reward {self.oracle_reward} (want 1.0)")
        if self.null_reward != 0.0:
            out.append(f"null reward {self.null_reward} (want 0.0)")
        if self.mistake_reward != 0.0:
            out.append(f"reward after the first mistake {self.mistake_reward} (want 0.0)")
        if self.recovery_reward != 1.0:
            out.append(f"reward after the first mistake and the recovery {self.recovery_reward} (want 1.0)")
        if not self.mistake_output.strip():
            out.append("the first mistake printed nothing")
        elif not self.signal_seen:
            out.append("the first mistake's output lacks mistake_signal")
        if self.mistake_timed_out != self.expect_hang:
            out.append("the first mistake " + ("hung" if self.mistake_timed_out else "returned") +
                       (" (a hang was expected)" if self.expect_hang else " (it should return on its own)"))
        return out


async def _verify(env, task_dir: Path) -> float:
    """Run the task's verifier the way Harbor does and return the reward (raises when none is written)."""
    await env.upload_dir(task_dir / "tests", "/tests")
    await env.exec("bash /tests/test.sh > /logs/verifier/test-stdout.txt 2>&1", timeout_sec=int(VERIFIER_TIMEOUT_SEC))
    r = await env.exec("cat /logs/verifier/reward.txt")
    text = (r.stdout or "").strip()
    if r.return_code != 0 or not text:
        raise RuntimeError(f"{task_dir.name}: the verifier wrote no reward ({(r.stderr or '').strip()})")
    return float(text)


async def check_drill(task_dir: Path | str) -> DrillCheck:
    """Check one drill folder in three fresh local sandboxes (see the module doc). Never raises for a bad
    drill: problems are in the result."""
    from reterm.sandbox.local import LocalEnvironment

    task_dir = Path(task_dir).resolve()
    t0 = time.monotonic()
    result = DrillCheck(name=task_dir.name, path=str(task_dir))
    try:
        meta = tomllib.loads((task_dir / "task.toml").read_text()).get("metadata", {})
    except (OSError, tomllib.TOMLDecodeError) as exc:
        result.problems.append(f"task.toml: {exc}")
        return result
    result.family, result.seed, result.index = meta.get("family", ""), meta.get("drill_seed"), meta.get("drill_index")
    result.category = (meta.get("error_categories") or [""])[0]
    mistake, signal = meta.get("first_mistake"), meta.get("mistake_signal", "")
    hang_s = meta.get("mistake_timeout_sec")
    recovery = meta.get("recovery") or []
    result.expect_hang = hang_s is not None
    if not mistake or not recovery:
        result.problems.append("task.toml: [metadata] first_mistake or recovery is missing")
        return result

    async def oracle() -> None:
        async with LocalEnvironment.for_task(task_dir) as env:
            await env.upload_dir(task_dir / "solution", "/solution")
            await env.exec("bash /solution/solve.sh", timeout_sec=SOLUTION_TIMEOUT_SEC)
            result.oracle_reward = await _verify(env, task_dir)

    async def null() -> None:
        async with LocalEnvironment.for_task(task_dir) as env:
            result.null_reward = await _verify(env, task_dir)

    async def first_mistake() -> None:
        async with LocalEnvironment.for_task(task_dir) as env:
            try:
                r = await env.exec(mistake, timeout_sec=float(hang_s) if hang_s else MISTAKE_TIMEOUT_SEC)
                output = (r.stdout or "") + (r.stderr or "")
                result.mistake_exit = r.return_code
            except ExecTimeoutError as exc:
                result.mistake_timed_out = True
                output = (exc.stdout or "") + (exc.stderr or "")
            result.mistake_output = output
            result.signal_seen = bool(signal) and signal in output
            label = classify_step(StepRecord(command=mistake, output=output, exit_status=result.mistake_exit,
                                             timed_out=result.mistake_timed_out))  # fmt: skip
            result.mistake_label = label.label.value
            result.mistake_reward = await _verify(env, task_dir)
            await env.exec("\n".join(recovery), timeout_sec=SOLUTION_TIMEOUT_SEC)
            result.recovery_reward = await _verify(env, task_dir)

    try:
        await oracle()  # builds (or finds) the task's layer once; the other two reuse it
        for outcome in await asyncio.gather(null(), first_mistake(), return_exceptions=True):
            if isinstance(outcome, Exception):  # both runs finished (and stopped their sandboxes) first
                raise outcome
    except Exception as exc:  # build, start or verifier faults: infrastructure, not a reward
        result.error = f"{type(exc).__name__}: {exc}"
    result.wall_s = time.monotonic() - t0
    return result


async def check_drills_async(task_dirs: list[Path], *, concurrency: int = 2, progress: bool = True) -> list[DrillCheck]:
    """Check every drill folder, ``concurrency`` instances at a time; results in input order."""
    from tqdm import tqdm

    sem = asyncio.Semaphore(max(1, concurrency))
    bar = tqdm(total=len(task_dirs), desc="check drills", unit="drill", disable=not progress)
    results: list[DrillCheck | None] = [None] * len(task_dirs)

    async def one(i: int) -> None:
        async with sem:
            results[i] = await check_drill(task_dirs[i])
        bar.set_postfix_str(f"{results[i].name} {'ok' if results[i].ok else 'FAIL'}")
        bar.update()

    try:
        await asyncio.gather(*(one(i) for i in range(len(task_dirs))))
    finally:
        bar.close()
    return [r for r in results if r is not None]


def check_drills(task_dirs: list[Path | str], *, concurrency: int = 2, progress: bool = True) -> list[DrillCheck]:
    """Synchronous :func:`check_drills_async` (runs its own event loop)."""
    return asyncio.run(check_drills_async([Path(p) for p in task_dirs], concurrency=concurrency, progress=progress))


def checks_json(results: list[DrillCheck], wall_s: float) -> dict:
    """JSON-ready report: per instance, its fields, ``ok`` and ``problems``; the totals and instances/s."""
    return {
        "n": len(results), "n_ok": sum(r.ok for r in results), "wall_s": wall_s,
        "n_label_agrees": sum(r.label_agrees for r in results),
        "instances_per_s": len(results) / wall_s if wall_s > 0 else None,
        "drills": [{**asdict(r), "ok": r.ok, "label_agrees": r.label_agrees, "problems": r.problems_found()}
                   for r in results],
    }  # fmt: skip
