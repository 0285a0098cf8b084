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
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PUBLISH = Path(__file__).parent / "fixtures" / "publish"
CELL = re.compile(r"^(-?\d+\.\d+) \[(-?\d+\.\d+), (-?\d+\.\d+)\] \(n=(\d+)\)$")
DIFF = re.compile(r"^- (.+ - .+), (\S+): ([+-]\d+\.\d+) \[([+-]\d+\.\d+), ([+-]\d+\.\d+)\] "
                  r"\(n=(\d+)(?:; smallest difference detectable with 80% power: ([-\d.]+))?\): (.+)$")


def _table(text: str, header_start: str) -> dict[str, list[str]]:
    """Rows (first cell -> other cells) of the markdown table whose header line starts with ``header_start``."""
    lines = text.splitlines()
    (start,) = [i for i, ln in enumerate(lines) if ln.startswith(header_start)]
    rows = {}
    for ln in lines[start + 2 :]:
        if not ln.startswith("|"):
            break
        cells = [c.strip() for c in ln.strip().strip("|").split("|")]
        rows[cells[0]] = cells[1:]
    return rows


def _same_rate(cell: str, r: dict | None, digits: int) -> None:
    """``cell`` ("v [lo, hi] (n=N)", or the no-value marker) shows the rate ``r`` at ``digits`` decimals."""
    if not r or r.get("value") is None:
        assert cell in ("n/a", "-"), (cell, r)
        return
    m = CELL.match(cell)
    assert m, f"not a rate cell: {cell!r}"
    tol = 0.5 * 10**-digits + 1e-9
    assert float(m[1]) == pytest.approx(r["value"], abs=tol), (cell, r)
    assert float(m[2]) == pytest.approx(r["ci95"][0], abs=tol) and float(m[3]) == pytest.approx(r["ci95"][1], abs=tol)
    assert int(m[4]) == r["n"], (cell, r)


def _diff_lines(text: str) -> dict[tuple[str, str], tuple]:
    out = {}
    for ln in text.splitlines():
        m = DIFF.match(ln)
        if m:
            out[(m[1], m[2])] = (float(m[3]), float(m[4]), float(m[5]), int(m[6]), m[8], m[7])
    return out


def _check_diffs(text: str, results: dict) -> None:
    shown = _diff_lines(text)
    expected = {(pair, key): d for pair, per in results["differences"].items() for key, d in per.items()
                if d.get("diff") is not None}  # fmt: skip
    assert set(shown) == set(expected) and expected
    for k, d in expected.items():
        diff, lo, hi, n, verdict, mde = shown[k]
        if mde is not None:  # the run summary states each comparison's power
            want = d.get("min_detectable_80")
            assert (mde == "-" and want is None) or float(mde) == pytest.approx(want, abs=5e-4), k
        assert (diff, lo, hi) == pytest.approx((d["diff"], d["ci95"][0], d["ci95"][1]), abs=5e-4 + 1e-9), k
        assert n == d["n"], k
        assert ("no difference" in verdict or "includes 0" in verdict) == (not d["excludes_zero"]), (k, verdict)


@pytest.fixture(scope="module")
def evaluation(tmp_path_factory):
    """RUN/eval/results.json of a real drills evaluation (three scripted models), and the drills folder."""
    import reterm.policies
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
    real = reterm.policies.load_policy
    reterm.policies.load_policy = lambda spec, **kw: policies[spec]()
    try:
        rc = eval_drills.main(["--tasks", str(tasks), "--model", "base=nothing", "--model", "sft=half",
                               "--model", "grpo-reterm=oracle", "--output", str(root / "run" / "eval"),
                               "--max-turns", "8", "--batch", "8", "--max-ood", "4", "--own-items", "3",
                               "--k-max", "2"])  # fmt: skip
    finally:
        reterm.policies.load_policy = real
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
    assert "This model is `sft`" in text
    rows = _table(text, "| model | Pass@1 ID |")
    assert list(rows) == list(models)
    columns = [("pass_at_1", "drills_id"), ("pass_at_1", "drills_ood"), ("recovery_at_1", "drills_id"),
               ("recovery_at_1", "drills_ood"), ("valid_tool_call_rate", None), ("recovery_own", "recovery_at_1"),
               ("recovery_own", "fatal_attempt_rate")]  # fmt: skip
    for name, m in models.items():
        assert len(rows[name]) == len(columns), rows[name]
        for cell, (key, sub) in zip(rows[name], columns):
            _same_rate(cell, m[key] if sub is None else m[key].get(sub), 3)
    _check_diffs(text, results)

    # --- summary.md of the run
    sys.path.insert(0, str(REPO / "train"))
    try:
        import run_summary
    finally:
        sys.path.remove(str(REPO / "train"))
    md, data = run_summary.build_drills_summary(run, [])
    rows = _table(md, "| model | Pass@1 ID |")
    assert list(rows) == list(run_summary.DRILL_MODELS.values())
    for name, label in run_summary.DRILL_MODELS.items():
        m = models.get(name)
        cells = rows[label]
        if m is None:
            assert set(cells[:5]) == {"-"}, (label, cells)  # not evaluated: nothing shown
            continue
        for cell, (key, sub) in zip(cells[:5], columns[:5]):
            _same_rate(cell, m[key] if sub is None else m[key][sub], 2)
        assert data["models"][name]["pass_at_1"] == m["pass_at_1"]
    _check_diffs(md, results)
