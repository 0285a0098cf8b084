"""One set of generation defaults (reterm.generation) in every harness: ``reterm run``, ``reterm serve``, the
Harbor agent, the drills evaluation and GRPO's config; the README's ``--ak`` line gives a Harbor trial the
evaluation's settings; ``reterm run`` stops on repeated parse errors."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from reterm import generation as g

REPO = Path(__file__).resolve().parents[1]


def _readme_harbor_lines() -> list[str]:
    """The README's `harbor run` commands (continuation lines joined)."""
    text = (REPO / "README.md").read_text().replace("\\\n", " ")
    return [line.strip() for line in text.splitlines() if line.strip().startswith(".venv/bin/harbor run")]


def _ak(line: str) -> dict[str, str]:
    words = shlex.split(line)
    return dict(words[i + 1].split("=", 1) for i, w in enumerate(words) if w == "--ak")


def test_the_readme_ak_line_gives_a_harbor_trial_the_evaluations_settings(tmp_path):
    from reterm.agent.harbor import ReTermAgent
    from reterm.eval.drills import build_parser

    # the README's line gives run_all's evaluation turns too (its EVAL_SIZE --max-turns)
    turns = int(re.search(r"EVAL_SIZE=\([^)]*--max-turns (\d+)", (REPO / "train" / "run_all.sh").read_text()).group(1))
    assert g.harbor_agent_args(max_turns=turns) in (REPO / "README.md").read_text()
    lines = [line for line in _readme_harbor_lines() if "policy_kwargs" in line]
    assert len(lines) == 1
    agent = ReTermAgent(logs_dir=tmp_path, **_ak(lines[0]))
    evaluation = build_parser().parse_args(["--tasks", "t", "--model", "m=smollm2", "--output", "o"])
    assert agent.policy_kwargs["max_new_tokens"] == evaluation.max_new_tokens == g.MAX_TURN_TOKENS
    assert agent.policy_kwargs["temperature"] == g.TEMPERATURE == 0
    assert agent.max_consecutive_parse_errors == g.MAX_CONSECUTIVE_PARSE_ERRORS
    # the agent's defaults are the same without the line; an override wins; a replay gets no sampling keywords
    assert ReTermAgent(logs_dir=tmp_path, policy="hf:./x").policy_kwargs == {"temperature": 0.0, "max_new_tokens": 96}
    assert ReTermAgent(logs_dir=tmp_path, policy_kwargs='{"max_new_tokens": 9}').policy_kwargs["max_new_tokens"] == 9
    assert ReTermAgent(logs_dir=tmp_path, policy="oracle").policy_kwargs == {}
    assert ReTermAgent(logs_dir=tmp_path, policy="openai:m").policy_kwargs == {}  # the server's defaults apply


def test_every_harness_defaults_to_the_shared_values():
    from reterm.agent.cli import _parser as run_parser
    from reterm.eval.drills import build_parser as eval_parser
    from reterm.policies.serve import build_parser as serve_parser
    from reterm.training.grpo_config import ReTermGRPOConfig
    from reterm.training.grpo_rollout import RolloutSettings

    serve = serve_parser().parse_args(["smollm2"])
    assert (serve.max_new_tokens, serve.temperature) == (g.MAX_TURN_TOKENS, g.TEMPERATURE)
    assert run_parser().parse_args(["t"]).max_parse_errors == g.MAX_CONSECUTIVE_PARSE_ERRORS
    assert eval_parser().parse_args(["--tasks", "t", "--model", "m=x", "--output", "o"]).max_new_tokens == g.MAX_TURN_TOKENS
    cfg = ReTermGRPOConfig(output_dir="/tmp/unused", use_cpu=True, bf16=False, report_to=[])
    assert cfg.max_turn_tokens == g.MAX_TURN_TOKENS
    assert cfg.max_consecutive_parse_errors == RolloutSettings().max_consecutive_parse_errors == g.MAX_CONSECUTIVE_PARSE_ERRORS
    assert g.policy_defaults("smollm2") == {"temperature": 0.0, "max_new_tokens": g.MAX_TURN_TOKENS}
    assert cfg.unsubmitted_reward_scale == RolloutSettings().unsubmitted_reward_scale == 1.0  # the verifier's reward
    with pytest.raises(ValueError, match=r"unsubmitted_reward_scale: 1.5 is not in \[0, 1\]"):
        ReTermGRPOConfig(output_dir="/tmp/unused", use_cpu=True, bf16=False, report_to=[], unsubmitted_reward_scale=1.5)
    assert g.policy_defaults("oracle", tasks="x") == {"tasks": "x"}


def test_the_harbor_agent_sets_the_thread_policy_before_torch():
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    code = ("import os, sys; import reterm.agent.harbor; assert 'torch' not in sys.modules; "
            "print(os.environ.get('OMP_WAIT_POLICY'))")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "PASSIVE"


@pytest.mark.parametrize("limit,steps", [(None, g.MAX_CONSECUTIVE_PARSE_ERRORS), ("4", 4)])
def test_reterm_run_stops_on_repeated_parse_errors(limit, steps, tmp_path, monkeypatch):
    import reterm.policies
    from reterm.agent import cli
    from reterm.policies.scripted import ScriptedPolicy

    seen: dict = {}

    def fake_load(spec, **kwargs):
        seen.update(kwargs)
        return ScriptedPolicy(lambda messages: "I would rather talk than call a tool.", name="prose")

    monkeypatch.setattr(reterm.policies, "load_policy", fake_load)
    out = tmp_path / "run"
    argv = [str(REPO / "tasks" / "semver-sort"), "--policy", "smollm2", "--max-turns", "10", "--output", str(out),
            "--no-verify"]  # fmt: skip
    assert cli.main(argv + (["--max-parse-errors", limit] if limit else [])) == 0
    assert seen == {"temperature": 0.0, "max_new_tokens": g.MAX_TURN_TOKENS}
    traj = json.loads((out / "agent" / "reterm_trajectory.json").read_text())
    assert traj["stop_reason"] == "parse_errors" and len(traj["steps"]) == steps
