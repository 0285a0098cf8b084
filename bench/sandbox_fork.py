"""Benchmark of the local sandbox: start, exec latency, snapshot and fork vs replay fork.

    python bench/sandbox_fork.py [--task DIR] [--forks 8] [--mb 50] [--prefixes 10,40,160] [--json out.json]
                                 [--rootless]

Prints, in one run:
  * start time of a fresh sandbox (layers cached), median of several;
  * median exec latency of ``true``;
  * snapshot time and the time to fork G live sandboxes from a state whose writable layer holds
    about ``--mb`` MB, made by a prefix of N commands, for each N in ``--prefixes``;
  * the same fork done by replay (G fresh sandboxes, each with the N-command prefix typed into the kit's
    terminal: the product's rebuild, :func:`reterm.recovery.materialize.materialize` with ``method="replay"``);
  * the ratio replay / snapshot fork.
The target: fork of 8 from a 50 MB state under 1 s, flat in the prefix length.
``--rootless`` measures rootless mode (``RETERM_SANDBOX_MODE=rootless``; as root it still uses cgroups,
as another user it falls back to rlimits); the mode in use is printed first.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from reterm.recovery.materialize import materialize  # noqa: E402
from reterm.recovery.state import Level, Source, State  # noqa: E402
from reterm.sandbox.local import LocalEnvironment  # noqa: E402
from reterm.trajectory import Action, Step  # noqa: E402

DEFAULT_TASK = REPO / "tests" / "fixtures" / "tasks" / "hello-file"


def prefix(n_commands: int, total_mb: int) -> list[str]:
    """An agent-like prefix of ``n_commands`` that leaves about ``total_mb`` MB in the writable layer."""
    cmds = ["mkdir -p /app/work && cd /app/work", "export STAGE=1"]
    writers = max(1, n_commands - len(cmds))
    kb = total_mb * 1024 // writers
    for i in range(n_commands - len(cmds)):
        cmds.append(f"head -c {kb}K /dev/urandom > blob{i}.bin && echo $STAGE > stage{i}.txt")
    return cmds[:n_commands]


async def fork_by_snapshot(task: Path, cmds: list[str], g: int) -> dict:
    async with LocalEnvironment.for_task(task) as env:
        await env.exec("\n".join(cmds), timeout_sec=600)  # the state, made by the prefix
        size = int((await env.exec("du -sm /app/work | cut -f1")).stdout)
        t0 = time.perf_counter()
        snap = await env.snapshot()
        t_snap = time.perf_counter() - t0
        forks = await LocalEnvironment.from_snapshot(snap, g)
        t_fork = time.perf_counter() - t0
        snap.release()
        check = await forks[-1].exec("ls /app/work | wc -l")
        assert int(check.stdout) == 2 * (len(cmds) - 2), check  # every blob and stage file is there
        await asyncio.gather(*(f.stop() for f in forks))
        return {"state_mb": size, "snapshot_s": t_snap, "fork_s": t_fork}


async def fork_by_replay(task: Path, cmds: list[str], g: int) -> float:
    """G environments in the state by the product's replay (:func:`reterm.recovery.materialize.materialize`,
    ``method="replay"``: each a fresh sandbox with the prefix typed into the kit's terminal, divergence checked)."""

    # the history's steps (all recorded exit 0) and their timeouts: what materialize reads
    history = [Step(index=i, model_text="", action=Action(tool="bash", command=c), exit_status=0, from_history=True)
               for i, c in enumerate(cmds)]  # fmt: skip
    state = State(id="bench", task_id=task.name, messages=[], category="other", source=Source.OWN,
                  level=Level.IN_ATTEMPT, history=history, replay_commands=list(cmds), replay_timeouts=[600.0] * len(cmds))
    t0 = time.perf_counter()
    made = await materialize(state, g, lambda tag: LocalEnvironment.for_task(task), method="replay")
    took = time.perf_counter() - t0
    assert made.diverged == 0 and len(made.environments) == g, made.detail
    await made.stop()
    return took


async def main_async(args) -> dict:
    task = Path(args.task)
    out: dict = {"forks": args.forks, "state_mb": args.mb}
    # warm the layer cache, then time fresh starts
    async with LocalEnvironment.for_task(task):
        pass
    starts = []
    for _ in range(args.starts):
        env = LocalEnvironment.for_task(task)
        t0 = time.perf_counter()
        await env.start(force_build=False)
        starts.append(time.perf_counter() - t0)
        await env.stop()
    out["start_s_median"] = statistics.median(starts)
    async with LocalEnvironment.for_task(task) as env:
        out["mode"], out["cgroups"] = env.box.mode, env.box.cgroups is not None
        lat = []
        for _ in range(args.execs):
            t0 = time.perf_counter()
            await env.exec("true")
            lat.append(time.perf_counter() - t0)
    out["exec_true_s_median"] = statistics.median(lat)
    rows = []
    for n in args.prefixes:
        cmds = prefix(n, args.mb)
        snap = await fork_by_snapshot(task, cmds, args.forks)
        rep = await fork_by_replay(task, cmds, args.forks)
        rows.append({"prefix_commands": n, **snap, "replay_fork_s": rep, "ratio": rep / snap["fork_s"]})
    out["rows"] = rows
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", default=str(DEFAULT_TASK), help="Harbor task folder (default: the hello-file fixture)")
    p.add_argument("--forks", type=int, default=8, help="G, the number of forks")
    p.add_argument("--mb", type=int, default=50, help="size of the forked state's writable layer (MB)")
    p.add_argument("--prefixes", default="10,40,160", help="prefix lengths (commands), comma-separated")
    p.add_argument("--starts", type=int, default=10, help="fresh starts to time")
    p.add_argument("--execs", type=int, default=50, help="`true` execs to time")
    p.add_argument("--json", help="also write the figures to this JSON file")
    p.add_argument("--plot", help="also draw fork time vs prefix length to this PNG file")
    p.add_argument("--rootless", action="store_true", help="run the sandboxes in rootless mode (user namespaces)")
    args = p.parse_args(argv)
    args.prefixes = [int(x) for x in args.prefixes.split(",")]
    if args.rootless:
        os.environ["RETERM_SANDBOX_MODE"] = "rootless"
    r = asyncio.run(main_async(args))
    print(f"mode: {r['mode']} ({'cgroups' if r['cgroups'] else 'no cgroups: rlimits, no freezer'}, uid {os.geteuid()})")
    print(f"fresh sandbox start (median of {args.starts}): {r['start_s_median'] * 1000:.0f} ms")
    print(f"exec `true` latency (median of {args.execs}): {r['exec_true_s_median'] * 1000:.1f} ms")
    print()
    print(f"| prefix commands | state MB | snapshot ms | fork G={args.forks} incl. snapshot ms "
          f"| replay fork G={args.forks} ms | replay / snapshot |")  # fmt: skip
    print("|---:|---:|---:|---:|---:|---:|")
    for row in r["rows"]:
        print(f"| {row['prefix_commands']} | {row['state_mb']} | {row['snapshot_s'] * 1000:.0f} | "
              f"{row['fork_s'] * 1000:.0f} | {row['replay_fork_s'] * 1000:.0f} | {row['ratio']:.1f}x |")  # fmt: skip
    first = r["rows"][0]
    ok = first["fork_s"] < 1.0
    print()
    print(f"target: fork of {args.forks} from a ~{args.mb} MB state < 1 s: "
          f"{'met' if ok else 'NOT met'} ({first['fork_s'] * 1000:.0f} ms)")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(r, indent=1))
    if args.plot:
        plot(r, args.plot)
        print(f"plot: {args.plot}")
    return 0


def plot(r: dict, path: str) -> None:
    """Fork time (snapshot vs replay) against the prefix length, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = [row["prefix_commands"] for row in r["rows"]]
    fig, ax = plt.subplots(figsize=(5, 3.2), dpi=120)
    ax.plot(n, [row["fork_s"] for row in r["rows"]], "o-", label="snapshot fork (local sandbox)")
    ax.plot(n, [row["replay_fork_s"] for row in r["rows"]], "s-", label="replay fork (any environment)")
    ax.set_xscale("log")
    ax.set_xlabel("commands in the prefix")
    ax.set_ylabel(f"seconds to fork G={r['forks']}")
    ax.set_title(f"Fork of {r['forks']} sandboxes from a ~{r['state_mb']} MB state")
    ax.set_ylim(bottom=0)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)


if __name__ == "__main__":
    sys.exit(main())
