"""The failure-state pool of ReTerm-GRPO (reterm.training.failure_pool): seeds from ReTerm-10K records,
per-group choices identical on every rank, the online refresh, retirement and checkpoints."""

from __future__ import annotations

from pathlib import Path

import pytest
from datasets import load_dataset

from reterm.agent.protocol import initial_messages
from reterm.policies.scripted import bash_call
from reterm.policies.transformers_policy import template_messages
from reterm.training.failure_pool import (
    FailurePool,
    PoolState,
    online_states_from_attempt,
    resolve_task_dir,
    seed_states_from_records,
    task_start_states,
)
from reterm.trajectory import Action, Outcome, Step, Trajectory

FIXTURES = Path(__file__).resolve().parent / "fixtures"
SEED = FIXTURES / "grpo_seed"
TASK_DIRS = ["tasks", str(FIXTURES / "tasks")]


@pytest.fixture(scope="module")
def records():
    return load_dataset(str(SEED), split="train")


def test_seed_states_from_records(records):
    states, skipped = seed_states_from_records(records, TASK_DIRS)
    assert len(states) == len(records) == 6 and not skipped
    assert {s.category for s in states} >= {"path_permission", "missing_dependency", "wrong_command"}
    for s, r in zip(states, records):
        assert s.prompt[-1]["role"] == "tool" and s.prompt[-1]["content"] == r["failure_output"]
        assert s.replay_commands == list(r["replay_commands"])
        assert Path(s.task_dir) == resolve_task_dir(r["task_id"], TASK_DIRS)
        assert all(step.from_history for step in s.history)
    # the SFT fixture's tasks are not runnable task folders: skipped and counted, never guessed
    mini = load_dataset(str(FIXTURES / "reterm10k_mini"), split="train")
    none, why = seed_states_from_records(mini, TASK_DIRS)
    assert none == [] and why == {"unknown_task": len(mini)}
    # test-split tasks are never trained on
    rows = [dict(records[2], task_id="semver-sort")]
    none, why = seed_states_from_records(rows, TASK_DIRS)
    assert none == [] and why == {"excluded_task": 1}
    with pytest.raises(ValueError, match="test split"):
        task_start_states(["semver-sort"], TASK_DIRS)


def _state(i: int, source: str = "seed") -> PoolState:
    return PoolState.from_prompt(state_id=f"s{i}", task_id="hello-file", task_dir="/nowhere", prompt=initial_messages(f"task {i}"),
                     category="other", source=source)  # fmt: skip


def test_choices_are_identical_on_every_rank_and_mix_online_states():
    seeds = [_state(i) for i in range(6)]
    online = [_state(100 + i, "online") for i in range(4)]
    pools = [FailurePool(seeds, online_fraction=0.5, seed=7) for _ in range(2)]  # two ranks
    for p in pools:
        p.add_candidates(online)
        p.refresh()
    # a batch of 6 positions per rank, G=4: the group of positions 4..7 spans both ranks
    sampled = ["s0"] * 4 + ["s1"] * 4 + ["s2"] * 4
    per_rank = [pools[r].choose(sampled[6 * r : 6 * r + 6], step=3, process_index=r, group_size=4) for r in range(2)]
    flat = [s.state_id for r in per_rank for s in r]
    groups = [flat[k : k + 4] for k in range(0, 12, 4)]
    assert all(len(set(g)) == 1 for g in groups)  # one state per group, on both sides of the rank boundary
    again = [s.state_id for r in range(2) for s in pools[r].choose(sampled[6 * r : 6 * r + 6], 3, r, 4)]
    assert again == flat  # seeded: the same step gives the same choice
    # over many steps about half the groups start from online states, the others keep the sampled row
    chosen = [pools[0].choose(["s5"] * 4, step, 0, 4)[0] for step in range(400)]
    share = sum(s.source == "online" for s in chosen) / len(chosen)
    assert 0.4 < share < 0.6
    assert {s.state_id for s in chosen if s.source == "seed"} == {"s5"}


def test_refresh_gathers_every_rank_dedups_evicts_and_retires():
    seeds = [_state(i) for i in range(3)]
    pools = [FailurePool(seeds, online_fraction=1.0, max_online=3, seed=0) for _ in range(2)]
    pools[0].add_candidates([_state(10, "online"), _state(11, "online")])
    pools[1].add_candidates([_state(11, "online"), _state(12, "online"), _state(13, "online")])
    pools[1].mark_retired("s1")
    pending = [list(p.pending) for p in pools]
    retired = [list(p._retired_pending) for p in pools]
    calls = {0: iter([sum(pending, []), sum(retired, [])]), 1: iter([sum(pending, []), sum(retired, [])])}
    evicted = [pools[r].refresh(gather=lambda _x, r=r: next(calls[r])) for r in range(2)]  # an all-gather
    assert [s.state_id for s in pools[0].online] == [s.state_id for s in pools[1].online] == ["s11", "s12", "s13"]
    assert evicted == [["s10"], ["s10"]]
    assert pools[0].retired == pools[1].retired == {"s1"}
    assert all(pools[0].draw(step, "k").state_id != "s1" for step in range(50))
    # checkpoints keep the online part
    other = FailurePool(seeds, online_fraction=1.0, max_online=3, seed=0)
    other.load_state_dict(pools[0].state_dict())
    assert [s.state_id for s in other.online] == ["s11", "s12", "s13"] and other.retired == {"s1"}
    assert other.get("s12").prompt == _state(12).prompt


def test_online_state_from_a_failed_attempt():
    parent_steps = [
        Step(index=0, model_text=bash_call("cd /app"), action=Action(tool="bash", command="cd /app"),
             observation="(no output)\n[exit status: 0]", exit_status=0, from_history=True),
    ]  # fmt: skip
    attempt = Trajectory(task_id="hello-file", instruction="Create /app/hello.txt.", system_prompt=initial_messages("")[0]["content"],
                         steps=parent_steps + [
                             Step(index=1, model_text=bash_call("jq . x.json"), action=Action(tool="bash", command="jq . x.json"),
                                  observation="bash: jq: command not found\n[exit status: 127]", exit_status=127),
                             Step(index=2, model_text=bash_call("ls"), action=Action(tool="bash", command="ls"),
                                  observation="(no output)\n[exit status: 0]", exit_status=0),
                         ], prefix_len=1)  # fmt: skip
    attempt.set_reward(0.0)
    parent = PoolState.from_prompt("p", "hello-file", "/nowhere", attempt.to_messages(upto=1), "other")
    (state,) = online_states_from_attempt(attempt, parent, step=4)
    assert state.category == "missing_dependency" and state.source == "online" and state.parent_id == "p"
    assert state.prompt[-1]["content"].startswith("bash: jq: command not found") and len(state.history) == 2
    assert template_messages(state.prompt[: len(parent.prompt)]) == template_messages(parent.prompt)
    assert state.created_step == 4
    attempt.outcome = Outcome.SANDBOX_ERROR  # infrastructure faults never become failure states
    assert online_states_from_attempt(attempt, parent, step=4) == []



def test_pool_entry_holds_a_state_and_old_flat_checkpoints_still_load(records):
    """A pool entry is a ``State`` plus its pool fields (issue 31): ``state_id``/``task_id``/``prompt``/``category``
    read the state; the JSON (checkpoints) and the pickle (accelerate's gather_object) round-trip; an entry in the
    flat layout of checkpoints written before (no ``state`` field) still loads, with the same state id."""
    import json
    import pickle

    from reterm.recovery.state import State, state_id

    (seed, *_), _ = seed_states_from_records(records, TASK_DIRS)
    assert isinstance(seed.state, State) and seed.state_id == seed.state.id == State.from_record(records[0]).id
    assert (seed.task_id, seed.prompt, seed.category) == (seed.state.task_id, seed.state.messages, seed.state.category)
    with pytest.raises(AttributeError):
        seed.state_id = "x"  # read-only: the id is the state's
    for back in (PoolState.from_json(json.loads(json.dumps(seed.to_json()))), pickle.loads(pickle.dumps(seed))):
        assert back == seed and back.state_id == seed.state_id and back.history == seed.history
    assert set(seed.to_json()) == {"state", "task_dir", "source", "parent_id", "created_step"}
    # the flat layout (PoolState fields before the entry held a State)
    flat = {"state_id": seed.state_id, "task_id": seed.task_id, "task_dir": seed.task_dir, "prompt": seed.prompt,
            "category": seed.category, "source": "online", "parent_id": "p", "created_step": 3,
            "failure_source": "own"}  # fmt: skip
    old = PoolState.from_json(json.loads(json.dumps(flat)))
    assert old.state_id == seed.state_id == state_id(old.task_id, old.prompt) and old.state.source == "online"
    assert (old.parent_id, old.created_step, old.category) == ("p", 3, seed.category)
    assert old.replay_commands == seed.replay_commands and old.state.replay_commands == seed.state.replay_commands
    pool = FailurePool([seed], online_fraction=1.0)
    pool.load_state_dict({"online": [flat], "pending": [], "retired": [], "counts": {}})
    assert pool.online[0].state_id == seed.state_id
    with pytest.raises(ValueError, match="neither"):
        PoolState.from_json({"state_id": "s", "prompt": []})


def test_pool_skips_states_that_keep_giving_equal_rewards_before_rollout():
    """GRESO-style pre-rollout skipping (issue 24): after 2 groups with equal rewards a state is replaced by another
    (most of the time), a group with differing rewards resets it, and the streaks survive a checkpoint."""
    from reterm.training.failure_pool import FailurePool, PoolState

    seeds = [PoolState.from_prompt(state_id=f"s{i}", task_id=f"t{i}", task_dir="", prompt=[{"role": "user", "content": str(i)}])
             for i in range(4)]  # fmt: skip
    pool = FailurePool(seeds, online_fraction=0.0, skip_equal_after=2, skip_equal_explore=0.2)
    assert [s.state_id for s in pool.choose(["s0"] * 4, 0, 0, 4)] == ["s0"] * 4  # nothing recorded yet
    pool.record_groups([("s0", 0, [0.0, 0.0, 0.0, 0.0])])
    assert pool.choose(["s0"] * 4, 1, 0, 4)[0].state_id == "s0"  # one equal group is not enough
    pool.record_groups([("s0", 0, [0.0, 0.0]), ("s0", 0, [0.0, 0.0])])  # one group split over two ranks' parts
    assert pool.equal_streak["s0"] == 2 and pool.stale() == {"s0"}
    chosen = [pool.choose(["s0"] * 4, step, 0, 4)[0].state_id for step in range(2, 102)]
    skipped = sum(c != "s0" for c in chosen)
    assert 65 <= skipped <= 95, skipped  # about 80% skipped, 20% still explored
    assert pool.counts["skipped_equal"] == skipped
    restored = FailurePool(seeds, online_fraction=0.0, skip_equal_after=2)
    restored.load_state_dict(pool.state_dict())
    assert restored.equal_streak == {"s0": 2}
    pool.record_groups([("s0", 0, [1.0, 0.0, 0.0, 0.0])])  # the policy now sometimes passes: signal again
    assert pool.equal_streak["s0"] == 0 and not pool.stale()
    never = FailurePool(seeds, online_fraction=0.0, skip_equal_after=0)
    never.record_groups([("s0", 0, [0.0, 0.0])] * 3)
    assert all(never.choose(["s0"] * 4, k, 0, 4)[0].state_id == "s0" for k in range(20))


def test_group_parts_from_every_process_are_judged_together():
    """A group split across two processes: neither part alone has differing rewards, the whole group has (the
    rule of ``skip_equal_after``'s streaks and of ``online_states_from: signal_groups``)."""
    from reterm.training.failure_pool import merge_group_parts

    rank = {0: [("a", 0, [1.0, 1.0]), ("b", 1, [0.0, 0.0])], 1: [("a", 0, [0.0, 0.0]), ("b", 1, [0.0, 0.0])]}
    gather = lambda part: rank[0] + rank[1]  # noqa: E731  (accelerate's gather_object: every rank's list, in rank order)
    merged = merge_group_parts(rank[0], gather)
    assert merged == {("a", 0): [1.0, 1.0, 0.0, 0.0], ("b", 1): [0.0] * 4}
    assert {g for (_, g), r in merged.items() if len(set(r)) > 1} == {0}
    assert merge_group_parts(rank[1]) == {("a", 0): [0.0, 0.0], ("b", 1): [0.0, 0.0]}  # one process: its parts
    pools = [FailurePool([_state(1, "seed")], skip_equal_after=1) for _ in range(2)]
    for r, pool in enumerate(pools):
        pool.record_groups(rank[r], gather=gather)
    assert pools[0].equal_streak == pools[1].equal_streak == {"a": 0, "b": 1}
