"""The Harbor adapter and the `reterm run` command: real `harbor run` jobs
with ReTermAgent on the local sandbox, and the CLI on a suite task."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from reterm.agent.atif import from_atif, trajectory_from_trial
from reterm.agent.cli import main as run_main
from reterm.trajectory import Outcome, Trajectory

REPO = Path(__file__).resolve().parents[1]
SUITE_TASK = REPO / "tasks" / "semver-sort"
HELLO_TASK = REPO / "tests" / "fixtures" / "tasks" / "hello-file"


def _harbor_run(tmp_path: Path, task: Path, *agent_kwargs: str) -> Path:
    args = [str(Path(sys.executable).parent / "harbor"), "run", "-p", str(task),
            "-a", "reterm.agent.harbor:ReTermAgent", "-e", "reterm.sandbox.local:LocalEnvironment",
            "-o", str(tmp_path / "jobs"), "-y"]  # fmt: skip
    for kv in agent_kwargs:
        args += ["--ak", kv]
    proc = subprocess.run(args, capture_output=True, text=True, cwd=tmp_path, timeout=600,
                          env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"})  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    trials = [p.parent for p in (tmp_path / "jobs").glob("*/*/result.json")]
    assert len(trials) == 1, list((tmp_path / "jobs").rglob("*"))
    return trials[0]


@pytest.mark.slow
def test_harbor_adapter_oracle_gets_reward_1_on_a_suite_task(tmp_path):
    trial = _harbor_run(tmp_path, SUITE_TASK, "policy=oracle")
    result = json.loads((trial / "result.json").read_text())
    assert result["verifier_result"]["rewards"]["reward"] == 1.0 and result["exception_info"] is None
    assert result["agent_info"]["name"] == "reterm"
    assert result["agent_result"]["metadata"]["stop_reason"] == "submitted"
    own = Trajectory.load(trial / "agent" / "reterm_trajectory.json")
    assert from_atif(trial / "agent" / "trajectory.json") == own  # ATIF in the trial folder, lossless
    assert own.outcome is Outcome.PENDING  # Harbor verifies; the agent does not
    traj = trajectory_from_trial(trial)
    assert traj.outcome is Outcome.SUCCESS and traj.reward == 1.0 and traj.task_id == "semver-sort"
    assert traj.steps[-1].action.tool == "submit" and all(s.exit_status == 0 for s in traj.steps[:-1])


@pytest.mark.slow
def test_harbor_adapter_endpoint_fault_is_recorded_as_a_fault(tmp_path):
    trial = _harbor_run(tmp_path, HELLO_TASK, "policy=openai:no-such-model", "base_url=http://127.0.0.1:9/v1",
                        'policy_kwargs={"max_retries": 0}')  # fmt: skip
    result = json.loads((trial / "result.json").read_text())
    assert result["exception_info"]["exception_type"] == "EpisodeFault"
    assert result["exception_info"]["exception_message"].startswith("endpoint_error:")
    traj = trajectory_from_trial(trial)
    assert traj.outcome is Outcome.ENDPOINT_ERROR and traj.reward is None  # never scored


def test_reterm_run_cli_oracle_on_a_suite_task(tmp_path, capsys):
    out = tmp_path / "run"
    rc = run_main([str(SUITE_TASK), "--policy", "oracle", "--env", "local", "--output", str(out)])
    printed = capsys.readouterr().out
    assert rc == 0, printed[-3000:]
    assert "reward 1" in printed and "outcome success" in printed
    assert "$ python3 /app/semver_sort.py < /app/versions.txt" in printed and "[exit status: 0]" in printed
    traj = Trajectory.load(out / "agent" / "reterm_trajectory.json")
    assert traj.outcome is Outcome.SUCCESS and traj.reward == 1.0
    assert from_atif(out / "agent" / "trajectory.json") == traj
    assert (out / "verifier").is_dir()


def test_reterm_run_cli_bad_arguments(tmp_path, capsys):
    assert run_main([str(tmp_path / "nope")]) == 2
    assert "not a task folder" in capsys.readouterr().err
    assert run_main([str(HELLO_TASK), "--env", "no-such-env", "--policy", "oracle", "--output", str(tmp_path / "o")]) == 2
    assert "no-such-env" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()  # nothing was made for a run that could not start


def test_concurrent_trials_load_the_policy_once():
    """Trials of one Harbor job run ``setup`` in parallel threads; they must share one loaded model.
    Unserialised, concurrent transformers loads failed ("Cannot copy out of meta tensor": found by the
    pipeline's concurrent rollouts)."""
    from concurrent.futures import ThreadPoolExecutor

    from reterm.agent import harbor

    kwargs = {"max_new_tokens": 7}  # a key no other test uses, so the cache starts empty
    harbor._POLICIES.pop(harbor.json.dumps(["smollm2", kwargs], sort_keys=True, default=str), None)
    with ThreadPoolExecutor(4) as pool:
        policies = list(pool.map(lambda _: harbor._load_policy("smollm2", kwargs), range(4)))
    assert all(p is policies[0] for p in policies)


def test_agent_defaults_stop_after_parse_errors_and_report_progress(tmp_path):
    from reterm.agent.harbor import DEFAULT_MAX_CONSECUTIVE_PARSE_ERRORS, ReTermAgent, progress_line
    from reterm.trajectory import Action, Step

    agent = ReTermAgent(logs_dir=tmp_path)
    assert agent.max_consecutive_parse_errors == DEFAULT_MAX_CONSECUTIVE_PARSE_ERRORS == 2  # reterm.generation and agent.progress
    off = ReTermAgent(logs_dir=tmp_path, max_consecutive_parse_errors="0", progress="false")
    assert off.max_consecutive_parse_errors is None and not off.progress
    assert ReTermAgent(logs_dir=tmp_path, max_consecutive_parse_errors="5").max_consecutive_parse_errors == 5
    with pytest.raises(ValueError, match="progress"):
        ReTermAgent(logs_dir=tmp_path, progress="maybe")
    bash = Step(index=0, model_text="", action=Action(tool="bash", command="make\nmake test"), generation_s=1.5,
                execution_s=0.25)  # fmt: skip
    assert progress_line("t", bash, 30, 12.0) == "[reterm] t turn 1/30  1.8 s (12 s in all)  $ make ..."
    bad = Step(index=4, model_text="hi", parse_error="no_tool_call", generation_s=3.0)
    assert progress_line("t", bad, 30, 40.0).endswith("turn 5/30  3.0 s (40 s in all)  parse error: no_tool_call")


@pytest.mark.slow
def test_harbor_trial_of_base_smollm2_stops_on_parse_errors_with_its_steps_on_disk(tmp_path):
    """The base model writes no tool call: the trial ends after the shared default number of parse errors in a row
    (reterm.generation.MAX_CONSECUTIVE_PARSE_ERRORS), long before the
    task's 1200 s agent timeout, prints a line per turn, and keeps its steps; no LiteLLM cost-map fetch."""
    env = {k: v for k, v in os.environ.items() if k != "LITELLM_LOCAL_MODEL_COST_MAP"}
    args = [str(Path(sys.executable).parent / "harbor"), "run", "-p", str(SUITE_TASK),
            "-a", "reterm.agent.harbor:ReTermAgent", "-e", "reterm.sandbox.local:LocalEnvironment",
            "--ak", "policy=smollm2", "--ak", 'policy_kwargs={"max_new_tokens": 48, "temperature": 0}',
            "-o", str(tmp_path / "jobs"), "-y"]  # fmt: skip
    proc = subprocess.run(args, capture_output=True, text=True, cwd=tmp_path, timeout=600, env=env)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    assert "cost map" not in output
    (trial,) = [p.parent for p in (tmp_path / "jobs").glob("*/*/result.json")]
    result = json.loads((trial / "result.json").read_text())
    assert result["agent_result"]["metadata"]["stop_reason"] == "parse_errors"
    own = Trajectory.load(trial / "agent" / "reterm_trajectory.json")
    from reterm.generation import MAX_CONSECUTIVE_PARSE_ERRORS

    assert len(own.steps) == MAX_CONSECUTIVE_PARSE_ERRORS
    assert all(s.action is None and s.parse_error for s in own.steps)
    assert from_atif(trial / "agent" / "trajectory.json") == own
    lines = [line for line in output.splitlines() if line.startswith("[reterm] reterm/semver-sort turn ")]
    assert [line.split()[3] for line in lines] == [f"{k}/30" for k in range(1, MAX_CONSECUTIVE_PARSE_ERRORS + 1)] and "parse error: " in lines[0]
    from datetime import datetime

    timing = {k: datetime.fromisoformat(v) for k, v in result["agent_execution"].items()}
    assert (timing["finished_at"] - timing["started_at"]).total_seconds() < 1200 / 4
