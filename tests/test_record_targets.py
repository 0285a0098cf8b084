"""No training target of the drills dataset contains a turn the record marks as its mistake.

Records come from a real (small) ``reterm.data.drills.build`` run in the local sandbox; each is tokenized
through the dataset card's own recipe, which is what ``train/sft.py`` runs: conversational prompt/completion
rows (:func:`reterm.training.sft_data.to_sft_dataset`) through TRL's ``SFTTrainer`` with
``assistant_only_loss=True`` and ``completion_only_loss=True`` (the recipes' settings). Every labelled token
must lie after the end of the last mistake turn's observation.
"""

from __future__ import annotations

import json

import pytest

from reterm.records import NO_FAILURE_STEP, mistake_message_indices, trains_on_mistake


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    from reterm.data.drills import build
    from reterm.drills import generate_drills
    from reterm.drills.multistage import add_train_instances
    from reterm.training.sft_data import load_records

    root = tmp_path_factory.mktemp("targets")
    generate_drills(root / "drills", 0, 2, families=["mkdir-parent", "exec-bit"], ood_families=[])
    add_train_instances(root / "drills", 3)  # one two-stage drill of each scripted kind (MULTISTAGE_KINDS)
    build(root / "drills", root / "data", policies=[], max_turns=2, batch=4, held_out=0.0)
    from datasets import concatenate_datasets

    # every record: with held_out 0 the build still moves one record to `test`
    return concatenate_datasets([load_records(str(root / "data"), split) for split in ("train", "test")])


def test_mistake_turns_are_marked_and_never_trained(records):
    kinds = {r["target_attempt_index"] for r in records}
    assert kinds == {1, 2}
    for r in records:
        mistakes = mistake_message_indices(r)
        if r["failure_step"] == NO_FAILURE_STEP:  # a whole reference solution: nothing to mask
            assert mistakes == [] and r["failure_category"] == "none"
            continue
        assert mistakes and all(r["messages"][i]["role"] == "assistant" for i in mistakes)
        if r["target_attempt_index"] == 1:  # the marked mistake is the drill's first mistake, typed at step 0
            call = json.loads(r["messages"][mistakes[0]]["tool_calls"][0]["function"]["arguments"])
            assert call["command"] == r["failure_command"]
        assert not trains_on_mistake(r), r["id"]


def test_a_record_training_from_its_mistake_is_detected(records):
    """The check itself can fail: the former layout (step-level records trained from the mistake) is caught."""
    r = next(r for r in records if r["target_attempt_index"] == 1 and r["failure_step"] == 0)
    assert trains_on_mistake({**r, "train_from_message_index": 2})


@pytest.mark.parametrize("model", ["tiny-qwen3.5", "smollm2"])
def test_the_card_recipe_masks_every_mistake_turn(model, records, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    from reterm.training.likelihood import training_chat_template
    from reterm.training.models import resolve_model_name_or_path
    from reterm.training.sft_data import to_sft_dataset

    folder = resolve_model_name_or_path(model)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    sft = to_sft_dataset(records, {"enable_thinking": False})
    args = SFTConfig(output_dir=str(tmp_path / "out"), assistant_only_loss=True, completion_only_loss=True,
                     max_length=None, bf16=False, use_cpu=True, report_to=[], dataset_num_proc=None,
                     gradient_checkpointing=False)  # fmt: skip
    trainer = SFTTrainer(model=AutoModelForCausalLM.from_pretrained(folder), args=args, train_dataset=sft,
                         processing_class=tokenizer)  # fmt: skip
    template = training_chat_template(tokenizer)
    checked = 0
    for rec, row, ex in zip(records, sft, trainer.train_dataset):
        assert rec["id"] == row["id"]
        messages = row["prompt"] + row["completion"]
        # the context: up to the last mistake turn, or the whole prompt of a record without a mistake
        end = max(mistake_message_indices(rec), default=rec["train_from_message_index"] - 1) + 1
        while end < len(messages) and messages[end]["role"] != "assistant":
            end += 1  # the mistake's observation (and the feedback message) is context too
        context = tokenizer.apply_chat_template(messages[:end], tools=json.loads(row["tools"]), tokenize=True,
                                                chat_template=template, enable_thinking=False,
                                                return_dict=False)  # fmt: skip
        assert ex["input_ids"][: len(context)] == list(context), rec["id"]  # the context renders as a prefix
        labelled = [i for i, lab in enumerate(ex["labels"]) if lab != -100]
        assert labelled and min(labelled) >= len(context), rec["id"]
        checked += 1
    assert checked == len(records)


def test_two_stage_records_of_every_kind(records):
    """The two-stage train drills give a whole reference solution each (trained from the first assistant turn, no
    mistake, the task start as its state) and one scripted failed attempt each, recovered after the feedback:
    part 1 done then submit (premature completion), part 2's mistake, part 1's mistake."""
    from reterm.data.drills import MULTISTAGE_KINDS
    from reterm.records import NO_FAILURE_STEP

    multi = [r for r in records if r["task_id"].startswith("multi-")]
    whole = [r for r in multi if r["failure_step"] == NO_FAILURE_STEP]
    assert len(whole) == 3
    for r in whole:
        roles = [m["role"] for m in r["messages"]]
        assert r["train_from_message_index"] == roles.index("assistant") == 2 and r["target_attempt_index"] == 1
        assert r["failure_category"] == "none" and r["failure_source"] == "task_start" and not trains_on_mistake(r)
    kinds = {r["injection"]: r for r in multi if r["failure_step"] != NO_FAILURE_STEP and r["target_attempt_index"] == 2}
    assert set(kinds) == set(MULTISTAGE_KINDS)
    assert kinds["part1_submit"]["failure_category"] == "premature_completion"
    for r in kinds.values():
        assert r["verifier_reward"] == 1.0 and not trains_on_mistake(r)
        feedback = r["messages"][r["train_from_message_index"] - 1]
        assert feedback["role"] == "tool" and "did not pass" in feedback["content"]


def test_two_stage_step_level_records_fix_the_part_before_submitting(records):
    """``part2_mistake`` and ``part1_mistake`` instances also give a step-level record: part 1 done (for part 2's
    mistake), the mistake and its error as context, then the recovery trained in the same attempt, no feedback."""
    from reterm.data.drills import IN_ATTEMPT_KINDS
    step_level = {r["injection"]: r for r in records
                  if r["task_id"].startswith("multi-") and r["target_attempt_index"] == 1 and r["failure_step"] >= 0}
    assert set(step_level) == set(IN_ATTEMPT_KINDS)
    for kind, r in step_level.items():
        assert r["verifier_reward"] == 1.0 and not trains_on_mistake(r)
        assert all("did not pass" not in (m["content"] or "") for m in r["messages"] if m["role"] == "tool")
        mistakes = mistake_message_indices(r)
        assert max(mistakes) < r["train_from_message_index"]  # the mistake is context
        call = json.loads(r["messages"][mistakes[-1]]["tool_calls"][0]["function"]["arguments"])
        assert call["command"] == r["failure_command"]
        assert r["messages"][r["train_from_message_index"]]["role"] == "assistant"
    part2 = step_level["part2_mistake"]
    assert part2["failure_step"] >= 1  # part 1's solution came first: that progress is in the state
    assert step_level["part1_mistake"]["failure_step"] == 0 and all(r["failure_output"] for r in step_level.values())


def test_reference_solutions_and_injected_mistakes_take_different_instances(tmp_path):
    """The reference solutions take the last N train instances of each family, the injected mistakes the first:
    disjoint while a family has enough (issue 30: an SFT start trained on few instances repeated their strings)."""
    from reterm.data.drills import _family, per_family, read_splits
    from reterm.drills import generate_drills

    generate_drills(tmp_path, 0, 8, families=["mkdir-parent", "exec-bit"], ood_families=[])
    train = [tmp_path / n for n in read_splits(tmp_path)["train"]]
    per = {f: [d for d in train if _family(d) == f] for f in ("mkdir-parent", "exec-bit")}
    assert all(len(v) >= 4 for v in per.values()), {f: len(v) for f, v in per.items()}
    n = min(len(v) for v in per.values()) // 2
    first, last = per_family(train, n), per_family(train, n, from_end=True)
    for f, dirs in per.items():
        assert [d for d in first if _family(d) == f] == dirs[:n]
        assert [d for d in last if _family(d) == f] == dirs[-n:]
    assert not set(first) & set(last)
    assert last == [d for d in train if d in set(last)]  # in the list's order
    assert per_family(train, None, from_end=True) == train
