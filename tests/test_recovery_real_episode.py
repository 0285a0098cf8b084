"""Failure localisation on a real episode: the harness's terminal in the local sandbox, a scripted
policy that makes typical mistakes, the task's real verifier, then reterm.recovery.localise."""

from __future__ import annotations

import pytest
from sandbox_support import HELLO_TASK, run

from reterm.agent.episode import run_episode, run_verifier
from reterm.policies.scripted import ScriptedPolicy
from reterm.recovery import in_trial_recovery, localise
from reterm.sandbox.local import LocalEnvironment
from reterm.trajectory import Outcome

SCRIPT = [
    "which jq",                               # 0 probe answering no: not a failure
    "jq --version",                           # 1 missing tool
    "grep -q nothing_here /etc/hostname",     # 2 probe answering no
    "cat /app/config.yaml",                   # 3 missing path
    "python3 -c 'import numpy'",              # 4 missing module
    "echo 'Hello world' > /app/hello.txt",    # 5 wrong content, no visible error
    "mkdir /app && echo ok",                  # 6 already exists
    "python3",                                # 7 a REPL opened on purpose
    "print(1+1)",                             # 8 typed into the REPL
    "C-d",                                    # 9 leaves it
    "sleep 60",                               # 10 times out (timeout 3 s)
]  # then submit (11): the verifier fails the trial


@pytest.mark.slow
def test_localise_a_real_episode():
    async def episode():
        async with LocalEnvironment.for_task(HELLO_TASK) as env:
            traj = await run_episode(ScriptedPolicy(SCRIPT, timeout=3), env, HELLO_TASK, max_turns=20)
            await run_verifier(env, HELLO_TASK, traj)
        return traj

    traj = run(episode())
    assert traj.outcome is Outcome.FAILURE and traj.reward == 0.0 and len(traj.steps) == 12
    res = localise(traj)
    assert res.step_labels == ["none", "missing_dependency", "none", "path_permission", "missing_dependency", "none",
                               "wrong_state", "none", "none", "none", "timeout_hang", "premature_completion"]
    assert [(s.step, s.category) for s in res.states] == [
        (1, "missing_dependency"), (3, "path_permission"), (4, "missing_dependency"), (6, "wrong_state"),
        (10, "timeout_hang")]
    primary = res.primary
    assert primary.step == 1 and primary.evidence == "bash: jq: command not found"
    assert primary.replay_commands == ["which jq", "jq --version"] and primary.replay_timeouts == [3, 3]
    assert [s.category for s in res.select("consequential")] == [s.category for s in res.states]
    rep = in_trial_recovery([traj])
    assert rep.categories["missing_dependency"].failure_states == 2 and rep.recovered == 0
