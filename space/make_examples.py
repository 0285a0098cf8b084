"""Write the replay examples bundled with the Space (``space/examples/``), from real runs.

    python space/make_examples.py [--records DIR] [--smollm2] [--out space/examples]
    python space/make_examples.py --checkpoint RUN/sft/merged --name NAME --tasks RUN/drills/test [--task T]...

- ``examples/records/``: a few ReTerm-10K records (at most ``--per-category`` per error category) copied from
  ``--records`` (default: the smoke dataset if ``outputs/reterm10k-smoke`` exists, else the test fixture), in
  the published layout (``data/train-00000-of-00001.parquet``, :data:`reterm.record_features.FEATURES`).
- ``examples/recoveries/<case>/``: live runs of this app (:class:`live_run.LiveRun`: the local sandbox, a
  user-typed mistake, the failure detected, the sandbox forked into G attempts, each verified), saved as
  ``main.json`` + ``attempts/attempt-K.json``: the scripted oracle on two suite tasks, and with ``--smollm2``
  the embedded SmolLM2 (a few minutes on 2 CPU cores).
- ``examples/model-recoveries/<task>-<name>/``: with ``--checkpoint``, a trained checkpoint's own run (same
  layout; nothing else is rewritten): the model works on a task, first with no typed mistake (its own failure),
  then, on a drill (``[metadata] first_mistake``), after the drill's first mistake typed for it (``--start``
  keeps one of the two); at the first failure the sandbox is forked and the model's recovery attempts run. Tasks are tried in turn (``--task``, else
  every task of ``--tasks``) until one run has a failure and an attempt that passes its verifier; when none does
  within ``--tries`` runs, the run with the most attempt reward (then the most attempts and steps) is kept and
  the output says so. The model is named ``--name`` in the files (no local path is recorded).

So that the Space shows recoveries and a fan-out before any dataset is published. Needs root (the sandbox).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
REPO = HERE.parent

from live_run import LiveRun, PolicyCache, validate_request  # noqa: E402

# (case folder, task, model, first command typed by the "user", forks, turns per attempt)
CASES = [
    ("jq-missing-oracle", "replace-missing-jq", "oracle", "jq -r '.[].name' users.json", 3, 8),
    ("pip-offline-oracle", "offline-wheel-install", "oracle", "pip install requests", 3, 12),
]
SMOLLM2_CASE = ("jq-missing-smollm2", "replace-missing-jq", "smollm2", "jq -r '.[].name' users.json", 3, 3)


def copy_records(source: Path, out: Path, per_category: int) -> int:
    """Copy up to ``per_category`` records per failure category (train split) into ``out``; returns the count."""
    from datasets import Dataset, load_dataset

    from reterm.record_features import FEATURES

    ds = load_dataset(str(source), split="train")
    taken: dict[str, int] = {}
    rows = []
    for row in ds:
        cat = row["failure_category"]
        if taken.get(cat, 0) < per_category:
            taken[cat] = taken.get(cat, 0) + 1
            rows.append(row)
    shutil.rmtree(out, ignore_errors=True)
    (out / "data").mkdir(parents=True)
    Dataset.from_list(rows, features=FEATURES).to_parquet(str(out / "data" / "train-00000-of-00001.parquet"))
    return len(rows)


async def run_case(case: tuple, out: Path, policies: PolicyCache) -> str:
    name, task, model, first, forks, turns = case
    req = validate_request(task=task, model=model, forks=forks, first_command=first, max_turns=turns,
                           recovery_turns=turns, max_new_tokens=192, temperature=0.8,
                           task_roots=[REPO / "tasks"])  # fmt: skip
    run = LiveRun(req, policies.get(req))
    st = await run.run()
    if st.error or st.main is None:
        raise RuntimeError(f"{name}: the run failed: {st.error}")
    dest = out / name
    shutil.rmtree(dest, ignore_errors=True)
    st.main.save(dest / "main.json")
    for k, a in enumerate(st.attempts):
        a.save(dest / "attempts" / f"attempt-{k}.json")
    rewards = [a.reward for a in st.attempts]
    return f"{name}: failure {st.failure_category} at step {st.failure_step}, attempt rewards {rewards}"


def record_model_recovery(checkpoint: Path, name: str, task_roots: list[Path], tasks: list[str], out: Path,
                          tries: int, forks: int, turns: int, temperature: float, start: str = "both") -> str:
    """Run ``checkpoint`` on ``tasks`` (suite names under ``task_roots``; all of them when empty) until a run's
    first failure is followed by a forked attempt that passes; save that run (else the best one) under
    ``out/<task>-<name>/``. ``start``: ``"own"`` (the model from the task start, its own failure),
    ``"mistake"`` (after the drill's first mistake typed for it; tasks without one are skipped) or ``"both"``
    (each task both ways, own first). Returns a line saying what was kept. Raises ``RuntimeError`` when no run
    got as far as a failure and its forks."""
    import tomllib

    from reterm.generation import MAX_TURN_TOKENS

    from live_run import list_tasks

    known = list_tasks(task_roots)
    names = tasks or sorted(known)
    if not names:
        raise RuntimeError(f"no tasks under {', '.join(map(str, task_roots))}")
    plan = []  # (task, first command): the model's own failure first, then the drill's first mistake
    for task in names:
        if start in ("own", "both"):
            plan.append((task, ""))
        meta = tomllib.loads((known[task][0] / "task.toml").read_text()).get("metadata", {}) if task in known else {}
        if meta.get("first_mistake") and start in ("mistake", "both"):
            plan.append((task, meta["first_mistake"]))
    if not plan:
        raise RuntimeError(f"none of {', '.join(names)} has a [metadata] first_mistake to start from")
    policies = PolicyCache()
    best, best_key = None, None
    for k in range(tries):
        task, first = plan[k % len(plan)]
        req = validate_request(task=task, model="checkpoint", checkpoint=str(checkpoint.resolve()), forks=forks,
                               max_turns=turns, recovery_turns=turns, max_new_tokens=MAX_TURN_TOKENS,
                               temperature=temperature, first_command=first, task_roots=task_roots)  # fmt: skip
        policies.get(req)  # loads it once; then named for the files and the page (not by its local path)
        policies._models[req.policy_spec].name = name
        st = asyncio.run(LiveRun(req, policies.get(req)).run())
        rewards = [a.reward or 0.0 for a in st.attempts]
        print(f"  try {k + 1}: {task}{' after ' + repr(first) if first else ''}: failure {st.failure_category} at step {st.failure_step}, "
              f"main reward {st.main.reward if st.main else None}, attempt rewards {rewards}", flush=True)  # fmt: skip
        if st.error or st.main is None or not st.attempts:
            continue
        key = (max(rewards), len(st.attempts), sum(len(a.steps) for a in st.attempts))
        if best_key is None or key > best_key:
            best, best_key = (task, st), key
        if max(rewards) > 0:
            break
    if best is None:
        raise RuntimeError(f"{name}: no run reached a failure and forked attempts in {tries} tries")
    task, st = best
    dest = out / f"{task}-{name}"
    shutil.rmtree(dest, ignore_errors=True)
    st.main.save(dest / "main.json")
    for k, a in enumerate(st.attempts):
        a.save(dest / "attempts" / f"attempt-{k}.json")
    rewards = [a.reward for a in st.attempts]
    what = "a recovery" if max(r or 0 for r in rewards) > 0 else "NO recovery (the best run kept)"
    return (f"{dest.name}: {what}: failure {st.failure_category} at step {st.failure_step}, "
            f"attempt rewards {rewards}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    smoke = REPO / "outputs" / "reterm10k-smoke"
    p.add_argument("--records", type=Path, default=smoke if smoke.is_dir() else REPO / "tests/fixtures/reterm10k_mini")
    p.add_argument("--per-category", type=int, default=2)
    p.add_argument("--smollm2", action="store_true", help="also record a SmolLM2 fan-out (slow on a CPU)")
    p.add_argument("--out", type=Path, default=HERE / "examples")
    p.add_argument("--checkpoint", type=Path, help="record this trained checkpoint's own recovery instead "
                   "(examples/model-recoveries/; records and oracle cases are left as they are)")
    p.add_argument("--name", help="the checkpoint's name in the files and the page (with --checkpoint)")
    p.add_argument("--tasks", type=Path, action="append", help="task roots for --checkpoint (default: tasks/)")
    p.add_argument("--task", action="append", default=[], help="tasks to try, in order (default: all of --tasks)")
    p.add_argument("--tries", type=int, default=8, help="runs at most (with --checkpoint)")
    p.add_argument("--forks", type=int, default=4, help="recovery attempts per failure (with --checkpoint)")
    p.add_argument("--turns", type=int, default=4, help="turns of the episode and of each attempt (with --checkpoint)")
    p.add_argument("--temperature", type=float, default=0.7, help="sampling temperature (with --checkpoint)")
    p.add_argument("--start", choices=["both", "own", "mistake"], default="both",
                   help="with --checkpoint: the model's own run from the task start, the run after the drill's "
                   "first mistake typed for it, or each task both ways (own first)")
    args = p.parse_args(argv)
    if args.checkpoint is not None:
        if not args.name:
            p.error("--checkpoint needs --name (how the model is called in the page)")
        line = record_model_recovery(args.checkpoint, args.name, args.tasks or [REPO / "tasks"], args.task,
                                     args.out / "model-recoveries", args.tries, args.forks, args.turns,
                                     args.temperature, args.start)  # fmt: skip
        print(line)
        return 0
    n = copy_records(args.records, args.out / "records", args.per_category)
    print(f"records: {n} copied from {args.records.name}")
    policies = PolicyCache()
    for case in CASES + ([SMOLLM2_CASE] if args.smollm2 else []):
        print(asyncio.run(run_case(case, args.out / "recoveries", policies)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
