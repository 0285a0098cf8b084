"""Stage walls of two or more runs of ``train/run_all.sh`` side by side, e.g. the same ``--size ci`` chain on the
decoding loop and on transformers' ``model.generate``::

    RETERM_CPU_BF16=0 RETERM_FAST_DECODE=0 bash train/run_all.sh --size ci --run-dir runs/walls-generate
    RETERM_CPU_BF16=0 RETERM_FAST_DECODE=1 bash train/run_all.sh --size ci --run-dir runs/walls-loop
    python bench/stage_walls.py runs/walls-generate runs/walls-loop

Reads each run's stage records (``RUN/stages/NAME.json``, written by ``train/stages.py``: wall seconds with any
interrupted attempts, mean load, the speed settings that were set, the commit) and prints a markdown table: one
row per stage, one column per run, and each later run's wall over the first run's (``ratio`` < 1: faster). Run
the sides one after the other on an otherwise idle machine: a stage's wall includes whatever else ran beside it
(its mean load is shown). In float32 the two decoding paths produce the same greedy tokens, so the two runs'
attempts match and only the time differs; in bf16 they round differently and trajectories can part.

Ends with one JSON line: per run its folder, machine (``run_records.machine``), speed settings, and per stage
its wall; per later run the ratio per stage and over the stages both runs completed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))

from run_records import fmt_duration, machine, read_marker  # noqa: E402


def stage_records(run_dir: Path) -> dict[str, dict]:
    """``{stage: record}`` of every completed stage of ``run_dir``, in the order they finished.

    Raises:
        FileNotFoundError: ``run_dir/stages`` does not exist (not a run folder).
    """
    folder = run_dir / "stages"
    if not folder.is_dir():
        raise FileNotFoundError(f"{run_dir}: no stages/ folder (not a train/run_all.sh run folder)")
    records = {}
    for path in folder.glob("*.json"):
        if path.name.endswith((".running.json", ".failed.json")):
            continue
        rec = read_marker(run_dir, path.stem)
        if rec is not None and rec.get("wall_s") is not None:
            records[path.stem] = rec
    return dict(sorted(records.items(), key=lambda kv: str(kv[1].get("finished_at") or "")))


def speed_settings(records: dict[str, dict]) -> dict[str, str] | str:
    """The speed settings a run's stages ran with (``speed_env`` of their records): one dict when every stage
    agrees, ``"mixed"`` when they differ (a run resumed under other settings), ``"unknown"`` when no record holds
    them (records written before ``train/stages.py`` kept them)."""
    found = [r["speed_env"] for r in records.values() if isinstance(r.get("speed_env"), dict)]
    if not found:
        return "unknown"
    return found[0] if all(env == found[0] for env in found) else "mixed"


def main(argv: list[str] | None = None) -> int:
    """Print the table and the JSON line for the run folders in ``argv``; exit status 2 on a folder that is not
    a run (argparse's error)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="run folders (the first is the reference)")
    args = ap.parse_args(argv)
    if len(args.runs) < 2:
        ap.error("give at least two run folders")
    try:
        runs = [(run, stage_records(run)) for run in args.runs]
    except FileNotFoundError as e:
        ap.error(str(e))
    stages = list(dict.fromkeys(st for _, recs in runs for st in recs))
    ref = runs[0][1]

    def label(run: Path, recs: dict) -> str:
        env = speed_settings(recs)
        shown = env if isinstance(env, str) else ", ".join(f"{k}={v}" for k, v in sorted(env.items())) or "defaults"
        return f"{run.name} ({shown})"

    header = ["stage"] + [label(run, recs) for run, recs in runs] + [f"ratio {run.name}" for run, _ in runs[1:]]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    ratios: list[dict[str, float]] = [{} for _ in runs[1:]]
    for st in stages:
        cells = [st]
        for _, recs in runs:
            rec = recs.get(st)
            load = f" (load {rec['load_avg_mean']})" if rec and rec.get("load_avg_mean") is not None else ""
            cells.append(f"{fmt_duration(rec['wall_s'])}{load}" if rec else "-")
        for i, (_, recs) in enumerate(runs[1:]):
            if st in ref and st in recs and ref[st]["wall_s"]:
                ratios[i][st] = round(recs[st]["wall_s"] / ref[st]["wall_s"], 3)
            cells.append(f"{ratios[i][st]:.2f}" if st in ratios[i] else "-")
        print("| " + " | ".join(cells) + " |")
    totals = []
    for i, (_, recs) in enumerate(runs[1:]):
        both = list(ratios[i])
        a = sum(ref[st]["wall_s"] for st in both)
        b = sum(recs[st]["wall_s"] for st in both)
        totals.append(round(b / a, 3) if a else None)
        print(f"\n{runs[i + 1][0].name} over {runs[0][0].name}, the {len(both)} stages both completed: "
              f"{fmt_duration(b)} against {fmt_duration(a)} (ratio {totals[-1]})")  # fmt: skip
    print(json.dumps({
        "machine": machine(),
        "runs": [{"run": str(run), "speed_env": speed_settings(recs),
                  "commits": sorted({(r.get("git") or {}).get("commit") for r in recs.values()} - {None}),
                  "wall_s": {st: r["wall_s"] for st, r in recs.items()}} for run, recs in runs],
        "ratio": [{"run": str(runs[i + 1][0]), "stages": ratios[i], "total": totals[i]} for i in range(len(ratios))],
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
