"""Failure localisation (reterm.recovery.localise) on hand-built trajectories."""

from __future__ import annotations

import json

import pytest

from reterm.agent.protocol import SYSTEM_PROMPT, format_observation
from reterm.policies.base import Generation
from reterm.recovery import Category, Classifier, LLMJudge, localise, localise_many
from reterm.recovery.state import State, state_id_of
from reterm.trajectory import Action, Outcome, Step, Trajectory

TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "/app/solve.py", line 3, in <module>\n'
    "    total += line\n"
    "TypeError: unsupported operand type(s) for +=: 'int' and 'str'\n"
)


def bash(i, command, observation="", exit_status=0, timed_out=False, timeout=None):
    """A bash step whose observation is worded by the harness's own formatter."""
    text = format_observation(observation, exit_status, timed_out=timed_out, timeout_s=timeout or 30)
    return Step(index=i, model_text=f"run {command}", action=Action(tool="bash", command=command, timeout=timeout,
                call_id=f"call_{i}"), observation=text, exit_status=exit_status, timed_out=timed_out)


def submit(i):
    return Step(index=i, model_text="done", action=Action(tool="submit", call_id=f"call_{i}"))


def parse_error(i):
    return Step(index=i, model_text="I will now run ls", parse_error="no_tool_call",
                observation="Your reply contained no tool call.")


def traj(steps, reward=None, outcome=None, task_id="t1", **kw):
    t = Trajectory(task_id=task_id, instruction="do it", system_prompt=SYSTEM_PROMPT, steps=steps, **kw)
    if outcome is not None:
        t.outcome = outcome
    elif reward is not None:
        t.set_reward(reward)
    return t


def jq_then_bug(reward=0.0):
    return traj([
        bash(0, "which jq", "", 1),                                           # benign probe
        bash(1, "jq . data.json", "bash: jq: command not found\n", 127),      # missing dependency
        bash(2, "apt-get install -y jq", "Setting up jq (1.6-2.1) ...\n", 0),
        bash(3, "jq . data.json", '{"a": 1}\n', 0),                             # resolves step 1
        bash(4, "cat > solve.py <<'EOF'\ntotal = 0\nEOF", "", 0, timeout=10),
        bash(5, "python3 solve.py", TRACEBACK, 1),                              # faulty implementation
        bash(6, "python3  solve.py", TRACEBACK, 1),                             # the same failure again
        submit(7),
    ], reward=reward, metadata={"rollout_id": "traj-a"})


def test_first_consequential_failure_is_primary():
    res = localise(jq_then_bug())
    assert res.outcome is Outcome.FAILURE and not res.infra_fault
    assert res.step_labels[:4] == ["none", "missing_dependency", "none", "none"]
    assert [(s.step, s.category) for s in res.states] == [(1, "missing_dependency"), (5, "faulty_implementation")]
    md, fi = res.states
    assert md.localisation.resolved_by == 3 and not md.localisation.consequential and not md.localisation.primary
    assert fi.localisation.consequential and fi.localisation.primary and res.primary is fi
    assert fi.localisation.repeats == [6] and "repeated_at:6" in fi.localisation.signals
    assert "exit_status=1" in fi.localisation.signals
    # the localiser's states are the kit's one failure-state type, with the id every stage gives the history
    assert isinstance(fi, State) and fi.source == "own" and fi.level == "in_attempt"
    assert fi.id == state_id_of(jq_then_bug(), jq_then_bug().prefix(6)) and fi.command == fi.history[-1].command
    assert fi.evidence.startswith("TypeError") and fi.localisation.confidence >= 0.85  # solve.py was written by the agent
    # history and replay: everything up to and including the failing step
    assert len(fi.history) == 6 and [s.index for s in fi.history] == list(range(6))
    assert all(s.from_history for s in fi.history)
    assert fi.replay_commands == [s.command for s in jq_then_bug().steps[:6]]
    assert fi.replay_timeouts == [None, None, None, None, 10, None]
    assert fi.task_id == "t1" and fi.localisation.origin_id == "traj-a" and fi.localisation.snapshot_id is None
    assert fi.localisation.trial_passed is False
    # no premature completion: an unresolved failure explains the failed submit
    assert all(s.category != "premature_completion" for s in res.states)
    assert res.select("first") == [fi]
    assert res.select("consequential") == [fi]
    assert res.select("all", max_states=1) == [md]
    with pytest.raises(ValueError, match="unknown selection mode"):
        res.select("best")


def test_state_ids_are_stable_and_distinct():
    a, b = localise(jq_then_bug()), localise(jq_then_bug())
    assert [s.id for s in a.states] == [s.id for s in b.states]
    assert len({s.id for s in a.states}) == 2
    # JSON round trip (the pipeline stores failure states)
    from reterm.recovery import LocalisationResult

    again = LocalisationResult.model_validate_json(a.model_dump_json())
    assert again.states[1].history[5].command == "python3 solve.py"


def test_premature_completion_at_submit_without_visible_error():
    t = traj([bash(0, "ls", "data.csv\n"), bash(1, "echo 42 > answer.txt"), submit(2)], reward=0.0)
    res = localise(t)
    assert [(s.step, s.category, s.localisation.primary) for s in res.states] == [(2, "premature_completion", True)]
    pc = res.states[0]
    assert len(pc.history) == 2 and pc.replay_commands == ["ls", "echo 42 > answer.txt"]  # the submit is left out
    assert "verifier_failed" in pc.localisation.signals
    # the same episode passing, or not verified yet: no failure state
    assert localise(traj(t.steps, reward=1.0)).states == []
    assert localise(traj(t.steps)).states == []  # PENDING


def test_resolved_errors_then_failed_submit_is_premature():
    t = traj([bash(0, "python3 -c 'import yaml'", "ModuleNotFoundError: No module named 'yaml'\n", 1),
              bash(1, "pip install pyyaml", "Successfully installed PyYAML-6.0.1\n"),
              bash(2, "python3 -c 'import yaml'", "", 0), submit(3)], reward=0.0)
    res = localise(t)
    assert [(s.step, s.category, s.localisation.consequential, s.localisation.primary) for s in res.states] == [
        (0, "missing_dependency", False, False), (3, "premature_completion", True, True)]


def test_infrastructure_fault_outcome_gives_no_failure_states():
    t = traj([bash(0, "pip install foo", "ERROR: No matching distribution found for foo\n", 1),
              bash(1, "ls", "OCI runtime exec failed: exec failed: unable to start container process\n", 126)],
             outcome=Outcome.SANDBOX_ERROR, error="container died")
    res = localise(t)
    assert res.infra_fault and res.infra_reason == "container died" and res.states == []
    assert [tag.step for tag in res.infra_steps] == [1]


def test_infra_step_is_tagged_and_later_failures_dropped():
    t = traj([bash(0, "pip install foo", "ERROR: No matching distribution found for foo\n", 1),
              bash(1, "ls", "no server running on /tmp/tmux-0/default\n", None),
              bash(2, "cat missing.txt", "cat: missing.txt: No such file or directory\n", 1),
              Step(index=3, model_text="x", action=Action(tool="bash", command="make"), observation="",
                   extra={"infra_fault": True}),
              submit(4)], reward=0.0)
    res = localise(t)
    assert [(s.step, s.category) for s in res.states] == [(0, "missing_dependency")]
    assert [tag.step for tag in res.infra_steps] == [1, 3]
    assert res.step_labels[1] == "infra" and res.step_labels[3] == "infra"


def test_timeout_and_parse_errors():
    t = traj([parse_error(0), bash(1, "python3 server.py", " * Running on http://127.0.0.1:5000\n^C\n", None,
                                   timed_out=True, timeout=30)],
             reward=0.0, stop_reason="max_turns")
    res = localise(t)
    assert res.parse_error_steps == [0]
    assert [(s.step, s.category) for s in res.states] == [(1, "timeout_hang")]
    assert res.states[0].replay_commands == ["python3 server.py"] and res.states[0].replay_timeouts == [30]
    assert "timed_out" in res.states[0].localisation.signals
    # only parse errors and a failed trial: nothing to recover from, flagged unexplained
    res = localise(traj([parse_error(0), parse_error(1)], reward=0.0, stop_reason="parse_errors"))
    assert res.states == [] and res.unexplained and res.parse_error_steps == [0, 1]


def test_undone_step_becomes_a_failure_state():
    t = traj([bash(0, "cat > app.py <<'EOF'\nprint('v1')\nEOF"), bash(1, "python3 app.py", "v1\n"),
              bash(2, "git checkout -- app.py"), bash(3, "pip install requests==2.0.0", "Successfully installed\n"),
              bash(4, "pip uninstall -y requests", "Successfully uninstalled requests-2.0.0\n"), submit(5)], reward=0.0)
    res = localise(t)
    assert [(s.step, s.category, s.localisation.source) for s in res.states] == [
        (0, "faulty_implementation", "localiser"), (3, "missing_dependency", "localiser")]
    assert res.states[0].localisation.signals == ["undone_by:2"] and res.states[0].localisation.confidence == 0.5
    assert res.primary.step == 0


def test_recovery_attempt_history_is_context_only():
    history = [bash(0, "ls"), bash(1, "python3 solve.py", TRACEBACK, 1)]
    steps = [s.model_copy(update={"from_history": True}) for s in history]
    steps += [bash(2, "sed -i 's/line/int(line)/' solve.py"), bash(3, "python3 solve.py", "6\n", 0), submit(4)]
    t = traj(steps, reward=1.0, prefix_len=2)
    res = localise(t)
    assert res.states == [] and res.step_labels[:2] == ["", ""]
    res = localise(t, include_history=True)
    assert [(s.step, s.category, s.localisation.resolved_by) for s in res.states] == [(1, "faulty_implementation", 3)]


class Judge:
    name = "judge"

    def __init__(self, answer):
        self.answer, self.calls = answer, 0

    def generate(self, batch, tools):
        self.calls += 1
        return [Generation(text=json.dumps({"category": self.answer})) for _ in batch]


def test_localise_many_batches_the_judge_over_trajectories():
    odd = traj([bash(0, "frob --go", "frobnication went sideways\n", 3), submit(1)], reward=0.0, task_id="t2")
    judge = Judge("wrong_state")
    a, b = localise_many([jq_then_bug(), odd], Classifier(judge=LLMJudge(judge)))
    assert judge.calls == 1
    assert [s.category for s in a.states] == ["missing_dependency", "faulty_implementation"]  # sure: not asked
    assert [(s.step, s.category, s.localisation.source) for s in b.states] == [(0, "wrong_state", "judge")]
    assert Category(b.states[0].category) is Category.WRONG_STATE


def test_judge_is_not_asked_about_copied_history():
    class Counting(Judge):
        def generate(self, batch, tools):
            self.sizes = getattr(self, "sizes", []) + [len(batch)]
            return super().generate(batch, tools)

    history = [s.model_copy(update={"from_history": True}) for s in [bash(0, "frob --go", "went sideways\n", 3)]]
    t = traj(history + [bash(1, "widget", "widget refused\n", 9), submit(2)], reward=0.0, prefix_len=1)
    judge = Counting("wrong_command")
    res = localise(t, Classifier(judge=LLMJudge(judge)))
    assert judge.sizes == [1]  # only the generated step
    assert [(s.step, s.category, s.localisation.source) for s in res.states] == [(1, "wrong_command", "judge")]
    assert res.step_labels == ["", "wrong_command", "premature_completion"]
