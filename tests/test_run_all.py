"""`bash train/run_all.sh` and its helper `train/stages.py`.

Fast tests: the stage runner's resume records, memory accounting and invalidation on real processes; the
stage selection of the shell script (`--dry-run`); the eval config, effective recipe and summary the helper
writes. Slow tests: the reduced chain end to end (`--size ci`: every stage for real, on fewer tasks and steps,
so that breakage between stages shows up in CI) and `--recipe qwen3.5-9b --check`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest
import yaml
from card_checks import assert_dataset_card_matches, assert_model_card_matches

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "train"))

import run_summary  # noqa: E402  (train/run_summary.py)
import stages  # noqa: E402  (train/stages.py)

PY = sys.executable
# the embedded default at size default: both GRPO arms at the recipes' seed and at seed 43
STAGE_ORDER = ["setup", "drills", "data", "sft", "mechanism", "mine", "grpo", "grpo-standard", "grpo-s43",
               "grpo-standard-s43", "eval", "cards", "summary"]  # fmt: skip
CI_STAGE_ORDER = [s for s in STAGE_ORDER if not s.endswith("-s43")]  # --size ci: one seed


def _run_all(*args: str, timeout: float = 120, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "train/run_all.sh", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})  # fmt: skip


# ---------------------------------------------------------------------------------- stage runner
def test_stage_runs_records_and_is_skipped_when_done(tmp_path, capsys):
    run = tmp_path / "run"
    out = run / "thing"
    cmd = [
        PY,
        "-c",
        f"import pathlib; p = pathlib.Path({str(out)!r}); p.mkdir(parents=True); (p / 'x').write_text('1')",
    ]
    assert stages.run_stage(run, "data", cmd, [out], later=[]) == 0
    rec = stages.read_marker(run, "data")
    assert rec["command"] == cmd and rec["exit_code"] == 0 and rec["wall_s"] >= 0
    assert (run / "logs" / "data.log").is_file()
    # done: the same command is skipped (it would fail now: the folder exists)
    assert stages.run_stage(run, "data", cmd, [out], later=[]) == 0
    assert "skipped" in capsys.readouterr().out
    # --force deletes the outputs and runs again (mkdir succeeds only because the folder was removed)
    assert stages.run_stage(run, "data", cmd, [out], later=[], force=True) == 0
    assert (out / "x").read_text() == "1"


def test_stage_records_keep_the_speed_settings_and_the_walls_bench_compares_them(tmp_path, monkeypatch):
    """Two runs of one stage, one with RETERM_FAST_DECODE=0: each record names the settings that were set, and
    bench/stage_walls.py puts the walls side by side with their ratio."""
    cmd = [PY, "-c", "import time; time.sleep(0.2)"]
    for value, name in (("0", "a"), ("1", "b")):
        monkeypatch.setenv("RETERM_FAST_DECODE", value)
        monkeypatch.delenv("RETERM_CPU_BF16", raising=False)
        assert stages.run_stage(tmp_path / name, "eval", cmd, [], later=[]) == 0
        assert stages.read_marker(tmp_path / name, "eval")["speed_env"]["RETERM_FAST_DECODE"] == value
        assert "RETERM_CPU_BF16" not in stages.read_marker(tmp_path / name, "eval")["speed_env"]
    r = subprocess.run([PY, str(REPO / "bench" / "stage_walls.py"), str(tmp_path / "a"), str(tmp_path / "b")],
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 0, r.stderr
    line = json.loads(r.stdout.strip().splitlines()[-1])
    assert [run["speed_env"]["RETERM_FAST_DECODE"] for run in line["runs"]] == ["0", "1"]
    assert 0 < line["ratio"][0]["stages"]["eval"] < 10 and "| eval |" in r.stdout
    r = subprocess.run([PY, str(REPO / "bench" / "stage_walls.py"), str(tmp_path / "a"), str(tmp_path)],
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode != 0 and "no stages/ folder" in r.stderr


def test_failed_stage_leaves_no_record_and_returns_its_status(tmp_path):
    run = tmp_path / "run"
    code = stages.run_stage(run, "sft", [PY, "-c", "import sys; print('boom'); sys.exit(3)"], [], later=[])
    assert code == 3
    assert stages.read_marker(run, "sft") is None
    assert json.loads((run / "stages" / "sft.failed.json").read_text())["exit_code"] == 3
    assert "boom" in (run / "logs" / "sft.log").read_text()


def test_running_a_stage_invalidates_later_stages_and_changed_inputs_rerun(tmp_path, capsys):
    run = tmp_path / "run"
    ok = [PY, "-c", "pass"]
    for name in ("sft", "grpo", "eval"):
        assert stages.run_stage(run, name, ok, [], later=[]) == 0
    # sft runs again (its command changed): grpo and eval lose their records, so they will run again too
    assert stages.run_stage(run, "sft", [PY, "-c", "pass  # new"], [], later=["grpo", "eval"]) == 0
    assert stages.read_marker(run, "grpo") is None and stages.read_marker(run, "eval") is None
    # a watched config that changes makes a completed stage run again
    cfg = tmp_path / "config.yaml"
    cfg.write_text("a: 1\n")
    assert stages.run_stage(run, "eval", ok, [], later=[], watch=[cfg]) == 0
    capsys.readouterr()
    stages.run_stage(run, "eval", ok, [], later=[], watch=[cfg])
    assert "skipped" in capsys.readouterr().out
    cfg.write_text("a: 2\n")
    stages.run_stage(run, "eval", ok, [], later=[], watch=[cfg])
    assert "changed" in capsys.readouterr().out


def test_ci_runs_the_readme_s_first_command_before_anything_makes_the_venv():
    """`.ci/run` (issue 29): the reduced chain first, on the fresh clone, with nothing before it that creates
    .venv (scripts/setup.sh, tests/run.sh, .venv/bin/...), then the suite with the chain's run folder named."""
    text = (REPO / ".ci" / "run").read_text()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    chain = next(i for i, ln in enumerate(lines) if ln.startswith("bash train/run_all.sh --size ci"))
    suite = next(i for i, ln in enumerate(lines) if "bash tests/run.sh" in ln)
    assert chain < suite
    assert not any(w in ln for ln in lines[:chain] for w in ("setup.sh", "tests/run.sh", ".venv/bin", "pip "))
    assert lines[suite].startswith("RETERM_CI_RUN_DIR=$RUN ") and "RUN=runs/smollm2-135m-ci" in " ".join(lines[:chain])


def test_a_stage_whose_inputs_were_replaced_starts_afresh_instead_of_resuming(tmp_path, capsys):
    """The eval stage skips a model whose metrics exist and the data stages resume their journals: after an
    earlier stage ran again, such resumed work would come from the old inputs. So the later stages are marked
    stale and their next run deletes their outputs first; an attempt interrupted after that resumes as usual."""
    run = tmp_path / "run"
    out = run / "eval"
    # a stage that "resumes": it appends to what is there
    append = [PY, "-c", f"import pathlib; p = pathlib.Path({str(out / 'log')!r}); p.parent.mkdir(parents=True, "
                        "exist_ok=True); p.write_text((p.read_text() if p.exists() else '') + 'x')"]  # fmt: skip
    assert stages.run_stage(run, "sft", [PY, "-c", "pass"], [], later=["eval"]) == 0
    assert stages.run_stage(run, "eval", append, [out], later=[]) == 0
    assert (out / "log").read_text() == "x"
    # sft runs again (changed command): eval's record is dropped and it is marked stale
    assert stages.run_stage(run, "sft", [PY, "-c", "pass  # new"], [], later=["eval"]) == 0
    assert stages.read_marker(run, "eval") is None and stages.stale_path(run, "eval").is_file()
    # eval's next attempt fails halfway: its old outputs were deleted first, its own partial work stays
    crash = [*append[:2], append[2] + "; raise SystemExit(1)"]
    assert stages.run_stage(run, "eval", crash, [out], later=[]) == 1
    assert "starting it afresh" in capsys.readouterr().out
    assert (out / "log").read_text() == "x" and not stages.stale_path(run, "eval").exists()
    # the attempt after that resumes the fresh work (not deleted again)
    assert stages.run_stage(run, "eval", append, [out], later=[]) == 0
    assert (out / "log").read_text() == "xx"
    # a stage that never ran is not marked
    assert stages.run_stage(run, "sft", [PY, "-c", "pass  # newer"], [], later=["eval", "cards"]) == 0
    assert stages.stale_path(run, "eval").exists() and not stages.stale_path(run, "cards").exists()


def test_peak_memory_counts_the_whole_process_tree(tmp_path):
    # a child process (not the stage's own process) holds 300 MB for 2.5 s: the tree's peak must see it
    child = "b = bytearray(300 * 1024 * 1024); import time; time.sleep(2.5)"
    cmd = [PY, "-c", f"import subprocess, sys; subprocess.run([sys.executable, '-c', {child!r}])"]
    assert stages.run_stage(tmp_path, "mem", cmd, [], later=[]) == 0
    rec = stages.read_marker(tmp_path, "mem")
    assert 300 <= rec["peak_mem_mb"] < 1000, rec
    assert rec["max_process_rss_mb"] >= 300


def test_killed_stage_runs_again_and_counts_the_interrupted_attempt(tmp_path):
    """kill -9 of the stage runner and its command (a crash, a reboot): no completion record, so the next run
    runs the stage again, and its record adds the killed attempt's time and peak memory."""
    run = tmp_path / "run"
    hold = "b = bytearray(200 * 1024 * 1024); import time; time.sleep(60)"
    proc = subprocess.Popen([PY, str(REPO / "train" / "stages.py"), "run", "--run-dir", str(run), "--stage", "data",
                             "--", PY, "-c", hold], stdout=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    running = run / "stages" / "data.running.json"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # the progress file is rewritten every 5 s: wait for a write with the peak
        if running.is_file() and json.loads(running.read_text())["peak_mem_mb"] >= 200:
            break
        time.sleep(0.5)
    time.sleep(1)
    os.killpg(proc.pid, 9)
    proc.wait()
    assert stages.read_marker(run, "data") is None
    earlier = json.loads(running.read_text())
    assert earlier["elapsed_s"] >= 1
    assert stages.run_stage(run, "data", [PY, "-c", "pass"], [], later=[]) == 0
    rec = stages.read_marker(run, "data")
    assert rec["interrupted_attempts"] == 1 and rec["peak_mem_mb"] >= 200
    assert rec["wall_s"] >= earlier["elapsed_s"] + rec["last_attempt_wall_s"] - 0.1
    assert not running.exists()


def test_always_stage_keeps_the_real_setup_record(tmp_path):
    assert stages.run_stage(tmp_path, "setup", [PY, "-c", "import time; time.sleep(0.2)"], [], [], always=True) == 0
    first = stages.read_marker(tmp_path, "setup")
    time.sleep(1.1)  # finished_at has a resolution of seconds
    assert stages.run_stage(tmp_path, "setup", [PY, "-c", "pass"], [], [], always=True) == 0
    assert stages.read_marker(tmp_path, "setup")["finished_at"] == first["finished_at"]  # quick re-check: kept


def test_setup_stage_runs_before_the_venv_exists(tmp_path):
    """On a fresh machine run_all.sh starts `stages.py run --stage setup` with whatever Python exists before
    `.venv` does: the runner, its progress file and its record must need only the standard library. Here the
    interpreter runs without site-packages, PYTHONPATH or user site (`-E -s -S`), so neither `reterm` nor any
    third-party package can be imported; the command itself then takes the place of scripts/setup.sh."""
    bare = [PY, "-E", "-s", "-S"]
    # the interpreter really is bare: what the venv adds cannot be imported
    for module in ("reterm", "yaml"):
        probe = subprocess.run([*bare, "-c", f"import {module}"], cwd=tmp_path, capture_output=True, text=True)
        assert probe.returncode != 0 and "ModuleNotFoundError" in probe.stderr, module
    run = tmp_path / "run"
    r = subprocess.run([*bare, str(REPO / "train" / "stages.py"), "run", "--run-dir", str(run), "--stage", "setup",
                        "--always", "--", "bash", "-c", "echo set-up; sleep 0.3"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert "set-up" in r.stdout and "<== setup: done" in r.stdout
    rec = json.loads((run / "stages" / "setup.json").read_text())
    assert rec["exit_code"] == 0 and rec["command"] == ["bash", "-c", "echo set-up; sleep 0.3"]
    assert not (run / "stages" / "setup.running.json").exists()
    # `record` (a stage the shell timed itself) likewise
    r = subprocess.run([*bare, str(REPO / "train" / "stages.py"), "record", "--run-dir", str(run), "--stage", "drills",
                        "--wall-s", "1.5", "--", "true"], cwd=tmp_path, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads((run / "stages" / "drills.json").read_text())["wall_s"] == 1.5


# ------------------------------------------------------------------------------ shell: selection
def _dry_stages(out: str) -> list[str]:
    return [line.strip()[1:-1] for line in out.splitlines() if line.startswith("[") and line.rstrip().endswith("]")]


def test_run_all_dry_run_lists_stages_in_order_and_selects(tmp_path):
    r = _run_all("--dry-run", "--run-dir", str(tmp_path / "r"))
    assert r.returncode == 0, r.stderr
    assert _dry_stages(r.stdout) == STAGE_ORDER
    # the chain's data flow: SFT reads the dataset, GRPO starts from the merged SFT checkpoint, eval reads the run
    assert f"--dataset_name {tmp_path}/r/data" in r.stdout
    assert f"--model_name_or_path {tmp_path}/r/sft/merged" in r.stdout
    assert "grpo_standard.yaml" in r.stdout and f"--output_dir {tmp_path}/r/grpo-standard" in r.stdout
    r = _run_all("--dry-run", "--run-dir", str(tmp_path / "r"), "--from", "eval")
    assert _dry_stages(r.stdout) == ["eval", "cards", "summary"]
    r = _run_all("--dry-run", "--run-dir", str(tmp_path / "r"), "--only", "sft", "--only", "cards")
    assert _dry_stages(r.stdout) == ["sft", "cards", "summary"]
    # the second seed's stages are stages like the others
    r = _run_all("--dry-run", "--run-dir", str(tmp_path / "r"), "--only", "grpo-standard-s43")
    assert _dry_stages(r.stdout) == ["grpo-standard-s43", "summary"]
    r = _run_all("--dry-run", "--run-dir", str(tmp_path / "r"), "--from", "grpo-s43")
    assert _dry_stages(r.stdout) == ["grpo-s43", "grpo-standard-s43", "eval", "cards", "summary"]
    r = _run_all("--dry-run", "--recipe", "qwen3.5-9b", "--run-dir", str(tmp_path / "q"))
    assert "accelerate launch --config_file train/accelerate_configs/zero3.yaml train/sft.py" in r.stdout
    assert "with-vllm --log-dir" in r.stdout and "--serve qwen3.5-9b=Qwen/Qwen3.5-9B@8000" in r.stdout
    assert "--mode standard" in r.stdout  # no grpo_standard.yaml at 9B: the same recipe in standard mode


def test_run_all_sizes_reach_the_stage_commands(tmp_path):
    # default: the embedded default's sizes on the drills; ci: the reduced chain
    r = _run_all("--dry-run", "--run-dir", str(tmp_path / "d"))
    cmds = {name: line for name, line in zip(_dry_stages(r.stdout), r.stdout.split("\n[")[1:])}
    assert "tasks drills" in cmds["drills"] and "--per-family 32 --multistage 48" in cmds["drills"]
    assert "pipeline.drills" in cmds["data"] and f"--tasks {tmp_path}/d/drills" in cmds["data"]
    assert "--injected-per-family" in cmds["data"]
    assert "--max_steps" not in cmds["sft"] and "--num_train_epochs" not in cmds["sft"]  # the recipe's epochs
    assert f"--policy hf:{tmp_path}/d/sft/merged" in cmds["mine"] and "--policy smollm2" in cmds["mine"]
    assert "--max_steps 15" in cmds["grpo"] and "--max_steps 15" in cmds["grpo-standard"]
    assert "eval.mechanism" in cmds["mechanism"] and f"--model hf:{tmp_path}/d/sft/merged" in cmds["mechanism"]
    assert "--tasks 72 --group-size 4 --chain-stages 4 --max-turns 14" in cmds["mechanism"]
    assert "--chains 3:24 --chains 4:24" in cmds["drills"]
    assert f"--task_dirs {tmp_path}/d/drills" in cmds["grpo"] and f"--task_dirs {tmp_path}/d/drills" in cmds["grpo-standard"]
    assert "eval.drills" in cmds["eval"] and "--model base=smollm2" in cmds["eval"] and "--max-id 120" in cmds["eval"]
    assert "--multistage-states 150 --chain-stages 4" in cmds["eval"]  # >= 150 own four-stage chain states
    assert f"--model grpo-reterm=hf:{tmp_path}/d/grpo-reterm/merged" in cmds["eval"]
    r = _run_all("--dry-run", "--size", "ci", "--run-dir", str(tmp_path / "c"))
    cmds = {name: line for name, line in zip(_dry_stages(r.stdout), r.stdout.split("\n[")[1:])}
    assert "--per-family 4 --no-check --multistage 2" in cmds["drills"] and "--max_steps 2" in cmds["sft"]
    assert "--chain-stages 3 --max-turns 3" in cmds["mechanism"]  # CI's chains: as short as its two-stage runs were
    assert "--max_steps 1 --num_generations 2" in cmds["grpo"]
    assert "--max-id 2" in cmds["eval"]
    assert "--multistage-states 2 --chain-stages 3 --chain-max-turns 2" in cmds["eval"]
    assert not (tmp_path / "d").exists()  # a dry run writes nothing
    # a changed recipe re-runs its stage, not only a changed command
    for name, watched in (("sft", "smollm2-135m/sft.yaml"), ("grpo", "smollm2-135m/grpo.yaml"),
                          ("grpo-standard", "smollm2-135m/grpo_standard.yaml")):  # fmt: skip
        assert f"{watched} changed" in cmds[name], name
    # the 9B recipe takes no CPU cuts and keeps the Terminal-Bench pipeline and Harbor evaluation
    r = _run_all("--dry-run", "--recipe", "qwen3.5-9b", "--run-dir", str(tmp_path / "q"))
    assert "--max_steps" not in r.stdout and "--num_train_epochs" not in r.stdout
    assert "pipeline.build" in r.stdout and "eval.run" in r.stdout and "tasks drills" not in r.stdout


def test_run_all_trains_both_grpo_arms_at_two_seeds_at_size_default_only(tmp_path):
    """Size default: grpo-s43 and grpo-standard-s43 run the commands of grpo and grpo-standard with their own output
    folder and --seed 43, and the evaluation gets their checkpoints and the seed's three pairs. --size ci and the 9B
    recipe train one seed: no such stage, and --only names it as not part of the run."""
    from check_recipe import parse_dry_run  # train/check_recipe.py: run_all's --dry-run output as argv lists

    run = tmp_path / "d"
    r = _run_all("--dry-run", "--run-dir", str(run))
    assert r.returncode == 0, r.stderr
    cmds = parse_dry_run(r.stdout)
    for first, second, folder in (("grpo", "grpo-s43", "grpo-reterm"), ("grpo-standard", "grpo-standard-s43", "grpo-standard")):
        want = [f"{run}/{folder}-s43" if w == f"{run}/{folder}" else w for w in cmds[first]] + ["--seed", "43"]
        assert f"{run}/{folder}" in cmds[first] and cmds[second] == want, second
        assert "--seed" not in cmds[first]  # the recipes' seed
    ev = cmds["eval"]
    models = [ev[i + 1] for i, w in enumerate(ev) if w == "--model"]
    assert models[-2:] == [f"grpo-standard-s43=hf:{run}/grpo-standard-s43/merged",
                           f"grpo-reterm-s43=hf:{run}/grpo-reterm-s43/merged"]  # fmt: skip
    assert [ev[i + 1] for i, w in enumerate(ev) if w == "--pair"] == \
        ["grpo-reterm-s43:grpo-standard-s43", "grpo-reterm-s43:sft", "grpo-standard-s43:sft"]
    for args in (["--size", "ci"], ["--recipe", "qwen3.5-9b"]):
        r = _run_all("--dry-run", "--run-dir", str(tmp_path / "one"), *args)
        assert r.returncode == 0, r.stderr
        one = parse_dry_run(r.stdout)
        assert list(one) == [s for s in CI_STAGE_ORDER if args[0] == "--size" or s not in ("drills", "mechanism", "mine")]
        assert not any("--seed" in one[s] for s in ("grpo", "grpo-standard")) and "--pair" not in one["eval"], args
        r = _run_all("--dry-run", "--run-dir", str(tmp_path / "one"), *args, "--only", "grpo-s43")
        assert r.returncode == 2 and "stage 'grpo-s43' is not part of" in r.stderr, args
    assert not run.exists() and not (tmp_path / "one").exists()


def test_run_all_runs_from_any_folder(tmp_path):
    r = subprocess.run(["bash", str(REPO / "train" / "run_all.sh"), "--dry-run", "--only", "sft"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "train/sft.py --config train/recipes/smollm2-135m/sft.yaml" in r.stdout
    r = subprocess.run(["bash", str(REPO / "train" / "run_all.sh"), "--help"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=60)  # fmt: skip
    assert r.returncode == 0 and "--only STAGE" in r.stdout and "grpo-standard" in r.stdout


def test_run_all_rejects_bad_flags_clearly():
    for args, message in [
        (["--only", "nope"], "unknown stage 'nope'"),
        (["--from", "train"], "unknown stage 'train'"),
        (["--recipe", "gpt-9000"], "no recipe train/recipes/gpt-9000"),
        (["--recipe"], "--recipe needs a value"),
        (["--only", "--force"], "--only needs a value"),
        (["--size", "huge"], "unknown size huge"),
        (["--fast"], "unknown option --fast"),
    ]:
        r = _run_all(*args)
        assert r.returncode == 2 and message in r.stderr, (args, r.stderr)
        assert "Traceback" not in r.stderr and "unbound variable" not in r.stderr
    assert not (REPO / "runs" / "smollm2-135m-huge").exists()  # nothing written before the flags were checked


# --------------------------------------------------------------------------- eval config, recipe
def _fake_checkpoints(run: Path) -> None:
    for sub in ("sft", "grpo-standard", "grpo-reterm"):
        (run / sub / "merged").mkdir(parents=True)
        (run / sub / "merged" / "config.json").write_text("{}")


def test_eval_config_has_the_four_models_and_loads(tmp_path):
    from reterm.eval.run import job_config, load_config

    run = tmp_path / "run"
    _fake_checkpoints(run)
    out = run / "eval" / "config.yaml"
    stages.eval_config(run, REPO / "eval" / "configs" / "local.yaml", out, trials=2, max_turns=4, max_new_tokens=96,
                       max_states=8, state_turns=3)  # fmt: skip
    cfg = load_config(out)  # eval's own validation
    assert [m.name for m in cfg.models] == ["base", "sft", "grpo-standard", "grpo-reterm"]
    assert cfg.models[0].policy == "smollm2"
    assert cfg.models[3].policy == f"hf:{run / 'grpo-reterm' / 'merged'}"
    assert all(m.kwargs["max_turns"] == 4 and m.kwargs["policy_kwargs"]["max_new_tokens"] == 96 for m in cfg.models)
    assert cfg.trials == 2 and cfg.output_dir == run / "eval"
    assert cfg.recovery_from_states.max_states == 8 and cfg.recovery_from_states.from_models == ["base"]
    job_config(cfg, cfg.models[1])  # a Harbor JobConfig builds


def test_eval_config_names_the_missing_stage(tmp_path):
    with pytest.raises(ValueError, match="run the sft stage first"):
        stages.eval_config(tmp_path, REPO / "eval" / "configs" / "local.yaml", tmp_path / "c.yaml")


def test_effective_recipe_applies_command_line_overrides(tmp_path):
    cmd = tmp_path / "command.json"
    cmd.write_text(json.dumps({"argv": ["train/grpo.py", "--config", "train/recipes/smollm2-135m/grpo.yaml",
                                        "--max_steps", "3", "--dataset_name", "runs/x/data", "--use_peft", "false",
                                        "--task_dirs", "tasks", "tests/fixtures/tasks"]}))  # fmt: skip
    data = stages.effective_recipe(cmd, tmp_path / "grpo.yaml")
    original = yaml.safe_load((REPO / "train/recipes/smollm2-135m/grpo.yaml").read_text())
    assert data["max_steps"] == 3 and data["dataset_name"] == "runs/x/data" and data["use_peft"] is False
    assert data["task_dirs"] == ["tasks", "tests/fixtures/tasks"]
    assert data["learning_rate"] == original["learning_rate"]
    assert yaml.safe_load((tmp_path / "grpo.yaml").read_text()) == data


def test_vllm_commands_split_gpus_into_replicas():
    # a 9B fits one GPU: each server's share of the GPUs becomes data-parallel replicas, not tensor parallel
    cmds = stages.vllm_commands([("a", "ck/a", 8000), ("b", "ck/b", 8001)], 8, ["--max-model-len", "4096"],
                                binary="vllm")
    assert cmds[0] == (["vllm", "serve", "ck/a", "--served-model-name", "a", "--port", "8000",
                        "--tensor-parallel-size", "1", "--data-parallel-size", "4", "--max-model-len", "4096"],
                       "0,1,2,3")  # fmt: skip
    assert cmds[1][1] == "4,5,6,7"
    one = stages.vllm_commands([("p", "ck/p", 8000)], 8, [], binary="vllm")[0][0]
    assert one[one.index("--data-parallel-size") + 1] == "8" and one[one.index("--tensor-parallel-size") + 1] == "1"
    tp2 = stages.vllm_commands([("p", "ck/p", 8000)], 8, [], tensor_parallel=2, binary="vllm")[0][0]
    assert tp2[tp2.index("--data-parallel-size") + 1] == "4" and tp2[tp2.index("--tensor-parallel-size") + 1] == "2"
    with pytest.raises(ValueError, match="at least 2 GPUs"):
        stages.vllm_commands([("a", "x", 1), ("b", "y", 2)], 1, [], binary="vllm")
    with pytest.raises(ValueError, match="NAME=CHECKPOINT@PORT"):
        stages.parse_serve("no-port")


def test_summary_reads_results_and_stage_records(tmp_path):
    run = tmp_path / "run"
    (run / "eval").mkdir(parents=True)
    models = []
    for i, name in enumerate(["base", "sft", "grpo-standard", "grpo-reterm"]):
        models.append({"name": name, "agent": "reterm", "policy": "smollm2" if i == 0 else f"hf:{name}",
                       "pass_at_1": {"mean": i / 10, "stderr": 0.05, "n_trials": 18, "n_tasks": 9},
                       "pass_at_k": {"2": i / 8}, "infra_faults": {"n": 0},
                       "recovery": {"missing_dependency": {"failure_states": 4, "recovered": i, "rate": i / 4}},
                       "recovery_from_states": {"wrong_command": {"failure_states": 2, "attempts": 2,
                                                                  "recovered": i % 3, "rate": (i % 3) / 2}}})  # fmt: skip
    (run / "eval" / "results.json").write_text(
        json.dumps(
            {
                "name": "t",
                "dataset": {"path": "tasks", "split": "test", "n_tasks": 9},
                "harness": {"trials_per_task": 2, "environment": "local", "timeouts_modified": False},
                "models": models,
            }
        )
    )
    stages.run_stage(run, "sft", [PY, "-c", "pass"], [], [])
    md, data = run_summary.build_summary(run, STAGE_ORDER[:-1])
    rows = {line.split("|")[1].strip(): line for line in md.splitlines() if line.startswith("| ")}
    assert "30.0% ± 5.0%" in rows["ReTerm-GRPO"] and "3/4 (75.0%)" in rows["ReTerm-GRPO"]
    assert "0/2 (0.0%)" in rows["ReTerm-GRPO"]  # recovery from recorded states: 3 % 3 = 0 of 2 attempts
    assert rows["wrong_command"].count("/2") == 4
    assert "not run" in rows["data"] and rows["sft"].split("|")[2].strip() != "not run"
    assert [m["model"] for m in data["models"]] == ["base", "sft", "grpo-standard", "grpo-reterm"]
    assert "space/app.py --source" in md


# ------------------------------------------------------------------------------------ slow: chain
def _same_path(a: str | Path, b: str | Path) -> bool:
    """Whether two paths name the same file (relative ones are relative to the repository root, as run_all runs)."""
    return (REPO / a).resolve() == (REPO / b).resolve()


def _assert_one_state_id(run: Path) -> None:
    """The reduced run's dataset, GRPO rollouts, eval items and the Space's views name a failure state by one id:
    :func:`reterm.recovery.state.state_id` of the history the attempt continues (issue 31)."""
    from datasets import load_dataset

    from reterm.recovery.state import state_id_of
    from reterm.training.grpo_outputs import read_rollout_file
    from reterm.trajectory import Trajectory

    sys.path.insert(0, str(REPO / "space"))
    from replay_sources import group_key, open_source, record_trajectory

    records = list(load_dataset(str(run / "data-mined"), split="train"))
    for r in records:  # the Space's view of a record starts its recovery from the state the dataset names
        traj, first = record_trajectory(r)
        assert state_id_of(traj, traj.steps[:first]) == r["trajectory_id"], (r["id"], first)
    data_ids = {r["trajectory_id"] for r in records}
    rows = [x for f in sorted((run / "grpo-reterm" / "rollouts").glob("*.jsonl")) for x in read_rollout_file(f)]
    rows = [x for x in rows if x["trajectory"]]
    assert rows
    for x in rows:
        traj = Trajectory.model_validate(x["trajectory"])
        assert traj.prefix_len > 0 and state_id_of(traj, traj.steps[: traj.prefix_len]) == x["state_id"]
        assert group_key(traj) == f"{x['task_id']}/{x['state_id']}"
        if x["pool_origin"] == "seed":  # a seed state is a state of the dataset GRPO read
            assert x["state_id"] in data_ids, x["state_id"]
    labels = [item.label for item in open_source(str(run / "grpo-reterm")).items]
    assert {x["state_id"] for x in rows} == {lab.split(" · state ")[1].split(" ")[0] for lab in labels}
    for name in ("base", "sft", "grpo-standard", "grpo-reterm"):
        per = json.loads((run / "eval" / name / "per_item.json").read_text())
        lines = [json.loads(line) for line in (run / "eval" / name / "attempts.jsonl").read_text().splitlines()]
        forked = [a for a in lines if a.get("state_id")]
        assert forked, name
        for a in forked:
            traj = Trajectory.model_validate({k: v for k, v in a.items() if k in Trajectory.model_fields})
            assert state_id_of(traj, traj.steps[: traj.prefix_len]) == a["state_id"], (name, a["kind"])
        own = {a["state_id"] for a in forked if a["kind"] == "recovery_multistage_own"}
        assert own == set(per.get("recovery_at_1/multistage_own", [])), name


@pytest.mark.slow
@pytest.mark.timeout(1200)  # the chain alone is about 10 min on 2 busy cores; the limit is a hang guard
def test_reduced_chain_end_to_end(tmp_path):
    """The whole chain on fewer tasks and steps (`--size ci`): every stage's outputs are where the summary
    says, the next stage consumed them, and a second run skips every completed stage.

    `.ci/run` runs `bash train/run_all.sh --size ci` on its fresh clone before the suite and names its run
    folder in ``RETERM_CI_RUN_DIR`` (exactly as given to run_all: the second run must pass the same
    ``--run-dir`` to find its stages done): this test then checks that run instead of running the chain again.
    """
    from datasets import load_dataset
    from huggingface_hub import DatasetCard, ModelCard

    run_arg = os.environ.get("RETERM_CI_RUN_DIR")
    if run_arg:
        run = REPO / run_arg
        missing = [s for s in CI_STAGE_ORDER[:-1] if stages.read_marker(run, s) is None]
        assert not missing and (run / "summary.json").is_file(), (
            f"RETERM_CI_RUN_DIR={run_arg}: the chain .ci/run ran there did not complete (no record of the stages "
            f"{missing}; their logs: {run / 'logs'})"
        )
        wall = float(json.loads((run / "summary.json").read_text())["wall_s"])
    else:
        run_arg = str(tmp_path / "run")
        run = Path(run_arg)
        t0 = time.monotonic()
        r = _run_all("--size", "ci", "--run-dir", run_arg, timeout=1150)
        wall = time.monotonic() - t0
        assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    ds = load_dataset(str(run / "data"), split="train")
    assert len(ds) >= 1 and "train_from_message_index" in ds.column_names
    for sub in ("sft", "grpo-reterm", "grpo-standard"):
        assert (run / sub / "merged" / "config.json").is_file(), sub
        assert (run / sub / "training_summary.json").is_file(), sub
    recs = {s: stages.read_marker(run, s) for s in CI_STAGE_ORDER[:-1]}
    assert all(recs.values()), [s for s, v in recs.items() if not v]
    grpo = json.loads((run / "grpo-reterm" / "training_summary.json").read_text())
    assert grpo["mode"] == "reterm" and grpo["steps"] == 1 and _same_path(grpo["base_model"], run / "sft" / "merged")
    assert set(ds.column_names) >= {"id", "task_id", "messages", "train_from_message_index", "target_attempt_index",
                                    "trajectory_sha256"}
    results = json.loads((run / "eval" / "results.json").read_text())
    assert list(results["models"]) == ["base", "sft", "grpo-standard", "grpo-reterm"]
    for name, m in results["models"].items():
        assert m["pass_at_1"]["drills_id"]["n"] + m["infra_faults"]["drills_id"] == 2, name
        assert m["recovery_at_1"]["drills_id"]["n"] >= 1, name
    summary_json = json.loads((run / "summary.json").read_text())
    for name in ("base", "sft", "grpo-standard", "grpo-reterm"):
        entry = summary_json["models"][name]
        # Pass@1 ID/OOD, and from the start of the chains the own failure states come from (CI: three-stage)
        assert set(entry["pass_at_1"]) == {"drills_id", "drills_ood", "multistage_start"}, name
        assert {"value", "ci95", "n"} <= set(entry["pass_at_1"]["drills_id"]), name
    assert summary_json["models"]["grpo-reterm"]["steps"] == 1
    assert summary_json["models"]["grpo-reterm"]["zero_variance_group_share"] is not None
    sig = summary_json["models"]["grpo-reterm"]["signal_attempt_share"]
    assert {"value", "ci95", "n", "groups", "signal_groups"} <= set(sig) and sig["groups"] <= 1
    mech = summary_json["mechanism"]
    assert mech["n_tasks"] == 2 and set(mech["signal_attempt_share"]) == {"task_start", "failure_state"}
    assert mech["signal_attempt_share"]["task_start"]["groups"] + mech["no_failure_state"] >= 1
    assert "failure_state - task_start" in mech["difference"]
    assert summary_json["wall_s"] > 0 and summary_json["peak_rss_gb"] > 0
    card = DatasetCard.load(run / "cards" / "dataset" / "README.md")
    assert card.data.license
    mcard = ModelCard.load(run / "cards" / "model" / "README.md")
    assert mcard.data.base_model
    # the dataset versions: data/ (what SFT trained on) is not touched by the mine stage; data-mined/ (round 2,
    # extending it) holds GRPO's seed states and is the one published
    first, mined = (json.loads((run / d / "stats.json").read_text()) for d in ("data", "data-mined"))
    assert first["config"]["round"] == 1 and mined["config"]["round"] == 2
    assert mined["config"]["extends"] == {"folder": "data", "version": first["version"], "records": first["filters"]["kept"],
                                          "created": first["created"]}  # fmt: skip
    mine_started = datetime.fromisoformat(recs["mine"]["started_at"]).timestamp()
    assert max(f.stat().st_mtime for f in (run / "data").rglob("*") if f.is_file()) < mine_started
    assert json.loads((run / "sft" / "training_summary.json").read_text())["dataset"] == "data"
    assert grpo["dataset"] == "data-mined"
    assert json.loads((run / "grpo-standard" / "training_summary.json").read_text())["dataset"] == "data-mined"
    # the rendered cards say, number by number, what the run measured and built
    assert_model_card_matches(str(mcard), results, "grpo-reterm")
    _assert_one_state_id(run)
    assert_dataset_card_matches(str(card).split("\n---\n", 1)[1], run / "data-mined")
    assert re.search(r"SFT trained on the recovery turns of the records of `[^`]*/data`", str(mcard))
    assert re.search(r"ReTerm-GRPO forked each group of 2 attempts from a failure state of `[^`]*/data-mined`", str(mcard))
    from reterm.io import default_mode

    assert (run / "grpo-reterm" / "merged" / "model.safetensors").stat().st_mode & 0o777 == default_mode()
    assert (run / "cards" / "space" / "app.py").exists()
    summary = (run / "summary.md").read_text()
    for label in ("base (SmolLM2-135M-Instruct)", "SFT cold start", "standard GRPO", "ReTerm-GRPO"):
        assert f"| {label} |" in summary
    assert "| not run |" not in summary
    assert (run / "plots" / "stages.png").is_file()
    assert max(v["peak_mem_mb"] or 0 for v in recs.values()) < 12 * 1024
    print(f"\nreduced chain: {wall:.0f} s; per stage: " + ", ".join(f"{s} {v['wall_s']:.0f}s" for s, v in recs.items()))
    # a second run: every completed stage is skipped, the summary is printed again
    r2 = _run_all("--size", "ci", "--run-dir", run_arg, timeout=600)
    assert r2.returncode == 0, r2.stdout[-3000:]
    assert r2.stdout.count("skipped") == len(CI_STAGE_ORDER) - 2  # all but setup (always checks) and summary
    assert "| ReTerm-GRPO |" in r2.stdout


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_check_9b_recipe_passes_without_gpus(tmp_path):
    """`--recipe qwen3.5-9b --check`: configs parse, trainers take one step on the tiny Qwen3.5, launch
    commands compose, credentials are reported (missing here) without failing."""
    env = {k: "" for k in ("HF_TOKEN", "DAYTONA_API_KEY", "HUB_ORG", "RETERM_POLICY_URL", "RETERM_TEACHER_URL")}
    env["HF_HUB_OFFLINE"] = "1"
    r = _run_all("--recipe", "qwen3.5-9b", "--check", "--run-dir", str(tmp_path / "q"), timeout=1700, env=env)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-5000:]
    assert "[ok  ] sft: tiny Qwen3.5, 1 step" in out
    assert "[ok  ] grpo: tiny Qwen3.5, 1 step" in out and "[ok  ] grpo-standard: tiny Qwen3.5, 1 step" in out
    assert "[miss] DAYTONA_API_KEY: not set" in out and "0 failures" in out
    assert "accelerate launch --config_file train/accelerate_configs/fsdp2.yaml train/grpo.py" in out
    assert "[grpo]" in out and "[eval]" in out  # the composed stage commands were printed
    # the saved checkpoint is text-only Qwen3.5 (docs/REPRODUCING.md, "The checkpoints' architecture")
    cfg = json.loads((tmp_path / "q" / "check" / "sft-check" / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3_5ForCausalLM"] and cfg["model_type"] == "qwen3_5_text"
    # the recipe's enable_thinking: false is pinned in the saved template (what vLLM serves from it)
    template = (tmp_path / "q" / "check" / "sft-check" / "chat_template.jinja").read_text()
    assert template.startswith("{%- set enable_thinking = false %}\n")


def test_vllm_comes_from_the_projects_environment(tmp_path, monkeypatch):
    # the servers are started from the environment's bin/ (like .venv/bin/accelerate), never from PATH
    fake = tmp_path / "bin"
    fake.mkdir()
    monkeypatch.setattr(sys, "executable", str(fake / "python"))
    with pytest.raises(FileNotFoundError, match="vLLM is not installed in this environment"):
        stages.vllm_commands([("p", "ck/p", 8000)], 8, [])
    (fake / "vllm").write_text("#!/bin/sh\n")
    assert stages.vllm_commands([("p", "ck/p", 8000)], 8, [])[0][0][0] == str(fake / "vllm")
