"""reterm.eval.run: typed config, Harbor JobConfig building, the offline registry check, and the report
built from the hand-built job folders (tests/fixtures/jobs) without running a job."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml

from reterm.agent.environments import LOCAL_ENVIRONMENT
from reterm.eval import run
from reterm.eval.report import markdown, write_report

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).parent / "fixtures"


def _write(tmp_path: Path, data: dict) -> Path:
    p = tmp_path / "cfg.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def test_shipped_configs_load():
    local = run.load_config(ROOT / "eval/configs/local.yaml")
    assert local.dataset.path == Path("tasks") and local.dataset.split == "test"
    assert local.environment.type == "local" and local.timeouts.overrides() == {}
    assert [m.name for m in local.models] == ["smollm2-base", "oracle-harness", "oracle"]
    assert local.recovery_from_states.from_models == ["smollm2-base"]
    assert local.recovery_from_states.records == Path("eval/states/test_split.jsonl")
    for v in ("2.0", "2.1"):
        tb = run.load_config(ROOT / f"eval/configs/terminal-bench-{v}.yaml")
        assert (tb.dataset.name, tb.dataset.version) == ("terminal-bench", v)
        assert tb.trials == 3 and tb.timeouts.overrides() == {}
        assert {m.agent for m in tb.models} == {"terminus-2", "reterm"}


def test_job_config_maps_onto_harbor(tmp_path):
    (tmp_path / "tasks").mkdir()
    cfg = run.EvalConfig.model_validate({
        "name": "x", "output_dir": str(tmp_path / "out"),
        "dataset": {"path": str(tmp_path / "tasks"), "task_names": ["a*"]},
        "trials": 4, "concurrency": 2, "timeouts": {"agent_sec": 60, "verifier_sec": 30},
        "models": [
            {"name": "base", "agent": "reterm", "policy": "smollm2"},
            {"name": "t2", "agent": "terminus-2", "model": "hosted_vllm/q", "api_base": "http://h:1/v1"},
        ],
    })
    jc = run.job_config(cfg, cfg.models[0])
    assert (jc.job_name, jc.jobs_dir, jc.n_attempts, jc.n_concurrent_trials) == ("base", tmp_path / "out/jobs", 4, 2)
    assert jc.environment.import_path == LOCAL_ENVIRONMENT
    assert jc.agents[0].import_path == run.RETERM_AGENT and jc.agents[0].kwargs == {"policy": "smollm2"}
    assert jc.agents[0].override_timeout_sec == 60 and jc.verifier.override_timeout_sec == 30
    assert jc.datasets[0].path == tmp_path / "tasks" and jc.datasets[0].task_names == ["a*"]
    t2 = run.job_config(cfg, cfg.models[1]).agents[0]
    assert (t2.name, t2.model_name, t2.kwargs) == ("terminus-2", "hosted_vllm/q", {"api_base": "http://h:1/v1"})
    docker = cfg.model_copy(update={"environment": run.EnvironmentSpec(type="docker")})
    assert run.job_config(docker, cfg.models[1]).environment.type.value == "docker"


def test_split_resolves_to_task_names(tmp_path):
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "splits.json").write_text(json.dumps({"train": ["a"], "test": ["b", "c"], "tasks": {}}))
    spec = run.DatasetSpec(path=tasks, split="test")
    assert run.harbor_dataset(spec).task_names == ["b", "c"]
    with pytest.raises(run.EvalConfigError, match="no task list under split 'dev'"):
        run.harbor_dataset(run.DatasetSpec(path=tasks, split="dev"))


@pytest.mark.parametrize("data, message", [
    ({"name": "x", "dataset": {"path": "t", "name": "tb"}, "models": [{"name": "a", "agent": "oracle"}]},
     "exactly one of dataset.name"),
    ({"name": "x", "dataset": {"path": "t"}, "models": [{"name": "a", "agent": "reterm"}]}, "needs a policy"),
    ({"name": "x", "dataset": {"path": "t"}, "models": [{"name": "a", "agent": "oracle"}] * 2}, "unique"),
    ({"name": "x", "dataset": {"path": "t"}, "environment": {"type": "vm"}, "models": [{"name": "a"}]},
     "environment.type 'vm'"),
    ({"name": "x", "dataset": {"path": "t"}, "trails": 3, "models": [{"name": "a", "agent": "oracle"}]}, "trails"),
])
def test_bad_configs_name_file_and_field(tmp_path, data, message):
    path = _write(tmp_path, data)
    with pytest.raises(run.EvalConfigError, match=message) as err:
        run.load_config(path)
    assert str(path) in str(err.value)


def test_offline_registry_dataset_fails_at_once(tmp_path, capsys):
    # This machine has no route to the Harbor registry (only package registries are reachable).
    path = _write(tmp_path, {"name": "tb", "dataset": {"name": "terminal-bench@2.0"}, "output_dir": str(tmp_path / "o"),
                             "models": [{"name": "o", "agent": "oracle"}]})
    start = time.monotonic()
    assert run.main(["--config", str(path)]) == 2
    assert time.monotonic() - start < 10
    err = capsys.readouterr().err
    assert "terminal-bench@2.0" in err and "-p DIR/terminal-bench" in err and "harbor download" in err
    assert not (tmp_path / "o").exists()  # nothing started


def test_report_from_fixture_jobs(tmp_path):
    # output_dir=tests/fixtures makes jobs_dir tests/fixtures/jobs, whose folders are named demo and oracle
    cfg = run.EvalConfig.model_validate({
        "name": "fixture", "output_dir": str(FIXTURES), "dataset": {"path": str(FIXTURES)}, "trials": 3,
        "models": [{"name": "demo", "agent": "reterm", "policy": "smollm2"}, {"name": "oracle", "agent": "oracle"}],
    })
    results = run.build_results(cfg, ["task-a", "task-b", "task-c", "task-d", "task-e"])
    demo, oracle = results["models"]
    assert demo["pass_at_1"]["mean"] == pytest.approx(19 / 30) and oracle["pass_at_1"]["mean"] == 1.0
    assert results["harness"]["timeouts_modified"] is False and results["dataset"]["n_tasks"] == 5
    paths = write_report(results, tmp_path)
    saved = json.loads(paths["results"].read_text())
    assert saved["schema"] == "reterm-eval/1" and saved["models"][0]["pass_at_k"]["2"] == pytest.approx(0.8)
    md = paths["markdown"].read_text()
    assert "| demo | reterm | 63.3 ± 12.0 | 80.0 |" in md
    assert "timeouts as the tasks define them" in md and "RewardFileNotFoundError: 1" in md
    assert "| missing_dependency | 50.0 (1/2) | – |" in md  # demo's in-trial recovery; the oracle has none
    for key in ("pass_rate_png", "recovery_png"):
        assert paths[key].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert demo["recovery"]["missing_dependency"] == {"failure_states": 2, "recovered": 1, "rate": 0.5,
                                                      "stderr": pytest.approx(0.5 / 2 ** 0.5)}
    # the model card's reader accepts the file
    from reterm.cards.model_inputs import load_results

    assert load_results(paths["results"]).find("demo").recovery["missing_dependency"].recovered == 1


def test_markdown_says_when_timeouts_were_modified():
    results = {
        "name": "m", "dataset": {"name": "d", "version": None, "split": None, "n_tasks": 1},
        "harness": {"environment": "local", "trials_per_task": 1, "harbor_version": "0", "timeouts_modified": True,
                    "timeout_overrides": {"agent_sec": 60.0}},
        "models": [{"name": "a", "agent": "oracle", "pass_at_1": {"mean": 1.0, "stderr": None, "n_trials": 1, "n_tasks": 1},
                    "pass_at_k": {"1": 1.0}, "per_task": {}, "infra_faults": {"n": 0}, "agent_timeouts": 0,
                    "job_dir": "j"}],
    }
    assert "timeouts **modified**: agent_sec=60.0" in markdown(results)


def test_report_only_cli_on_copied_jobs(tmp_path, capsys):
    import shutil

    shutil.copytree(FIXTURES / "jobs", tmp_path / "out" / "jobs", ignore=shutil.ignore_patterns("*.py"))
    path = _write(tmp_path, {"name": "tb-copy", "dataset": {"name": "terminal-bench@2.0"}, "output_dir": str(tmp_path / "out"),
                             "models": [{"name": "demo", "agent": "reterm", "policy": "smollm2"},
                                        {"name": "oracle", "agent": "oracle"}]})
    # a registry dataset, offline: --report-only needs neither the network nor the tasks
    assert run.main(["--config", str(path), "--report-only"]) == 0
    out = capsys.readouterr().out
    assert "| demo | reterm | 63.3 ± 12.0 | 80.0 | 11 | 5 | 5 | 1 |" in out
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["dataset"]["n_tasks"] == 5 and results["models"][1]["job_dir"] == "jobs/oracle"
    assert {p.name for p in (tmp_path / "out").glob("*.png")} == {"pass_rate.png", "recovery_rate.png"}


@pytest.mark.slow
def test_harbor_jobs_on_the_local_sandbox(tmp_path, capsys):
    """Real Harbor jobs (Job.create/run) with Harbor's oracle and nop agents in the local sandbox."""
    path = _write(tmp_path, {
        "name": "e2e", "output_dir": str(tmp_path / "out"), "trials": 2, "concurrency": 2,
        "dataset": {"path": str(FIXTURES / "tasks")}, "environment": {"type": "local"},
        "models": [{"name": "oracle", "agent": "oracle"}, {"name": "nop", "agent": "nop"}],
    })
    assert run.main(["--config", str(path)]) == 0
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    oracle, nop = results["models"]
    assert oracle["pass_at_1"] == {"mean": 1.0, "stderr": 0.0, "n_trials": 2, "n_tasks": 1}
    assert nop["pass_at_1"] == {"mean": 0.0, "stderr": 0.0, "n_trials": 2, "n_tasks": 1}
    assert oracle["infra_faults"]["n"] == 0 and results["dataset"]["tasks"] == ["hello-file"]
    assert len(list((tmp_path / "out" / "jobs" / "oracle").glob("hello-file__*/result.json"))) == 2
    # a second run resumes the finished jobs: Harbor keeps their trials, nothing new runs
    assert run.main(["--config", str(path)]) == 0
    assert len(list((tmp_path / "out" / "jobs" / "oracle").glob("hello-file__*/result.json"))) == 2
    assert "| oracle | oracle | 100.0 ± 0.0 | 100.0 | 2 | 1 | 0 | 0 |" in capsys.readouterr().out


def test_a_model_with_only_infrastructure_faults_exits_non_zero(tmp_path, capsys):
    # new-user case: a model whose every trial is an infrastructure fault measured nothing; the CLI says so
    # (exit 3) instead of reporting an empty score with exit 0
    import shutil

    from reterm.eval import metrics

    faults = [t for t in metrics.load_job(FIXTURES / "jobs" / "demo").trials if t.outcome.is_infra_fault]
    assert faults, "the fixture has infrastructure faults"
    for t in faults:
        shutil.copytree(t.trial_dir, tmp_path / "out" / "jobs" / "faulty" / Path(t.trial_dir).name)
    path = _write(tmp_path, {"name": "faulty", "dataset": {"name": "terminal-bench@2.0"}, "output_dir": str(tmp_path / "out"),
                             "models": [{"name": "faulty", "agent": "reterm", "policy": "smollm2"}]})
    assert run.main(["--config", str(path), "--report-only"]) == 3
    err = capsys.readouterr().err
    assert "no trial of faulty was scored" in err and "infrastructure fault" in err
    assert (tmp_path / "out" / "results.json").is_file()  # the report is still written
    report = (tmp_path / "out" / "report.md").read_text()
    first = faults[0]
    assert f"`{first.trial}` ({first.task}): {first.exception_type}" in report  # which trial, and what broke
    if first.exception_message:
        assert " ".join(first.exception_message.split())[:40] in report
