"""Recovery metrics (reterm.recovery.metrics) on hand-built trajectories, against hand-computed values."""

from __future__ import annotations

import json
import math

import pytest

from reterm.recovery import (
    RecoveryAttempt,
    attempt_recovery,
    in_trial_recovery,
    localise,
    markdown_table,
)
from reterm.trajectory import Outcome

try:  # tests/ as a plain folder (pytest's default) or as a package
    from test_recovery_localise import bash, jq_then_bug, submit, traj
except ImportError:  # pragma: no cover
    from tests.test_recovery_localise import bash, jq_then_bug, submit, traj


def trials():
    """Seven trials; the failure states of each are worked out in the comments."""
    a = jq_then_bug(reward=1.0)  # passed: missing_dependency@1 (resolved), faulty_implementation@5 (primary)
    b = jq_then_bug(reward=0.0)  # failed: the same two states
    c = traj([bash(0, "ls"), submit(1)], reward=0.0)  # failed: premature_completion@1
    d = traj([bash(0, "ls", "bwrap: Can't mount proc on /newroot/proc\n", 1)], outcome=Outcome.SANDBOX_ERROR)
    e = traj([bash(0, "cat x", "cat: x: No such file or directory\n", 1), submit(1)])  # pending: not scored
    f = traj([bash(0, "pip install foo", "ERROR: No matching distribution found for foo\n", 1),
              bash(1, "ls", "no server running on /tmp/tmux-0/default\n", None),
              bash(2, "ls", "Error response from daemon: container 3f2a9c1d0b7e is not running\n", 1),
              submit(3)], reward=0.0)  # failed: missing_dependency@0; two infra-tagged steps
    g = traj([bash(0, "python3 server.py", "^C\n", None, timed_out=True), bash(1, "python3 server.py &"),
              submit(2)], reward=1.0)  # passed: timeout_hang@0
    return [a, b, c, d, e, f, g]


def test_in_trial_recovery_all_states():
    rep = in_trial_recovery(trials())
    assert (rep.trajectories, rep.passed, rep.infra_faults, rep.unscored, rep.infra_steps) == (5, 2, 1, 1, 2)
    got = {k: (v.failure_states, v.recovered) for k, v in rep.categories.items() if v.failure_states}
    assert got == {"missing_dependency": (3, 1), "faulty_implementation": (2, 1),
                   "premature_completion": (1, 0), "timeout_hang": (1, 1)}
    md = rep.categories["missing_dependency"]
    assert md.recovery_rate == pytest.approx(1 / 3)
    assert md.stderr == pytest.approx(math.sqrt((1 / 3) * (2 / 3) / 3))
    assert rep.categories["wrong_state"].recovery_rate is None
    assert (rep.failure_states, rep.recovered) == (7, 3) and rep.recovery_rate == pytest.approx(3 / 7)
    table = rep.to_markdown()
    assert "| missing_dependency | 3 | 1 | 0.33 ± 0.27 |" in table
    assert "| wrong_state | 0 | 0 | - |" in table and "| **all** | 7 | 3 | 0.43 ± 0.19 |" in table
    assert "1 infrastructure faults, 1 unscored" in table
    blob = json.loads(json.dumps(rep.to_dict()))
    assert blob["categories"]["faulty_implementation"]["recovery_rate"] == 0.5 and blob["failure_states"] == 7


def test_in_trial_recovery_first_state_only_and_mixed_inputs():
    items = trials()
    items[0] = localise(items[0])  # a LocalisationResult is accepted as well as a trajectory
    rep = in_trial_recovery(items, scope="first")
    got = {k: (v.failure_states, v.recovered) for k, v in rep.categories.items() if v.failure_states}
    assert got == {"faulty_implementation": (2, 1), "premature_completion": (1, 0),
                   "missing_dependency": (1, 0), "timeout_hang": (1, 1)}
    assert rep.scope == "first" and (rep.failure_states, rep.recovered) == (5, 2)


def test_attempt_recovery_from_recorded_states():
    s, f = Outcome.SUCCESS, Outcome.FAILURE
    attempts = [
        RecoveryAttempt("s1", "missing_dependency", s),
        RecoveryAttempt("s1", "missing_dependency", f),
        RecoveryAttempt("s1", "missing_dependency", f),
        RecoveryAttempt("s2", "missing_dependency", f),
        RecoveryAttempt("s2", "missing_dependency", Outcome.SANDBOX_ERROR),  # excluded, counted apart
        RecoveryAttempt("s3", "faulty_implementation", Outcome.PENDING),  # never verified
        RecoveryAttempt("s3", "faulty_implementation", s),
    ]
    rep = attempt_recovery(attempts)
    md, fi = rep.categories["missing_dependency"], rep.categories["faulty_implementation"]
    assert (md.states, md.states_recovered, md.attempts, md.successes, md.infra_faults) == (2, 1, 4, 1, 1)
    assert md.success_rate == 0.25 and md.state_recovery_rate == 0.5
    assert md.stderr == pytest.approx(math.sqrt(0.25 * 0.75 / 4))
    assert (fi.states, fi.states_recovered, fi.attempts, fi.successes, fi.unscored) == (1, 1, 1, 1, 1)
    assert (rep.attempts, rep.successes, rep.infra_faults) == (5, 2, 1) and rep.success_rate == 0.4
    table = rep.to_markdown()
    assert "| missing_dependency | 2 | 1 | 4 | 1 | 0.25 ± 0.22 | 1 |" in table
    assert "| **all** | 3 | 2 | 5 | 2 | 0.40 ± 0.22 | 1 |" in table
    assert json.loads(json.dumps(rep.to_dict()))["categories"]["missing_dependency"]["state_recovery_rate"] == 0.5


def test_attempt_recovery_from_state_and_trajectory_pairs():
    state = localise(jq_then_bug()).primary  # faulty_implementation at step 5
    fixed = traj(state.history + [bash(6, "python3 solve.py", "6\n"), submit(7)], reward=1.0, prefix_len=6)
    broken = traj(state.history + [submit(6)], reward=0.0, prefix_len=6)
    rep = attempt_recovery([(state, fixed), (state, broken)])
    fi = rep.categories["faulty_implementation"]
    assert (fi.states, fi.states_recovered, fi.attempts, fi.successes) == (1, 1, 2, 1)
    with pytest.raises(ValueError, match="'none' is not a failure category"):
        attempt_recovery([RecoveryAttempt("x", "none", Outcome.SUCCESS)])
    with pytest.raises(ValueError, match="unknown error category"):
        attempt_recovery([RecoveryAttempt("x", "bogus", Outcome.SUCCESS)])


def test_markdown_table():
    assert markdown_table(["a", "b"], [["x", 1]]) == "| a | b |\n| --- | ---: |\n| x | 1 |"
