"""The failure state the mechanism forks from (reterm.recovery.attempts.most_progress): the failed attempt with the
fewest failed verifier checks, then the most commands that exited 0, then the fewest parse errors, then the
earliest; attempts without steps and infrastructure faults are never chosen, an attempt without verifier output
counts as worst. Real Attempt/Trajectory/Step objects, no sandbox, no model."""

from pathlib import Path

from reterm.recovery.attempts import Attempt, failed_checks, most_progress
from reterm.trajectory import Action, Outcome, Step, Trajectory


def _bash(i: int, cmd: str, exit_status: int | None) -> Step:
    return Step(index=i, model_text=cmd, action=Action(tool="bash", command=cmd, call_id=f"call_{i}"),
                observation="", exit_status=exit_status)  # fmt: skip


def _parse_error(i: int) -> Step:
    return Step(index=i, model_text="{not a call", parse_error="invalid_json", observation="no valid tool call")


def _submit(i: int) -> Step:
    return Step(index=i, model_text="", action=Action(tool="submit", call_id=f"call_{i}"))


def _attempt(steps: list[Step], tail: str | None, reward: float | None = 0.0) -> Attempt:
    t = Trajectory(task_id="multi-000", instruction="do two things", system_prompt="", steps=steps)
    t.set_reward(reward, error=None if reward is not None else "verifier crashed")
    if tail is not None:
        t.metadata["verifier_output_tail"] = tail
    return Attempt(Path("tasks/multi-000"), t)


TWO_FAILS = "FAIL: part 1 not done\nFAIL: part 2 not done\n"
ONE_FAIL = "checking...\nFAIL: part 2 not done\n"


def test_fewest_failed_checks_wins_over_the_first_failed_attempt():
    first = _attempt([_submit(0)], TWO_FAILS)  # submitted at once: the old choice
    later = _attempt([_bash(0, "python3 fix.py", 0), _bash(1, "./run.sh", 126), _submit(2)], ONE_FAIL)
    passed = _attempt([_bash(0, "python3 fix.py", 0), _submit(1)], "", reward=1.0)
    group = [first, passed, later]
    assert failed_checks(first) == 2 and failed_checks(later) == 1
    assert most_progress(group) is later


def test_ties_go_to_more_successful_commands_then_fewer_parse_errors_then_the_earliest():
    few_ok = _attempt([_bash(0, "ls", 0), _bash(1, "false", 1), _submit(2)], ONE_FAIL)
    more_ok = _attempt([_bash(0, "ls", 0), _bash(1, "cat x", 0), _submit(2)], ONE_FAIL)
    assert most_progress([few_ok, more_ok]) is more_ok
    noisy = _attempt([_parse_error(0), _bash(1, "ls", 0), _submit(2)], ONE_FAIL)
    clean = _attempt([_bash(0, "ls", 0), _submit(1)], ONE_FAIL)
    assert most_progress([noisy, clean]) is clean
    a, b = _attempt([_bash(0, "ls", 0)], ONE_FAIL), _attempt([_bash(0, "ls", 0)], ONE_FAIL)
    assert most_progress([a, b]) is a and most_progress([b, a]) is b  # equal: the earliest


def test_no_candidate_gives_none():
    passed = _attempt([_submit(0)], "", reward=1.0)
    no_steps = _attempt([], TWO_FAILS)
    infra = _attempt([_bash(0, "ls", 0)], None, reward=None)  # a verifier fault: never a failure state
    assert infra.trajectory.outcome is Outcome.VERIFIER_ERROR
    assert most_progress([passed, no_steps, infra]) is None and most_progress([]) is None


def test_an_attempt_without_verifier_output_counts_as_worst():
    unknown = _attempt([_bash(0, "ls", 0), _bash(1, "pwd", 0), _submit(2)], None)
    blank = _attempt([_bash(0, "ls", 0), _bash(1, "pwd", 0), _submit(2)], "  \n")
    known = _attempt([_submit(0)], TWO_FAILS)
    assert failed_checks(unknown) is None and failed_checks(blank) is None
    assert most_progress([unknown, blank, known]) is known
    assert most_progress([unknown, blank]) is unknown  # still a candidate when no attempt has a tail
