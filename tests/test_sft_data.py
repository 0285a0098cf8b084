"""SFT data: records split at the failure state, and the loss mask TRL actually trains with.

The mask tests build a real TRL ``SFTTrainer`` on the hand-made fixture (tests/fixtures/reterm10k_mini)
for the embedded SmolLM2 (ReTerm's ChatML tool template) and the tiny Qwen3.5 (TRL's Qwen3.5 training
template), decode the labelled tokens and compare them with the expected recovery text, end-of-turn
token included.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from datasets import load_dataset

from reterm.agent.protocol import TOOLS
from reterm.training.likelihood import tokenize_for_loss, training_chat_template
from reterm.training.sft_data import load_records, record_to_prompt_completion, to_sft_dataset

FIXTURE = Path(__file__).parent / "fixtures" / "reterm10k_mini"
PERMISSION_TASK = "run-script"  # its variant-0 record is the one whose mask is spelled out below
CHMOD = "chmod +x /app/deploy.sh && /app/deploy.sh > /app/deploy.log 2>&1; cat /app/deploy.log"
REASON = "The script is not executable. I'll add the execute bit and run it again."

EXPECTED_SPANS = {
    # ReTerm's ChatML template: Hermes JSON calls; the mask ends with <|im_end|> (no newline).
    "smollm2": [
        REASON + '\n<tool_call>\n{"name": "bash", "arguments": {"command": "' + CHMOD + '"}}\n</tool_call><|im_end|>',
        '<tool_call>\n{"name": "submit", "arguments": {}}\n</tool_call><|im_end|>',
    ],
    # TRL's qwen3_5_think_training.jinja with enable_thinking=False: the first recovery turn starts after the
    # generation prompt's empty think block (the model never writes it); later turns include it.
    "tiny-qwen3.5": [
        REASON + "\n\n<tool_call>\n<function=bash>\n<parameter=command>\n" + CHMOD
        + "\n</parameter>\n</function>\n</tool_call><|im_end|>\n",
        "<think>\n\n</think>\n\n<tool_call>\n<function=submit>\n</function>\n</tool_call><|im_end|>\n",
    ],
}


def _spans(tokenizer, input_ids, labels) -> list[str]:
    """Decoded runs of consecutive labelled tokens."""
    spans, run = [], []
    for tok, lab in zip(input_ids, labels):
        if lab != -100:
            run.append(tok)
        elif run:
            spans.append(tokenizer.decode(run))
            run = []
    if run:
        spans.append(tokenizer.decode(run))
    return spans


@pytest.fixture(scope="module")
def records():
    return load_records(str(FIXTURE), "train")


def test_fixture_layout_and_split_at_failure_state(records):
    ds = load_dataset(str(FIXTURE))
    assert set(ds) == {"train", "test"} and len(ds["train"]) == 16 and len(ds["test"]) == 8
    assert not set(ds["train"]["id"]) & set(ds["test"]["id"])
    for rec in records:
        row = record_to_prompt_completion(rec)
        assert [m["role"] for m in row["prompt"][:2]] == ["system", "user"]
        # the prompt ends on the failing step's observation, which is the record's failure_output
        assert row["prompt"][-1]["role"] == "tool" and row["prompt"][-1]["content"] == rec["failure_output"]
        assert row["completion"][0]["role"] == "assistant"
        assert row["completion"][-1]["tool_calls"][0]["function"]["name"] == "submit"
        assert len(row["prompt"]) + len(row["completion"]) == len(rec["messages"])
        assert [t["function"]["name"] for t in json.loads(row["tools"])] == [t["function"]["name"] for t in TOOLS]


def test_json_feature_keeps_tool_arguments_exact(records):
    sft = to_sft_dataset(records, {"enable_thinking": False})
    row = sft[0]
    calls = [c["function"] for m in row["completion"] for c in m.get("tool_calls", [])]
    # a struct column would have merged the keys and given submit {"command": None}
    assert calls[-1] == {"name": "submit", "arguments": {}}
    assert set(calls[0]["arguments"]) == {"command"}
    assert row["chat_template_kwargs"] == {"enable_thinking": False}


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("train_from_message_index", 3, "points at a 'tool' message"),
        ("train_from_message_index", 99, "outside"),
        ("train_from_message_index", 0, "outside"),
        ("tools", "{not json", "'tools' is not valid JSON"),
    ],
)
def test_bad_records_are_named(records, field, value, message):
    rec = dict(records[0])
    rec[field] = value
    with pytest.raises(ValueError, match=message) as err:
        record_to_prompt_completion(rec)
    assert rec["id"] in str(err.value)


def test_missing_split_and_columns_are_named(tmp_path, records):
    with pytest.raises(ValueError, match="no split 'validation'"):
        load_records(str(FIXTURE), "validation")
    bad = tmp_path / "bad"
    records.remove_columns(["train_from_message_index"]).to_parquet(str(bad / "data" / "train-00000-of-00001.parquet"))
    with pytest.raises(ValueError, match=r"missing column\(s\) \['train_from_message_index'\]"):
        load_records(str(bad), "train")


def _trainer(model_dir: str, train_ds, tmp_path, **config):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    args = SFTConfig(
        output_dir=str(tmp_path / "out"), assistant_only_loss=True, max_length=None, bf16=False, use_cpu=True,
        report_to=[], dataset_num_proc=None, gradient_checkpointing=False, **config,
    )
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    return SFTTrainer(model=model, args=args, train_dataset=train_ds, processing_class=tokenizer), tokenizer


@pytest.fixture(scope="module")
def model_dirs():
    from reterm.training.models import resolve_model_name_or_path

    return {name: resolve_model_name_or_path(name) for name in ("smollm2", "tiny-qwen3.5")}


@pytest.mark.parametrize("model", [pytest.param("smollm2", marks=pytest.mark.slow), "tiny-qwen3.5"])  # smollm2: ~32 s
def test_mask_is_exactly_the_recovery_assistant_turns(model, model_dirs, records, tmp_path):
    sft = to_sft_dataset(records, {"enable_thinking": False})
    trainer, tokenizer = _trainer(model_dirs[model], sft, tmp_path)
    prepared = trainer.train_dataset
    index = next(i for i, r in enumerate(sft) if r["task_id"] == PERMISSION_TASK)
    ex = prepared[index]
    assert _spans(tokenizer, ex["input_ids"], ex["labels"]) == EXPECTED_SPANS[model]

    template = training_chat_template(tokenizer)
    for row, ex in zip(sft, prepared):
        spans = _spans(tokenizer, ex["input_ids"], ex["labels"])
        recovery_turns = [m for m in row["completion"] if m["role"] == "assistant"]
        assert len(spans) == len(recovery_turns)
        assert all(s.endswith(("<|im_end|>", "<|im_end|>\n")) for s in spans)
        assert not any("[exit status:" in s or "<tool_response>" in s for s in spans)  # observations: no loss
        # our scorer (held-out likelihood) tokenises exactly as the trainer does
        ids, labels = tokenize_for_loss(
            tokenizer, row["prompt"], row["completion"], json.loads(row["tools"]), template, row["chat_template_kwargs"]
        )
        assert ids == ex["input_ids"] and labels == ex["labels"]


def test_all_assistant_turns_switch(model_dirs, records, tmp_path):
    """``completion_only_loss: false`` trains every assistant turn, the failing prefix's included."""
    sft = to_sft_dataset(records.select(range(4)), {"enable_thinking": False})
    trainer, tokenizer = _trainer(model_dirs["smollm2"], sft, tmp_path, completion_only_loss=False)
    for row, ex in zip(sft, trainer.train_dataset):
        spans = _spans(tokenizer, ex["input_ids"], ex["labels"])
        turns = [m for m in row["prompt"] + row["completion"] if m["role"] == "assistant"]
        assert len(spans) == len(turns) > len([m for m in row["completion"] if m["role"] == "assistant"])
        ids, labels = tokenize_for_loss(
            tokenizer, row["prompt"], row["completion"], json.loads(row["tools"]), None, None, completion_only=False
        )
        assert labels == ex["labels"]


def test_dataset_name_may_be_a_hub_id(tmp_path, monkeypatch):
    """The same loader reads a Hub dataset (the kit's local Hub-compatible test server)."""
    import datasets
    import huggingface_hub
    from huggingface_hub import HfApi

    from hub_server import HubServer, patched_hub_endpoint

    token = "hf_" + "SftFixtureTokenAbcdefghijklmnopq12"
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "ds-cache")
    with HubServer(tmp_path / "hub", tokens={token: "alice"}) as hub, patched_hub_endpoint(hub.url):
        api = HfApi(token=token)
        api.create_repo("alice/reterm10k-mini", repo_type="dataset")
        api.upload_folder(folder_path=str(FIXTURE / "data"), path_in_repo="data", repo_id="alice/reterm10k-mini",
                          repo_type="dataset")
        monkeypatch.setenv("HF_TOKEN", token)
        held_out = load_records("alice/reterm10k-mini", "test")
        assert any(q["route"] == "resolve" for q in hub.requests)  # read through the Hub API
    local = load_records(str(FIXTURE), "test")
    assert held_out["id"] == local["id"] and len(held_out) == 8
