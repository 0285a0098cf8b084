"""Build the held-out failure-state set of the test split: ``eval/states/test_split.jsonl``.

Recovery from recorded failure states (Recovery-Bench style, :mod:`reterm.eval.recovery`) compares checkpoints
on the *same* states; states mined from each model's own trials differ per model (and SmolLM2, the
embedded default, rarely runs a command at all). This file gives every checkpoint the same states on
the test split of ``tasks/`` (never used for data or training).

Each state is a short command prefix that makes the natural mistake its task was designed to provoke
(``tasks/README.md``, "Error categories"). The prefix is run for real through this kit's one harness
(:func:`reterm.agent.episode.run_episode` with a :class:`~reterm.policies.scripted.ScriptedPolicy`) in a
fresh local sandbox, so the observations are the harness's own; the task's verifier must still fail
there, and :func:`reterm.recovery.localise.localise` (rules) must find the failure state at the last
step: its category is the localiser's, not a hand label. Rows are state-only records written by the one
record writer (:meth:`reterm.recovery.state.State.to_record`: the ReTerm-10K columns, ``train_from_message_index``
= the number of messages, ``trajectory_id`` the state's id; ``failure_source = "injected"``, ``injection`` says
where the prefix comes from), so :func:`reterm.eval.recovery.states_from_records` reads them like pipeline
records.

Run (about a minute): ``python eval/states/build_states.py [--tasks tasks] [--out eval/states/test_split.jsonl]``.
Raises ``RuntimeError`` naming the task when a prefix does not end in a failure state.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from reterm.agent.episode import run_episode
from reterm.io import write_text_atomic
from reterm.policies.scripted import ScriptedPolicy
from reterm.recovery.localise import localise
from reterm.trajectory import Outcome

# (task, prefix commands, per-command timeout in seconds); the last command is the mistake.
PREFIXES: list[tuple[str, list[str], float | None]] = [
    ("fix-makefile-build", ["cd /app", "make"], None),
    ("fix-makefile-build", ["cd /app", "sed -i 's/^        \\$(PYTHON)/\\t$(PYTHON)/' Makefile", "make"], None),
    ("git-recover-reset-commits", ["cd /app/repo", "git --no-pager log --oneline -3", "git pull origin main"], None),
    ("job-as-service-user", ["runuser -u svc -- python3 /app/job.py",
                             "runuser -u svc -- cat /etc/myapp/settings.ini"], None),
    ("offline-wheel-install", ["cd /app", "python3 -m venv /app/.venv",
                               "/app/.venv/bin/pip install -r /app/requirements.txt"], 120.0),
    ("release-hooks", ["cd /app", "/app/run-hooks.sh", "/app/hooks.d/20-migrate.sh"], None),
    ("sales-report-json", ["ls /data/sales", "head -3 /data/sales/2024-01.csv",
                           "python3 -c \"import pandas as pd; print(pd.read_csv('/data/sales/2024-01.csv').head())\""], None),
    ("semver-sort", ["cd /app", "printf 'import sys\\nvs = [l.strip() for l in sys.stdin if l.strip()]\\n"
                     "for v in sorted(vs, key=lambda v: tuple(map(int, v.split(\".\")))):\\n    print(v)\\n' "
                     "> /app/semver_sort.py", "python3 /app/semver_sort.py < /app/versions.txt"], None),
    ("sqlite-import-csv", ["cd /app", "head -3 /data/customers.csv",
                           "sqlite3 /app/shop.db \".import /data/customers.csv customers\""], None),
    ("start-health-service", ["cd /app/service", "cp config.env.example config.env", "python3 app.py"], 10.0),
]

INJECTION = "hand-written failure prefix (eval/states/build_states.py)"


async def _state_row(tasks: Path, task: str, commands: list[str], timeout: float | None) -> dict:
    from reterm.sandbox.local import LocalEnvironment

    task_dir = tasks / task
    env = LocalEnvironment.for_task(task_dir)
    try:
        await env.start(force_build=False)
        traj = await run_episode(ScriptedPolicy(commands, submit=False, timeout=timeout, name="prefix"),
                                 env, task_dir, max_turns=len(commands))
    finally:
        await env.stop(delete=True)
    if traj.outcome is not Outcome.FAILURE:
        raise RuntimeError(f"{task}: the prefix {commands} ends in {traj.outcome.value}, not a failed verifier")
    states = [s for s in localise(traj).states if s.step == len(commands) - 1]
    if not states:
        raise RuntimeError(f"{task}: no failure state at the last command {commands[-1]!r} "
                           f"(observation: {traj.steps[-1].observation[:300]!r})")
    fs = states[0]
    state = fs.with_source("injected")
    return state.to_record(None, task_license="Apache-2.0", instruction=traj.instruction, failure_step=fs.step,
                           injection=INJECTION, failure_command=fs.command or "", failure_output=fs.output,
                           verifier_reward=float(traj.reward or 0.0), source_policy="prefix")  # fmt: skip


def build(tasks: Path, out: Path) -> list[dict]:
    """Run every prefix of :data:`PREFIXES` and write the rows (JSON Lines) to ``out``; returns them."""
    from tqdm import tqdm

    rows = [asyncio.run(_state_row(tasks, t, c, to)) for t, c, to in tqdm(PREFIXES, desc="failure states", unit="state")]
    write_text_atomic(out, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return rows


def main(argv: list[str] | None = None) -> int:
    """``python eval/states/build_states.py`` (or ``python -m reterm.eval.states``): write the state set and
    print one line per state."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", type=Path, default=Path("tasks"))
    default_out = Path(__file__).resolve().parents[2] / "eval" / "states" / "test_split.jsonl"
    p.add_argument("--out", type=Path, default=default_out)
    a = p.parse_args(argv)
    rows = build(a.tasks, a.out)
    for r in rows:
        print(f"{r['task_id']:<28} {r['failure_category']:<22} {r['failure_command'][:60]}")
    print(f"{len(rows)} failure states -> {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
