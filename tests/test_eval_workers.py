"""``python -m eval.drills --workers N``: models evaluated side by side, each in its own process, with the real
SmolLM2 on the local sandbox. The two-stage failure states are built once, by the parent, before the workers
start; every worker recovers from those very states; the parent writes the one results file; a worker that fails
makes the evaluation fail with its model named, and what the others finished is kept."""

from __future__ import annotations

import json

import pytest

from reterm import workers
from reterm.drills import generate_drills
from reterm.eval import drills as eval_drills
from reterm.policies.scripted import ScriptedPolicy
from reterm.sandbox.snapshot import list_snapshots


def _drills(tmp_path):
    tasks = tmp_path / "drills"
    generate_drills(tasks, 0, 4, families=["mkdir-parent", "exec-bit", "off-by-one", "wc-number"],
                    ood_families=["wc-number"])  # fmt: skip
    return tasks


SIZES = ["--max-id", "2", "--max-ood", "0", "--max-states", "0", "--own-items", "0", "--k-max", "1", "--max-turns",
         "1", "--max-new-tokens", "8", "--multistage-states", "2"]  # fmt: skip


def test_two_workers_share_the_states_and_write_one_result(tmp_path, capfd, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    tasks = _drills(tmp_path)
    out = tmp_path / "eval"
    rc = eval_drills.main(["--tasks", str(tasks), "--output", str(out), "--model", "base=smollm2",
                           "--model", "sft=smollm2", "--workers", "2", *SIZES])  # fmt: skip
    assert rc == 0
    said = capfd.readouterr().out  # the workers' output too
    threads = workers.threads_per_worker(2)
    assert f"2 worker processes of {threads} threads for 2 models" in said
    assert said.count("two-stage pass rate from task start") == 1  # built once, by the parent; no worker rebuilt
    assert said.count("[eval-drills] model base = smollm2") == said.count("[eval-drills] model sft = smollm2") == 1
    results = json.loads((out / "results.json").read_text())
    assert results["settings"]["workers"] == 2 and set(results["models"]) == {"base", "sft"}
    states = json.loads((out / "multistage" / "states.json").read_text())
    assert states["state_model"] == "sft" and states["released"] is True  # built once; freed when both were done
    start_lines = (out / "multistage" / "start_attempts.jsonl").read_text().splitlines()
    assert len(start_lines) == states["n_tasks"]  # no worker attempted the tasks from the start again
    per = {n: json.loads((out / n / "per_item.json").read_text()) for n in ("base", "sft")}
    ids = {it["state"]["id"] for it in states["items"]}
    for n in per:  # every worker recovered from the parent's states, and the same model greedily gives the same
        assert set(per[n]["recovery_at_1/multistage_own"]) == ids
        assert None not in per[n]["recovery_at_1/multistage_own"].values()  # none from a released snapshot
    assert per["base"] == per["sft"]
    assert "sft - base" in results["differences"]


def test_a_failing_worker_fails_the_evaluation_and_keeps_the_others(tmp_path, capsys):
    tasks = _drills(tmp_path)
    out = tmp_path / "eval"
    (tmp_path / "not-a-checkpoint").mkdir()  # a folder, so that only its worker finds out, when it loads it
    rc = eval_drills.main(["--tasks", str(tasks), "--output", str(out), "--model",
                           f"broken=hf:{tmp_path / 'not-a-checkpoint'}", "--model", "sft=smollm2", "--workers", "2",
                           *SIZES])  # fmt: skip
    assert rc == 1
    assert "['broken'] failed" in capsys.readouterr().err
    assert (out / "sft" / "metrics.json").is_file() and not (out / "broken" / "metrics.json").exists()
    assert not (out / "results.json").exists()
    # the states stay for the re-run that resumes the evaluation
    assert not json.loads((out / "multistage" / "states.json").read_text()).get("released")


def test_bad_worker_options_are_named(tmp_path, capsys):
    tasks = _drills(tmp_path)
    common = ["--tasks", str(tasks), "--output", str(tmp_path / "eval"), "--model", "sft=smollm2"]
    assert eval_drills.main([*common, "--workers", "0"]) == 2
    assert "--workers 0" in capsys.readouterr().err
    assert eval_drills.main([*common, "--only", "grpo"]) == 2
    assert "--only 'grpo'" in capsys.readouterr().err


def test_workers_get_their_own_only():
    argv = ["--tasks", "d", "--only", "a", "--model", "a=x", "--only=b", "--workers", "2"]
    assert eval_drills._without_only(argv) == ["--tasks", "d", "--model", "a=x", "--workers", "2"]
    # an abbreviation would slip past that: the parser takes none
    args = ["--tasks", "d", "--output", "o", "--model", "a=x"]
    try:
        eval_drills.build_parser().parse_args([*args, "--onl", "a"])
    except SystemExit as exc:
        assert exc.code == 2
    else:
        raise AssertionError("--onl was taken for --only")


def test_a_missing_checkpoint_or_output_folder_is_named_before_anything_runs(tmp_path, capsys):
    tasks = _drills(tmp_path)
    common = ["--tasks", str(tasks), "--model", "sft=smollm2", "--workers", "2", *SIZES]
    rc = eval_drills.main([*common, "--output", str(tmp_path / "eval"), "--model", "late=hf:./no-such-checkpoint"])
    assert rc == 2 and "--model late=hf:./no-such-checkpoint: no checkpoint folder" in capsys.readouterr().err
    assert not (tmp_path / "eval" / "multistage").exists()  # no state was built for a run that cannot finish
    (tmp_path / "a-file").write_text("")
    assert eval_drills.main([*common, "--output", str(tmp_path / "a-file" / "eval")]) == 2
    assert "cannot make the folder" in capsys.readouterr().err


def test_the_cores_are_split_among_the_processes_that_run(monkeypatch):
    started = []

    class Done:
        def __init__(self, cmd, env):
            started.append((cmd, env))
            self.returncode = 0

        def poll(self):
            return 0

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(workers, "usable_cpus", lambda: 16)
    monkeypatch.setattr(workers.subprocess, "Popen", Done)
    monkeypatch.setattr(workers.time, "sleep", lambda s: None)
    assert eval_drills.run_workers(["--tasks", "d"], ["a", "b"], 3) == {}
    assert [env["OMP_NUM_THREADS"] for _, env in started] == ["8", "8"]  # 2 processes, not 3
    assert [cmd[-1] for cmd, _ in started] == ["a", "b"] and all("--keep-states" in cmd for cmd, _ in started)


def test_only_every_model_releases_the_states_it_alone_used(tmp_path, capsys):
    tasks = _drills(tmp_path)
    out = tmp_path / "eval"
    rc = eval_drills.main(["--tasks", str(tasks), "--output", str(out), "--model", "sft=smollm2", "--only", "sft",
                           *SIZES])  # fmt: skip
    assert rc == 0 and "results.json is written by a run without --only" in capsys.readouterr().out
    assert not (out / "results.json").exists() and (out / "sft" / "metrics.json").is_file()
    assert json.loads((out / "multistage" / "states.json").read_text())["released"] is True


def _unreleased_under(path) -> list[str]:
    return [s.id for s in list_snapshots()
            if str(s.meta.get("environment_dir", "")).startswith(str(path)) and not s.released]  # fmt: skip


def test_an_interrupted_model_releases_the_snapshots_it_kept(tmp_path, monkeypatch):
    """A model stopped midway (here as its own Recovery@k starts, after Pass@1 kept a failed attempt's snapshot for
    it; in a worker, SIGTERM does the same through SystemExit) leaves no snapshot behind."""
    tasks = _drills(tmp_path)
    submit = '<tool_call>\n{"name": "submit", "arguments": {}}\n</tool_call>'
    monkeypatch.setattr(eval_drills, "load_policy", lambda spec, **kw: ScriptedPolicy(lambda m: submit, name="s"))
    real = eval_drills._attempts

    async def attempts(policy, dirs, batch, label, **kw):
        if "own Recovery@" in label:
            assert _unreleased_under(tmp_path)  # the kept failed attempt
            raise KeyboardInterrupt
        return await real(policy, dirs, batch, label, **kw)

    monkeypatch.setattr(eval_drills, "_attempts", attempts)
    with pytest.raises(KeyboardInterrupt):
        eval_drills.main(["--tasks", str(tasks), "--output", str(tmp_path / "eval"), "--model", "sft=submitter",
                          "--max-id", "2", "--max-ood", "0", "--max-states", "0", "--own-items", "1", "--k-max", "1",
                          "--max-turns", "2"])  # fmt: skip
    assert _unreleased_under(tmp_path) == []
