"""`bash train/run_all.sh --recipe qwen3.5-9b --gpu-smoke` (train/gpu_smoke.py): on a machine without CUDA it runs the
recipe's SFT and GRPO micro-batches on the tiny Qwen3.5 through TRL's fused LM head, names the kernels in use, and
writes the figures; its FLOPs formula reproduces the MFU measured on one H200."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "train"))

import gpu_smoke  # noqa: E402  (train/gpu_smoke.py)


def test_gpu_smoke_runs_the_9b_recipe_on_the_tiny_qwen_without_cuda(tmp_path):
    run = tmp_path / "run"
    r = subprocess.run(["bash", "train/run_all.sh", "--recipe", "qwen3.5-9b", "--gpu-smoke", "--run-dir", str(run)],
                       cwd=REPO, capture_output=True, text=True, timeout=600,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})  # fmt: skip
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    assert "tiny Qwen3.5" in out and "code path only, no GPU figures" in out
    assert "torch_chunk_gated_delta_rule -> torch fallback (flash-linear-attention not installed)" in out
    assert "LM head: TRL add_fused_lm_head" in out and "== GPU smoke passed" in out
    report = json.loads((run / "gpu-smoke.json").read_text())
    assert report["tiny"] is True and report["activation_checkpointing"] is True  # the recipe's setting
    sft, grpo = report["micro_batches"]["sft"], report["micro_batches"]["grpo"]
    assert (sft["seq"], sft["prompt_tokens"]) == (256, 0) and (grpo["seq"], grpo["prompt_tokens"]) == (256, 128)
    assert sft["tokens_per_s"] > 0 and grpo["tokens_per_s"] > 0
    assert sft["memory_gb"]["peak"] is None and sft["mfu"] is None  # no CUDA: no GPU figures are made up
    computed = report["computed_per_gpu_8"]["grpo"]
    assert computed["zero3_states"] == pytest.approx(16 * report["parameters"] / 8 / 1e9)
    assert computed["vllm"] == pytest.approx(0.30 * 80) and computed["total"] is None  # nothing measured to add


def test_gpu_smoke_is_for_the_9b_recipe(tmp_path):
    r = subprocess.run(["bash", "train/run_all.sh", "--gpu-smoke", "--run-dir", str(tmp_path / "r")], cwd=REPO,
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 2 and "--gpu-smoke is for --recipe qwen3.5-9b" in r.stderr


def test_recipe_sequences_and_the_measured_mfu():
    sft, grpo = gpu_smoke.read_recipe(REPO / "train" / "recipes" / "qwen3.5-9b")
    assert sft["max_length"] == 32768 and gpu_smoke.grpo_sequence(grpo) == (32768, 16384)
    from transformers import Qwen3_5TextConfig

    cfg = Qwen3_5TextConfig()  # the 9B's shape; the H200 figures of issue 32 (fla 0.6.0)
    for seq, tokens_per_s, mfu in ((8192, 6492, 0.363), (32768, 6018, 0.366)):
        fpt = gpu_smoke.model_flops_per_token(cfg, 8.95e9, seq)
        assert tokens_per_s * fpt / gpu_smoke.PEAK_BF16_FLOPS["H200"] == pytest.approx(mfu, abs=0.002)


def test_a_recipe_without_the_smokes_fields_is_named(tmp_path):
    (tmp_path / "sft.yaml").write_text("max_length: 10\n")
    with pytest.raises(ValueError, match=r"sft.yaml: field per_device_train_batch_size is missing"):
        gpu_smoke.read_recipe(tmp_path)
    with pytest.raises(FileNotFoundError, match="grpo.yaml: no such recipe file"):
        (tmp_path / "sft.yaml").write_text("max_length: 10\nper_device_train_batch_size: 1\n")
        gpu_smoke.read_recipe(tmp_path)
