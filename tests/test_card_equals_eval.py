"""The model card and the run's summary.md say what the drills evaluation measured (issue 22, item 4).

A real ``results.json`` is made by ``reterm.eval.drills``' own command line (``main``) on generated drills in the
local sandbox, with three scripted policies put behind ``load_policy``: one that never makes a tool call
(``base``), one that replays the reference solution on half of the instances and answers in prose on the rest
(``sft``: rates strictly between 0 and 1) and the reference solution everywhere (``grpo-reterm``). The model
card (``reterm.cards.model.render_model_card``) and ``summary.md`` (``train/run_summary.build_drills_summary``)
are rendered from that file; their tables are parsed back and every rate, interval bound, n and paired
difference is compared with ``results.json``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from card_checks import DRILL_COLUMNS, assert_model_card_matches, check_diffs, same_rate, table

REPO = Path(__file__).resolve().parents[1]
PUBLISH = Path(__file__).parent / "fixtures" / "publish"


@pytest.fixture(scope="module")
def evaluation(tmp_path_factory):
    """RUN/eval/results.json of a real drills evaluation (three scripted models), and the drills folder."""
    from reterm.agent.episode import load_task
    from reterm.data.drills import read_splits
    from reterm.drills import generate_drills
    from reterm.eval import drills as eval_drills
    from reterm.policies.scripted import OraclePolicy, ScriptedPolicy, _first_user_text

    root = tmp_path_factory.mktemp("card_eval")
    tasks = root / "drills"
    generate_drills(tasks, 0, 8, families=["mkdir-parent", "exec-bit", "off-by-one", "wc-number"],
                    ood_families=["off-by-one", "wc-number"])  # fmt: skip
    splits = read_splits(tasks)
    dirs = sorted(tasks / n for n in splits["test"] + splits["test_ood"])
    oracle = OraclePolicy(dirs)
    solved = [load_task(d).instruction.strip() for d in dirs[::2]]  # half of the items, both splits

    def half(messages):
        text = _first_user_text(messages)
        return oracle.reply(messages) if any(i in text for i in solved) else "I would look at the files first."

    policies = {"nothing": lambda: ScriptedPolicy(lambda m: "I am not sure what to do.", name="nothing"),
                "half": lambda: ScriptedPolicy(half, name="half"), "oracle": lambda: oracle}  # fmt: skip
    real = eval_drills.load_policy  # the evaluation's own reference (imported at its top)
    eval_drills.load_policy = lambda spec, **kw: policies[spec]()
    try:
        rc = eval_drills.main(["--tasks", str(tasks), "--model", "base=nothing", "--model", "sft=half",
                               "--model", "grpo-reterm=oracle", "--output", str(root / "run" / "eval"),
                               "--max-turns", "8", "--batch", "8", "--max-ood", "4", "--own-items", "3",
                               "--k-max", "2"])  # fmt: skip
    finally:
        eval_drills.load_policy = real
    assert rc == 0
    return root / "run", json.loads((root / "run" / "eval" / "results.json").read_text())


@pytest.mark.slow
def test_model_card_and_summary_show_the_evaluation(evaluation, tmp_path):
    from reterm.cards.model import render_model_card

    run, results = evaluation
    models = results["models"]
    # the evaluation itself is not degenerate: the half policy sits strictly between the two others
    sft = models["sft"]
    assert 0 < sft["pass_at_1"]["drills_id"]["value"] < 1 and 0 < sft["valid_tool_call_rate"]["value"] < 1
    assert models["base"]["valid_tool_call_rate"]["value"] == 0.0
    assert models["grpo-reterm"]["pass_at_1"]["drills_id"]["value"] == 1.0
    assert sft["pass_at_1"]["drills_id"]["n"] + sft["infra_faults"]["drills_id"] == results["items"]["drills_id"] > 0

    # --- the model card
    ckpt = tmp_path / "ckpt"
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                 num_attention_heads=2, num_key_value_heads=1)).save_pretrained(ckpt)  # fmt: skip
    (ckpt / "training_summary.json").write_text(json.dumps({"method": "ReTerm-GRPO (TRL GRPOTrainer subclass)", "steps": 4}))
    card = render_model_card(ckpt, "reterm/reterm-sft", [PUBLISH / "recipes" / "sft.yaml", PUBLISH / "recipes" / "grpo.yaml"],
                             run / "eval" / "results.json", eval_name="sft")  # fmt: skip
    path = tmp_path / "README.md"
    card.save(path)
    text = path.read_text()
    assert_model_card_matches(text, results, "sft")

    # --- summary.md of the run
    sys.path.insert(0, str(REPO / "train"))
    try:
        import run_summary
    finally:
        sys.path.remove(str(REPO / "train"))
    md, data = run_summary.build_drills_summary(run, [])
    rows = table(md, "| model | Pass@1 ID |")
    assert list(rows) == list(run_summary.DRILL_MODELS.values())
    for name, label in run_summary.DRILL_MODELS.items():
        m = models.get(name)
        cells = rows[label]
        if m is None:
            assert set(cells[:5]) == {"-"}, (label, cells)  # not evaluated: nothing shown
            continue
        for cell, (key, sub) in zip(cells[:5], DRILL_COLUMNS[:5]):
            same_rate(cell, m[key] if sub is None else m[key][sub], 2)
        assert data["models"][name]["pass_at_1"] == m["pass_at_1"]
    check_diffs(md, results)
