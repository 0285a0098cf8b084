"""A failure state is what the failed attempt left behind: the consumers that rebuild it
(:func:`reterm.recovery.materialize.materialize`) must hand out that state, not a fresh task.

The state (fixture task hello-file: write ``/app/hello.txt`` = ``Hello, world!``): the failed attempt made a
folder ``/app/work``, wrote the right text to ``/app/work/draft.txt`` and then failed (``cat /app/hello.txt``).
The scripted recovery only copies the draft into place and submits, so it passes exactly when the rebuilt
environment holds what the attempt left; from a fresh start of the same task it fails.
A second state records an exit status the replay cannot reproduce: it is dropped and counted, never scored.

Consumers: eval's Recovery@1 from states (:func:`reterm.eval.recovery.recover_from_states`), the data
stage (:func:`reterm.data.recover.run_attempts`, fork and replay) and a GRPO group
(:class:`reterm.training.grpo_rollout.RolloutEngine`, snapshot and replay; the fresh start is standard GRPO's
task-start state). The ids the drills dataset, the GRPO pool
and the drills eval give the same injected states agree (the reduced chain, on the real sandbox).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from sandbox_support import run

from reterm.agent.protocol import SYSTEM_PROMPT
from reterm.policies.scripted import ScriptedPolicy, assistant_commands, bash_call, submit_call
from reterm.recovery import localise
from reterm.recovery.state import State, state_id
from reterm.trajectory import Action, Outcome, Step, Trajectory

TASKS = Path(__file__).resolve().parent / "fixtures" / "tasks"
TASK = TASKS / "hello-file"
FIX = "cp /app/work/draft.txt /app/hello.txt"
LEFT_BEHIND = [("mkdir -p /app/work", 0, "(no output)\n[exit status: 0]"),
               ("printf 'Hello, world!\\n' > /app/work/draft.txt", 0, "(no output)\n[exit status: 0]"),
               ("cat /app/hello.txt", 1, "cat: /app/hello.txt: No such file or directory\n[exit status: 1]")]  # fmt: skip
# the original run saw /app/hello.txt already there (exit 0); a replay in a fresh sandbox cannot
LYING = [("test -e /app/hello.txt", 0, "(no output)\n[exit status: 0]"),
         ("jq . /app/hello.txt", 127, "bash: jq: command not found\n[exit status: 127]")]  # fmt: skip


def _trajectory(steps: list[tuple[str, int, str]]) -> Trajectory:
    history = [Step(index=i, model_text="", action=Action(tool="bash", command=c, timeout=10), observation=o,
                    exit_status=s) for i, (c, s, o) in enumerate(steps)]  # fmt: skip
    history.append(Step(index=len(history), model_text="", action=Action(tool="submit")))
    traj = Trajectory(task_id=TASK.name, instruction=(TASK / "instruction.md").read_text(), system_prompt=SYSTEM_PROMPT,
                      steps=history, metadata={"rollout_id": "t"})  # fmt: skip
    traj.set_reward(0.0)
    return traj


def _state(steps) -> State:
    traj = _trajectory(steps)
    primary = localise(traj).primary
    assert primary is not None
    return primary


def _fixer(messages: list[dict]) -> str:
    return submit_call() if FIX in assistant_commands(messages) else bash_call(FIX)


def _policy() -> ScriptedPolicy:
    return ScriptedPolicy(_fixer, name="copy-the-draft")


@pytest.mark.slow
def test_recovery_depends_on_what_the_attempt_left_and_diverged_replays_are_never_scored(tmp_path):
    from reterm.data.config import EnvironmentConfig, RecoveryConfig
    from reterm.data.recover import WorkItem, run_attempts
    from reterm.eval.recovery import recover_from_states
    from reterm.recovery.attempts import run_attempts as fresh_attempts

    state, lying = _state(LEFT_BEHIND), _state(LYING)

    # fresh start of the same task: the same recovery fails (nothing was left behind)
    (fresh,) = run(fresh_attempts(_policy(), [TASK], max_turns=3))
    assert fresh.trajectory.outcome is Outcome.FAILURE

    # eval's Recovery@1 from states: the materialized state passes; the diverged one is dropped, never scored
    rates = recover_from_states(_policy(), [state, lying], TASKS, tmp_path / "eval", attempts=2, max_turns=3)
    ok, bad = rates[state.category], rates[lying.category]
    assert state.category != lying.category  # one block each
    assert (ok["attempts"], ok["recovered"], ok["diverged"]) == (2, 2, 0)
    assert (bad["attempts"], bad["recovered"], bad["failure_states"], bad["diverged"]) == (0, 0, 0, 2)
    assert bad["infra_faults"] == 0

    # the data stage, snapshot fork and replay: the same
    local = EnvironmentConfig(type="local")
    for rebuild in ("fork", "replay"):
        unit = run(run_attempts(WorkItem(state, _trajectory(LEFT_BEHIND).instruction, "own", "scripted", 10.0),
                                _policy(), RecoveryConfig(attempts=2, max_turns=3, rebuild=rebuild), local, TASK))
        assert (unit["status"], unit["rebuild"]) == ("ok", rebuild)
        assert [Trajectory.model_validate(a).outcome for a in unit["attempts"]] == [Outcome.SUCCESS] * 2
        unit = run(run_attempts(WorkItem(lying, "", "own", "scripted", 10.0), _policy(),
                                RecoveryConfig(attempts=2, max_turns=3, rebuild=rebuild), local, TASK))
        assert (unit["status"], unit["attempts"], unit["diverged_attempts"]) == ("diverged", [], 2)


@pytest.mark.slow
@pytest.mark.parametrize("fork_method", ["snapshot", "replay"])
def test_a_grpo_group_starts_in_what_the_attempt_left(fork_method):
    from transformers import AutoTokenizer

    from reterm.policies.transformers_policy import template_messages
    from reterm.sandbox.box import live_boxes
    from reterm.training.failure_pool import PoolState, SnapshotCache, task_start_states
    from reterm.training.grpo_policy import TokenTrajectoryPolicy, scripted_generate_fn
    from reterm.training.grpo_rollout import RolloutEngine, RolloutSettings
    from reterm.training.models import resolve_model_name_or_path

    def pool_state(steps) -> PoolState:
        traj = _trajectory(steps)
        prompt = template_messages(traj.to_messages(upto=len(steps)))
        return PoolState.from_prompt(state_id(TASK.name, prompt), TASK.name, str(TASK), prompt, "other")

    tok = AutoTokenizer.from_pretrained(resolve_model_name_or_path("smollm2"))
    policy = TokenTrajectoryPolicy(tok, scripted_generate_fn(tok, lambda chain, messages: _fixer(messages)),
                                   max_turn_tokens=48, max_completion_tokens=512)  # fmt: skip
    left, lying = pool_state(LEFT_BEHIND), pool_state(LYING)
    (start,) = task_start_states([TASK.name], [TASKS])
    cache = SnapshotCache(4)
    engine = RolloutEngine(RolloutSettings(max_turns=3, environment="local", fork_method=fork_method), cache=cache)
    try:
        ok, fresh, dropped = run(engine.run(policy, [(left, 2, 0), (start, 2, 1), (lying, 2, 2)]))
    finally:
        cache.close()
    assert ok.dropped is None and [a.reward for a in ok.attempts] == [1.0, 1.0]
    assert fresh.dropped is None and [a.reward for a in fresh.attempts] == [0.0, 0.0]  # nothing left behind
    assert dropped.dropped.startswith("diverged: command 0 `test -e /app/hello.txt`")
    assert [a.mask_reason for a in dropped.attempts] == ["dropped:diverged"] * 2
    assert all(a.reward is None for a in dropped.attempts)
    assert live_boxes() == []


@pytest.mark.slow
def test_drills_dataset_grpo_pool_and_eval_join_on_the_state_id(tmp_path):
    """The reduced chain on the real sandbox: the drills dataset's attempt-level records, the GRPO pool's seeds
    read from them and the drills eval's injected states (same train instances) carry the same ids."""
    from datasets import load_dataset

    from reterm.data.drills import build, read_splits
    from reterm.drills import generate_drills
    from reterm.eval.drills import _injected_states
    from reterm.recovery.attempts import release
    from reterm.training.failure_pool import seed_states_from_records

    drills = tmp_path / "drills"
    generate_drills(drills, 0, 2, families=["mkdir-parent", "exec-bit"], ood_families=["exec-bit"])
    build(drills, tmp_path / "data", policies=[], max_turns=2, batch=8, held_out=0.0)
    records = [r for r in load_dataset(str(tmp_path / "data"), split="train") if r["target_attempt_index"] == 2]
    seeds, _ = seed_states_from_records(records, [drills], exclude=set())
    dirs = [drills / n for n in read_splits(drills)["train"]]

    async def go():
        failed, states, _ = await _injected_states(dirs, 8)
        release(failed)
        return states

    states = asyncio.run(go())
    data_ids = {r["trajectory_id"] for r in records}
    # every record's state is one the eval rebuilds (the eval also keeps states the teacher did not recover)
    assert data_ids and data_ids == {s.state_id for s in seeds} and data_ids <= {s.id for s in states}
