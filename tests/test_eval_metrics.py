"""reterm.eval.metrics on hand-built Harbor job folders (tests/fixtures/jobs, see build_fixtures.py there).

Expected values are worked out by hand below from the trial list in build_fixtures.py.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from harbor.models.trial.result import TrialResult
from harbor.utils.pass_at_k import compute_pass_at_k_by_evals

from reterm.eval.metrics import (
    classify_trial,
    load_job,
    pass_at_1,
    pass_at_k,
    pass_at_ks,
    reward_of,
    summarize,
    task_counts,
)
from reterm.trajectory import Outcome

JOBS = Path(__file__).parent / "fixtures" / "jobs"


def test_classification_of_each_fault_and_the_timeout():
    job = load_job(JOBS / "demo")
    by_exc = {t.exception_type: t for t in job.trials if t.exception_type}
    assert by_exc["AgentTimeoutError"].outcome is Outcome.FAILURE  # agent timeout = failure (TB rule)
    assert by_exc["AgentTimeoutError"].agent_timed_out
    assert by_exc["RewardFileNotFoundError"].outcome is Outcome.VERIFIER_ERROR  # missing reward file
    assert by_exc["SandboxBuildFailedError"].outcome is Outcome.SANDBOX_ERROR
    assert by_exc["VerifierTimeoutError"].outcome is Outcome.VERIFIER_TIMEOUT
    # Harbor would score this one (unknown type, reward 1); a harness crash is a fault here
    assert by_exc["RuntimeError"].outcome is Outcome.HARNESS_ERROR
    assert all(t.outcome.is_infra_fault for e, t in by_exc.items() if e != "AgentTimeoutError")
    assert [Path(p).name for p in job.incomplete] == ["task-a__demo99"]
    assert len(job.trials) == 15


def test_counts_and_pass_at_1_by_hand():
    job = load_job(JOBS / "demo")
    counts = task_counts(job.trials)
    # faults leave the denominators: b loses the missing reward, c the build failure,
    # d the verifier timeout, e the harness crash; the timeout stays in b as a failure
    assert counts == {"task-a": (3, 2), "task-b": (2, 0), "task-c": (2, 2), "task-d": (2, 1), "task-e": (2, 2)}
    p1 = pass_at_1(counts)
    # mean of per-task rates (2/3, 0, 1, 1/2, 1) = (19/6) / 5 = 19/30
    assert p1.mean == pytest.approx(19 / 30)
    # stderr = sqrt(sum p(1-p)/(n-1)) / T = sqrt((2/9)/2 + 0 + 0 + (1/4)/1 + 0) / 5 = sqrt(13/36) / 5
    assert p1.stderr == pytest.approx(math.sqrt(13) / 6 / 5)
    assert (p1.n_trials, p1.n_tasks) == (11, 5)


def test_pass_at_k_by_hand_and_against_harbor():
    assert pass_at_k(3, 2, 2) == 1.0  # any 2 of {1,1,0} hold a pass
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - 3 / 6)  # 1 - C(3,2)/C(4,2)
    assert pass_at_k(5, 0, 3) == 0.0
    with pytest.raises(ValueError):
        pass_at_k(2, 1, 3)
    counts = task_counts(load_job(JOBS / "demo").trials)
    # k=2: a 1, b 1-C(2,2)/C(2,2)=0, c 1, d 1-C(1,2)/C(2,2)=1, e 1 -> 4/5
    assert pass_at_ks(counts) == pytest.approx({1: 19 / 30, 2: 0.8})
    # only task-a has 3 trials: pass@3 = 1
    assert pass_at_ks(counts, [3]) == {3: 1.0}

    # Harbor's estimator on the same trials agrees once the trial Harbor scores but we do not
    # (the harness crash) is left out; Harbor already drops the other faults (no reward).
    results = [TrialResult.model_validate_json(p.read_text()) for p in sorted((JOBS / "demo").glob("*/result.json"))]
    kept = [r for r in results if not (r.exception_info and r.exception_info.exception_type == "RuntimeError")]
    harbor = next(iter(compute_pass_at_k_by_evals(kept).values()))
    assert harbor[2] == pytest.approx(pass_at_ks(counts)[2])


def test_summary_block():
    job = load_job(JOBS / "demo")
    info = {"task-a": {"categories": ["files"], "difficulty": "easy"}}
    s = summarize(job.trials, job.incomplete, info)
    assert s["infra_faults"]["n"] == 5  # 4 faulted trials + 1 incomplete
    assert s["infra_faults"]["by_outcome"] == {
        "verifier_error": 1, "sandbox_error": 1, "verifier_timeout": 1, "harness_error": 1}
    assert s["agent_timeouts"] == 1
    assert s["n_trials_total"] == 16
    assert s["per_task"]["task-a"] == {
        "n_trials": 3, "n_passed": 2, "pass_rate": pytest.approx(2 / 3), "n_infra_faults": 0,
        "n_agent_timeouts": 0, "categories": ["files"], "difficulty": "easy"}
    assert s["per_task"]["task-b"]["n_infra_faults"] == 1
    assert s["per_task"]["task-b"]["n_agent_timeouts"] == 1


def test_oracle_job_and_single_trial_stderr():
    job = load_job(JOBS / "oracle")
    p1 = pass_at_1(task_counts(job.trials))
    assert p1.mean == 1.0
    assert p1.stderr is None  # tasks b..e have one trial: the estimator needs n_t >= 2
    assert pass_at_1({"x": (3, 3), "y": (2, 2)}).stderr == 0.0
    assert pass_at_1({}).mean is None


def test_bad_inputs_name_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such Harbor job folder"):
        load_job(tmp_path / "missing")
    (tmp_path / "t1").mkdir()
    (tmp_path / "t1" / "result.json").write_text("{}")
    with pytest.raises(ValueError, match="t1/result.json"):
        load_job(tmp_path)


def test_a_torn_result_is_an_incomplete_trial_not_an_error(tmp_path, capsys):
    """A result.json cut short by a kill (new-user case) counts as an incomplete trial; the rest still score."""
    import shutil

    for name in ("task-a__demo0", "task-b__demo3"):
        shutil.copytree(JOBS / "demo" / name, tmp_path / name)
    torn = tmp_path / "task-b__demo3" / "result.json"
    torn.write_text(torn.read_text()[:200])
    job = load_job(tmp_path)
    assert [t.trial for t in job.trials] == ["task-a__demo0"]
    assert job.incomplete == [str(tmp_path / "task-b__demo3")]
    assert "task-b__demo3/result.json is not complete JSON" in capsys.readouterr().err


@pytest.mark.parametrize("rewards, says", [
    ({"a": 1.0, "b": 0.0}, "several rewards ['a', 'b'] and none named 'reward'"),
    ({"reward": 1.7}, "reward 'reward' is 1.7, outside [0, 1]"),
    ({"reward": -1}, "reward 'reward' is -1.0, outside [0, 1]"),
    ({"score": 2}, "reward 'score' is 2.0, outside [0, 1]"),
])
def test_a_bad_reward_is_a_verifier_fault_of_that_trial_only(tmp_path, rewards, says):
    """Several keys without 'reward', or a value outside [0, 1]: a verifier fault naming the file and
    the value; the other trials of the job still score."""
    import shutil

    from reterm.rewards import RewardError

    for name in ("task-a__demo0", "task-b__demo3"):
        shutil.copytree(JOBS / "demo" / name, tmp_path / name)
    path = tmp_path / "task-a__demo0" / "result.json"
    result = TrialResult.model_validate_json(path.read_text())
    result.verifier_result.rewards = rewards
    assert classify_trial(result) == (Outcome.VERIFIER_ERROR, None)
    with pytest.raises(RewardError, match="task-a__demo0"):
        reward_of(result)
    path.write_text(result.model_dump_json())
    (tmp_path / "task-a__demo0" / "verifier").mkdir(exist_ok=True)
    (tmp_path / "task-a__demo0" / "verifier" / "reward.json").write_text(json.dumps(rewards))
    job = load_job(tmp_path)
    bad, good = job.trials
    assert bad.outcome is Outcome.VERIFIER_ERROR and not bad.scored and bad.exception_type == "RewardError"
    assert says in bad.exception_message and "task-a__demo0/verifier/reward.json" in bad.exception_message
    assert good.scored and good.trial == "task-b__demo3"
    summary = summarize(job.trials)
    assert summary["infra_faults"]["by_exception"] == {"RewardError": 1} and summary["pass_at_1"]["n_trials"] == 1


def test_recovery_within_trials_by_hand():
    from reterm.eval.recovery import recovery_in_trials

    # build_fixtures.py: trajectories of trials 0-5. `jq` not found in trial 0 (passed), 3 (failed) and
    # 5 (missing reward file: a fault, left out) -> 2 states, 1 recovered; a missing file in trial 2
    # (failed) -> 1 state, 0 recovered; the hang in trial 4 (agent timeout, failed) -> 1, 0.
    # Trial 1 has no error; trials without a trajectory add nothing.
    rec = recovery_in_trials(load_job(JOBS / "demo").trials)
    assert {c: (e["failure_states"], e["recovered"]) for c, e in rec.items()} == {
        "missing_dependency": (2, 1), "path_permission": (1, 0), "timeout_hang": (1, 0)}
    assert rec["missing_dependency"]["rate"] == 0.5
    assert recovery_in_trials(load_job(JOBS / "oracle").trials) == {}  # Harbor's oracle writes no trajectory


@pytest.mark.parametrize("exc_type, message, outcome", [
    ("EpisodeFault", "endpoint_error: connection refused", Outcome.ENDPOINT_ERROR),
    ("EpisodeFault", "sandbox_error: tmux died", Outcome.SANDBOX_ERROR),
    ("EpisodeFault", "something odd", Outcome.HARNESS_ERROR),
    ("APIConnectionError", "litellm could not connect", Outcome.ENDPOINT_ERROR),
    ("EnvironmentStartTimeoutError", "start timed out", Outcome.ENVIRONMENT_TIMEOUT),
    ("CancelledError", "", Outcome.HARNESS_ERROR),
    ("ContextWindowExceededError", "too long", Outcome.SUCCESS),  # an agent outcome: its reward (1) counts
])
def test_exception_mapping(exc_type, message, outcome):
    from harbor.models.trial.result import ExceptionInfo

    result = TrialResult.model_validate_json((JOBS / "demo" / "task-a__demo0" / "result.json").read_text())
    result.exception_info = ExceptionInfo(exception_type=exc_type, exception_message=message,
                                          exception_traceback="", occurred_at=result.started_at)
    assert classify_trial(result)[0] is outcome
