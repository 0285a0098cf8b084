"""train/sft.py end to end: recipes parse, the 9B recipe's code path runs one step on the tiny Qwen3.5
(``--check``), LoRA adapters merge exactly, outputs (curves, summary, recipe copy) are written, and the
held-out scorer agrees with TRL's evaluation loss.

The SmolLM2 training run (loss falls, held-out likelihood rises, the model runs an episode in the
harness) is ``test_sft_smollm2.py`` (slow).
"""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest
import torch
import yaml

from reterm.training import outputs
from reterm.training.likelihood import score_rows
from reterm.training.merge import merge_adapter
from reterm.training.sft_data import load_records, to_sft_dataset

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "tests" / "fixtures" / "reterm10k_mini"
RECIPE_9B = REPO / "train" / "recipes" / "qwen3.5-9b" / "sft.yaml"
RECIPE_CPU = REPO / "train" / "recipes" / "smollm2-135m" / "sft.yaml"


def _sft_module():
    spec = importlib.util.spec_from_file_location("reterm_train_sft", REPO / "train" / "sft.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve string annotations through sys.modules
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def sft():
    return _sft_module()


@pytest.fixture(scope="module")
def tiny_qwen():
    from reterm.tiny_qwen import build_tiny_qwen3_5

    return build_tiny_qwen3_5()


def test_recipes_parse_with_the_script_parser(sft):
    # The CPU recipe as is; the 9B recipe with only the flags a CPU needs to construct its config
    # (bf16 on a CPU is refused by TrainingArguments itself).
    script, train, model, _ = sft.parse_args(["--config", str(RECIPE_CPU)])
    # bf16: autocast where the CPU has bf16 instructions (train/sft.py turns it off elsewhere: reterm.precision)
    assert model.model_name_or_path == "smollm2" and model.use_peft and train.use_cpu and train.bf16
    assert not train.gradient_checkpointing  # memory allows it on the CPU recipe
    assert train.assistant_only_loss and train.completion_only_loss and script.merge_adapter
    assert script.dataset_name == "runs/smollm2-135m/data" and script.dataset_test_split == "test"  # run_all.sh writes it

    script, train, model, _ = sft.parse_args(["--config", str(RECIPE_9B), "--use_cpu", "True", "--bf16", "False"])
    assert model.model_name_or_path == "Qwen/Qwen3.5-9B" and not model.use_peft and model.dtype == "bfloat16"
    assert train.assistant_only_loss and train.completion_only_loss and not train.packing
    assert script.enable_thinking is False and train.gradient_checkpointing
    # every value is attributed to the paper or to us
    text = RECIPE_9B.read_text()
    assert "[paper]" in text and "[ours]" in text and "does NOT publish its SFT hyperparameters" in text


def test_accelerate_configs_parse():
    zero3 = yaml.safe_load((REPO / "train/accelerate_configs/zero3.yaml").read_text())
    fsdp2 = yaml.safe_load((REPO / "train/accelerate_configs/fsdp2.yaml").read_text())
    assert zero3["distributed_type"] == "DEEPSPEED" and zero3["deepspeed_config"]["zero_stage"] == 3
    assert zero3["deepspeed_config"]["zero3_init_flag"] is True
    assert fsdp2["distributed_type"] == "FSDP" and fsdp2["fsdp_config"]["fsdp_version"] == 2
    from accelerate.commands.config.config_args import load_config_from_file

    for name in ("zero3.yaml", "fsdp2.yaml"):
        cfg = load_config_from_file(str(REPO / "train/accelerate_configs" / name))
        assert cfg.num_processes == 8 and cfg.mixed_precision == "bf16"


def test_check_runs_the_9b_recipe_for_one_step_on_tiny_qwen(sft, tiny_qwen, tmp_path, capsys):
    from safetensors.torch import load_file
    from transformers import AutoTokenizer, Qwen3_5ForCausalLM
    from trl.chat_template_utils import qwen3_5_think_chat_template

    assert sft.main(["--config", str(RECIPE_9B), "--check", "--output_dir", str(tmp_path / "run")]) == 0
    out = tmp_path / "run-check"
    summary = json.loads((out / "training_summary.json").read_text())
    assert summary["check_run"] and summary["steps"] == 1 and summary["base_model"] == "tiny-qwen3.5"
    assert summary["finetuning"] == "full" and summary["loss_on"] == "recovery assistant turns"
    assert summary["chat_template"] == "trl/chat_templates/qwen3_5_think_training.jinja"
    assert summary["chat_template_kwargs"] == {"enable_thinking": False}
    assert summary["dataset"] == "reterm10k_mini" and summary["dataset_splits"] == {"train": 4, "test": 2}
    assert math.isfinite(summary["final_loss"]) and summary["heldout"]["base_nll_per_token"] > 0
    # the one step changed the weights (no warm-up in check mode)
    before, after = load_file(tiny_qwen / "model.safetensors"), load_file(out / "model.safetensors")
    assert any(not torch.equal(before[k], after[k]) for k in before)
    # the checkpoint loads text-only and keeps Qwen3.5's original template with the recipe's thinking setting
    # pinned (issue 25: a model trained without thinking is served without it)
    from reterm.training.thinking import pin_thinking, pinned_value

    assert type(Qwen3_5ForCausalLM.from_pretrained(out)).__name__ == "Qwen3_5ForCausalLM"
    saved = AutoTokenizer.from_pretrained(out).chat_template
    assert saved == pin_thinking(qwen3_5_think_chat_template, False) and pinned_value(saved) is False
    # run record
    assert (out / "recipe.yaml").read_bytes() == RECIPE_9B.read_bytes()
    argv = json.loads((out / "command.json").read_text())["argv"]
    assert "--check" in argv and argv[argv.index("--model_name_or_path") + 1] == "tiny-qwen3.5"
    assert {"torch", "transformers", "trl", "peft"} <= set(json.loads((out / "versions.json").read_text()))
    rows = (out / "curves.csv").read_text().splitlines()
    assert rows[0].startswith("step,epoch,loss,mean_token_accuracy") and len(rows) == 3  # step 0 (eval) + step 1
    assert (out / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "held-out recovery NLL/token: base" in capsys.readouterr().out


def test_check_runs_the_cpu_recipe_with_lora_and_merge(sft, tiny_qwen, tmp_path):
    from transformers import AutoModelForCausalLM

    assert sft.main(["--config", str(RECIPE_CPU), "--check", "--output_dir", str(tmp_path / "run")]) == 0
    out = tmp_path / "run-check"
    summary = json.loads((out / "training_summary.json").read_text())
    assert summary["finetuning"] == "LoRA" and summary["lora"]["r"] == 16
    assert summary["lora"]["target_modules"] == "all-linear"
    assert (out / "adapter_config.json").is_file() and not (out / "model.safetensors").exists()
    merged = out / "merged"
    model = AutoModelForCausalLM.from_pretrained(merged)
    assert type(model).__name__ == "Qwen3_5ForCausalLM"
    assert (merged / "training_summary.json").is_file() and (merged / "chat_template.jinja").is_file()


def test_merge_adapter_reproduces_the_adapted_model(tiny_qwen, tmp_path):
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_qwen)
    peft_model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM"))
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)  # a trained adapter is not the identity
    adapter = tmp_path / "adapter"
    peft_model.save_pretrained(adapter)
    merged = merge_adapter(adapter, tmp_path / "merged", base_model=str(tiny_qwen))
    x = torch.randint(0, 1000, (1, 24))
    reloaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_qwen), adapter).eval()
    full = AutoModelForCausalLM.from_pretrained(merged).eval()
    with torch.no_grad():
        plain = AutoModelForCausalLM.from_pretrained(tiny_qwen).eval()(x).logits
        want, got = reloaded(x).logits, full(x).logits
    assert torch.allclose(want, got, atol=1e-4) and not torch.allclose(plain, got, atol=1e-3)
    # the checkpoint is readable by others (0666 less the umask, as open() gives), not mkstemp's 0600
    from reterm.io import default_mode

    modes = {p.name: p.stat().st_mode & 0o777 for p in merged.iterdir() if p.is_file()}
    assert modes["model.safetensors"] == default_mode() and set(modes.values()) == {default_mode()}, modes
    # merging again replaces the folder atomically
    assert merge_adapter(adapter, merged, base_model=str(tiny_qwen)) == merged and (merged / "config.json").is_file()


def test_scorer_matches_trl_eval_loss(tiny_qwen, tmp_path):
    """Per-record NLL of the held-out scorer == SFTTrainer.evaluate()'s eval_loss on that record."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    rows = to_sft_dataset(load_records(str(FIXTURE), "test"), {"enable_thinking": False}, max_samples=2)
    tok = AutoTokenizer.from_pretrained(tiny_qwen)
    model = AutoModelForCausalLM.from_pretrained(tiny_qwen).eval()
    scores = score_rows(model, tok, list(rows))
    for i, row_score in enumerate(scores):
        args = SFTConfig(output_dir=str(tmp_path / "o"), assistant_only_loss=True, max_length=None, bf16=False,
                         use_cpu=True, report_to=[], per_device_eval_batch_size=1, gradient_checkpointing=False)
        trainer = SFTTrainer(model=model, args=args, train_dataset=rows.select([i]), eval_dataset=rows.select([i]),
                             processing_class=tok)
        assert trainer.evaluate()["eval_loss"] == pytest.approx(row_score["nll"], rel=1e-4)
        assert row_score["tokens"] > 20


def test_curve_rows_merge_train_and_eval_entries():
    history = [
        {"eval_loss": 2.0, "eval_mean_token_accuracy": 0.5, "step": 0, "epoch": 0},
        {"loss": 1.9, "mean_token_accuracy": 0.55, "learning_rate": 1e-4, "step": 1, "epoch": 0.5},
        {"loss": 1.5, "mean_token_accuracy": 0.6, "step": 2, "epoch": 1.0},
        {"eval_loss": 1.6, "step": 2, "epoch": 1.0},
        {"train_runtime": 3.0, "train_loss": 1.7, "step": 2, "epoch": 1.0},
    ]
    rows = outputs.curve_rows(history)
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert rows[0]["loss"] is None and rows[0]["eval_loss"] == 2.0
    assert rows[2]["loss"] == 1.5 and rows[2]["eval_loss"] == 1.6
