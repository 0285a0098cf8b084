"""Benchmark of the agent harness's own cost: how much of an episode is neither the model nor the commands.

For each configuration, episodes run on the local sandbox (``tests/fixtures/tasks/hello-file`` by default)
and the episode loop's wall time is split into:

- model generation (``policy.generate``),
- command execution (the terminal session typing a command and waiting for its result, polling included),
- lock-step wait (in a batch, an episode whose command finished first waits for the slowest one),
- **overhead**: everything else (parsing, observation formatting, trajectory bookkeeping, building the
  chat messages for the next turn, asyncio scheduling). Target: under 5% of the loop's wall time.

Configurations: a scripted policy replaying ``--turns`` quick commands (generation ~0 s, so the overhead
share is the worst case), optionally the embedded SmolLM2 model (``--smollm2``, real generation), single
episodes and a lock-step batch of ``--batch`` forks. Session start and the verifier are reported apart
(they are once per episode, not per turn). Also printed: the terminal round trip of ``true`` (the
execution floor per turn on this machine) and the load average (other processes change the figures).

Usage: ``python bench/agent_overhead.py [--task DIR] [--turns 20] [--episodes 3] [--batch 4] [--smollm2]``
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COMMANDS = ["ls -la /app", "echo $HOME", "cd /tmp && pwd", "seq 1 50 | tail -3", "python3 -c 'print(6*7)'",
            "cat /etc/os-release | head -2", "export X=1; echo $X", "false", "true", "date +%Y"]  # fmt: skip


async def _single(policy, task: Path, turns: int) -> dict:
    from reterm.agent.episode import run_episode
    from reterm.sandbox.local import LocalEnvironment

    env = LocalEnvironment.for_task(task)
    async with env:
        traj = await run_episode(policy, env, task, max_turns=turns + 1)
    return traj.metadata["timing"] | {"turns": traj.metadata["turns"]}


async def _batch(policy, task: Path, turns: int, n: int) -> list[dict]:
    from reterm.agent.episode import EpisodeSpec, run_episodes
    from reterm.sandbox.local import LocalEnvironment

    env = LocalEnvironment.for_task(task)
    async with env:
        forks = await env.fork(n)
        try:
            trajs = await run_episodes(policy, [EpisodeSpec(f, task) for f in forks], max_turns=turns + 1)
        finally:
            for f in forks:
                await f.stop(delete=True)
    return [t.metadata["timing"] | {"turns": t.metadata["turns"]} for t in trajs]


async def _true_round_trip(task: Path, n: int = 20) -> float:
    from reterm.agent.terminal import TerminalSession
    from reterm.sandbox.local import LocalEnvironment

    env = LocalEnvironment.for_task(task)
    async with env:
        s = await TerminalSession.start(env)
        t0 = time.perf_counter()
        for _ in range(n):
            await s.run("true")
        return (time.perf_counter() - t0) / n


def _row(name: str, timings: list[dict]) -> str:
    loop = sum(t["loop_s"] for t in timings)
    gen = sum(t["generation_s"] for t in timings)
    exe = sum(t["execution_s"] for t in timings)
    wait = sum(t.get("lockstep_wait_s", 0.0) for t in timings)
    over = sum(t["overhead_s"] for t in timings)
    turns = sum(t["turns"] for t in timings)
    start = statistics.mean(t["session_start_s"] for t in timings)
    verify = statistics.mean(t.get("verify_s", 0.0) for t in timings)
    return (f"| {name} | {len(timings)} | {turns} | {loop:.2f} | {gen:.2f} | {exe:.2f} | {wait:.2f} | {over:.3f} | "
            f"**{100 * over / loop:.2f}%** | {1000 * over / turns:.2f} | {start:.2f} | {verify:.2f} |")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--task", type=Path, default=REPO / "tests" / "fixtures" / "tasks" / "hello-file")
    ap.add_argument("--turns", type=int, default=20, help="bash turns per episode (then submit)")
    ap.add_argument("--episodes", type=int, default=3, help="single episodes per configuration")
    ap.add_argument("--batch", type=int, default=4, help="forks in the lock-step batch (0: skip)")
    ap.add_argument("--smollm2", action="store_true", help="also run the embedded SmolLM2 model (slow on a CPU)")
    args = ap.parse_args()

    from reterm.policies.scripted import ScriptedPolicy

    scripted = ScriptedPolicy([COMMANDS[i % len(COMMANDS)] for i in range(args.turns)])
    rows = []
    rows.append(_row("scripted, single", [asyncio.run(_single(scripted, args.task, args.turns)) for _ in range(args.episodes)]))
    if args.batch:
        rows.append(_row(f"scripted, lock-step x{args.batch}", asyncio.run(_batch(scripted, args.task, args.turns, args.batch))))
    if args.smollm2:
        from reterm.policies import load_policy

        model = load_policy("smollm2", max_new_tokens=96)
        turns = min(args.turns, 5)
        rows.append(_row("smollm2, single", [asyncio.run(_single(model, args.task, turns))]))
    floor = asyncio.run(_true_round_trip(args.task))

    print(f"# Agent harness overhead ({args.task.name}, load average {os.getloadavg()[0]:.1f}, "
          f"{os.cpu_count()} CPUs)\n")  # fmt: skip
    print("Times in seconds, summed over episodes; overhead = loop - generation - execution - lock-step wait.\n")
    print("| configuration | episodes | turns | loop | generation | execution | lock-step wait | overhead | "
          "overhead share | overhead per turn (ms) | session start (mean) | verifier (mean) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(r)
    print(f"\nTerminal round trip of `true` (execution floor per turn): {1000 * floor:.1f} ms")
    print("Target: overhead share under 5% of the loop's wall time.")


if __name__ == "__main__":
    main()
