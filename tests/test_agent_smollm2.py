"""The harness with the real embedded model: SmolLM2-135M-Instruct completes a
5-turn episode on a suite task through `reterm run` and through the Harbor adapter without crashing,
and its trajectory round-trips through ATIF and chat messages. Greedy decoding, short turns."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from reterm.agent.atif import conversation_view, from_atif, from_messages, trajectory_from_trial
from reterm.agent.cli import main as run_main
from reterm.agent.protocol import PARSE_OUTCOMES
from reterm.trajectory import Trajectory

REPO = Path(__file__).resolve().parents[1]
SUITE_TASK = REPO / "tasks" / "semver-sort"
POLICY_KWARGS = {"max_new_tokens": 48, "temperature": 0}
TURNS = 5


def _check(traj: Trajectory) -> None:
    assert not traj.outcome.is_infra_fault, traj.error
    assert traj.reward is not None
    assert traj.policy == "smollm2"
    # the Harbor agent stops after 3 replies in a row without a valid tool call (its default)
    assert len(traj.steps) >= TURNS or traj.stop_reason in ("submitted", "parse_errors")
    assert traj.metadata["turns"] == len(traj.steps)
    assert sum(traj.metadata["parse_outcomes"].values()) == len(traj.steps)
    for step in traj.steps:
        assert step.generation_s > 0 and step.completion_tokens
        assert (step.parse_error is None) == (step.action is not None)
        assert step.parse_error is None or step.parse_error in PARSE_OUTCOMES
        assert step.observation or step.action.tool == "submit"
    assert from_atif(json.loads(json.dumps(_atif(traj)))) == traj
    messages = traj.to_messages()
    assert from_messages(messages).to_messages() == messages
    assert conversation_view(from_messages(messages)) == conversation_view(traj)


def _atif(traj: Trajectory) -> dict:
    from reterm.agent.atif import to_atif

    return to_atif(traj).to_json_dict()


@pytest.mark.slow
def test_reterm_run_smollm2_five_turns(tmp_path, capsys):
    out = tmp_path / "run"
    # --max-parse-errors 0: run every turn (the base model writes no tool call; the default stops after 2)
    args = [str(SUITE_TASK), "--policy", "smollm2", "--max-turns", str(TURNS), "--time-budget", "3600", "--max-parse-errors", "0",
            "--output", str(out)] + [f"--policy-arg={k}={v}" for k, v in POLICY_KWARGS.items()]  # fmt: skip
    rc = run_main(args)
    printed = capsys.readouterr().out
    assert rc == 0, printed[-3000:]
    assert "step 5" in printed or "submit" in printed
    traj = Trajectory.load(out / "agent" / "reterm_trajectory.json")
    _check(traj)
    assert from_atif(out / "agent" / "trajectory.json") == traj


@pytest.mark.slow
def test_harbor_adapter_smollm2_five_turns(tmp_path):
    args = [str(Path(sys.executable).parent / "harbor"), "run", "-p", str(SUITE_TASK),
            "-a", "reterm.agent.harbor:ReTermAgent", "-e", "reterm.sandbox.local:LocalEnvironment",
            "-o", str(tmp_path / "jobs"), "-y", "--ak", "policy=smollm2", "--ak", f"max_turns={TURNS}",
            "--ak", f"policy_kwargs={json.dumps(POLICY_KWARGS)}"]  # fmt: skip
    proc = subprocess.run(args, capture_output=True, text=True, cwd=tmp_path, timeout=1800,
                          env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"})  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (result_path,) = (tmp_path / "jobs").glob("*/*/result.json")
    result = json.loads(result_path.read_text())
    assert result["exception_info"] is None, result["exception_info"]
    traj = trajectory_from_trial(result_path.parent)
    _check(traj)
    assert traj.reward == result["verifier_result"]["rewards"]["reward"]
