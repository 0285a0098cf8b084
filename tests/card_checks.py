"""Checks that a rendered card says, number by number, what it was rendered from (shared by the card tests and
the reduced chain's test in ``tests/test_run_all.py``).

- :func:`assert_model_card_matches`: the drills table of a model card (every rate, interval bound and n) and its
  paired differences equal the evaluation's ``results.json``.
- :func:`assert_dataset_card_matches`: a dataset card's headline, splits, funnel, category table and failure
  sources equal the records of its folder and their ``stats.json``.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest

CELL = re.compile(r"^(-?\d+\.\d+) \[(-?\d+\.\d+), (-?\d+\.\d+)\] \(n=(\d+)\)$")
DIFF = re.compile(r"^- (.+ - .+), (\S+): ([+-]\d+\.\d+) \[([+-]\d+\.\d+), ([+-]\d+\.\d+)\] "
                  r"\(n=(\d+)(?:; smallest difference detectable with 80% power: ([-\d.]+))?\): (.+)$")
# the columns of the drills table (reterm.eval.drills.report): (results key, sub-key)
DRILL_COLUMNS = [("pass_at_1", "drills_id"), ("pass_at_1", "drills_ood"), ("recovery_at_1", "drills_id"),
                 ("recovery_at_1", "drills_ood"), ("valid_tool_call_rate", None), ("recovery_own", "recovery_at_1"),
                 ("recovery_own", "fatal_attempt_rate"), ("recovery_at_1", "multistage_own"),
                 ("pass_at_1", "multistage_start")]  # fmt: skip


def table(text: str, header_start: str) -> dict[str, list[str]]:
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


def same_rate(cell: str, r: dict | None, digits: int) -> None:
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


def diff_lines(text: str) -> dict[tuple[str, str], tuple]:
    out = {}
    for ln in text.splitlines():
        m = DIFF.match(ln)
        if m:
            out[(m[1], m[2])] = (float(m[3]), float(m[4]), float(m[5]), int(m[6]), m[8], m[7])
    return out


def check_diffs(text: str, results: dict) -> None:
    """Every paired difference of ``results`` is shown once, with its value, interval, n, verdict (and power)."""
    shown = diff_lines(text)
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


def assert_model_card_matches(text: str, results: dict, eval_name: str) -> None:
    """The model card ``text`` shows the drills evaluation ``results`` (``reterm.eval.drills``) number by number."""
    assert f"This model is `{eval_name}`" in text
    rows = table(text, "| model | Pass@1 ID |")
    models = results["models"]
    assert list(rows) == list(models)
    for name, m in models.items():
        assert len(rows[name]) == len(DRILL_COLUMNS), rows[name]
        for cell, (key, sub) in zip(rows[name], DRILL_COLUMNS):
            same_rate(cell, m[key] if sub is None else (m.get(key) or {}).get(sub), 3)
    if any(d.get("diff") is not None for per in results["differences"].values() for d in per.values()):
        check_diffs(text, results)


def assert_dataset_card_matches(body: str, folder: Path) -> None:
    """The dataset card ``body`` (without its YAML header) says what the records of ``folder`` and its
    ``stats.json`` hold: headline counts by source, splits, funnel, records per category and per source."""
    from datasets import load_dataset

    stats = json.loads((folder / "stats.json").read_text())
    rows = {split: list(load_dataset(str(folder), split=split)) for split in stats["splits"]}
    for split, n in stats["splits"].items():
        assert len(rows[split]) == n and f"| `{split}` | {n:,} |" in body, split
    records = [r for split in rows.values() for r in split]
    n = len(records)
    sources = Counter(r["failure_source"] for r in records)
    parts = [f"{sources['own']:,} from the policy's own failed attempts"] if sources.get("own") else []
    parts += [f"{sources['injected']:,} from injected mistakes"] if sources.get("injected") else []
    parts += [f"{sources['task_start']:,} whole reference solutions from the task's start (no mistake, `failure_step` -1)"
              ] if sources.get("task_start") else []  # fmt: skip
    lead = "verified records of a terminal agent" if sources.get("task_start") else \
        "verified recoveries of a terminal agent from failure states"
    assert f"**{n:,} {lead}: {', '.join(parts)}.**" in body
    assert f"| **records** | **{n:,}** |" in body
    assert f"| verified recoveries kept as candidates | {stats['filters']['verified_recoveries']:,} |" in body
    found = re.findall(r"^\| (?:\*not an error category:\* )?[^|]+ \(`(\w+)`\) \| ([\d,]+) \|", body, re.M)
    assert {c: int(k.replace(",", "")) for c, k in found} == dict(Counter(r["failure_category"] for r in records))
    for name, k in sources.items():
        assert f"{name} {k:,} ({100 * k / n:.1f}%)" in body, name
    teachers = Counter(r["teacher"] for r in records)
    for teacher, k in teachers.items():
        assert f"`{teacher}` ({k:,}, {100 * k / n:.1f}%)" in body, teacher
    for k, count in Counter(r["target_attempt_index"] for r in records).items():
        assert f"`target_attempt_index` = {k}, {count:,} records" in body, k
    injected = sources.get("injected", 0)
    assert ("**Injected failures**" in body) == bool(injected)
    assert f"Version {stats['version']}" in body
