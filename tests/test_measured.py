"""``train/measured.py``: docs/RESULTS.md's Measured section written from a run's ``summary.json``.

The summary is made by the real summary code (``train/run_summary.summary``) from stage records whose commands
are the ones today's ``bash train/run_all.sh --dry-run --size ci`` composes (one of them changed, one watched
recipe with another digest), and an evaluation ``results.json``; the section must show every figure with its n
and interval, the commit and machine, and exactly the settings that differ from today's code.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "train"))

import measured  # noqa: E402  (train/measured.py)

import run_summary  # noqa: E402
from run_records import git_commit, marker_path, write_json_atomic  # noqa: E402

GRPO_RECIPE = "train/recipes/smollm2-135m/grpo.yaml"


def _r(value: float, lo: float, hi: float, n: int) -> dict:
    return {"value": value, "ci95": [lo, hi], "n": n}


RESULTS = {
    "models": {
        "base": {"pass_at_1": {"drills_id": _r(0.0, 0.0, 0.11, 32), "drills_ood": _r(0.0, 0.0, 0.24, 12)},
                 "recovery_at_1": {"drills_id": _r(0.05, 0.01, 0.24, 20), "drills_ood": _r(0.0, 0.0, 0.24, 12)},
                 "valid_tool_call_rate": _r(0.0, 0.0, 0.04, 88)},
        "sft": {"pass_at_1": {"drills_id": _r(0.156, 0.069, 0.318, 32), "drills_ood": _r(0.083, 0.015, 0.354, 12)},
                "recovery_at_1": {"drills_id": _r(0.2, 0.081, 0.416, 20), "drills_ood": _r(0.0, 0.0, 0.243, 12)},
                "valid_tool_call_rate": _r(0.848, 0.777, 0.9, 132)},
    },
    "differences": {"sft - base": {"pass_at_1/drills_id": {"diff": 0.156, "ci95": [0.031, 0.281], "n": 32,
                                                           "excludes_zero": True, "min_detectable_80": 0.125}}},
}  # fmt: skip


def _run(tmp_path: Path, changed: bool) -> tuple[Path, dict[str, list[str]]]:
    run = tmp_path / "runs" / "smollm2-135m-ci"  # a *-ci folder: the size is read from its name
    today = measured.todays_commands(str(run), "ci", "smollm2-135m")
    assert {"setup", "drills", "data", "sft", "mine", "grpo", "eval", "cards"} <= set(today)
    git = git_commit()
    for i, (stage, cmd) in enumerate(today.items()):
        inputs = {}
        if stage == "grpo":
            inputs = {GRPO_RECIPE: "0123456789abcdef" if changed else measured.digest(REPO / GRPO_RECIPE)}
        if stage == "sft" and changed:
            cmd = [w if w != "2" or cmd[j - 1] != "--max_steps" else "7" for j, w in enumerate(cmd)]
        write_json_atomic(marker_path(run, stage), {"stage": stage, "command": cmd, "inputs": inputs, "exit_code": 0,
                                                    "wall_s": 10.0 + i, "peak_mem_mb": 100.0 * (i + 1),
                                                    "load_avg_mean": 1.5, "finished_at": f"2026-12-05T10:{i:02d}:00+00:00",
                                                    "git": git})  # fmt: skip
    write_json_atomic(run / "eval" / "results.json", RESULTS)
    assert run_summary.summary(run, list(today)) == 0
    return run, today


def test_the_section_shows_every_figure_and_what_differs_from_today(tmp_path, capsys):
    run, today = _run(tmp_path, changed=True)
    readme = tmp_path / "README.md"
    readme.write_text(f"# Kit\n\nbefore\n\n{measured.BEGIN}\nold numbers\n{measured.END}\n\nafter\n")
    assert measured.main([str(run / "summary.json"), "--doc", str(readme)]) == 0
    text = readme.read_text()
    assert text.startswith("# Kit\n\nbefore\n\n") and text.endswith("\n\nafter\n") and "old numbers" not in text
    section = text.split(measured.BEGIN)[1].split(measured.END)[0]
    # every rate with its n and interval, each model in its row
    for name, m in RESULTS["models"].items():
        row = next(ln for ln in section.splitlines() if ln.startswith(f"| {measured.MODEL_LABELS[name]} |"))
        for key in ("pass_at_1", "recovery_at_1"):
            for split in ("drills_id", "drills_ood"):
                assert measured.rate(m[key][split]) in row, (name, key, split)
        assert measured.rate(m["valid_tool_call_rate"]) in row
    assert "| standard GRPO | - | - | - | - | - | - | - |" in section  # not evaluated: nothing invented
    assert "- sft - base, pass_at_1/drills_id: +0.156 [+0.031, +0.281] (n=32; 0.125): better" in section
    # provenance: commit and machine
    commit = git_commit()["commit"][:7]
    assert f"code at commit `{commit}`" in section and "`runs/smollm2-135m-ci`" not in section
    assert "`smollm2-135m-ci` (outside the checkout) (recipe `smollm2-135m`, size `ci`)" in section
    assert " CPUs (" in section and " GB of memory." in section
    # exactly the two settings that differ from today's code
    diff = [ln for ln in section.splitlines() if ln.startswith("- `")]
    assert diff == ["- `sft`: `--max_steps`: run `7`, today `2`",
                    f"- `grpo`: `{GRPO_RECIPE}` changed since the run (digest 0123456789abcdef -> "
                    f"{measured.digest(REPO / GRPO_RECIPE)})"], diff  # fmt: skip
    assert "these numbers are not those of today's defaults" in section
    # time per stage, with the commit of each
    assert f"| sft | 13s | 400 MB | 1.5 | `{commit}` |" in section


def test_a_run_of_todays_defaults_says_so_and_bad_inputs_are_named(tmp_path, capsys):
    run, _ = _run(tmp_path, changed=False)
    assert measured.main([str(run / "summary.json"), "--print"]) == 0
    out = capsys.readouterr().out
    assert "**Defaults that differ from today's code:** none" in out
    summary = json.loads((run / "summary.json").read_text())
    readme = tmp_path / "README.md"
    readme.write_text("# no markers\n")
    assert measured.main([str(run / "summary.json"), "--doc", str(readme)]) == 2
    assert "needs exactly one <!-- measured:begin -->" in capsys.readouterr().err
    summary.pop("provenance")
    (tmp_path / "old.json").write_text(json.dumps(summary))
    assert measured.main([str(tmp_path / "old.json"), "--print"]) == 2
    assert "no 'provenance'" in capsys.readouterr().err


@pytest.mark.parametrize("run_cmd, today_cmd, want", [
    (["py", "x.py", "--a", "1"], ["py", "x.py", "--a", "1"], []),
    (["py", "x.py", "--model", "a", "--model", "b"], ["py", "x.py", "--model", "a"],
     ["`--model`: run `a; b`, today `a`"]),
    (["py", "x.py", "--no-check"], ["py", "x.py"], ["`--no-check`: run `(set)`, today `absent`"]),
    (["py", "x.py"], ["py", "y.py"], ["the program: run `py x.py`, today `py y.py`"]),
])  # fmt: skip
def test_command_differences_flag_by_flag(run_cmd, today_cmd, want):
    assert measured.command_differences(run_cmd, today_cmd) == want


def test_run_folder_paths_compare_across_checkouts():
    run = "runs/smollm2-135m-ci"
    a = measured.portable(["--model", "hf:/tmp/a/runs/smollm2-135m-ci/sft/merged", "--out", "runs/smollm2-135m-ci/x",
                           "--other", "/tmp/a/runs/smollm2-135m-cix"], run)  # fmt: skip
    assert a == ["--model", "hf:RUN/sft/merged", "--out", "RUN/x", "--other", "/tmp/a/runs/smollm2-135m-cix"]
    assert measured.portable(["hf:/srv/k/runs/smollm2-135m-ci/sft/merged"], run) == a[1:2]


def test_the_mechanism_on_chains_reaches_summary_json_and_the_section(tmp_path):
    # mechanism.json made by the real summarize() from groups.jsonl rows of four-stage chains
    from reterm.eval.mechanism import power_plan, summarize

    rows = []
    for i in range(12):
        done = i % 3 + 1
        rows.append({"task": f"chain4-{i:03d}", "family": "f", "category": "wrong_command",
                     "task_start": {"rewards": [0.0, 0.0, 1.0 if i % 2 else 0.0, 0.0], "stages_done": [done] * 4},
                     "failure_state": {"rewards": [1.0, 0.0, 0.0, 1.0 if i % 4 else 0.0], "category": "wrong_command",
                                       "state_id": f"s{i}", "from_attempt": 0, "failed_checks": 1,
                                       "stages_done": done}})  # fmt: skip
    mech = summarize(rows)
    mech.update(settings={"model": "m", "stages": 4}, power_plan=power_plan(12, 0.4, 0.2))
    run = tmp_path / "runs" / "smollm2-135m-ci"
    write_json_atomic(run / "mechanism" / "mechanism.json", mech)
    run, today = _run(tmp_path, changed=False)
    summary = json.loads((run / "summary.json").read_text())
    got = summary["mechanism"]
    assert set(got["by_stages_done"]) == {"1", "2", "3"} and got["by_stages_done"]["2"]["tasks"] == 4
    assert got["power_plan"] == mech["power_plan"] and got["power_plan"]["n_needed"] > 12
    body = measured.section(summary, today, "ci", "smollm2-135m", "summary.json")
    for j, v in got["by_stages_done"].items():
        s = v["signal_attempt_share"]
        assert (f"- failure state with {j} stages done (4 tasks): share from the task start "
                f"{measured.rate(s['task_start'])}, from the failure state {measured.rate(s['failure_state'])}") in body
    assert f"{got['power_plan']['n_needed']} paired tasks for 80% power" in body
    md = (run / "summary.md").read_text()
    assert "- failure state with 3 stages done (4 tasks)" in md and "planned before the run" in md


def _two_seed_run(tmp_path: Path, seeds: tuple[str, ...]) -> tuple[Path, dict]:
    """A run folder whose evaluation paired the GRPO arms of each seed in ``seeds`` ("" = the recipes' seed, "-s43")
    with each other and with SFT (the differences made by ``reterm.eval.drills.compare`` from per-item outcomes on
    30 chains), and whose GRPO runs wrote training summaries with their diagnostics."""
    from reterm.eval.drills import compare
    from reterm.stats import rate

    run = tmp_path / "runs" / "smollm2-135m"
    names = ["sft"] + [f"{arm}{s}" for s in seeds for arm in ("grpo-standard", "grpo-reterm")]
    models = {}
    for i, name in enumerate(names):  # model i passes the items j with (j + i) % 5 < 1 + i % 3
        outcomes = {f"chain4-{j:03d}": float((j + i) % 5 < 1 + i % 3) for j in range(30)}
        per = {"recovery_at_1/multistage_own": outcomes, "pass_at_1/multistage_start": dict(outcomes)}
        write_json_atomic(run / "eval" / name / "per_item.json", per)
        models[name] = {"pass_at_1": {"multistage_start": rate(list(outcomes.values()))},
                        "recovery_at_1": {"multistage_own": rate(list(outcomes.values()))}}  # fmt: skip
        if name != "sft":
            seed = 43 if name.endswith("-s43") else 42
            write_json_atomic(run / name / "training_summary.json", {
                "steps": 15, "attempts": 120, "groups": 30, "zero_variance_groups": 10 + i,
                "hyperparameters": {"seed": seed}, "kl_to_start": {"kl_k1": 0.01 * i, "kl_k3": 0.02 * i, "tokens": 900,
                                                                   "attempts": 16},
                "diagnostics": {"grad_norm": {"mean": 0.5 + i, "max": 1.5 + i, "n": 15}}})  # fmt: skip
    pairs = [(f"grpo-reterm{s}", f"grpo-standard{s}") for s in seeds if s] + \
        [(f"{arm}{s}", "sft") for s in seeds if s for arm in ("grpo-reterm", "grpo-standard")]
    results = {"models": models, "differences": compare(run / "eval", names, pairs)}
    write_json_atomic(run / "eval" / "results.json", results)
    assert run_summary.summary(run, ["grpo", "grpo-standard", "grpo-s43", "grpo-standard-s43", "eval"]) == 0
    return run, results


def test_summary_reports_each_seed_s_differences_and_diagnostics(tmp_path):
    run, results = _two_seed_run(tmp_path, ("", "-s43"))
    summary = json.loads((run / "summary.json").read_text())
    seeds = summary["seeds"]
    assert list(seeds) == ["42", "43"]  # the recipes' seed read from the training summaries, then the extra one
    for seed, sfx in (("42", ""), ("43", "-s43")):
        v = seeds[seed]
        assert v["runs"] == {"grpo-reterm": f"grpo-reterm{sfx}", "grpo-standard": f"grpo-standard{sfx}"}
        assert v["differences"] == {
            "grpo-reterm - grpo-standard": results["differences"][f"grpo-reterm{sfx} - grpo-standard{sfx}"],
            "grpo-reterm - sft": results["differences"][f"grpo-reterm{sfx} - sft"],
            "grpo-standard - sft": results["differences"][f"grpo-standard{sfx} - sft"]}  # fmt: skip
        for arm in ("grpo-reterm", "grpo-standard"):
            ts = json.loads((run / f"{arm}{sfx}" / "training_summary.json").read_text())
            assert v["diagnostics"][arm] == {"zero_variance_group_share": round(ts["zero_variance_groups"] / 30, 3),
                                             "kl_to_start": ts["kl_to_start"],
                                             "grad_norm": ts["diagnostics"]["grad_norm"]}  # fmt: skip
    assert summary["models"]["grpo-reterm-s43"]["label"] == "ReTerm-GRPO (seed 43)"
    # summary.md: a row per seed and pair, the two metrics of the issue with interval and power
    md = (run / "summary.md").read_text()
    d = results["differences"]["grpo-reterm-s43 - grpo-standard-s43"]
    cells = [run_summary._diff_cell(d[k]) for k in run_summary.SEED_KEYS]
    assert f"| 43 | grpo-reterm - grpo-standard | {cells[0]} | {cells[1]} |" in md
    assert cells[0].startswith(f"{d['recovery_at_1/multistage_own']['diff']:+.3f} [") and "MDE 0." in cells[0]
    assert "| standard GRPO (seed 43) |" in md and "| ReTerm-GRPO (seed 43) |" in md
    # docs/RESULTS.md's section: both seeds' rows, pairs and diagnostics
    body = measured.section(summary, None, "default", "smollm2-135m", "summary.json")
    assert "| ReTerm-GRPO (seed 43) | " in body and "| standard GRPO (seed 43) | " in body
    assert "- grpo-reterm-s43 - grpo-standard-s43, recovery_at_1/multistage_own: " in body
    for seed, sfx in (("42", ""), ("43", "-s43")):
        ts = json.loads((run / f"grpo-reterm{sfx}" / "training_summary.json").read_text())
        zv, kl, gn = ts["zero_variance_groups"] / ts["groups"], ts["kl_to_start"]["kl_k3"], ts["diagnostics"]["grad_norm"]
        assert f"| {seed} | ReTerm-GRPO | {zv:.2f} | {kl:.3g} | {gn['mean']:.3g} ({gn['max']:.3g}) |" in md
        assert (f"- seed {seed}, ReTerm-GRPO: zero-variance group share {zv:.2f}, KL to start {kl:.3g} (900 tokens), "
                f"gradient norm {gn['mean']:.3g} ({gn['max']:.3g}; 15 steps)") in body


def test_summary_of_a_one_seed_run_has_one_seed(tmp_path):
    run, results = _two_seed_run(tmp_path, ("",))  # --size ci, or a run made before the second seed
    summary = json.loads((run / "summary.json").read_text())
    assert list(summary["seeds"]) == ["42"] and len(summary["seeds"]["42"]["differences"]) == 3
    assert not any("-s43" in name for name in summary["models"])
    assert "(seed 43)" not in (run / "summary.md").read_text()
