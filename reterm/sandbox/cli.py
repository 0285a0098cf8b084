"""``reterm sandbox``: prepare the local sandbox's base, sweep leftovers, list what is cached.

    reterm sandbox prepare [--task DIR ...]   build the Debian base (and task layers) if missing
                                              (without root: in a user namespace, see rootless.py)
    reterm sandbox sweep [--snapshots]        remove leftovers of crashed runs (and unused snapshots)
    reterm sandbox list                       cached base, layers, snapshots and running sandboxes
    reterm sandbox exec TASK_DIR COMMAND      run one command in a fresh sandbox of a task (debugging)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from pathlib import Path

from reterm.sandbox.base_image import ensure_base
from reterm.sandbox.paths import cache_root, sub
from reterm.sandbox.preflight import missing_tools
from reterm.sandbox.rootless import rootless_problems, sandbox_mode
from reterm.sandbox.snapshot import list_snapshots
from reterm.sandbox.sweep import live_sandbox_states, sweep


def _log(msg: str) -> None:
    print(f"[sandbox] {msg}", file=sys.stderr, flush=True)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="reterm sandbox", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    verbs = parser.add_subparsers(dest="cmd", required=True)
    p = verbs.add_parser("prepare", help="build the cached Debian base root filesystem (debootstrap) if missing")
    p.add_argument("--task", action="append", default=[], help="also build this task's layer (repeatable)")
    p = verbs.add_parser("sweep", help="remove leftovers of crashed runs")
    p.add_argument("--snapshots", action="store_true", help="also delete snapshots no running sandbox uses")
    verbs.add_parser("list", help="show the cache")
    p = verbs.add_parser("exec", help="run a command in a fresh sandbox of a task and print its output")
    p.add_argument("task_dir")
    p.add_argument("command")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[sandbox] %(message)s")

    if args.cmd == "prepare":
        if missing := missing_tools():
            _log(f"missing: {', '.join(missing)}")
            return 1
        sweep(log=_log)
        base = ensure_base(log=_log)
        _log(f"base {base.key} ready: {base.rootfs}")
        if args.task:
            from reterm.sandbox.build import ensure_layer

            async def build_all() -> None:
                for t in args.task:
                    from harbor.models.task.task import Task

                    task = Task(t, disable_verification=True)
                    layer = await ensure_layer(task.paths.environment_dir, base,
                                               docker_image=task.config.environment.docker_image, log=_log)  # fmt: skip
                    _log(f"{t}: layer {layer.key}")

            asyncio.run(build_all())
        return 0
    if args.cmd == "sweep":
        counts = sweep(snapshots=args.snapshots, log=_log)
        print(json.dumps(counts))
        return 0
    if args.cmd == "list":
        mode = sandbox_mode()
        problems = "; ".join(rootless_problems()) if mode == "rootless" else ""
        print(f"cache: {cache_root()}")
        print(f"mode: {mode}" + (f" (cannot start here: {problems})" if problems else ""))
        for meta in sorted(sub("base").glob("*.json")):
            m = json.loads(meta.read_text())
            print(f"base {m['key']}: {m['suite']} {len(m['packages'])} packages, built in {m['build_s']} s")
        for d in sorted(sub("layers").iterdir()):
            if (d / "meta.json").is_file():
                m = json.loads((d / "meta.json").read_text())
                print(f"layer {d.name}: FROM {m.get('from')} ({m.get('dockerfile')})")
        for s in list_snapshots():
            print(f"snapshot {s.id}: {s.meta.get('size_bytes', 0) / 2**20:.1f} MiB from {s.meta.get('source')}"
                  f"{' (released)' if s.released else ''}, {len(list((s.path / 'leases').iterdir()))} users")  # fmt: skip
        for st in live_sandbox_states():
            print(f"running {st['id']}: owner pid {st['owner_pid']}")
        return 0
    if args.cmd == "exec":
        from reterm.sandbox.local import LocalEnvironment

        async def run() -> int:
            async with LocalEnvironment.for_task(Path(args.task_dir)) as env:
                r = await env.exec(args.command)
                sys.stdout.write(r.stdout or "")
                sys.stderr.write(r.stderr or "")
                return r.return_code

        return asyncio.run(run())
    return 2
