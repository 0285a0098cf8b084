"""reterm.data.recover on the real local sandbox: snapshot fork vs replay rebuilds, a diverged replay
dropped, background processes forcing a replay, the teacher's attempts verified by the task's tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from sandbox_support import run

from reterm.agent.protocol import SYSTEM_PROMPT
from reterm.data.config import EnvironmentConfig, RecoveryConfig
from reterm.data.environments import can_fork, make_environment, stop_quietly
from reterm.data.recover import WorkItem, run_attempts
from reterm.data.teacher import OracleGuidedTeacher
from reterm.recovery import localise
from reterm.trajectory import Action, Outcome, Step, Trajectory

TASK = Path(__file__).resolve().parent.parent / "tasks" / "replace-missing-jq"
LOCAL = EnvironmentConfig(type="local")


def _item(steps: list[tuple[str, int, str]]) -> WorkItem:
    history = [Step(index=i, model_text="", action=Action(tool="bash", command=c, timeout=10), observation=o,
                    exit_status=s) for i, (c, s, o) in enumerate(steps)]  # fmt: skip
    history.append(Step(index=len(history), model_text="", action=Action(tool="submit")))
    traj = Trajectory(task_id=TASK.name, instruction=(TASK / "instruction.md").read_text(), system_prompt=SYSTEM_PROMPT,
                      steps=history, reward=0.0, outcome=Outcome.FAILURE, metadata={"rollout_id": "t"})  # fmt: skip
    state = localise(traj).primary
    assert state is not None
    return WorkItem(state, traj.instruction, "own", "scripted", 10.0)


def _attempts(item: WorkItem, **cfg) -> dict:
    teacher = OracleGuidedTeacher({TASK.name: TASK})
    teacher.register(item.state, item.instruction)
    return run(run_attempts(item, teacher, RecoveryConfig(attempts=2, max_turns=8, **cfg), LOCAL, TASK))


def test_harbor_types_cannot_fork_and_are_rebuilt_by_replay(monkeypatch):
    from harbor.environments.docker.docker import DockerEnvironment
    from harbor.models.task.config import NetworkMode

    # Harbor's Docker enforces no-network only where the engine's kernel has nftables fib rules (not here)
    monkeypatch.setattr(DockerEnvironment, "_egress_control_kernel_support", classmethod(lambda cls: True))
    docker = make_environment(EnvironmentConfig(type="docker"), TASK)
    assert not can_fork(docker)
    # the offline task's policy reaches a Harbor environment too (before: Harbor's default, public)
    assert docker._network_policy.network_mode == NetworkMode.NO_NETWORK
    assert can_fork(make_environment(LOCAL, TASK))


def test_an_environment_the_task_cannot_run_on_is_refused_with_the_reason():
    """Without egress control Harbor refuses an offline task on Docker rather than give it the internet."""
    from harbor.environments.docker.docker import DockerEnvironment

    if DockerEnvironment._egress_control_kernel_support():
        pytest.skip("this host's kernel supports Docker egress control")
    with pytest.raises(ValueError, match="no-network.*not supported"):
        make_environment(EnvironmentConfig(type="docker"), TASK)


def test_stop_quietly_removes_the_trial_folder_it_made():
    env = make_environment(LOCAL, TASK, "t")
    trial = Path(env.trial_paths.trial_dir)
    assert trial.is_dir() and trial.name.startswith("reterm-pipeline-")
    run(stop_quietly(env))
    assert not trial.exists()


@pytest.mark.slow
def test_fork_rebuild_then_verified_attempts():
    jq = "jq -r '.services[] | .name' /app/services.json"
    item = _item([("cd /app", 0, "(no output)\n[exit status: 0]"),
                  (jq, 127, "bash: jq: command not found\n[exit status: 127]")])  # fmt: skip
    assert item.state.category == "missing_dependency"
    unit = _attempts(item)
    assert (unit["status"], unit["rebuild"]) == ("ok", "fork")
    trajs = [Trajectory.model_validate(a) for a in unit["attempts"]]
    assert len(trajs) == 2 and all(t.outcome is Outcome.SUCCESS for t in trajs)
    assert all(t.prefix_len == 2 and t.steps[1].command == jq for t in trajs)  # the failure prefix, as history
    assert trajs[0].steps[2].reasoning.startswith("The last command failed with exit status 127")
    # the teacher skipped the `cd /app` the prefix had run and rewrote the script next
    assert trajs[0].steps[2].command.startswith("cat > /app/scripts/summary.sh")
    # a fork carries the agent's shell state: the working directory the prefix `cd`-ed into
    from reterm.policies.scripted import ScriptedPolicy

    unit = run(run_attempts(item, ScriptedPolicy(["-", "-", "pwd"]), RecoveryConfig(attempts=2, max_turns=1), LOCAL, TASK))
    assert unit["rebuild"] == "fork"
    assert [Trajectory.model_validate(a).steps[2].observation.split("\n")[0] for a in unit["attempts"]] == ["/app"] * 2


@pytest.mark.slow
def test_diverged_replay_is_dropped_and_background_processes_force_replay():
    lying = _item([("cd /app", 0, "(no output)\n[exit status: 0]"),
                   ("ls /app/services.json", 2, "ls: cannot access '/app/services.json'\n[exit status: 2]")])  # fmt: skip
    unit = _attempts(lying)
    assert unit["status"] == "diverged" and unit["attempts"] == [] and "recorded exit 2" in unit["detail"]

    busy = _item([("cd /app", 0, "(no output)\n[exit status: 0]"), ("sleep 300 &", 0, "[1] 30\n[exit status: 0]"),
                  ("jq . services.json", 127, "bash: jq: command not found\n[exit status: 127]")])  # fmt: skip
    unit = _attempts(busy)
    assert (unit["status"], unit["rebuild"]) == ("ok", "replay") and "sleep 300" in unit["detail"]
    assert [Trajectory.model_validate(a).outcome for a in unit["attempts"]] == [Outcome.SUCCESS] * 2

    unit = _attempts(busy, rebuild="replay")
    assert unit["rebuild"] == "replay" and len(unit["attempts"]) == 2


def test_a_snapshot_cache_builds_a_state_once_and_a_child_from_its_parents_snapshot():
    """materialize with GRPO's snapshot cache: the parent is typed from the task's start and cached; a state that
    continues it is typed from the parent's snapshot (its cwd and variables restored), only its own commands."""
    from reterm.recovery.materialize import materialize
    from reterm.recovery.state import Source, State
    from reterm.sandbox.local import LocalEnvironment
    from reterm.training.failure_pool import SnapshotCache

    def bash(i: int, cmd: str, out: str = "", status: int = 0) -> Step:
        return Step(index=i, model_text="", action=Action(tool="bash", command=cmd, timeout=10), observation=out,
                    exit_status=status, from_history=True)  # fmt: skip

    head = Trajectory(task_id=TASK.name, instruction="x", system_prompt=SYSTEM_PROMPT)
    parent = State.from_history(head, [bash(0, "cd /tmp && export MARK=parent && date +%s%N > one.txt")],
                                category="other", source=Source.OWN, level="in_attempt")  # fmt: skip
    # the child's own command fails unless it runs in the parent's cwd with its variable; one.txt holds the time it
    # was written, so a child typed from the parent's snapshot has the parent's one.txt, one typed afresh another
    child = State.from_history(head, [*parent.history, bash(1, 'test "$MARK" = parent && cat one.txt > two.txt')],
                               category="other", source=Source.ONLINE, level="in_attempt")  # fmt: skip
    cache = SnapshotCache(4)

    async def go():
        made = await materialize(parent, 1, lambda tag: LocalEnvironment.for_task(TASK), cache=cache)
        assert made.method == "snapshot" and not made.cached and made.snapshot_id and len(made.environments) == 1
        await made.stop()
        again = await materialize(parent, 2, lambda tag: LocalEnvironment.for_task(TASK), cache=cache)
        assert again.cached and again.snapshot_id == made.snapshot_id and len(again.environments) == 2
        stamp = (await again.environments[0].exec("cat /tmp/one.txt", timeout_sec=30)).stdout.strip()
        await again.stop()
        kid = await materialize(child, 2, lambda tag: LocalEnvironment.for_task(TASK), cache=cache, parent=parent)
        try:
            assert kid.diverged == 0 and not kid.cached and len(kid.environments) == 2, kid.detail
            r = await kid.environments[1].exec("cat /tmp/two.txt", timeout_sec=30)
            assert r.stdout.strip() == stamp
        finally:
            await kid.stop()
        # without the parent the whole history is typed from the task's start: another one.txt
        alone = await materialize(State(**{**child.__dict__, "id": "alone"}), 1,
                                  lambda tag: LocalEnvironment.for_task(TASK), cache=cache)  # fmt: skip
        try:
            r = await alone.environments[0].exec("cat /tmp/two.txt", timeout_sec=30)
            assert alone.diverged == 0 and r.stdout.strip() != stamp
        finally:
            await alone.stop()

    try:
        run(go())
    finally:
        cache.close()
