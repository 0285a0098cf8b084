"""kill -9 and resume (issue 22, item 5): SFT (train/sft.py on the tiny Qwen3.5), GRPO in both modes (train/grpo.py on the tiny Qwen3.5, local sandbox,
real verifier) and the drills evaluation (reterm.eval.drills' command line, scripted policies, local sandbox).

Each run is a real process killed with SIGKILL at a point where its work is half done, then started again with
the same command line. Checked: GRPO resumes from the last checkpoint with its failure pool and generation round,
ends at max_steps, and writes exactly one rollouts file per generation round (none duplicated, none lost); the
drills evaluation keeps the model it had finished (not recomputed) and counts every item once.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RECIPES = REPO / "train" / "recipes" / "smollm2-135m"


def _env() -> dict[str, str]:
    return dict(os.environ, OMP_WAIT_POLICY="PASSIVE", PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1")


def _kill_when(proc: subprocess.Popen, ready, timeout: float = 600) -> None:
    """SIGKILL ``proc`` as soon as ``ready()`` is true; fail if it ends or times out first."""
    t0 = time.monotonic()
    while not ready():
        if proc.poll() is not None:
            out = proc.stdout.read() if proc.stdout else ""
            pytest.fail(f"the run ended (rc {proc.returncode}) before the kill point:\n{out[-3000:]}")
        if time.monotonic() - t0 > timeout:
            proc.kill()
            pytest.fail("the kill point was not reached in time")
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL


def _grpo_argv(recipe: Path, out: Path, max_steps: int) -> list[str]:
    """The recipe's ``--check`` command line (tiny Qwen3.5, G=2, the fixture's states), made a real run of
    ``max_steps`` steps with a checkpoint every step."""
    _, _, _, argv = _script_module("grpo").parse_args(["--config", str(recipe), "--check", "--output_dir", str(out)])
    argv = [a for a in argv if a != "--check"]
    return argv + ["--output_dir", str(out), "--max_steps", str(max_steps), "--save_strategy", "steps",
                   "--save_steps", "1", "--online_state_fraction", "1.0"]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["grpo.yaml", "grpo_standard.yaml"])
def test_grpo_resumes_after_kill_9(recipe, tmp_path):
    steps, g = 3, 2
    out = tmp_path / "grpo"
    cmd = [sys.executable, "train/grpo.py", *_grpo_argv(RECIPES / recipe, out, steps)]
    first = subprocess.Popen(cmd, cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    _kill_when(first, lambda: (out / "checkpoint-1" / "failure_pool.json").is_file())
    assert not (out / "training_summary.json").exists()
    saved = json.loads((out / "checkpoint-1" / "failure_pool.json").read_text())
    assert saved["generation_round"] == 1

    second = subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=900)
    log = second.stdout + second.stderr
    assert second.returncode == 0, log[-4000:]
    last = max((int(p.name.split("-")[1]) for p in out.glob("checkpoint-*")))
    assert re.search(r"\[grpo\] resuming from \S*checkpoint-\d+ \(with its online failure states\)", log), log[-3000:]
    summary = json.loads((out / "training_summary.json").read_text())
    assert summary["steps"] == steps and last == steps
    # one rollouts file per generation round, rounds 1..steps at steps 0..steps-1: none duplicated or lost
    names = sorted(p.name for p in (out / "rollouts").glob("*.jsonl"))
    found = [tuple(int(x) for x in re.match(r"round-(\d+)-step-(\d+)-rank0\.jsonl$", n).groups()) for n in names]
    assert found == [(i + 1, i) for i in range(steps)], names  # rounds count from 1
    rows = [json.loads(line) for n in names for line in (out / "rollouts" / n).read_text().splitlines()]
    assert len(rows) == g * steps and summary["attempts"] == g * steps
    final = json.loads((out / f"checkpoint-{steps}" / "failure_pool.json").read_text())
    assert final["generation_round"] == steps
    state = json.loads((out / f"checkpoint-{steps}" / "trainer_state.json").read_text())
    assert state["global_step"] == steps
    if recipe == "grpo.yaml":  # ReTerm mode: the online states found before the kill are still in the pool
        before = {s["state_id"] for s in saved["pool"]["online"] + saved["pool"]["pending"]}
        after = {s["state_id"] for s in final["pool"]["online"]} | set(final["pool"]["retired"])
        assert before <= after | {s["state_id"] for s in final["pool"]["pending"]}, (before, after)
    # the pool's counters go on from the checkpoint's (a resume that lost them would start again from 0)
    assert all(final["pool"]["counts"].get(k, 0) >= v for k, v in saved["pool"]["counts"].items()), (saved, final)


def _script_module(name: str):
    spec = importlib.util.spec_from_file_location(f"reterm_train_{name}_resume", REPO / "train" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_sft_resumes_after_kill_9(tmp_path):
    steps = 6
    out = tmp_path / "sft"
    _, _, _, argv = _script_module("sft").parse_args(["--config", str(RECIPES / "sft.yaml"), "--check",
                                                      "--output_dir", str(out)])  # fmt: skip
    argv = [a for a in argv if a != "--check"] + ["--output_dir", str(out), "--max_steps", str(steps),
                                                  "--save_strategy", "steps", "--save_steps", "1",
                                                  "--save_total_limit", "100", "--eval_strategy", "no",
                                                  "--merge_adapter", "false"]  # fmt: skip
    cmd = [sys.executable, "train/sft.py", *argv]
    first = subprocess.Popen(cmd, cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    _kill_when(first, lambda: (out / "checkpoint-2" / "trainer_state.json").is_file())
    assert not (out / "training_summary.json").exists()
    kept = (out / "checkpoint-1" / "trainer_state.json").stat().st_mtime_ns
    second = subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=900)
    log = second.stdout + second.stderr
    assert second.returncode == 0, log[-4000:]
    assert (out / "checkpoint-1" / "trainer_state.json").stat().st_mtime_ns == kept  # not trained again
    assert re.search(r"\[sft\] resuming from \S*checkpoint-\d+", log), log[-3000:]
    summary = json.loads((out / "training_summary.json").read_text())
    assert summary["steps"] == steps
    state = json.loads((out / f"checkpoint-{steps}" / "trainer_state.json").read_text())
    logged = [e["step"] for e in state["log_history"] if "loss" in e]
    assert logged == list(range(1, steps + 1)), logged  # every step trained once, none twice


CHILD = '''
import sys, time
import reterm.policies
from reterm.agent.episode import load_task
from reterm.data.drills import read_splits
from reterm.eval import drills
from reterm.policies.scripted import OraclePolicy, ScriptedPolicy

tasks = sys.argv[1]
from pathlib import Path
splits = read_splits(Path(tasks))
dirs = [Path(tasks) / n for n in splits["test"] + splits["test_ood"]]
oracle = OraclePolicy(dirs)

def slow(messages):
    time.sleep(0.4)  # so that the kill lands inside this model's evaluation
    return oracle.reply(messages)

policies = {"nothing": lambda: ScriptedPolicy(lambda m: "I am not sure.", name="nothing"),
            "slow-oracle": lambda: ScriptedPolicy(slow, name="slow-oracle")}
drills.load_policy = lambda spec, **kw: policies[spec]()  # the evaluation's own reference
sys.exit(drills.main(["--tasks", tasks, "--model", "base=nothing", "--model", "sft=slow-oracle",
                      "--output", sys.argv[2], "--max-turns", "8", "--batch", "4", "--own-items", "2", "--k-max", "1"]))
'''


@pytest.mark.slow
def test_drills_evaluation_resumes_after_kill_9(tmp_path):
    from reterm.data.drills import read_splits
    from reterm.drills import generate_drills

    tasks = tmp_path / "drills"
    generate_drills(tasks, 0, 4, families=["mkdir-parent", "exec-bit", "wc-number"], ood_families=["wc-number"])
    splits = read_splits(tasks)
    n_id, n_ood = len(splits["test"]), len(splits["test_ood"])
    out = tmp_path / "eval"
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    cmd = [sys.executable, str(script), str(tasks), str(out)]
    first = subprocess.Popen(cmd, cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    # killed inside the second model: the first one is finished, the second has attempts under way
    _kill_when(first, lambda: (out / "base" / "metrics.json").is_file())
    assert not (out / "sft" / "metrics.json").exists() and not (out / "results.json").exists()
    base_bytes = (out / "base" / "metrics.json").read_bytes()
    base_mtime = (out / "base" / "metrics.json").stat().st_mtime_ns

    second = subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=900)
    assert second.returncode == 0, (second.stdout + second.stderr)[-4000:]
    assert "model base =" not in second.stdout + second.stderr  # the finished model was not evaluated again
    assert (out / "base" / "metrics.json").read_bytes() == base_bytes
    assert (out / "base" / "metrics.json").stat().st_mtime_ns == base_mtime
    results = json.loads((out / "results.json").read_text())
    assert list(results["models"]) == ["base", "sft"]
    for name, m in results["models"].items():
        for split, n in (("drills_id", n_id), ("drills_ood", n_ood)):
            assert m["pass_at_1"][split]["n"] + m["infra_faults"][split] == n, (name, split)
        lines = [json.loads(x) for x in (out / name / "attempts.jsonl").read_text().splitlines() if x]
        tasks_seen = [x["task_id"] for x in lines if x.get("kind") == "pass_at_1"]
        assert len(tasks_seen) == len(set(tasks_seen)) == n_id + n_ood, (name, tasks_seen)  # each item once
    sft = results["models"]["sft"]
    assert sft["pass_at_1"]["drills_id"] == {**sft["pass_at_1"]["drills_id"], "value": 1.0, "n": n_id}
    diff = results["differences"]["sft - base"]["pass_at_1/drills_id"]
    assert diff["n"] == n_id and diff["diff"] == 1.0  # paired over the same items, each once
