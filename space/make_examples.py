"""Write the replay examples bundled with the Space (``space/examples/``), from real runs.

    python space/make_examples.py [--records DIR] [--smollm2] [--out space/examples]

- ``examples/records/``: a few ReTerm-10K records (at most ``--per-category`` per error category) copied from
  ``--records`` (default: the smoke dataset if ``outputs/reterm10k-smoke`` exists, else the test fixture), in
  the published layout (``data/train-00000-of-00001.parquet``, :data:`reterm.record_features.FEATURES`).
- ``examples/recoveries/<case>/``: live runs of this app (:class:`live_run.LiveRun`: the local sandbox, a
  user-typed mistake, the failure detected, the sandbox forked into G attempts, each verified), saved as
  ``main.json`` + ``attempts/attempt-K.json``: the scripted oracle on two suite tasks, and with ``--smollm2``
  the embedded SmolLM2 (a few minutes on 2 CPU cores).

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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    smoke = REPO / "outputs" / "reterm10k-smoke"
    p.add_argument("--records", type=Path, default=smoke if smoke.is_dir() else REPO / "tests/fixtures/reterm10k_mini")
    p.add_argument("--per-category", type=int, default=2)
    p.add_argument("--smollm2", action="store_true", help="also record a SmolLM2 fan-out (slow on a CPU)")
    p.add_argument("--out", type=Path, default=HERE / "examples")
    args = p.parse_args(argv)
    n = copy_records(args.records, args.out / "records", args.per_category)
    print(f"records: {n} copied from {args.records.name}")
    policies = PolicyCache()
    for case in CASES + ([SMOLLM2_CASE] if args.smollm2 else []):
        print(asyncio.run(run_case(case, args.out / "recoveries", policies)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
