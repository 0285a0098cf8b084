"""Scoring the classifier on a labelled set of step records: per-category precision, recall and F1.

The labelled set (``tests/data/recovery_labelled.yaml`` in this repository) is a list of mappings with the
fields of :class:`~reterm.recovery.classify.StepRecord` plus ``label`` (the gold category id), ``split``
(``dev``: written before the rules; ``heldout``: written after they were frozen) and an optional ``note``.
YAML (a list) or JSON Lines (one mapping a line) are read.

Run ``python -m reterm.recovery PATH [--split dev|heldout|heldout2|heldout3]`` to print the
table; the test suite prints it too (tests/test_recovery_classify.py).

Precision, recall and F1 follow the usual one-vs-rest definitions (as in scikit-learn's
``classification_report``, written out here to keep the module free of that dependency); macro-F1 is the
unweighted mean over the labels that occur in gold or predictions.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

import yaml

from reterm.recovery.classify import Classification, StepRecord
from reterm.recovery.judge import Classifier
from reterm.recovery.taxonomy import LABELS, Category, parse_category


@dataclass
class LabelledRecord:
    """One labelled step: the record, its gold label, its split and a free-text note."""

    record: StepRecord
    label: Category
    split: str = "dev"
    note: str = ""


def load_labelled(path: str | Path) -> list[LabelledRecord]:
    """Read a labelled set (``.yaml``/``.yml`` list or ``.jsonl``).

    Raises ``ValueError`` naming the file and the record (index and id) for a missing ``label``, an
    unknown category id, a duplicate id or a field of the wrong type.
    """
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    if path.suffix in (".yaml", ".yml"):
        try:
            rows = yaml.safe_load(text) or []
        except yaml.YAMLError as exc:
            raise ValueError(f"{path}: not valid YAML ({exc})") from exc
        if not isinstance(rows, list):
            raise ValueError(f"{path}: expected a YAML list of records, got {type(rows).__name__}")
    else:
        rows = []
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}:{n}: not JSON ({exc})") from exc
    out: list[LabelledRecord] = []
    seen: set[str] = set()
    for i, row in enumerate(rows):
        where = f"{path} record {i} (id {row.get('id', '?')!r})" if isinstance(row, dict) else f"{path} record {i}"
        if not isinstance(row, dict):
            raise ValueError(f"{where}: expected a mapping")
        if "label" not in row:
            raise ValueError(f"{where}: missing field 'label'")
        try:
            label = parse_category(row["label"])
        except ValueError as exc:
            raise ValueError(f"{where}: field 'label': {exc}") from None
        rid = str(row.get("id", i))
        if rid in seen:
            raise ValueError(f"{where}: duplicate id {rid!r}")
        seen.add(rid)
        record = StepRecord.from_dict({**row, "id": rid}, where=where)
        out.append(LabelledRecord(record, label, str(row.get("split", "dev")), str(row.get("note", ""))))
    return out


@dataclass
class LabelScore:
    """One label's one-vs-rest counts and scores (``None`` when undefined: no predictions / no gold)."""

    label: str
    support: int  # gold records with this label
    predicted: int  # records predicted with this label
    true_positive: int

    @property
    def precision(self) -> float | None:
        return self.true_positive / self.predicted if self.predicted else None

    @property
    def recall(self) -> float | None:
        return self.true_positive / self.support if self.support else None

    @property
    def f1(self) -> float | None:
        p, r = self.precision or 0.0, self.recall or 0.0
        if not self.support and not self.predicted:
            return None
        return 2 * p * r / (p + r) if p + r else 0.0


@dataclass
class ClassificationReport:
    """Per-label scores, accuracy, macro-F1, the confusion counts and the misclassified ids."""

    scores: dict[str, LabelScore]
    total: int
    correct: int
    confusion: Counter = field(default_factory=Counter)  # (gold, predicted) -> count
    errors: list[tuple[str, str, str, str]] = field(default_factory=list)  # (id, gold, predicted, rule)

    @property
    def accuracy(self) -> float:
        return self.correct / self.total if self.total else 0.0

    @property
    def macro_f1(self) -> float:
        values = [s.f1 for s in self.scores.values() if s.f1 is not None]
        return sum(values) / len(values) if values else 0.0

    def to_markdown(self, title: str = "") -> str:
        """A markdown table: label | support | predicted | precision | recall | F1, then totals and errors."""
        def fmt(x: float | None) -> str:
            return "-" if x is None else f"{x:.2f}"

        lines = [f"### {title}", ""] if title else []
        lines += ["| category | support | predicted | precision | recall | F1 |", "|---|---:|---:|---:|---:|---:|"]
        for s in self.scores.values():
            lines.append(f"| {s.label} | {s.support} | {s.predicted} | {fmt(s.precision)} | {fmt(s.recall)} | {fmt(s.f1)} |")
        lines += ["", f"records {self.total}, accuracy {self.accuracy:.3f}, macro-F1 {self.macro_f1:.3f}"]
        if self.errors:
            lines += ["", "misclassified: " + "; ".join(f"{i} ({g} -> {p}, {r})" for i, g, p, r in self.errors)]
        return "\n".join(lines)


def score(gold: Iterable[tuple[str, Category]], predicted: Iterable[Classification]) -> ClassificationReport:
    """Compare ``(id, gold label)`` pairs with the classifications made for them, in the same order."""
    gold = list(gold)
    predicted = list(predicted)
    if len(gold) != len(predicted):
        raise ValueError(f"score: {len(gold)} gold labels but {len(predicted)} predictions")
    support, pred, tp = Counter(), Counter(), Counter()
    confusion: Counter = Counter()
    errors = []
    for (rid, g), p in zip(gold, predicted):
        support[g.value] += 1
        pred[p.label.value] += 1
        confusion[(g.value, p.label.value)] += 1
        if g is p.label:
            tp[g.value] += 1
        else:
            errors.append((rid, g.value, p.label.value, p.rule))
    labels = [c.value for c in LABELS if support[c.value] or pred[c.value]]
    scores = {lab: LabelScore(lab, support[lab], pred[lab], tp[lab]) for lab in labels}
    return ClassificationReport(scores, len(gold), sum(tp.values()), confusion, errors)


def evaluate(records: list[LabelledRecord], classifier=None) -> ClassificationReport:
    """Classify ``records`` (with :class:`~reterm.recovery.judge.Classifier`, rules only by default)
    and score them against their gold labels."""

    classifier = classifier or Classifier()
    predictions = classifier.classify([r.record for r in records])
    return score([(r.record.id, r.label) for r in records], predictions)


def main(argv: list[str] | None = None) -> int:
    """``python -m reterm.recovery PATH``: print the per-category tables (markdown), per split and overall."""
    parser = argparse.ArgumentParser(prog="python -m reterm.recovery", description=main.__doc__)
    parser.add_argument("path", help="labelled set (.yaml or .jsonl)")
    parser.add_argument("--split", default=None, help="only records of this split (dev, heldout)")
    args = parser.parse_args(argv)
    records = load_labelled(args.path)
    splits = [args.split] if args.split else sorted({r.split for r in records}) + ["all"]
    for split in splits:
        chosen = records if split == "all" else [r for r in records if r.split == split]
        print(evaluate(chosen).to_markdown(f"{split} ({len(chosen)} records)"))
        print()
    return 0


