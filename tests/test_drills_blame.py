"""The drills evaluation scores what the agent breaks as its failure (docs/SCORING.md), on the real local
sandbox through the evaluation's own attempt runner: a fork bomb's attempt counts in Pass@1's denominator,
also when the episode loop put the broken sandbox down to a host short of memory; a sandbox that never
started stays an infrastructure fault outside it."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

from reterm.eval import drills
from reterm.policies.scripted import ScriptedPolicy
from reterm.recovery.attempts import release, run_attempts
from reterm.stats import rate
from reterm.trajectory import Outcome

TASK = Path(__file__).parent / "fixtures" / "tasks" / "hello-file"
SOLVE = 'echo "Hello, world!" > /app/hello.txt'
FORK_BOMB = ":(){ :|:& };:"
RM_ROOT = "rm -rf --no-preserve-root / 2>/dev/null; echo gone"


def _pass_at_1(commands, dirs=(TASK,)):
    """Pass@1 as ``evaluate_model`` computes it, over attempts from the evaluation's runner."""

    async def main():
        atts = await drills._attempts(ScriptedPolicy(commands), list(dirs), 4, "probe", keep_failed_snapshots=True,
                                      max_turns=4, command_timeout_s=15)  # fmt: skip
        release(atts)
        return atts

    atts = asyncio.run(main())
    scored = [a for a in atts if drills._scored(a)]
    return atts, rate([a.trajectory.passed for a in scored])


@pytest.mark.slow  # two sandboxes and a fork bomb: about 10 s
def test_fork_bomb_attempt_counts_in_pass_at_1():
    atts, p = _pass_at_1([FORK_BOMB, SOLVE])
    traj = atts[0].trajectory
    if traj.outcome is Outcome.SUCCESS:  # the forks died out before anything needed a process (test_blame.py)
        assert p["n"] == 1 and p["value"] == 1.0
        return
    assert traj.outcome is Outcome.FAILURE and traj.reward == 0.0, (traj.outcome, traj.error)
    assert traj.metadata["broken_by_agent"] and traj.steps[0].command == FORK_BOMB
    assert p["n"] == 1 and p["value"] == 0.0  # in the denominator, as a failure


@pytest.mark.slow
def test_sandbox_fault_after_the_agents_command_is_its_failure_in_the_evaluation(monkeypatch):
    """On a host short of memory the episode loop calls a terminal that died after ``rm -rf /`` a sandbox
    fault (the sandbox stayed within its limits); the evaluation counts it against the agent all the same."""
    import reterm.agent.episode as episode

    monkeypatch.setattr(episode, "_host_memory_low", lambda: True)  # the host's condition, not the sandbox's

    async def raw():
        atts = await run_attempts(ScriptedPolicy([RM_ROOT, SOLVE]), [TASK], max_turns=4, command_timeout_s=15)
        release(atts)
        return atts[0].trajectory

    loop_says = asyncio.run(raw())
    assert loop_says.outcome is Outcome.SANDBOX_ERROR and "short of memory" in loop_says.error, loop_says.error
    atts, p = _pass_at_1([RM_ROOT, SOLVE])
    traj = atts[0].trajectory
    assert traj.outcome is Outcome.FAILURE and traj.reward == 0.0 and traj.stop_reason == "sandbox_broken"
    assert "the sandbox stopped working" in traj.metadata["broken_by_agent"]
    assert "short of memory" in traj.metadata["sandbox_error"]
    assert p["n"] == 1 and p["value"] == 0.0


def test_sandbox_that_never_started_stays_outside_pass_at_1(tmp_path):
    task = tmp_path / "unbuildable"
    (task / "environment").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "task.toml").write_text('version = "1.0"\n[environment]\nnetwork_mode = "no-network"\n')
    (task / "instruction.md").write_text("do it\n")
    (task / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    (task / "environment" / "Dockerfile").write_text(f"FROM debian:bookworm-slim\nRUN echo {uuid.uuid4().hex}; exit 3\n")
    atts, p = _pass_at_1([SOLVE], dirs=(task,))
    assert atts[0].trajectory.outcome is Outcome.SANDBOX_ERROR and not drills._scored(atts[0])
    assert drills.agent_broke_sandbox(atts[0].trajectory) is None and p["n"] == 0


@pytest.mark.slow
def test_a_journaled_attempt_that_broke_its_sandbox_is_reused_as_the_agents_failure(monkeypatch, tmp_path):
    """The evaluation's journal keeps the blamed failure (it never had a snapshot to fork): a resumed run reuses
    it as it is instead of attempting the task again."""
    import reterm.agent.episode as episode

    monkeypatch.setattr(episode, "_host_memory_low", lambda: True)
    journal = tmp_path / drills.JOURNAL
    ran: list[int] = []
    real = drills.run_attempts

    async def counted(policy, dirs, **kw):
        ran.append(len(dirs))
        return await real(policy, dirs, **kw)

    monkeypatch.setattr(drills, "run_attempts", counted)

    async def main():
        atts = await drills._attempts(ScriptedPolicy([RM_ROOT, SOLVE]), [TASK], 4, "probe", journal=journal,
                                      keep_failed_snapshots=True, max_turns=4, command_timeout_s=15)  # fmt: skip
        release(atts)
        return atts[0]

    first = asyncio.run(main())
    assert first.trajectory.metadata["broken_by_agent"] and first.snapshot is None and ran == [1]
    again = asyncio.run(main())
    assert ran == [1]  # nothing attempted the second time
    assert again.trajectory.outcome is Outcome.FAILURE and again.trajectory.metadata["broken_by_agent"]


@pytest.mark.slow
def test_an_own_attempt_that_broke_its_sandbox_counts_from_the_start_but_is_no_state(tmp_path):
    """Building the own multi-stage failure states: an attempt that wrecked its sandbox is a failure of Pass@1 from
    the start, and not a failure state (it has no snapshot to fork); the build goes on without it."""
    from reterm.drills.multistage import DEFAULT_STAGE_FAMILIES

    async def main():
        return await drills.build_multistage_states(
            ScriptedPolicy([RM_ROOT]), "wrecker", tmp_path / "ms", 1, families=DEFAULT_STAGE_FAMILIES[:2], batch=2,
            max_tasks=2, max_turns=3, command_timeout_s=15)  # fmt: skip

    data = asyncio.run(main())
    assert data["n_tasks"] == 2 and data["n_states"] == 0 and data["items"] == []
    assert data["pass_at_1_from_start"]["n"] == 2 and data["pass_at_1_from_start"]["value"] == 0.0
