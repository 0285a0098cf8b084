"""The data stage's own attempts on two-stage drills (``--own-multistage``): the real SmolLM2 attempts them with
the harness's caps and at least ``OWN_MULTISTAGE_TURNS`` turns; its failed attempts become ``own`` records on
``multi-*`` tasks (the seed states ReTerm-GRPO forks from when the recipes train on ``multi-*``)."""

from __future__ import annotations

import json

import pytest

from reterm.data.drills import OWN_MULTISTAGE_TURNS, build
from reterm.drills import generate_drills
from reterm.drills.multistage import add_train_instances
from reterm.generation import MAX_TURN_TOKENS


@pytest.mark.slow
def test_own_attempts_on_two_stage_drills_become_own_records(tmp_path):
    generate_drills(tmp_path / "drills", 0, 2, families=["mkdir-parent", "exec-bit"], ood_families=[])
    add_train_instances(tmp_path / "drills", 2)
    stats = build(tmp_path / "drills", tmp_path / "data", policies=["smollm2"], max_turns=2, batch=4, held_out=0.0,
                  own_tasks=0, own_multistage=2)  # fmt: skip
    journal = [json.loads(line) for line in (tmp_path / "data" / ".drills" / "journal.jsonl").read_text().splitlines()]
    own = [e for e in journal if e["key"] == "own-multi:smollm2"]
    assert [t for e in own for t in e["tasks"]] == ["multi-10000", "multi-10001"]
    assert not [e for e in journal if e["key"] == "own:smollm2" and e["tasks"]]  # own_tasks=0: no single-stage ones
    assert sum(e["outcomes"].get("failure", 0) for e in own) == 2  # the base model fails both two-part tasks
    assert stats["config"]["episodes_by_policy"]["smollm2"] == 2
    own_records = [r for split in ("train", "test") for r in _rows(tmp_path / "data", split)
                   if r["failure_source"] == "own"]  # fmt: skip
    assert own_records and all(r["task_id"].startswith("multi-") and r["target_attempt_index"] == 2 for r in own_records)
    assert MAX_TURN_TOKENS >= 96 and OWN_MULTISTAGE_TURNS >= 4


def _rows(folder, split):
    from reterm.training.sft_data import load_records

    try:
        return list(load_records(str(folder), split))
    except ValueError:  # a split with no record is not written
        return []
