"""Hostile or malformed inputs a new user tried on recently changed parts (a break-it pass, 30 Nov 2026):
each test failed on the code as found (a traceback, a silent wrong result or a leftover folder) and states
the behaviour a user expects. Real parts: real files, the real CLIs' ``main`` functions; seconds each.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "space"))
sys.path.insert(0, str(REPO / "train"))

from reterm.agent.protocol import SYSTEM_PROMPT  # noqa: E402
from reterm.trajectory import Action, Step, Trajectory  # noqa: E402

from replay_sources import SourceError, open_source  # noqa: E402
from trajectory_view import FanOutView, render_episode, render_fanout  # noqa: E402

HELLO = REPO / "tests" / "fixtures" / "tasks" / "hello-file"
RECORDS = REPO / "tests" / "fixtures" / "reterm10k_mini" / "data" / "train-00000-of-00001.parquet"


# ------------------------------------------------------------------------- Space replay sources
def _attempt(k: int, reward: float) -> Trajectory:
    def step(i, command, observation="", exit_status=0):
        action = Action(tool="submit") if command is None else Action(tool="bash", command=command)
        return Step(index=i, model_text="", action=action, observation=observation, exit_status=exit_status)

    steps = [step(0, "ls", "a.txt\n[exit status: 0]"), step(1, "jq . a.json", "bash: jq: not found\n[exit status: 127]", 127),
             step(2, f"python3 -m json.tool a.json # {k}", "{}\n[exit status: 0]"), step(3, None)]  # fmt: skip
    t = Trajectory(task_id="t", instruction="do it", system_prompt=SYSTEM_PROMPT, steps=steps, prefix_len=2,
                   metadata={"failure_state": "s1", "attempt": k, "failure_category": "missing_dependency"})  # fmt: skip
    t.set_reward(reward)
    return t


def _rollout_rows() -> list[dict]:
    from reterm.training.failure_pool import PoolState
    from reterm.training.grpo_outputs import rollout_rows
    from reterm.training.grpo_rollout import Attempt, GroupRollout

    state = PoolState.from_prompt(state_id="s1", task_id="t", task_dir="tasks/t", prompt=[], category="missing_dependency")
    group = GroupRollout(state=state, group=0)
    for k, reward in enumerate([1.0, 0.0]):
        traj = _attempt(k, reward)
        group.attempts.append(Attempt("s1", 0, k, trajectory=traj, reward=reward, outcome=traj.outcome.value))
    return rollout_rows([group], step=1, generation_round=1)


def _write_rollouts(folder: Path, rows: list[dict], name: str = "round-00001-step-00001-rank0.jsonl") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def _open_and_render_all(spec: Path) -> None:
    """Open a source and render every item, as the Space does; only SourceError is an acceptable failure."""
    src = open_source(str(spec))
    for item in src.items:
        view = src.view(item.key)
        render_fanout(view) if isinstance(view, FanOutView) else render_episode(view)


def test_rollout_with_negative_prefix_len_is_a_source_error_not_an_index_error(tmp_path):
    # a rollouts row whose trajectory says prefix_len -3: the fan-out view ended in IndexError in
    # trajectory_view.render_attempts (the Space shows a bare "Error"); expected a SourceError naming the file
    rows = _rollout_rows()
    for r in rows:
        r["trajectory"]["prefix_len"] = -3
    folder = _write_rollouts(tmp_path / "rollouts", rows)
    with pytest.raises(SourceError, match="round-00001-step-00001-rank0.jsonl"):
        _open_and_render_all(folder)


def test_rollout_row_with_unhashable_group_is_a_source_error(tmp_path):
    # "group": [0] passed read_rollout_file's check, then open_source raised TypeError: unhashable type: 'list'
    rows = _rollout_rows()
    for r in rows:
        r["group"] = [0]
    folder = _write_rollouts(tmp_path / "rollouts", rows)
    with pytest.raises(SourceError, match="round-00001-step-00001-rank0.jsonl"):
        open_source(str(folder))


@pytest.mark.parametrize("field,value", [("failure_step", None), ("train_from_message_index", "x"), ("verifier_reward", "good")])
def test_record_with_a_wrongly_typed_field_is_a_source_error(tmp_path, field, value):
    # a .jsonl of records whose failure_step is null / train_from_message_index or verifier_reward a word: opening
    # worked, showing an item raised TypeError/ValueError (the Space only turns SourceError into a message)
    from datasets import load_dataset

    rows = [dict(r) for r in load_dataset("parquet", data_files=str(RECORDS), split="train").select(range(2))]
    for r in rows:
        r[field] = value
    path = tmp_path / "records.jsonl"
    path.write_text("".join(json.dumps(r, default=str) + "\n" for r in rows))
    with pytest.raises(SourceError):
        _open_and_render_all(path)


def test_rollouts_folder_with_a_stray_parquet_still_opens_as_rollouts(tmp_path):
    # a rollouts/ folder (round-*-step-*-rank*.jsonl) that also holds a .parquet opened as ReTerm-10K
    # records: every GRPO group silently disappeared from the item list
    folder = _write_rollouts(tmp_path / "rollouts", _rollout_rows())
    shutil.copy(RECORDS, folder / "export.parquet")
    src = open_source(str(folder))
    assert src.description.startswith("ReTerm-GRPO rollouts"), src.description


# ------------------------------------------------------------------------------- train/stages.py
def _stages():
    import stages

    return stages


@pytest.mark.parametrize("content", ["[1, 2]", '"done"'])
def test_stage_record_of_the_wrong_type_is_named_not_a_traceback(tmp_path, capsys, content):
    # RUN/stages/a.json holding JSON that is not an object: `run` and `summary` ended in AttributeError
    st = _stages()
    (tmp_path / "stages").mkdir()
    (tmp_path / "stages" / "a.json").write_text(content)
    for argv in (["run", "--run-dir", str(tmp_path), "--stage", "a", "--", "true"],
                 ["summary", "--run-dir", str(tmp_path), "--stages", "a"]):  # fmt: skip
        try:
            st.main(argv)
        except AttributeError as exc:
            pytest.fail(f"{argv[0]}: traceback ({exc}) instead of an error naming stages/a.json")
        err = capsys.readouterr().err
        if argv[0] == "run":
            assert "a.json" in err


def test_stage_summary_with_a_wrongly_typed_wall_time_does_not_crash(tmp_path, capsys):
    # {"wall_s": "12"} in a completion record: write_plots raised TypeError (str / int)
    st = _stages()
    (tmp_path / "stages").mkdir()
    (tmp_path / "stages" / "a.json").write_text(json.dumps({"command": ["true"], "wall_s": "12", "peak_mem_mb": "x"}))
    try:
        rc = st.main(["summary", "--run-dir", str(tmp_path), "--stages", "a"])
    except TypeError as exc:
        pytest.fail(f"summary: traceback ({exc})")
    assert rc == 0 or "a.json" in capsys.readouterr().err


def test_corrupt_running_record_is_named(tmp_path, capsys):
    # RUN/stages/a.running.json = [1] -> AttributeError traceback; {"elapsed_s": "abc"} -> "error: could not
    # convert string to float: 'abc'" without saying which file
    st = _stages()
    (tmp_path / "stages").mkdir()
    for content in ("[1]", '{"elapsed_s": "abc"}'):
        (tmp_path / "stages" / "a.running.json").write_text(content)
        try:
            st.main(["run", "--run-dir", str(tmp_path), "--stage", "a", "--", "true"])
        except AttributeError as exc:
            pytest.fail(f"{content}: traceback ({exc})")
        out = capsys.readouterr()
        if "error" in out.err:
            assert "a.running.json" in out.err, out.err


def test_truncated_stage_record_is_reported_and_later_records_are_kept(tmp_path, capsys):
    # a truncated RUN/stages/a.json (disk full, a hand edit) was read as "not completed": stage a ran again
    # without a word about the file, and the completed records of the later stages were deleted
    st = _stages()
    assert st.main(["run", "--run-dir", str(tmp_path), "--stage", "a", "--", "true"]) == 0
    assert st.main(["run", "--run-dir", str(tmp_path), "--stage", "b", "--", "true"]) == 0
    marker = tmp_path / "stages" / "a.json"
    marker.write_text(marker.read_text()[:30])
    capsys.readouterr()
    st.main(["run", "--run-dir", str(tmp_path), "--stage", "a", "--later", "b", "--", "true"])
    out = capsys.readouterr()
    assert "a.json" in out.out + out.err, "the unreadable completion record is not named"


@pytest.mark.parametrize("base", ["", "- a\n", "models: 5\n", "models: [1, 2]\n", "a: [unclosed\n",
                                  "recovery_from_states: 3\nmodels: [{policy: smollm2}]\n"])  # fmt: skip
def test_eval_config_with_a_malformed_base_names_the_file(tmp_path, capsys, base):
    # train/stages.py eval-config --base X: an empty file, a list, `models` not a list of mappings or bad YAML
    # ended in AttributeError/TypeError/yaml tracebacks
    st = _stages()
    run = tmp_path / "run"
    for sub in ("sft", "grpo-standard", "grpo-reterm"):
        (run / sub).mkdir(parents=True)
        (run / sub / "config.json").write_text("{}")
    (tmp_path / "base.yaml").write_text(base)
    try:
        rc = st.main(["eval-config", "--run-dir", str(run), "--base", str(tmp_path / "base.yaml"),
                      "--out", str(tmp_path / "out.yaml")])  # fmt: skip
    except Exception as exc:
        pytest.fail(f"traceback {type(exc).__name__}: {exc}")
    assert rc == 2 and "base.yaml" in capsys.readouterr().err


# ---------------------------------------------------------------------------------- reterm run
@pytest.mark.parametrize("spec", ["bogus", "oracle:extra", ""])
def test_reterm_run_bad_policy_spec_leaves_no_output_folder(tmp_path, capsys, spec):
    # like a bad --env (fixed earlier), a bad --policy must fail before the output folder is made
    from reterm.agent.cli import main

    out = tmp_path / "out"
    assert main([str(HELLO), "--policy", spec, "--output", str(out)]) == 2
    assert not out.exists(), "an empty output folder was left behind"


def test_reterm_run_missing_local_model_is_an_error_not_a_traceback(tmp_path, capsys):
    # --policy hf:/nonexistent/model ended in a transformers/huggingface_hub traceback (OSError), exit 1
    from reterm.agent.cli import main

    try:
        rc = main([str(HELLO), "--policy", f"hf:{tmp_path / 'no-such-model'}", "--output", str(tmp_path / "out")])
    except OSError as exc:
        pytest.fail(f"traceback: {exc}")
    assert rc == 2 and "no-such-model" in capsys.readouterr().err


# ------------------------------------------------------------------------------- reterm tasks check
def test_tasks_check_refuses_a_negative_agent_timeout(tmp_path, capsys):
    # [agent] timeout_sec = -5 passed `reterm tasks check`; `reterm run` then ended at once with
    # stop time_budget and reward 0: a task-config mistake counted as an agent failure
    from reterm.tasks.cli import main

    task = tmp_path / "neg-timeout"
    shutil.copytree(HELLO, task)
    toml = (task / "task.toml").read_text()
    (task / "task.toml").write_text(toml.replace("[agent]\ntimeout_sec = 60.0", "[agent]\ntimeout_sec = -5"))
    assert "timeout_sec = -5" in (task / "task.toml").read_text()
    assert main(["check", str(task), "--no-build"]) != 0
    out = capsys.readouterr()
    assert "timeout_sec" in out.out + out.err


# ------------------------------------------------------------------------------- reterm.data.build
@pytest.mark.parametrize("value", ["[1", ": x"])
def test_pipeline_set_with_a_value_that_is_not_yaml_names_the_override(tmp_path, capsys, value):
    # python -m reterm.data.build --set 'rollout.attempts=[1' ended in a yaml ScannerError traceback
    from reterm.data.build import main

    try:
        rc = main(["--output", str(tmp_path / "out"), "--set", f"rollout.attempts={value}"])
    except Exception as exc:
        pytest.fail(f"traceback {type(exc).__name__}")
    assert rc == 2 and "rollout.attempts" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
