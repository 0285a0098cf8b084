"""Benchmark of the recovery drills: how fast instances are written, and checked in the local sandbox.

Writes ``--per-family`` instances of every family (``reterm.drills.generate_drills``) into a temporary
folder, then checks them (``reterm.drills.check.check_drills``: per instance three fresh sandboxes, the
oracle, the null agent and the first mistake, each followed by the verifier) and, with ``--harbor N``,
also runs Harbor trials (oracle and nop, ``reterm tasks verify``'s code) on the first N instances for
comparison. Prints instances per second and the load average (other processes change the figures), and
ends with one JSON line.

Usage: ``python bench/drills.py [--per-family 4] [--concurrency 2] [--harbor 8] [--seed 0]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--per-family", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--harbor", type=int, default=0, help="also run Harbor trials on the first N instances")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    from reterm.drills import generate_drills
    from reterm.drills.check import check_drills

    with tempfile.TemporaryDirectory(prefix="reterm-bench-drills-") as tmp:
        out = Path(tmp) / "drills"
        t0 = time.monotonic()
        instances = generate_drills(out, args.seed, args.per_family)
        gen_s = time.monotonic() - t0
        print(f"generate: {len(instances)} instances in {gen_s:.2f} s ({len(instances) / gen_s:.0f} instances/s)")
        load0 = os.getloadavg()[0]
        t0 = time.monotonic()
        results = check_drills([i.path for i in instances], concurrency=args.concurrency, progress=False)
        check_s = time.monotonic() - t0
        n_ok = sum(r.ok for r in results)
        print(f"check: {n_ok}/{len(results)} sound in {check_s:.1f} s ({len(results) / check_s:.2f} instances/s, "
              f"concurrency {args.concurrency}, load average {load0:.1f} -> {os.getloadavg()[0]:.1f})")  # fmt: skip
        figures = {"instances": len(instances), "generate_per_s": len(instances) / gen_s, "check_s": check_s,
                   "check_per_s": len(results) / check_s, "check_ok": n_ok, "concurrency": args.concurrency}  # fmt: skip
        if args.harbor:
            from reterm.tasks import load_task
            from reterm.tasks.verify import verify_tasks

            loaded = [load_task(i.path) for i in instances[: args.harbor]]
            t0 = time.monotonic()
            verified = asyncio.run(verify_tasks(loaded, Path(tmp) / "verify", n_concurrent=args.concurrency,
                                                progress=False))  # fmt: skip
            harbor_s = time.monotonic() - t0
            print(f"harbor trials (oracle + nop): {sum(v.ok for v in verified)}/{len(verified)} sound in "
                  f"{harbor_s:.1f} s ({len(verified) / harbor_s:.2f} instances/s)")  # fmt: skip
            figures.update(harbor_instances=len(verified), harbor_per_s=len(verified) / harbor_s)
        figures["load_average"] = os.getloadavg()[0]
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
