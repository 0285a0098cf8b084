"""Blame where it belongs (docs/SCORING.md), on the real local sandbox with its default limits: what
the agent breaks is its failure (reward 0, the command recorded as a step) or, where the terminal
survives, something it can recover from; what the host or the harness does stays an infrastructure
fault; the evaluation report of real Harbor trials counts the agent's breakage as failures."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from reterm.agent.episode import BROKEN_KEY, run_episode, run_verifier
from reterm.policies.scripted import ScriptedPolicy
from reterm.sandbox.local import DEFAULT_MEMORY_MB, LocalEnvironment
from reterm.trajectory import Outcome

TASK = Path(__file__).parent / "fixtures" / "tasks" / "hello-file"
SOLVE = 'echo "Hello, world!" > /app/hello.txt'
FORK_BOMB = ":(){ :|:& };:"
PIDS_HOG = "while :; do sleep 600 & done"  # holds every pid it gets: no race with the forks dying out
RM_ROOT = "rm -rf --no-preserve-root / 2>/dev/null; echo gone"
REPLACE_LOGS = "rm -rf /logs && echo mine > /logs"


def _episode(commands, **kwargs):
    async def main():
        env = LocalEnvironment.for_task(TASK)
        async with env:
            traj = await run_episode(ScriptedPolicy(commands), env, TASK, command_timeout_s=30, **kwargs)
            return traj, env.sandbox_health()

    return asyncio.run(main())


def _assert_broken(traj, commands_run, says):
    assert traj.outcome is Outcome.FAILURE and traj.reward == 0.0, (traj.outcome, traj.error)
    assert traj.stop_reason == "sandbox_broken" and traj.error is None
    assert [s.command for s in traj.steps] == commands_run  # the command that broke it is a step
    assert says in traj.metadata[BROKEN_KEY], traj.metadata[BROKEN_KEY]


def test_fork_bomb_is_an_agent_failure_with_the_command_recorded():
    """The fork bomb's own command is a step. Its background forks can exhaust the pids limit after
    the shell has already returned (a race that depends on the host's load): then the breakage shows on
    the next command, or only at the probe before the verifier once the agent has submitted (the
    ``None`` step); every such order is scored as the agent's failure, with the pids limit named.
    Under load the forks can also die out before anything else needed a process (seen once in CI,
    through Harbor): then nothing is broken, the task's own command passes and the attempt is the
    success it is, like a memory hog that was OOM-killed."""
    traj, health = _episode([FORK_BOMB, SOLVE])
    ran = [s.command for s in traj.steps]
    assert "pids" in health.limits_hit and health.alive
    if traj.outcome is Outcome.SUCCESS:  # the forks died out: nothing was left broken (by the probe, if any)
        assert ran in ([FORK_BOMB, SOLVE], [FORK_BOMB, SOLVE, None]), ran
        assert traj.reward == 1.0 and BROKEN_KEY not in traj.metadata
        return
    assert ran in ([FORK_BOMB], [FORK_BOMB, SOLVE], [FORK_BOMB, SOLVE, None]), ran
    _assert_broken(traj, ran, "the sandbox ran out of pids")
    if ran[-1] is not None:  # seen while a command ran: that step says so
        assert traj.steps[-1].observation.startswith("[the sandbox stopped working:")


def test_holding_every_pid_is_an_agent_failure_with_the_command_recorded():
    """Background processes that keep the pids the agent's loop took: the terminal cannot run its next
    command, so the attempt is the agent's failure at the command that did it, the pids limit named."""
    traj, health = _episode([PIDS_HOG, SOLVE])
    _assert_broken(traj, [PIDS_HOG], "the sandbox ran out of pids")
    assert traj.steps[-1].observation.startswith("[the sandbox stopped working:")
    assert "pids" in health.limits_hit and health.alive


def test_rm_rf_root_is_an_agent_failure_with_the_command_recorded():
    traj, _ = _episode([RM_ROOT, SOLVE])
    _assert_broken(traj, [RM_ROOT], "the terminal failed after this command")


def test_replacing_logs_is_an_agent_failure_although_the_terminal_survives():
    traj, _ = _episode([REPLACE_LOGS, SOLVE])
    # the terminal survived, so the agent went on; the verifier cannot run: the agent's doing
    _assert_broken(traj, [REPLACE_LOGS, SOLVE, None], "/logs/verifier cannot be made writable")
    assert traj.steps[0].exit_status == 0 and traj.steps[1].exit_status == 0


def test_kill_minus_one_is_survived_and_the_recovery_passes():
    traj, _ = _episode(["kill -9 -1", SOLVE])
    assert traj.outcome is Outcome.SUCCESS and traj.reward == 1.0
    assert "a new shell was started" in traj.steps[0].extra["terminal_restarted"]
    assert BROKEN_KEY not in traj.metadata


@pytest.mark.slow
def test_disk_fill_says_no_space_before_the_memory_limit_and_the_recovery_passes():
    """Default limits: the writable layer (a tmpfs counted against memory) is smaller than the memory
    limit, so `dd` ends with ENOSPC, nothing is OOM-killed and the shell survives to clean up."""
    fill = "dd if=/dev/zero of=/big bs=1M 2>&1 | grep -o 'No space left on device'; df -m / | tail -1"
    traj, health = _episode([fill, "rm /big && echo freed", SOLVE])
    assert traj.outcome is Outcome.SUCCESS and traj.reward == 1.0, (traj.outcome, traj.metadata.get(BROKEN_KEY))
    assert "No space left on device" in traj.steps[0].observation and traj.steps[0].exit_status == 0
    assert traj.steps[1].observation.startswith("freed") and "terminal_restarted" not in traj.steps[0].extra
    assert health.oom_events == 0 and health.memory_limit_bytes == DEFAULT_MEMORY_MB * 2**20
    assert health.storage_limit_bytes < health.memory_limit_bytes
    assert health.memory_peak_bytes < health.memory_limit_bytes


def test_a_sandbox_ended_by_the_host_stays_an_infrastructure_fault():
    """The harness (standing in for the host) ends the sandbox after the agent's first command: the
    next command fails, and that is not the agent's doing."""
    async def main():
        env = LocalEnvironment.for_task(TASK)
        await env.start(force_build=False)
        stops = []

        def stop_after_first_step(i, traj, step):
            stops.append(asyncio.get_running_loop().create_task(env.stop(delete=True)))

        traj = await run_episode(ScriptedPolicy(["true", SOLVE]), env, TASK, on_step=stop_after_first_step)
        await asyncio.gather(*stops)
        return traj

    traj = asyncio.run(main())
    assert traj.outcome is Outcome.SANDBOX_ERROR and traj.reward is None and BROKEN_KEY not in traj.metadata
    assert "the sandbox itself ended" in traj.error


@pytest.mark.slow
def test_evaluation_report_counts_what_the_agent_broke_as_failures(tmp_path):
    """Real Harbor trials (ReTermAgent replaying each task's solve.sh on the local sandbox): processes
    holding every pid, `rm -rf /` and a replaced /logs leave a sandbox the verifier cannot use, and the
    report scores them as agent failures, not infrastructure faults. (The pids case holds its pids:
    a classic fork bomb can die out before the verifier runs, see the fork-bomb test.)"""
    from reterm.eval.metrics import load_job, summarize

    dataset = tmp_path / "tasks"
    for name, command in (("pids", PIDS_HOG), ("rmroot", RM_ROOT), ("logs", REPLACE_LOGS)):
        task = dataset / f"hello-{name}"
        shutil.copytree(TASK, task)
        (task / "solution" / "solve.sh").write_text(f"#!/bin/bash\n{command}\n{SOLVE}\n")
    args = [str(Path(sys.executable).parent / "harbor"), "run", "-p", str(dataset),
            "-a", "reterm.agent.harbor:ReTermAgent", "--ak", "policy=oracle", "--ak", "command_timeout=20",
            "-e", "reterm.sandbox.local:LocalEnvironment", "-o", str(tmp_path / "jobs"), "-y", "-n", "1"]  # fmt: skip
    proc = subprocess.run(args, capture_output=True, text=True, cwd=tmp_path, timeout=900,
                          env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"})  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (job_dir,) = (tmp_path / "jobs").iterdir()
    job = load_job(job_dir)
    assert len(job.trials) == 3 and not job.incomplete
    for t in job.trials:
        assert t.outcome is Outcome.FAILURE and t.reward == 0.0 and t.scored, (t.trial, t.outcome, t.exception_type)
        assert t.broken_by_agent
        meta = json.loads((Path(t.trial_dir) / "result.json").read_text())["agent_result"]["metadata"]
        assert meta["stop_reason"] == "sandbox_broken"
    summary = summarize(job.trials, job.incomplete)
    assert summary["broken_by_agent"] == 3 and summary["infra_faults"]["n"] == 0
    assert summary["pass_at_1"]["n_trials"] == 3 and summary["pass_at_1"]["mean"] == 0.0


@pytest.mark.slow
def test_memory_hog_is_oom_killed_and_the_recovery_passes():
    """Default limits: a command that allocates past the memory limit is killed (exit 137), the
    terminal survives (its processes are small; the kernel kills the largest), and the agent goes on."""
    hog = "python3 -c 'b = bytearray(6 << 30)'"
    traj, health = _episode([hog, SOLVE])
    assert traj.outcome is Outcome.SUCCESS and traj.reward == 1.0, (traj.outcome, traj.metadata.get(BROKEN_KEY))
    assert traj.steps[0].exit_status == 137, traj.steps[0].observation
    assert health.oom_events >= 1 and "memory" in health.limits_hit


def test_an_attempt_that_broke_its_sandbox_is_no_failure_state():
    """Attempt-level runs (the release protocol) score it 0 and keep no snapshot to recover from."""
    from reterm.recovery.attempts import release, run_attempts

    (attempt,) = asyncio.run(run_attempts(ScriptedPolicy([REPLACE_LOGS]), [TASK], keep_failed_snapshots=True))
    try:
        assert attempt.trajectory.outcome is Outcome.FAILURE and attempt.trajectory.reward == 0.0
        assert attempt.trajectory.metadata[BROKEN_KEY] and attempt.snapshot is None
    finally:
        release([attempt])


def test_a_verifier_fault_after_the_agent_ran_out_of_pids_is_the_agents_failure(tmp_path):
    """The fourth order of the fork-bomb race: by the time the verifier runs, the forks are gone and the
    probe passes, but the verifier still failed (Harbor's ``DownloadVerifierDirError`` under the pids
    limit). A sandbox that ran into its own limits makes a following verifier fault the agent's.
    The burst runs through ``exec`` between the episode and the verifier: through the terminal it
    races the harness's own polling."""
    task = tmp_path / "task"
    shutil.copytree(TASK, task)
    (task / "tests" / "test.sh").write_text("#!/bin/bash\necho 'no reward written'\n")
    burst = "(for i in $(seq 60); do sleep 1 & done; wait) 2>/dev/null; echo waited"

    async def main(burst_first):
        env = LocalEnvironment.for_task(task, pids_max=48)
        async with env:
            traj = await run_episode(ScriptedPolicy([SOLVE]), env, task, verify=False)
            if burst_first:
                assert "waited" in (await env.exec(burst, timeout_sec=60)).stdout
            outcome = await run_verifier(env, task, traj)
            return traj, outcome, env.sandbox_health()

    traj, outcome, health = asyncio.run(main(True))
    assert "pids" in health.limits_hit and health.alive
    assert traj.outcome is Outcome.FAILURE and traj.reward == 0.0 and traj.stop_reason == "sandbox_broken"
    assert "the verifier could not run" in outcome.broken_by_agent and "ran out of pids" in traj.metadata[BROKEN_KEY]

    traj, outcome, health = asyncio.run(main(False))  # the same verifier fault within the limits: the verifier's
    assert health.limits_hit == [] and traj.outcome is Outcome.VERIFIER_ERROR and outcome.broken_by_agent is None
