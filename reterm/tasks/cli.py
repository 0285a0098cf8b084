"""``reterm tasks``: check and verify task folders.

    reterm tasks check PATH [--no-build] [--json FILE]       load, build locally, solution, categories, shim
    reterm tasks verify PATH [--out DIR] [-n N] [--task NAME ...] [--limit N] [--ek KEY=VALUE ...] [--no-build-first]
                                                             build, then oracle and null agents through Harbor
                                                             on the local sandbox: build, rewards, wall times,
                                                             infrastructure faults with their reason, totals
    reterm tasks steps TASK                                  the reference solution as terminal commands
    reterm tasks decontaminate COLLECTION --benchmark DIR|terminal-bench@2.0 [...] [--ngram 8] [--threshold 0.5]
                                                             remove a training collection's tasks that are (by id)
                                                             or ask for (by instruction) benchmark tasks; writes
                                                             COLLECTION/splits.json and a report
    reterm tasks drills --out DIR --seed S --per-family N [--no-check] [--ood-families a,b]
                                                             generate recovery drills (reterm.drills) and
                                                             check each: oracle 1, null 0, first mistake 0

PATH is a task folder or a folder of task folders (Harbor / Terminal-Bench 2.x, Terminal-Bench 1
``task.yaml``, generated tasks without solution; see ``reterm.tasks.loader``).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

from reterm.drills import DEFAULT_OOD_FAMILIES, generate_drills, summary_table
from reterm.drills.check import check_drills, checks_json
from reterm.drills.multistage import add_train_instances
from reterm.tasks.decontaminate import decontaminate, load_benchmark, write_outputs
from reterm.trajectory import write_json_atomic


def _check(args: argparse.Namespace) -> int:
    from reterm.tasks.check import check_path, checks_json, checks_markdown

    checks, problems = check_path(Path(args.path), build=not args.no_build, progress=not args.quiet)
    if not checks:
        print(f"{args.path}: no task folders found", file=sys.stderr)
        return 1
    print(checks_markdown(checks, problems))
    if args.json:
        write_json_atomic(args.json, checks_json(checks, problems))
    return 0 if all(c.valid for c in checks) and not problems else 1


def _verify(args: argparse.Namespace) -> int:
    from reterm.tasks.loader import load_tasks
    from reterm.tasks.verify import verification_json, verification_markdown, verify_tasks

    root = Path(args.path)
    loaded, errors = load_tasks(root)
    # a folder the loader refused (a base image or layout the local sandbox cannot run) is a row of the table
    refused = {_task_folder(root, err.path): err.problem for err in errors}
    if args.task:
        wanted = set(args.task)
        loaded = [t for t in loaded if t.name in wanted or t.source_dir.name in wanted]
        refused = {name: why for name, why in refused.items() if name in wanted}
        missing = wanted - {t.name for t in loaded} - {t.source_dir.name for t in loaded} - set(refused)
        if missing:
            print(f"unknown task(s): {', '.join(sorted(missing))}", file=sys.stderr)
            return 2
    if args.limit:
        names = sorted([t.source_dir.name for t in loaded] + list(refused))[: args.limit]
        loaded = [t for t in loaded if t.source_dir.name in names]
        refused = {name: why for name, why in refused.items() if name in names}
    for name, why in refused.items():
        print(f"not loaded: {name}: {why}", file=sys.stderr)
    if not loaded and not refused:
        print(f"{args.path}: no task to verify", file=sys.stderr)
        return 1
    ek = {}
    for item in args.ek or []:
        key, eq, value = item.partition("=")
        if not eq or not key:
            print(f"--ek {item!r}: expected KEY=VALUE (e.g. public_network=host)", file=sys.stderr)
            return 2
        ek[key] = value
    out = Path(args.out or f"runs/tasks-verify-{time.strftime('%Y%m%d-%H%M%S')}")
    t0 = time.monotonic()
    results = asyncio.run(verify_tasks(loaded, out, n_concurrent=args.n_concurrent, progress=not args.quiet,
                                       environment_kwargs=ek, build_first=not args.no_build_first,
                                       rerun=tuple(args.task or ())))  # fmt: skip
    total = time.monotonic() - t0
    from reterm.tasks.verify import TaskVerification

    results += [TaskVerification(name, str(root / name), False, load_error=why) for name, why in refused.items()]
    results.sort(key=lambda v: v.name)
    md = verification_markdown(results, total)
    print(md)
    (out / "verify.md").write_text(md)
    write_json_atomic(out / "verify.json", verification_json(results, total))
    print(f"results: {out / 'verify.md'}, {out / 'verify.json'}", file=sys.stderr)
    return 0 if all(r.ok for r in results) and not errors else 1


def _task_folder(root: Path, path: Path) -> str:
    """The name of the task folder under ``root`` that ``path`` (a file of it, or itself) is in."""
    try:
        parts = Path(path).resolve().relative_to(root.resolve()).parts
    except ValueError:
        return Path(path).name
    return parts[0] if parts else root.name


def _steps(args: argparse.Namespace) -> int:
    from reterm.tasks.loader import load_task
    from reterm.tasks.steps import solution_steps

    for i, step in enumerate(solution_steps(load_task(args.task, check_local=False)), start=1):
        print(f"# step {i}\n{step}")
    return 0


def _drills(args: argparse.Namespace) -> int:
    def names(text: str | None) -> list[str] | None:
        return [n.strip() for n in text.split(",") if n.strip()] if text is not None else None

    ood = names(args.ood_families)
    try:
        instances = generate_drills(args.out, args.seed, args.per_family, families=names(args.families),
                                    ood_families=DEFAULT_OOD_FAMILIES if ood is None else ood,
                                    test_fraction=args.test_fraction)  # fmt: skip
        if args.multistage:
            instances += add_train_instances(args.out, args.multistage)
        for spec in args.chains or []:
            k, _, n = spec.partition(":")
            if not (k.isdigit() and n.isdigit()):
                raise ValueError(f"--chains {spec!r}: expected STAGES:N, e.g. 3:24")
            instances += add_train_instances(args.out, int(n), stages=int(k))
    except (ValueError, KeyError) as exc:
        print(f"reterm tasks drills: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {len(instances)} drills and splits.json to {args.out}", file=sys.stderr)
    print(summary_table(instances))
    if args.no_check:
        return 0

    t0 = time.monotonic()
    results = check_drills([i.path for i in instances], concurrency=args.n_concurrent, progress=not args.quiet)
    wall = time.monotonic() - t0
    report = checks_json(results, wall)
    write_json_atomic(Path(args.out) / "drills-check.json", report)
    bad = [r for r in results if not r.ok]
    print(f"check: {report['n_ok']}/{len(results)} drills sound (oracle 1.0, null 0.0, first mistake 0.0 with its "
          f"error shown, then the recovery 1.0) in {wall:.1f} s: {report['instances_per_s']:.2f} instances/s "
          f"({Path(args.out) / 'drills-check.json'})")  # fmt: skip
    disagree = sorted({(r.family, r.category, r.mistake_label) for r in results if r.ok and not r.label_agrees})
    print(f"the rule classifier labels {report['n_label_agrees']}/{len(results)} first mistakes as their family's category"
          + "".join(f"; {f}: {lab} (family: {c})" for f, c, lab in disagree))  # fmt: skip
    for r in bad:
        print(f"FAILED {r.name} (family {r.family}, seed {r.seed}, index {r.index}): {'; '.join(r.problems_found())}")
    return 1 if bad else 0


def _decontaminate(args: argparse.Namespace) -> int:
    root = Path(args.collection)
    benchmarks = [t for spec in args.benchmark for t in load_benchmark(spec)]
    report = decontaminate(root, benchmarks, ngram=args.ngram, threshold=args.threshold)
    split_file = Path(args.split_file) if args.split_file else root / "splits.json"
    report_file = Path(args.report) if args.report else root / "decontamination.json"
    write_outputs(report, split_file, report_file)
    print(report.to_markdown())
    print(f"written: {split_file} (train: {len(report.kept)} tasks), {report_file} and {report_file.with_suffix('.md')}")
    return 0 if report.kept else 1


def main(argv: list[str]) -> int:
    """Entry point of ``reterm tasks``; returns the exit status (1 when a task is invalid or fails)."""
    parser = argparse.ArgumentParser(prog="reterm tasks", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("check", help="check task folders (load, local build, solution, categories, shim)")
    p.add_argument("path")
    p.add_argument("--no-build", action="store_true", help="static checks only (no sandbox build)")
    p.add_argument("--json", help="also write the report as JSON to this file")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_check)
    p = sub.add_parser("verify", help="run oracle and null agents through Harbor on the local sandbox")
    p.add_argument("path")
    p.add_argument("--out", help="output folder (default runs/tasks-verify-<time>)")
    p.add_argument("-n", "--n-concurrent", type=int, default=2, help="trials at a time (default 2)")
    p.add_argument("--task", action="append",
                   help="only this task (repeatable); run again even when --out's verify-progress.jsonl has it")
    p.add_argument("--limit", type=int, help="only the first N tasks by name")
    p.add_argument("--ek", action="append", metavar="KEY=VALUE", help="a local-sandbox option for every trial, as "
                   "harbor's --ek (e.g. public_network=host; reterm.sandbox.local.LocalOptions); repeatable")
    p.add_argument("--no-build-first", action="store_true", help="do not build each task before its trials")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_verify)
    p = sub.add_parser("steps", help="print a task's reference solution split into terminal commands")
    p.add_argument("task")
    p.set_defaults(func=_steps)
    p = sub.add_parser("decontaminate", help="remove a training collection's benchmark overlaps (id, instruction)")
    p.add_argument("collection", help="a folder of task folders (e.g. data/endless-terminals)")
    p.add_argument("--benchmark", action="append", required=True,
                   help="a folder of benchmark task folders (harbor download terminal-bench@2.0 -o DIR) or "
                   "terminal-bench@2.0 (the shipped id list: ids only); repeatable")  # fmt: skip
    p.add_argument("--ngram", type=int, default=8, help="words per n-gram of the instruction check (default 8)")
    p.add_argument("--threshold", type=float, default=0.5,
                   help="shared share of n-grams at which a task is removed (default 0.5)")  # fmt: skip
    p.add_argument("--split-file", help="where the kept tasks go (default COLLECTION/splits.json, key train)")
    p.add_argument("--report", help="the report (default COLLECTION/decontamination.json, and .md)")
    p.set_defaults(func=_decontaminate)
    p = sub.add_parser("drills", help="generate recovery drills (small learnable tasks) and check them")
    p.add_argument("--out", required=True, help="output folder (one task folder per drill, plus splits.json)")
    p.add_argument("--seed", type=int, default=0, help="generation seed (default 0)")
    p.add_argument("--per-family", type=int, default=40, help="instances per family (default 40: with the other "
                   "defaults 450 train, 150 test, 80 test_ood)")  # fmt: skip
    p.add_argument("--families", help="comma-separated families to generate (default: all)")
    p.add_argument("--ood-families", help="comma-separated families held out whole as test_ood "
                   "(default: cwd-relative,sqlite-schema; an empty string holds out none)")  # fmt: skip
    p.add_argument("--test-fraction", type=float, default=0.25,
                   help="share of each other family's instances held out as test (default 0.25)")  # fmt: skip
    p.add_argument("--multistage", type=int, default=0, help="also write N two-stage train drills (multi-10000, ...)")
    p.add_argument("--chains", action="append", metavar="STAGES:N",
                   help="also write N train chains of STAGES stages (chain3-10000, ...; repeatable, e.g. --chains 3:24 "
                   "--chains 4:24)")  # fmt: skip
    p.add_argument("--no-check", action="store_true", help="write only; skip the sandbox check")
    p.add_argument("-n", "--n-concurrent", type=int, default=2, help="drills checked at a time (default 2)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_drills)
    args = parser.parse_args(argv)
    from reterm.tasks.loader import TaskLoadError

    try:
        return int(args.func(args) or 0)
    except (TaskLoadError, ValueError) as exc:  # e.g. a path that is not a folder: the message names it
        print(f"reterm tasks {args.cmd}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
