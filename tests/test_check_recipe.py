"""`bash train/run_all.sh --recipe qwen3.5-9b --check` checks the commands run_all runs (train/check_recipe.py).

Fast tests: the check's plan is made from run_all's own `--dry-run` output and differs from it only by the
documented swap (launcher -> one CPU python process, `--check` appended: tiny Qwen3.5); every accelerate
config's composed launch command passes accelerate's parser and the Trainer's construction rules; run_all
refuses the 9B data stage without a teacher before starting anything; the recipes use the checkpointing key
both transformers versions (GPU set 5.20, CPU kit 5.24) read.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "train"))

import check_recipe  # noqa: E402  (train/check_recipe.py)

TRAINERS = ("sft", "grpo", "grpo-standard")


def _dry_run(run_dir: Path, **env: str) -> dict[str, list[str]]:
    """run_all's stage commands, read independently of check_recipe's parser: `[stage]` then the command."""
    r = subprocess.run(["bash", "train/run_all.sh", "--recipe", "qwen3.5-9b", "--run-dir", str(run_dir), "--dry-run"],
                       cwd=REPO, capture_output=True, text=True, timeout=60, env={**os.environ, **env})  # fmt: skip
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    out = {}
    for i, line in enumerate(lines):
        if line.startswith("[") and line.endswith("]"):
            out[line[1:-1]] = shlex.split(lines[i + 1])
    return out


def _plan(run_dir: Path, **env: str) -> dict:
    r = subprocess.run([sys.executable, "train/check_recipe.py", "--recipe", "qwen3.5-9b", "--run-dir", str(run_dir),
                        "--plan"], cwd=REPO, capture_output=True, text=True, timeout=120,
                       env={**os.environ, **env})  # fmt: skip
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.mark.parametrize("config", ["zero3", "fsdp2"])
def test_check_runs_the_command_lines_run_all_composes(tmp_path, config):
    dry = _dry_run(tmp_path / "r", ACCELERATE_CONFIG=config)
    plan = _plan(tmp_path / "r", ACCELERATE_CONFIG=config)
    assert list(plan) == list(dry)  # every stage, in order
    for stage, argv in dry.items():
        assert plan[stage]["command"] == argv, stage
    for stage in TRAINERS:
        argv = dry[stage]
        i = next(i for i, a in enumerate(argv) if a.startswith("train/") and a.endswith(".py"))
        assert argv[:3] == [".venv/bin/accelerate", "launch", "--config_file"]
        assert argv[3] == f"train/accelerate_configs/{config}.yaml"
        # only the launcher (devices) goes and --check (model) comes: recipe, flags and output folder are run_all's
        assert plan[stage]["run"] == [sys.executable, *argv[i:], "--check"], stage
        assert plan[stage]["launcher"] == argv[:i]
    # the configs the check loads are the ones the data and eval stages name
    assert plan["data"]["pipeline"]["config"] == dry["data"][dry["data"].index("--config") + 1]
    assert plan["eval"]["eval"]["config"] == dry["eval"][dry["eval"].index("--config") + 1]
    if config == "fsdp2":  # FSDP checkpoints activations itself: every trainer turns its own off
        for stage in TRAINERS:
            cmd = dry[stage]
            assert "--gradient_checkpointing" in cmd, stage
            assert cmd[cmd.index("--gradient_checkpointing") + 1] == "false", stage


def test_fsdp2_with_the_trainers_activation_checkpointing_is_refused(tmp_path):
    # the crash a user with 8 GPUs would have met at trainer construction, found from the same two settings
    dry = _dry_run(tmp_path / "r", ACCELERATE_CONFIG="fsdp2")
    launcher, script = check_recipe.split_launcher(dry["sft"])
    assert "FSDP v2" in check_recipe.check_launch(launcher, script)
    broken = script[: script.index("--gradient_checkpointing")]  # run_all before the fix
    with pytest.raises(ValueError, match="activation checkpointing"):
        check_recipe.check_launch(launcher, broken)
    # ZeRO-3 keeps the trainer's activation checkpointing (no FSDP rule applies)
    launcher, script = check_recipe.split_launcher(_dry_run(tmp_path / "z")["grpo"])
    out = check_recipe.check_launch(launcher, script)
    detail = out[1] if isinstance(out, tuple) else out
    assert "ZeRO stage 3" in detail


def test_recipes_name_checkpointing_as_both_transformers_versions_read():
    # the GPU set's transformers 5.20 (requirements-gpu.txt) has no `activation_checkpointing`, 5.24's name: its
    # parser refuses the key; `gradient_checkpointing` is read by both (5.24: an alias)
    import yaml

    recipes = sorted((REPO / "train" / "recipes").glob("*/*.yaml"))
    assert len(recipes) >= 5
    for path in recipes:
        keys = set(yaml.safe_load(path.read_text()) or {})
        assert not keys & {"activation_checkpointing", "activation_checkpointing_kwargs"}, path
    nine_b = yaml.safe_load((REPO / "train/recipes/qwen3.5-9b/sft.yaml").read_text())
    assert nine_b["gradient_checkpointing"] is True


def test_parse_dry_run_reads_quoted_arguments():
    text = "[sft]\n  python train/sft.py --x a\\ b --y 'c d'\n  (done already = skipped)\n\n[summary]\n  p s\n"
    assert check_recipe.parse_dry_run(text) == {"sft": ["python", "train/sft.py", "--x", "a b", "--y", "c d"],
                                                "summary": ["p", "s"]}  # fmt: skip


def test_9b_run_without_a_teacher_stops_before_anything_starts(tmp_path):
    run = tmp_path / "r"
    r = subprocess.run(["bash", "train/run_all.sh", "--recipe", "qwen3.5-9b", "--run-dir", str(run)], cwd=REPO,
                       capture_output=True, text=True, timeout=60,
                       env={**os.environ, "RETERM_TEACHER_URL": ""})  # fmt: skip
    assert r.returncode == 2 and "needs RETERM_TEACHER_URL" in r.stderr
    assert not (run / "stages").exists() and not (run / "logs").exists()  # no stage ran, not even setup


def test_9b_grpo_micro_batch_fits_80gb_by_the_measured_terms():
    # the recipe's own command (run_all's grpo stage) fits with the recipe's kernels; the PyTorch fallback would not
    script = ["train/grpo.py", "--config", "train/recipes/qwen3.5-9b/grpo.yaml"]
    msg = check_recipe.check_grpo_memory(script)
    assert "~73 GB per GPU with flash-linear-attention" in msg and "~81 GB on the PyTorch fallback" in msg
    with pytest.raises(ValueError, match="> 80 GB"):  # two attempts a micro-batch do not fit
        check_recipe.check_grpo_memory([*script, "--per_device_train_batch_size", "2"])
    args = check_recipe.training_args_of(script)
    est = check_recipe.grpo_gpu_memory_gb(args, use_vllm=True)
    # the terms measured on one H200 at 32K tokens (issue 32): checkpointed activations, the recomputed layer with
    # fla, the LM head's fp32 gradient and its bf16 copy; ZeRO-3's shards are arithmetic
    assert est["activations"] == pytest.approx(10.2) and est["recomputed layer"] == pytest.approx(10.0)
    assert est["lm head gradient"] == pytest.approx(6.1) and est["zero3 states"] == pytest.approx(17.9)
    assert check_recipe.grpo_gpu_memory_gb(args, True, kernels="torch")["recomputed layer"] == pytest.approx(18.0)
    with pytest.raises(ValueError, match="kernels must be"):
        check_recipe.grpo_gpu_memory_gb(args, True, kernels="triton")
    # with fsdp2, run_all turns the trainer's activation checkpointing off: FSDP's counts the same
    fsdp = _dry_run(REPO / "runs" / "unused", ACCELERATE_CONFIG="fsdp2")["grpo"]
    launcher, fsdp_script = check_recipe.split_launcher(fsdp)
    assert "~73 GB per GPU" in check_recipe.check_grpo_memory(fsdp_script, launcher)
    with pytest.raises(ValueError, match="> 80 GB"):  # without any checkpointing it would not fit
        check_recipe.check_grpo_memory(fsdp_script)
    # 256 attempts per optimiser step on 8 GPUs, whole groups on each process
    assert args.per_device_train_batch_size * args.gradient_accumulation_steps * 8 == 256
    assert (args.per_device_train_batch_size * args.gradient_accumulation_steps) % args.num_generations == 0


def test_thinking_is_one_setting_that_reaches_every_9b_stage(tmp_path):
    plan = _plan(tmp_path / "r")
    recipes = REPO / "train" / "recipes" / "qwen3.5-9b"
    assert "enable_thinking false" in check_recipe.check_thinking(recipes, plan)
    # a stage that lost the flag (run_all before this) is found
    broken = json.loads(json.dumps(plan))
    broken["grpo"]["command"] = [a for a in broken["grpo"]["command"] if "enable_thinking" not in a]
    with pytest.raises(ValueError, match="grpo command does not pass"):
        check_recipe.check_thinking(recipes, broken)
    broken = json.loads(json.dumps(plan))
    broken["eval"]["servers"] = [a for a in broken["eval"]["servers"] if a not in ("--enable-thinking", "false")]
    with pytest.raises(ValueError, match="eval vLLM servers"):
        check_recipe.check_thinking(recipes, broken)


def test_pinned_template_overrides_what_a_caller_passes():
    from transformers import AutoTokenizer

    from reterm.tiny_qwen import build_tiny_qwen3_5
    from reterm.training.thinking import pin_thinking, pinned_value

    tok = AutoTokenizer.from_pretrained(build_tiny_qwen3_5())
    msgs = [{"role": "user", "content": "hi"}]
    open_think = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert open_think.endswith("<think>\n")  # Qwen3.5 thinks by default
    pinned = pin_thinking(tok.chat_template, False)
    assert pinned_value(pinned) is False and pinned_value(pin_thinking(pinned, True)) is True
    for passed in ({}, {"enable_thinking": True}):  # the harness sends nothing, or asks for thinking
        text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, chat_template=pinned,
                                       **passed)
        assert text.endswith("<think>\n\n</think>\n\n"), passed
    with pytest.raises(ValueError, match="does not read enable_thinking"):
        pin_thinking("{{ messages }}", False)
