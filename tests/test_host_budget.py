"""The host budget: every sandbox's cgroups live under one parent whose memory and pids limits are
derived from the machine, and sandboxes are admitted against it, so a GRPO group of fork bombs cannot
starve the host or each other. Real sandboxes, real fork bombs."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from reterm.sandbox.box import SANDBOXES_PER_BUDGET, budget_usage, default_pids_max
from reterm.sandbox.cgroups import host_budget
from reterm.sandbox.local import LocalEnvironment

TASK = Path(__file__).parent / "fixtures" / "tasks" / "hello-file"
G = 8


def test_budget_is_derived_from_the_machine():
    budget = host_budget()
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    total = int(Path("/proc/meminfo").read_text().split("MemTotal:")[1].split()[0]) * 1024
    assert 0 < budget.pids <= pid_max - 4096 and 0 < budget.memory_bytes <= total - (2 << 30)
    assert default_pids_max() * SANDBOXES_PER_BUDGET <= budget.pids
    usage = budget_usage()
    assert usage["pids_max"] == budget.pids and usage["memory_limit_bytes"] <= budget.memory_bytes


def test_more_sandboxes_than_the_default_share_all_start_and_share_the_pids():
    """12 sandboxes at once (more than the 8 the default limit is sized for): none waits, their pids
    limits are lowered to a fair share that adds up to the budget at most, and given back at stop."""
    from reterm.sandbox.box import live_boxes

    n = 12

    async def main():
        envs = [LocalEnvironment.for_task(TASK) for _ in range(n)]
        await asyncio.gather(*(e.start(force_build=False) for e in envs))
        try:
            mine = [e.box for e in envs]
            limits = [e.sandbox_health().pids_max for e in envs]
            running = len([b for b in live_boxes() if b.cgroups is not None])
            assert all(b.pids_max == limit for b, limit in zip(mine, limits))
            assert sum(b.pids_max for b in live_boxes() if b.cgroups is not None) <= host_budget().pids
            assert all(limit == min(default_pids_max(), host_budget().pids // running) for limit in limits), limits
            assert (await envs[-1].exec("echo ok")).stdout == "ok\n"
        finally:
            await asyncio.gather(*(e.stop(delete=True) for e in envs[1:]))
        try:
            assert envs[0].sandbox_health().pids_max == default_pids_max()  # the others' shares came back
        finally:
            await envs[0].stop(delete=True)
        return limits

    limits = asyncio.run(main())
    print(json.dumps({"sandboxes": n, "pids_max_each": limits[0], "budget_pids": host_budget().pids}))


@pytest.mark.slow
def test_a_group_of_fork_bombs_leaves_the_host_able_to_start_processes():
    async def main():
        before = budget_usage()["pids"]  # other processes may run sandboxes on this host too
        envs = [LocalEnvironment.for_task(TASK) for _ in range(G)]
        await asyncio.gather(*(e.start(force_build=False) for e in envs))
        figures = {}
        try:
            assert budget_usage()["pids_granted"] <= host_budget().pids
            # the bombs run while the host and the harness are measured (an exec's timeout kills its tree)
            # (output to /dev/null, as in the agent's terminal, where it goes to tmux, not to an exec pipe)
            bombs = [asyncio.create_task(e.exec("exec >/dev/null 2>&1; :(){ :|:& };:", timeout_sec=12)) for e in envs]
            await asyncio.sleep(1.0)
            worst_spawn = worst_tick = 0.0
            peak_pids = peak_mem = 0
            t_end = time.monotonic() + 6
            while time.monotonic() < t_end:
                t0 = time.monotonic()
                await asyncio.sleep(0.05)
                worst_tick = max(worst_tick, time.monotonic() - t0 - 0.05)  # the harness's event loop
                t0 = time.monotonic()
                subprocess.run(["true"], check=True, timeout=30)  # the host can still start processes
                worst_spawn = max(worst_spawn, time.monotonic() - t0)
                usage = budget_usage()
                peak_pids, peak_mem = max(peak_pids, usage["pids"]), max(peak_mem, usage["memory_bytes"])
            healths = [e.sandbox_health() for e in envs]
            await asyncio.gather(*bombs, return_exceptions=True)
            host_pids = sum(1 for p in os.listdir("/proc") if p.isdigit())
            figures = {"sandboxes": G, "pids_per_sandbox": [h.pids for h in healths], "budget_pids": usage["pids_max"],
                       "peak_pids_in_use": peak_pids, "peak_memory_mib": peak_mem >> 20,
                       "budget_memory_mib": usage["memory_limit_bytes"] >> 20, "host_pids_after": host_pids,
                       "worst_spawn_s": round(worst_spawn, 3), "worst_loop_lag_s": round(worst_tick, 3)}  # fmt: skip
            print(json.dumps(figures))
            # the bombs ran (on 2 cores they grow and shrink as forks fail and shells exit); each stayed
            # within its own share, and the shares together within the budget
            assert peak_pids >= G * 256, figures
            assert all(h.alive and h.pids <= h.pids_max for h in healths), healths
            assert peak_pids <= usage["pids_max"] and sum(h.pids_max for h in healths) <= usage["pids_max"]
            assert worst_spawn < 10 and worst_tick < 10
        finally:
            t0 = time.monotonic()
            await asyncio.gather(*(e.stop(delete=True) for e in envs))
            figures["stop_s"] = round(time.monotonic() - t0, 2)
        for _ in range(100):  # every bomb process is gone once the sandboxes are stopped
            if budget_usage()["pids"] <= before:
                break
            await asyncio.sleep(0.1)
        assert budget_usage()["pids"] <= before
        return figures

    figures = asyncio.run(main())
    print(json.dumps(figures))
