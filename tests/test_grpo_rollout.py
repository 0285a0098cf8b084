"""Group rollouts on the local sandbox (reterm.training.grpo_rollout): the replay fork used for other
Harbor environments (each attempt's environment rebuilt by replaying the prefix), the shell state the
prefix left (cwd) carried into the attempts, and a prefix whose replay diverges: the group is dropped,
counted, and its attempts carry no reward."""

from __future__ import annotations

from pathlib import Path

import pytest
from datasets import load_dataset
from sandbox_support import run
from transformers import AutoTokenizer

from reterm.policies.scripted import assistant_turns, bash_call, submit_call
from reterm.sandbox.box import live_boxes
from reterm.training.failure_pool import PoolState, SnapshotCache, seed_states_from_records
from reterm.training.grpo_policy import TokenTrajectoryPolicy, scripted_generate_fn
from reterm.training.grpo_rollout import RolloutEngine, RolloutSettings
from reterm.training.models import resolve_model_name_or_path

FIXTURES = Path(__file__).resolve().parent / "fixtures"


@pytest.fixture(scope="module")
def states():
    records = load_dataset(str(FIXTURES / "grpo_seed"), split="train")
    out, _ = seed_states_from_records(records.select(range(2)), ["tasks", str(FIXTURES / "tasks")])
    return out  # [hello-file: `ls /app` then a write to /ap/, hello-file: `cd /app` then `catt hello.txt`]


@pytest.fixture(scope="module")
def policy():
    tok = AutoTokenizer.from_pretrained(resolve_model_name_or_path("smollm2"))

    def reply(chain_id: int, messages: list[dict]) -> str:
        # after the prefix: print the working directory, then submit
        return bash_call("pwd") if assistant_turns(messages) in (2,) else submit_call()

    return TokenTrajectoryPolicy(tok, scripted_generate_fn(tok, reply), max_turn_tokens=32, max_completion_tokens=512)


def _tampered(state: PoolState) -> PoolState:
    """The same history, except that the failing command is recorded as having succeeded."""
    prompt = [dict(m) for m in state.prompt]
    prompt[-1]["content"] = prompt[-1]["content"].replace("[exit status: 127]", "[exit status: 0]")
    assert prompt[-1]["content"].endswith("[exit status: 0]")
    return PoolState.from_prompt(state.state_id + "-tampered", state.task_id, state.task_dir, prompt, state.category)


@pytest.mark.parametrize("fork_method", ["replay", "snapshot"])
def test_groups_fork_the_state_and_drop_diverged_replays(states, policy, fork_method):
    cache = SnapshotCache(4)
    engine = RolloutEngine(RolloutSettings(max_turns=3, environment="local", fork_method=fork_method), cache=cache)
    good, bad = states[1], _tampered(states[1])
    try:
        ok, dropped = run(engine.run(policy, [(good, 2, 0), (bad, 2, 1)]))
        assert len(cache) == (1 if fork_method == "snapshot" else 0)  # the diverged state is not cached
    finally:
        cache.close()
    assert ok.dropped is None and len(ok.attempts) == 2
    for a in ok.attempts:
        steps = a.trajectory.steps[a.trajectory.prefix_len :]
        # the prefix ran `cd /app`: the new terminal in each fork starts there
        assert steps[0].command == "pwd" and steps[0].observation.startswith("/app\n")
        assert a.reward == 1.0 and a.mask_reason is None  # hello.txt was written by the prefix
        assert a.tokens.exact and sum(a.tokens.env_mask) > 0
    if fork_method == "snapshot":
        assert ok.snapshot_id and all(f"fork-{ok.snapshot_id}-" in a.environment_id for a in ok.attempts)
    assert dropped.dropped.startswith("diverged: command 1 `echo 'Hello, world!' > hello.txt && catt hello.txt`")
    assert [a.mask_reason for a in dropped.attempts] == ["dropped:diverged"] * 2
    assert all(a.reward is None and sum(a.tokens.env_mask) == 0 for a in dropped.attempts)
    assert live_boxes() == []


def test_a_pass_without_submit_trains_on_the_scaled_reward(states):
    """unsubmitted_reward_scale: an attempt that passes the verifier but ends at the turn limit without submitting
    trains on reward x scale; one that submits keeps the verifier's reward; the outcome stays a success."""
    tok = AutoTokenizer.from_pretrained(resolve_model_name_or_path("smollm2"))

    def never_submits(chain_id: int, messages: list[dict]) -> str:
        return bash_call("pwd")

    def submits(chain_id: int, messages: list[dict]) -> str:
        return submit_call()

    rewards = {}
    for name, reply in (("never", never_submits), ("submit", submits)):
        policy = TokenTrajectoryPolicy(tok, scripted_generate_fn(tok, reply), max_turn_tokens=32, max_completion_tokens=512)
        engine = RolloutEngine(RolloutSettings(max_turns=2, environment="local", fork_method="replay",
                                               unsubmitted_reward_scale=0.5))  # fmt: skip
        (group,) = run(engine.run(policy, [(states[1], 2, 0)]))
        assert [a.outcome for a in group.attempts] == ["success", "success"]
        stops = {a.trajectory.stop_reason for a in group.attempts}
        assert stops == ({"max_turns"} if name == "never" else {"submitted"})
        rewards[name] = [a.reward for a in group.attempts]
    assert rewards == {"never": [0.5, 0.5], "submit": [1.0, 1.0]}
    assert live_boxes() == []
