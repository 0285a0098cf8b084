"""Rewards are checked once (reterm.rewards): the episode loop's verifier, evaluation and task
verification read them the same way; a reward that cannot be scored is a verifier fault naming the
file and the value; an agent timeout keeps its reward. Real Harbor verifier on the local sandbox."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from reterm.agent.episode import run_episode, run_verifier
from reterm.policies.scripted import ScriptedPolicy
from reterm.rewards import RewardError, scalar_reward, training_reward
from reterm.sandbox.local import LocalEnvironment
from reterm.trajectory import Outcome

HELLO = Path(__file__).parent / "fixtures" / "tasks" / "hello-file"


def _task(tmp_path: Path, test_sh: str | None = None, toml_edit: tuple[str, str] | None = None,
          solve_sh: str | None = None) -> Path:  # fmt: skip
    task = tmp_path / "task"
    shutil.copytree(HELLO, task)
    if test_sh is not None:
        (task / "tests" / "test.sh").write_text("#!/bin/bash\nmkdir -p /logs/verifier\n" + test_sh)
    if solve_sh is not None:
        (task / "solution" / "solve.sh").write_text("#!/bin/bash\n" + solve_sh)
    if toml_edit is not None:
        toml = task / "task.toml"
        toml.write_text(toml.read_text().replace(*toml_edit))
    return task


@pytest.mark.parametrize("rewards, ok", [
    ({"reward": 1}, 1.0), ({"reward": 0.0, "extra": 5}, 0.0), ({"only": 0.5}, 0.5), (None, None), ({}, None), (1, 1.0),
])  # fmt: skip
def test_scalar_reward_accepts_numbers_in_range(rewards, ok):
    assert scalar_reward(rewards, "f") == ok


@pytest.mark.parametrize("rewards, says", [
    ({"a": 1, "b": 0}, "f: several rewards ['a', 'b'] and none named 'reward'"),
    ({"reward": 1.0001}, "f: reward 'reward' is 1.0001, outside [0, 1]"),
    ({"reward": -0.5}, "f: reward 'reward' is -0.5, outside [0, 1]"),
    ({"reward": float("nan")}, "f: reward 'reward' is nan"),
    ({"reward": True}, "f: reward 'reward' is True, not a number"),
    ({"reward": "1"}, "f: reward 'reward' is '1', not a number"),
])  # fmt: skip
def test_scalar_reward_rejects_what_cannot_be_scored(rewards, says):
    with pytest.raises(RewardError) as err:
        scalar_reward(rewards, "f")
    assert says in str(err.value)


@pytest.mark.parametrize("test_sh, says", [
    ("echo 1.7 > /logs/verifier/reward.txt", "reward.txt: reward 'reward' is 1.7, outside [0, 1]"),
    ("echo '{\"a\": 1, \"b\": 0}' > /logs/verifier/reward.json", "reward.json: several rewards ['a', 'b']"),
])
def test_episode_verifier_turns_a_bad_reward_into_a_verifier_fault(tmp_path, test_sh, says):
    task = _task(tmp_path, test_sh)

    async def main():
        env = LocalEnvironment.for_task(task)
        async with env:
            traj = await run_episode(ScriptedPolicy(["true"]), env, task, trial_dir=tmp_path / "trial")
            again = await run_verifier(env, task)
            return traj, again

    traj, again = asyncio.run(main())
    assert traj.outcome is Outcome.VERIFIER_ERROR and traj.reward is None
    assert says in traj.error and str(tmp_path / "trial" / "verifier") in traj.error, traj.error
    assert again.reward is None and says in again.error


def test_task_verification_keeps_the_reward_of_an_agent_timeout(tmp_path):
    """The oracle solves the task, then overruns the agent timeout: Harbor records AgentTimeoutError,
    the verifier still runs, and its reward (1.0) is reported, not dropped."""
    from reterm.tasks.loader import load_task
    from reterm.tasks.verify import run_trial

    task = _task(tmp_path, solve_sh='echo "Hello, world!" > /app/hello.txt\nsleep 60\n',
                 toml_edit=("[agent]\ntimeout_sec = 60.0", "[agent]\ntimeout_sec = 3.0"))
    outcome = asyncio.run(run_trial(load_task(task), "oracle", tmp_path / "trials"))
    assert outcome.reward == 1.0 and outcome.error is None, outcome
    assert "AgentTimeoutError" in (tmp_path / "trials" / Path(outcome.trial_dir).name / "result.json").read_text()


def test_training_reward_scales_only_attempts_that_never_submitted():
    assert training_reward(1.0, submitted=True, unsubmitted_scale=0.5) == 1.0
    assert training_reward(1.0, submitted=False, unsubmitted_scale=0.5) == 0.5
    assert training_reward(0.0, submitted=False, unsubmitted_scale=0.5) == 0.0
    assert training_reward(1.0, submitted=False) == 1.0  # default: the verifier's reward alone
    with pytest.raises(ValueError, match="unsubmitted_reward_scale: 1.5"):
        training_reward(1.0, submitted=False, unsubmitted_scale=1.5)
