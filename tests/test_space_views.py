"""The Space's replay sources, HTML views and live-mode input checks, in-process (no server).

The served app is tested end to end in tests/test_space.py (gradio_client and Chromium).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "space"))

from reterm.agent.protocol import SYSTEM_PROMPT  # noqa: E402
from reterm.trajectory import Action, Step, Trajectory  # noqa: E402

from live_run import MAX_FORKS, check_endpoint, list_tasks, validate_request  # noqa: E402
from replay_sources import SourceError, fanout_view, open_source  # noqa: E402
from trajectory_view import EpisodeView, FanOutView, esc, render_episode, render_fanout  # noqa: E402

RECORDS = REPO / "tests" / "fixtures" / "reterm10k_mini"
JOBS = REPO / "tests" / "fixtures" / "jobs" / "demo"
ROOTS = [REPO / "tests" / "fixtures" / "tasks", REPO / "tasks"]


def _step(i: int, command: str | None, observation: str = "", exit_status: int | None = 0) -> Step:
    action = Action(tool="submit") if command is None else Action(tool="bash", command=command)
    return Step(index=i, model_text="", action=action, observation=observation, exit_status=exit_status)


def _attempt(k: int, reward: float, state: str = "s1") -> Trajectory:
    prefix = [_step(0, "ls", "a.txt\n[exit status: 0]"),
              _step(1, "jq . a.json", "bash: jq: command not found\n[exit status: 127]", 127)]  # fmt: skip
    own = [_step(2, f"python3 -m json.tool a.json # try {k}", "{}\n[exit status: 0]"), _step(3, None)]
    t = Trajectory(task_id="t", instruction="do it", system_prompt=SYSTEM_PROMPT, steps=prefix + own, prefix_len=2,
                   metadata={"failure_state": state, "attempt": k, "failure_category": "missing_dependency"})  # fmt: skip
    t.set_reward(reward)
    return t


# --------------------------------------------------------------------------------- records
def test_records_view_marks_failure_and_recovery():
    src = open_source(str(RECORDS))
    assert src.kind == "records" and len(src.items) == 24
    assert "missing_dependency" in src.categories()
    view = src.view("train:0")
    assert isinstance(view, EpisodeView)
    # record train:0: head (step 0), pandas import fails (step 1), recovery from step 2
    assert view.failure_step == 1 and view.failure_category == "missing_dependency"
    assert view.recovery_from == 2 and view.trajectory.passed
    html = render_episode(view)
    assert html.count('class="rt-step rt-failure"') == 1
    assert "No module named &#x27;pandas&#x27;" in html
    assert "recovery from the failure state" in html and "verifier passed" in html
    only = src.filtered("missing_dependency")
    assert only and all(i.category == "missing_dependency" for i in only)
    with pytest.raises(SourceError, match="no item"):
        src.view("train:999")


def test_job_folder_view_uses_localisation():
    src = open_source(str(JOBS))
    assert src.kind == "job"
    labels = {i.key: i.label for i in src.items}
    assert "task-a__demo0" in labels and "task-a__demo99" not in labels  # killed trial: no trajectory
    view = src.view("task-a__demo0")  # `jq` not found, then a fix; passes
    assert view.failure_step == 0 and view.failure_category == "missing_dependency" and view.recovery_from == 1
    failed = src.view("task-b__demo3")
    assert failed.trajectory.outcome.value == "failure" and failed.failure_category == "missing_dependency"
    assert "verifier failed" in render_episode(failed)


def test_attempt_folder_grouped_into_fanout(tmp_path):
    for k, reward in enumerate([1.0, 0.0, 1.0]):
        _attempt(k, reward).save(tmp_path / f"s1__{k}.json")
    _attempt(0, 1.0, state="s2").save(tmp_path / "other" / "s2__0.json")
    (tmp_path / "config.json").write_text('{"not": "a trajectory"}')
    src = open_source(str(tmp_path))
    assert src.kind == "trajectories" and len(src.items) == 2
    item = next(i for i in src.items if "fan-out of 3" in i.label)
    view = src.view(item.key)
    assert isinstance(view, FanOutView) and [a.reward for a in view.attempts] == [1.0, 0.0, 1.0]
    assert view.prefix.failure_step == 1 and view.prefix.failure_category == "missing_dependency"
    html = render_fanout(view)
    assert html.count('class="rt-col ') == 3 and "2 of 3 scored attempts recovered" in html
    assert html.count("rt-failure") == 1  # the shared failure step, drawn once


def test_fanout_category_from_classifier_when_not_recorded():
    attempts = [_attempt(k, 1.0) for k in range(2)]
    for a in attempts:
        a.metadata.pop("failure_category")
    view = fanout_view(attempts)
    assert view.prefix.failure_category == "missing_dependency"
    assert "jq: command not found" in view.prefix.failure_evidence


def test_source_errors_are_clear(tmp_path):
    with pytest.raises(SourceError, match="no source given"):
        open_source("  ")
    with pytest.raises(SourceError, match="no such file or folder"):
        open_source(str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(SourceError, match="found no ReTerm-10K shards"):
        open_source(str(tmp_path / "empty"))
    with pytest.raises(SourceError, match="cannot be opened here"):
        open_source(str(RECORDS), allowed_roots=[tmp_path])
    assert open_source(str(RECORDS), allowed_roots=[REPO / "tests"]).kind == "records"


def test_escaping_keeps_terminal_text_inert():
    text = "<script>alert(1)</script> ${HOME} {{user}} & done"
    out = esc(text)
    assert "<" not in out and "{" not in out and "$" not in out
    steps = [_step(0, "echo '${HOME}'", text + "\n[exit status: 0]")]
    traj = Trajectory(task_id="t", instruction="x", system_prompt="", steps=steps)
    html = render_episode(EpisodeView(traj))
    assert "<script>" not in html and "{{user}}" not in html


# ------------------------------------------------------------------------------ live inputs
def test_validate_request_accepts_suite_task_and_defaults_instruction():
    req = validate_request(task="hello-file", model="oracle", forks=3, task_roots=ROOTS)
    assert req.task_dir == ROOTS[0] / "hello-file" and req.policy_spec == "oracle"
    assert "Hello, world!" in req.instruction and req.policy_kwargs == {"tasks": str(req.task_dir)}
    assert "replace-missing-jq" in list_tasks(ROOTS) and list_tasks(ROOTS)["replace-missing-jq"][1] == "train"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(task="no-such-task"), "unknown task 'no-such-task'"),
        (dict(task=""), "no task chosen"),
        (dict(task="hello-file", forks=MAX_FORKS + 1), f"between 0 and {MAX_FORKS}"),
        (dict(task="hello-file", max_turns=0), "max turns must be between 1"),
        (dict(task="hello-file", instruction="   "), "instruction is empty"),
        (dict(task="", task_folder=str(ROOTS[0] / "hello-file"), instruction=""), "instruction is empty"),
        (dict(task="", task_folder=str(REPO / "space")), "not a Harbor task folder"),
        (dict(task="", task_folder=str(ROOTS[0] / "hello-file"), instruction="x", allow_local_paths=False),
         "local task folders cannot be used"),
        (dict(task="hello-file", model="checkpoint", checkpoint=""), "no checkpoint given"),
        (dict(task="hello-file", model="checkpoint", checkpoint=str(REPO / "space")), "not a transformers checkpoint"),
        (dict(task="hello-file", model="checkpoint", checkpoint="./no-such-ckpt"), "./no-such-ckpt: no such checkpoint"),
        (dict(task="hello-file", model="checkpoint", checkpoint="runs/a/b"), "read as a Hub model id, which is ORG/NAME"),
        (dict(task="hello-file", model="endpoint", base_url="localhost:8000", endpoint_model="m"), "must start with http"),
        (dict(task="hello-file", model="gpt-9"), "unknown model choice"),
        (dict(task="hello-file", temperature=5), "temperature must be between 0 and 2"),
    ],
)
def test_validate_request_rejects_bad_input(kwargs, message):
    args = dict(model="oracle", task_roots=ROOTS) | kwargs
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        validate_request(**args)


def test_unreachable_endpoint_is_named():
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ValueError, match=f"cannot reach the endpoint http://127.0.0.1:{port}/v1"):
        check_endpoint(f"http://127.0.0.1:{port}/v1", "m", timeout_s=2)


# ---------------------------------------------------------------------------- Space metadata
def test_space_readme_header_is_valid_hub_metadata():
    from reterm.hub_metadata import check_readme

    card = check_readme((REPO / "space" / "README.md").read_text(), "space", where="space/README.md")
    assert card["sdk"] == "gradio" and card["sdk_version"] == "6.31.0" and card["app_file"] == "app.py"
    assert str(card["python_version"]) == "3.12" and card["datasets"] == ["twothsnd/ReTerm-10K"]
    assert card["suggested_hardware"] and card["models"]
    pins = dict(line.split("==") for line in (REPO / "requirements.txt").read_text().splitlines() if "==" in line)
    assert pins["gradio"] == card["sdk_version"]  # the Space runs the Gradio the kit is tested with


def test_public_config_confines_paths(tmp_path):
    from app import default_config

    cfg = default_config(tasks=[str(ROOTS[0])], sources=[str(RECORDS)], runs_dir=str(tmp_path), public=True)
    assert not cfg.allow_local_paths and cfg.allowed_roots is not None
    assert open_source(str(RECORDS), allowed_roots=cfg.allowed_roots).kind == "records"
    with pytest.raises(SourceError, match="cannot be opened here"):
        open_source(str(JOBS), allowed_roots=cfg.allowed_roots)
    with pytest.raises(ValueError, match="local task folders cannot be used"):
        validate_request(task="", task_folder=str(ROOTS[0] / "hello-file"), instruction="x", task_roots=cfg.task_roots,
                         allow_local_paths=cfg.allow_local_paths)  # fmt: skip
    local = default_config(tasks=[str(ROOTS[0])], sources=[str(RECORDS)], runs_dir=str(tmp_path), public=False)
    assert local.allow_local_paths and local.allowed_roots is None


# ------------------------------------------------------------------------ live run, in-process
def test_premature_submit_forks_from_the_end_state():
    """No step fails, the agent submits too early: the verifier fails, localisation finds a premature
    completion, and the attempts start from the end state snapshotted before the verifier ran."""
    import asyncio

    from sandbox_support import run_dirs_of

    from reterm.policies.base import Generation
    from reterm.policies.scripted import OraclePolicy, bash_call, submit_call

    from live_run import LiveRun

    task = ROOTS[0] / "hello-file"
    oracle = OraclePolicy(task)

    class EarlyThenOracle:  # main episode: `true`, then submit; recovery attempts: the oracle
        name, calls = "early-then-oracle", 0

        def generate(self, batch, tools):
            self.calls += 1
            if self.calls <= 2:
                return [Generation(text=bash_call("true") if self.calls == 1 else submit_call())]
            return oracle.generate(batch, tools)

    req = validate_request(task="hello-file", model="oracle", forks=2, task_roots=ROOTS)
    st = asyncio.run(LiveRun(req, EarlyThenOracle()).run())
    assert st.error is None, st.error
    assert st.forked_at_end and st.failure_category == "premature_completion"
    assert st.main.outcome.value == "failure" and [s.command for s in st.main.steps] == ["true", None]
    assert [a.reward for a in st.attempts] == [1.0, 1.0]
    assert all(a.prefix_len == 1 for a in st.attempts)  # the submit is not part of the attempts' history
    assert run_dirs_of(os.getpid()) == []


def test_grpo_rollouts_open_as_one_fanout_per_group(tmp_path):
    """ReTerm-GRPO's rollouts/ (written with the trainer's own row format) open in the Space: one fan-out per
    group; an attempt without a trajectory (an infrastructure fault) is counted, not drawn."""
    from reterm.training.failure_pool import PoolState
    from reterm.training.grpo_outputs import rollout_rows
    from reterm.training.grpo_rollout import Attempt, GroupRollout

    state = PoolState.from_prompt(state_id="s1", task_id="t", task_dir="tasks/t", prompt=[], category="missing_dependency")
    group = GroupRollout(state=state, group=0)
    for k, reward in enumerate([1.0, 0.0, 1.0]):
        traj = _attempt(k, reward)
        group.attempts.append(Attempt("s1", 0, k, trajectory=traj, reward=reward, outcome=traj.outcome.value))
    group.attempts.append(Attempt("s1", 0, 3, reward=None, outcome="sandbox_error", mask_reason="infra_fault"))
    rollouts = tmp_path / "run" / "rollouts"
    rollouts.mkdir(parents=True)
    (rollouts / "round-00002-step-00002-rank0.jsonl").write_text(
        "\n".join(__import__("json").dumps(r) for r in rollout_rows([group], step=2, generation_round=2)) + "\n")
    for spec in (rollouts, tmp_path / "run"):  # the rollouts folder, or the run's output_dir
        src = open_source(str(spec))
        assert len(src.items) == 1 and "2 group" not in src.description
        item = src.items[0]
        assert "step 2" in item.label and "group of 4" in item.label and "2 recovered" in item.label
        assert "1 infra" in item.label and item.category == "missing_dependency"
        view = src.view(item.key)
        assert isinstance(view, FanOutView) and [a.reward for a in view.attempts] == [1.0, 0.0, 1.0]
        assert view.prefix.failure_step == 1 and "2 of 3 scored attempts recovered" in render_fanout(view)
    (rollouts / "round-00003-step-00003-rank0.jsonl").write_text('{"group": 0}\n')
    with pytest.raises(SourceError, match=r"round-00003-step-00003-rank0.jsonl:1: not a GRPO rollout row"):
        open_source(str(rollouts))
