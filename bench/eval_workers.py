"""Benchmark of ``python -m eval.drills --workers N``: the same evaluation with the models one after the other in
one process, and N at a time in N processes.

An evaluation process leaves cores idle: between turns it waits for the sandboxes, and a batch's decode of a few
rows uses its threads poorly. ``--workers N`` runs N models at once, each in its own process with
``cpus / N`` threads (``OMP_NUM_THREADS`` overrides). This times the sides on the same items: Pass@1 on
``--max-id`` held-out drills and Recovery@1 from ``--n-states`` two-stage failure states of the first ``--model``,
built once here before the sides run (or the first ones of an existing, kept set: ``--states
RUN/eval/multistage`` after ``eval.drills ... --keep-states``) and copied into each side's output folder, so that
no side builds states and all recover from the very same ones. States built here are released at the end; a
``--states`` set is left as it was. The sides run one after the other, in the order given, each as its own
``eval.drills`` process.

Measured (2026-12-06, 2 cores, the SFT and ReTerm-GRPO checkpoints of a run, 24 + 24 attempts each): one process
of 2 threads 248.7 s, two workers of 1 thread 203.9 s (1.22x), of 2 threads 204.8 s (1.21x).

Prints a table (workers, threads per process, wall seconds, attempts per minute) and one JSON line with each
side's wall and ``speedup`` (the first side's wall over each side's) and whether the sides' per-item results
agree (``same_items``: greedy decoding; bf16 rounding in other batch shapes may flip a near-tie).

Usage: ``python bench/eval_workers.py --tasks RUN/drills --states RUN/eval/multistage --model sft=hf:RUN/sft/merged
--model grpo=hf:RUN/grpo-reterm/merged [--max-id 32] [--n-states 32] [--side 1x2 --side 2x1 --side 2x2]``
(with ``--states``, one ``--model`` must carry the name of its state model, ``state_model`` in ``states.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from reterm.eval.drills import release_multistage  # noqa: E402


def build_states(args: argparse.Namespace, folder: Path) -> Path:
    """Build ``--n-states`` two-stage failure states of the first ``--model`` in ``folder`` (as ``eval.drills``
    does: its attempts from the start of held-out two-stage drills); returns ``folder``."""
    import asyncio

    from reterm.eval.drills import build_multistage_states, multistage_families
    from reterm.generation import MAX_CONSECUTIVE_PARSE_ERRORS, apply_thread_policy, policy_defaults
    from reterm.policies import load_policy

    apply_thread_policy()
    name, _, spec = args.model[0].partition("=")
    print(f"{args.n_states} two-stage failure states of {name} ...", flush=True)
    policy = load_policy(spec, **policy_defaults(spec, max_new_tokens=args.max_new_tokens), seed=0)
    asyncio.run(build_multistage_states(policy, name, folder, args.n_states, families=multistage_families(args.tasks),
                                        batch=32, max_turns=args.max_turns,
                                        max_consecutive_parse_errors=MAX_CONSECUTIVE_PARSE_ERRORS))  # fmt: skip
    del policy
    return folder


def seed_states(src: Path, dst: Path, n: int) -> str:
    """Copy the kept two-stage set ``src`` (its ``tasks/`` and the first ``n`` items of ``states.json``) to
    ``dst``; returns its state model's name. Raises ``SystemExit`` naming ``src`` when it has fewer than ``n``
    usable states or was released."""
    data = json.loads((src / "states.json").read_text())
    if data.get("released") or len(data.get("items", [])) < n:
        raise SystemExit(f"bench/eval_workers.py: --states {src}: released or fewer than {n} states "
                         "(evaluate with --keep-states first)")  # fmt: skip
    dst.mkdir(parents=True)
    shutil.copytree(src / "tasks", dst / "tasks")
    items = data["items"][:n]
    (dst / "states.json").write_text(json.dumps(data | {"items": items, "n_requested": n, "n_states": n}))
    return data["state_model"]


def run_side(args: argparse.Namespace, workers: int, threads: int, out: Path) -> dict:
    state_model = seed_states(args.states, out / "multistage", args.n_states)
    names = [m.partition("=")[0] for m in args.model]
    if state_model not in names:
        raise SystemExit(f"bench/eval_workers.py: no --model named {state_model!r}, the state model of {args.states}")
    cmd = [sys.executable, "-m", "reterm.eval.drills", "--tasks", str(args.tasks), "--output", str(out),
           *[x for m in args.model for x in ("--model", m)], "--max-id", str(args.max_id), "--max-ood", "0",
           "--max-states", "0", "--own-items", "0", "--k-max", "1", "--max-turns", str(args.max_turns),
           "--max-new-tokens", str(args.max_new_tokens), "--multistage-states", str(args.n_states),
           "--states-from", state_model, "--keep-states", "--workers", str(workers)]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS=str(threads))
    t0 = time.monotonic()
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.monotonic() - t0
    if done.returncode:
        raise SystemExit(f"bench/eval_workers.py: --workers {workers} failed ({done.returncode}):\n"
                         f"{done.stderr[-3000:]}")  # fmt: skip
    per = {n: json.loads((out / n / "per_item.json").read_text()) for n in names}
    attempts = sum(len(v) for p in per.values() for v in p.values())
    return {"workers": workers, "threads": threads, "wall_s": round(wall, 1), "attempts": attempts,
            "per_item": per}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", type=Path, required=True, help="the run's drills folder (RUN/drills)")
    p.add_argument("--states", type=Path, default=None, help="a kept two-stage set (RUN/eval/multistage)")
    p.add_argument("--model", action="append", required=True, metavar="NAME=SPEC")
    p.add_argument("--max-id", type=int, default=32)
    p.add_argument("--n-states", type=int, default=32)
    p.add_argument("--max-turns", type=int, default=5)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--side", action="append", default=None, metavar="WxT",
                   help="a side to time: W workers of T threads each (default: 1xC and 2x(C/2), C the cpus)")
    a = p.parse_args(argv)
    a.tasks = a.tasks.resolve()
    cpus = os.cpu_count() or 1
    sides = []
    with tempfile.TemporaryDirectory() as tmp:
        built = None
        if a.states is None:
            a.states = built = build_states(a, Path(tmp) / "states")
        a.states = a.states.resolve()
        for side in a.side or [f"1x{cpus}", f"2x{max(1, cpus // 2)}"]:
            w, _, t = side.partition("x")
            if not (w.isdigit() and t.isdigit() and int(w) > 0 and int(t) > 0):
                raise SystemExit(f"bench/eval_workers.py: --side {side!r}: expected WxT, e.g. 2x1")
            print(f"--workers {w}, {t} threads each ...", flush=True)
            try:
                sides.append(run_side(a, int(w), int(t), Path(tmp) / f"side-{side}"))
            except BaseException:
                if built is not None:
                    release_multistage(built)
                raise
        if built is not None:
            release_multistage(built)
    print(f"\neval.drills, {len(a.model)} models, {a.max_id} Pass@1 items + {a.n_states} two-stage recoveries each "
          f"(cpus {os.cpu_count()}, load average {os.getloadavg()[0]:.1f})\n")  # fmt: skip
    print("| workers | threads each | wall s | attempts/min |\n|---:|---:|---:|---:|")
    for s in sides:
        print(f"| {s['workers']} | {s['threads']} | {s['wall_s']} | {60 * s['attempts'] / s['wall_s']:.1f} |")
    first = sides[0]
    print(json.dumps({f"{s['workers']}x{s['threads']}": {"wall_s": s["wall_s"],
                                                           "speedup": round(first["wall_s"] / s["wall_s"], 2)}
                      for s in sides} | {"same_items": all(s["per_item"] == first["per_item"] for s in sides)}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
