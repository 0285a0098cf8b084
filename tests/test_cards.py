"""Dataset and model cards: rendered from the run's outputs, parsed back by huggingface_hub, bad input refused."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest
from huggingface_hub import DatasetCard, ModelCard

from reterm.cards.dataset import COLUMN_DOCS, render_dataset_card
from reterm.cards.model import render_model_card
from reterm.cards.model_inputs import load_recipe, load_results
from reterm.data.dataset_stats import load_stats
from reterm.hub_metadata import check_readme, size_category, validate_card_metadata
from reterm.record_features import FEATURES

FIXTURES = Path(__file__).parent / "fixtures" / "publish"
RECIPES = [FIXTURES / "recipes" / "sft.yaml", FIXTURES / "recipes" / "grpo.yaml"]
RESULTS = FIXTURES / "results.json"


def _fixture_module():
    spec = importlib.util.spec_from_file_location("publish_fixture", FIXTURES / "build_fixture.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def dataset_folder(tmp_path_factory) -> Path:
    return _fixture_module().build_dataset(tmp_path_factory.mktemp("ds") / "reterm10k")


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)  # fmt: skip
    out = tmp_path_factory.mktemp("model") / "checkpoint"
    LlamaForCausalLM(config).save_pretrained(out)
    # the record train/grpo.py leaves next to a checkpoint (the base model's id comes from the recipes here)
    (out / "training_summary.json").write_text(json.dumps({"method": "ReTerm-GRPO (TRL GRPOTrainer subclass)", "steps": 4}))
    return out


# ---------------------------------------------------------------------------------- dataset card
def test_dataset_card_parses_back_with_metadata_intact(dataset_folder, tmp_path):
    card = render_dataset_card(dataset_folder, "twothsnd/ReTerm-10K")
    path = tmp_path / "README.md"
    card.save(path)
    loaded = DatasetCard.load(path)
    assert loaded.data.to_dict() == card.data.to_dict()
    meta = loaded.data.to_dict()
    assert meta["license"] == "apache-2.0"
    assert meta["task_categories"] == ["text-generation"]
    assert meta["size_categories"] == ["n<1K"]
    assert meta["pretty_name"] == "ReTerm-10K (test fixture)"
    assert meta["configs"] == [
        {"config_name": "default", "data_files": [{"split": "train", "path": "data/train-*"},
                                                  {"split": "test", "path": "data/test-*"}]}  # fmt: skip
    ]
    # datasets reads the features and split sizes back from the card exactly as push_to_hub writes them
    from datasets.info import DatasetInfosDict

    info = DatasetInfosDict.from_dataset_card_data(loaded.data)["default"]
    assert info.features == FEATURES
    assert {s: info.splits[s].num_examples for s in info.splits} == {"train": 4, "test": 1}
    assert validate_card_metadata(meta, "dataset") == []


def test_dataset_card_reads_well(dataset_folder):
    text = str(render_dataset_card(dataset_folder, "twothsnd/ReTerm-10K"))
    body = text.split("\n---\n", 1)[1]
    for heading in ("# ReTerm-10K (test fixture)", "## Quick start", "## Dataset structure", "### Fields",
                    "### A worked example", "## How it was made", "## Failure categories", "## Decontamination",
                    "## Source tasks and licences", "## Limitations", "## Citation"):  # fmt: skip
        assert f"\n{heading}\n" in body, heading
    # per-category table from stats.json, recovery rate derived (14/24 = 58.3%)
    assert "| missing dependency (`missing_dependency`) | 2 | 40.0% | 3 | 24 | 14 | 58.3% |" in body
    assert "| **records** | **5** |" in body
    assert 'load_dataset("twothsnd/ReTerm-10K", split="train")' in body
    # the worked example: the shortest record (json-pretty), its failing step and where the recovery starts
    assert "task `json-pretty`" in body
    assert "❌ *failing step*" in body and "**recovery starts here** (`train_from_message_index` = 4)" in body
    assert "bash: jq: command not found" in body
    # every column is documented, in FEATURES order
    assert [line.split("`")[1] for line in body.splitlines() if line.startswith("| `") and "` | `" in line][: len(FEATURES)] == list(FEATURES)
    assert set(COLUMN_DOCS) == set(FEATURES)
    assert "terminal-bench@2.0" in body and "13-gram overlap" in body
    assert "@misc{reterm10k2026" in body


def test_dataset_card_refuses_stats_that_disagree_with_the_shards(dataset_folder, tmp_path):
    folder = tmp_path / "ds"
    shutil.copytree(dataset_folder, folder)
    stats = json.loads((folder / "stats.json").read_text())
    # totals still add up, but the per-category counts no longer match the records
    stats["categories"]["missing_dependency"]["records"] = 1
    stats["categories"]["timeout_hang"]["records"] = 1
    (folder / "stats.json").write_text(json.dumps(stats))
    with pytest.raises(ValueError, match="failure_category"):
        render_dataset_card(folder, "twothsnd/ReTerm-10K")
    # a split the shards do not have
    stats = json.loads((dataset_folder / "stats.json").read_text())
    stats["splits"] = {"train": 3, "validation": 1, "test": 1}
    (folder / "stats.json").write_text(json.dumps(stats))
    with pytest.raises(ValueError, match="splits in data/"):
        render_dataset_card(folder, "twothsnd/ReTerm-10K")


def test_stats_errors_name_the_file_and_field(dataset_folder, tmp_path):
    stats = json.loads((dataset_folder / "stats.json").read_text())
    stats["filters"]["kept"] = 6
    del stats["policy"]
    path = tmp_path / "stats.json"
    path.write_text(json.dumps(stats))
    with pytest.raises(ValueError) as err:
        load_stats(path)
    message = str(err.value)
    assert str(path) in message and "filters" in message and "kept (6)" in message and "policy" in message
    assert load_stats(dataset_folder / "stats.json").recovery_rate == pytest.approx(27 / 72)


# ------------------------------------------------------------------------------------ model card
def test_model_card_parses_back_with_model_index(tiny_model, tmp_path):
    card = render_model_card(tiny_model, "reterm/reterm-grpo", RECIPES, RESULTS, datasets=["twothsnd/ReTerm-10K"])
    path = tmp_path / "README.md"
    card.save(path)
    loaded = ModelCard.load(path)
    meta = loaded.data.to_dict()
    assert meta == card.data.to_dict()
    assert meta["base_model"] == "HuggingFaceTB/SmolLM2-135M-Instruct"  # first recipe's model_name_or_path
    assert meta["base_model_relation"] == "finetune"
    assert meta["library_name"] == "transformers" and meta["pipeline_tag"] == "text-generation"
    assert meta["datasets"] == ["twothsnd/ReTerm-10K"]
    assert "sft" in meta["tags"] and "grpo" in meta["tags"]
    results = loaded.data.eval_results
    assert loaded.data.model_name == "reterm-grpo"  # picked by the repo name among three models
    assert [(r.metric_type, r.metric_value) for r in results] == [("pass@1", 34.8), ("pass@2", 40.5), ("pass@3", 43.8)]
    assert results[0].dataset_type == "terminal-bench" and results[0].dataset_config == "2.0"
    assert "± 1.7" in results[0].metric_name and "3 trials/task" in results[0].metric_name
    assert validate_card_metadata(meta, "model") == []


def test_model_card_reads_well_and_redacts_secrets(tiny_model):
    text = str(render_model_card(tiny_model, "reterm/reterm-grpo", RECIPES, RESULTS, datasets=["twothsnd/ReTerm-10K"]))
    body = text.split("\n---\n", 1)[1]
    for heading in ("## Results", "### Recovery per error category", "## Training", "### Stage 1: SFT (`sft.yaml`)",
                    "### Stage 2: GRPO (`grpo.yaml`)", "## How to use", "### Serve with vLLM",
                    "### Evaluate in Harbor (Terminal-Bench)", "## Limitations", "## Citation"):  # fmt: skip
        assert f"\n{heading}\n" in body, heading
    assert "| **reterm-grpo** (this model) | reterm | 34.8 ± 1.7 | +14.6 | 267 | 89 | 0 |" in body
    assert "| missing dependency | 25.0 (30/120) | 40.6 (41/101) | 57.8 (52/90) |" in body
    assert "| group size G | `8` |" in body and "| LoRA r | `16` |" in body
    assert "vllm serve reterm/reterm-grpo --served-model-name reterm-grpo --port 8000" in body
    assert "fixture-secret-value" not in text and "hub_token: <redacted>" in text
    assert "4.4 K parameters" in body  # counted from the safetensors header of the tiny model


def test_model_card_for_a_lora_adapter(tiny_model, tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model),
                           LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"]))  # fmt: skip
    adapter = tmp_path / "adapter"
    model.save_pretrained(adapter)
    (adapter / "training_summary.json").write_text(json.dumps({"method": "SFT (TRL SFTTrainer)", "steps": 3}))
    card = render_model_card(adapter, "reterm/reterm-sft-lora", RECIPES[:1], None,
                             base_model="HuggingFaceTB/SmolLM2-135M-Instruct")  # fmt: skip
    meta = ModelCard(str(card)).data.to_dict()
    assert meta["base_model_relation"] == "adapter" and meta["library_name"] == "peft"
    assert "model-index" not in meta and "lora" in meta["tags"]
    assert "--enable-lora --lora-modules reterm-sft-lora=reterm/reterm-sft-lora" in str(card)
    assert "This checkpoint has not been evaluated yet." in str(card)


def test_model_card_refuses_bad_inputs(tiny_model, tmp_path):
    # a recipe whose model is a local path, and no other source of the base model's Hub id
    with pytest.raises(ValueError, match="--base-model"):
        render_model_card(tiny_model, "reterm/x", RECIPES[1:], None)
    # several models in results.json, none named like the repo
    with pytest.raises(ValueError, match="--eval-name"):
        render_model_card(tiny_model, "reterm/other", RECIPES, RESULTS)
    # Pass@1 written as a percentage instead of a fraction
    bad = json.loads(RESULTS.read_text())
    bad["models"][0]["pass_at_1"]["mean"] = 20.22
    path = tmp_path / "results.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(ValueError, match=r"models\.0\.pass_at_1\.mean: .*fraction"):
        load_results(path)
    # an unknown licence is malformed metadata
    with pytest.raises(ValueError, match='"license" .*not-a-licence'):
        render_model_card(tiny_model, "reterm/reterm-grpo", RECIPES, RESULTS, license="not-a-licence")
    with pytest.raises(ValueError, match="not a checkpoint"):
        render_model_card(tmp_path, "reterm/x", RECIPES, None)


def test_recipe_kinds_and_redaction():
    sft, grpo = (load_recipe(p) for p in RECIPES)
    assert (sft.trainer, grpo.trainer) == ("sft", "grpo")
    assert sft.redacted == ["hub_token"] and sft.params["hub_token"] == "<redacted>"


# ----------------------------------------------------------------------------- metadata checks
def test_metadata_validation_messages():
    assert size_category(999) == "n<1K" and size_category(10_000) == "10K<n<100K"
    errors = validate_card_metadata(
        {"license": "apache2", "size_categories": ["huge"], "base_model": "./ckpt", "base_model_relation": "copy",
         "model-index": [{"name": "x", "results": [{"task": {}}]}], "tags": "ok", "configs": [{"data_files": 3}]},
        "model",
    )  # fmt: skip
    joined = "\n".join(errors)
    for field in ('"license"', '"size_categories"', '"base_model"', '"base_model_relation"', '"model-index"', '"configs[0]"'):
        assert field in joined, field
    assert validate_card_metadata({"title": "x"}, "space") == ['"sdk" must be one of gradio, streamlit, docker, static, got None']
    with pytest.raises(ValueError, match="not valid YAML"):
        check_readme("---\nlicense: [unclosed\n---\nbody", "model")
    assert check_readme("# no metadata", "model") == {}


# ------------------------------------------------------------------- cards true to their folder
REPO = Path(__file__).resolve().parents[1]


def _publish(*args: str) -> tuple[int, str]:
    import contextlib
    import io

    from reterm.publish import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main([str(a) for a in args])
    return code, err.getvalue()


def test_a_folder_written_by_train_sft_publishes_from_its_own_record(tmp_path):
    """train/sft.py's real output (its --check run on the tiny Qwen3.5: RUN/training_summary.json,
    RUN/recipe.yaml, RUN/merged/) publishes without --recipe; the card's base model, method and recipe
    come from the folder."""
    spec = importlib.util.spec_from_file_location("reterm_train_sft_cards", REPO / "train" / "sft.py")
    sft = importlib.util.module_from_spec(spec)
    import sys

    sys.modules[spec.name] = sft
    spec.loader.exec_module(sft)
    recipe = REPO / "train" / "recipes" / "smollm2-135m" / "sft.yaml"
    assert sft.main(["--config", str(recipe), "--check", "--output_dir", str(tmp_path / "run")]) == 0
    merged = tmp_path / "run-check" / "merged"
    # the check run's base is the tiny random Qwen3.5, which has no Hub id: the error lists what was read
    code, err = _publish("model", "--folder", merged, "--repo-id", "org/x", "--dry-run", "--stage-dir", tmp_path / "s0")
    assert code == 1 and "training_summary.json base_model_hub_id = 'tiny-qwen3.5'" in err and "--base-model" in err
    stage = tmp_path / "stage"
    code, err = _publish("model", "--folder", merged, "--repo-id", "org/x", "--base-model", "Qwen/Qwen3.5-9B",
                         "--dry-run", "--stage-dir", stage)  # fmt: skip
    assert code == 0, err
    card = ModelCard.load(stage / "README.md")
    assert card.data.base_model == "Qwen/Qwen3.5-9B" and "sft" in card.data.tags
    assert (stage / "recipes" / "1-sft-recipe.yaml").read_text() == recipe.read_text()
    assert json.loads((stage / "training_summary.json").read_text())["steps"] >= 1


def _sft_run(tmp_path: Path, tiny_model: Path, summary: dict) -> Path:
    run = tmp_path / "sft"
    shutil.copytree(tiny_model, run / "merged")
    (run / "merged" / "training_summary.json").unlink()
    shutil.copyfile(REPO / "train" / "recipes" / "smollm2-135m" / "sft.yaml", run / "recipe.yaml")
    (run / "training_summary.json").write_text(json.dumps(summary))
    return run / "merged"


SFT_SUMMARY = {"base_model": "smollm2", "base_model_hub_id": "HuggingFaceTB/SmolLM2-135M-Instruct",
               "method": "SFT (TRL SFTTrainer)", "steps": 5}  # fmt: skip


def test_cards_refuse_what_their_folder_contradicts(tiny_model, tmp_path):
    untrained = tmp_path / "untrained"
    shutil.copytree(tiny_model, untrained)
    (untrained / "training_summary.json").unlink()
    sft_recipe = REPO / "train" / "recipes" / "smollm2-135m" / "sft.yaml"
    with pytest.raises(ValueError, match=r"no training_summary.json .*trained with SFT"):
        render_model_card(untrained, "org/x", [sft_recipe], base_model="HuggingFaceTB/SmolLM2-135M-Instruct")
    code, err = _publish("model", "--folder", untrained, "--repo-id", "org/x", "--recipe", sft_recipe, "--dry-run",
                         "--stage-dir", tmp_path / "s")  # fmt: skip
    assert code == 1 and "nothing shows these weights were trained" in err
    zero = _sft_run(tmp_path / "zero", tiny_model, {**SFT_SUMMARY, "steps": 0})
    with pytest.raises(ValueError, match="'steps' is 0"):
        render_model_card(zero, "org/x")
    sft = _sft_run(tmp_path / "ok", tiny_model, SFT_SUMMARY)
    with pytest.raises(ValueError, match=r"GRPO recipe, but .*records 'SFT \(TRL SFTTrainer\)'"):
        render_model_card(sft, "org/x", RECIPES)  # the last recipe claims GRPO


def test_an_sft_run_publishes_without_base_model_and_a_staged_folder_publishes_as_it_is(tiny_model, tmp_path):
    merged = _sft_run(tmp_path, tiny_model, SFT_SUMMARY)
    first = tmp_path / "cards" / "model"
    code, err = _publish("model", "--folder", merged, "--repo-id", "org/ReTerm-tiny", "--results", RESULTS,
                         "--eval-name", "reterm-sft", "--dry-run", "--stage-dir", first)  # fmt: skip
    assert code == 0, err
    card = ModelCard.load(first / "README.md")
    assert card.data.base_model == "HuggingFaceTB/SmolLM2-135M-Instruct"  # from training_summary.json
    assert "trained with SFT" in card.text and "grpo" not in card.data.tags
    assert json.loads((first / "training_summary.json").read_text())["eval_name"] == "reterm-sft"
    # the staged folder (what train/run_all.sh leaves under cards/) publishes again as it is
    again = tmp_path / "again"
    code, err = _publish("model", "--folder", first, "--repo-id", "org/ReTerm-tiny", "--dry-run", "--stage-dir", again)
    assert code == 0, err
    files = sorted(p.relative_to(first).as_posix() for p in first.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(again).as_posix() for p in again.rglob("*") if p.is_file())
    assert (again / "README.md").read_text() == (first / "README.md").read_text()
    assert (first / "recipes" / "1-sft-recipe.yaml").read_text() == (merged.parent / "recipe.yaml").read_text()


def test_staged_dataset_and_space_folders_publish_as_they_are(dataset_folder, tmp_path):
    for kind, folder, repo in (("dataset", dataset_folder, "org/ReTerm-10K"), ("space", REPO / "space", "org/demo")):
        first, again = tmp_path / kind / "first", tmp_path / kind / "again"
        code, err = _publish(kind, "--folder", folder, "--repo-id", repo, "--dry-run", "--stage-dir", first)
        assert code == 0, err
        code, err = _publish(kind, "--folder", first, "--repo-id", repo, "--dry-run", "--stage-dir", again)
        assert code == 0, err
        files = sorted(p.relative_to(first).as_posix() for p in first.rglob("*") if p.is_file())
        assert files == sorted(p.relative_to(again).as_posix() for p in again.rglob("*") if p.is_file()), kind
        assert (again / "README.md").read_text() == (first / "README.md").read_text(), kind
