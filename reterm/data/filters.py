"""Stage 5: quality filters, exact and near-duplicate removal, decontamination. Each step is counted.

Records are rows of :data:`reterm.record_features.FEATURES`. The order of the funnel (``stats.json``'s
``filters``): quality -> duplicates -> decontamination; within each, candidates are visited in a fixed
order (fewest recovery turns, then fewest characters, then id), so the better of two duplicates is kept
and the result does not depend on the order records were produced in.

- **Quality** (:func:`quality_problem`): too many recovery turns or characters, a command repeated more
  than ``max_repeats`` times in the recovery, recovery turns the harness could not parse, and (when
  configured) recoveries that merely restart from scratch (they begin by re-running the prefix's own
  first commands). A failed replay check (:mod:`reterm.data.build`) is counted here too.
- **Exact duplicates**: the same record id (a hash of task and messages).
- **Near duplicates** (:class:`NearDuplicates`): among records of the same task and failure category,
  MinHash over shingles of what the record teaches (3-grams of the tokens of the failing command, its
  error output and the recovery's commands; numbers folded), LSH banding to find candidate pairs, exact
  Jaccard to confirm; a record at or above the threshold to a kept one is dropped.
- **Decontamination** (:class:`Decontaminator`): a record is removed when its task has the name of an
  evaluation task, when at least ``threshold`` of its instruction's word n-grams occur in one evaluation
  task's instruction, or when at least ``threshold`` of its commands' n-grams occur in one evaluation
  task's reference solution. Evaluation tasks: the suite's test split, plus Terminal-Bench 2.0/2.1 when a
  local copy is given.

Own code, written simply (the brief allows it): ``datasets`` has no near-duplicate or decontamination
filters; MinHash is 128 universal-hash permutations of one blake2b hash per shingle.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from reterm.data.config import FiltersConfig

_TOKEN = re.compile(r"[A-Za-z0-9_./:=+-]+")
_WORD = re.compile(r"[a-z0-9_]+")


# ------------------------------------------------------------------------------------ helpers
def record_commands(record: dict[str, Any], start: int = 0) -> list[str]:
    """The bash commands of ``record["messages"][start:]`` (assistant tool calls), in order."""
    out = []
    for m in record["messages"][start:]:
        if m["role"] != "assistant":
            continue
        for call in m.get("tool_calls") or []:
            if call["function"]["name"] == "bash":
                try:
                    out.append(str(json.loads(call["function"]["arguments"] or "{}").get("command", "")))
                except ValueError:
                    out.append("")
    return out


def recovery_commands(record: dict[str, Any]) -> list[str]:
    return record_commands(record, record["train_from_message_index"])


def record_chars(record: dict[str, Any]) -> int:
    """Characters of every message's content and tool calls."""
    return sum(len(m["content"] or "") + sum(len(c["function"]["arguments"]) for c in m.get("tool_calls") or [])
               for m in record["messages"])  # fmt: skip


def sort_key(record: dict[str, Any]) -> tuple:
    """Fewest recovery turns, then fewest characters, then id (the better record first)."""
    return (record["recovery_turns"], record_chars(record), record["id"])


def _norm_command(cmd: str) -> str:
    return " ".join(cmd.split())


# ------------------------------------------------------------------------------------ quality
def quality_problem(record: dict[str, Any], cfg: FiltersConfig) -> str | None:
    """Why ``record`` fails the quality filter (a short reason), or ``None``."""
    if record["recovery_turns"] > cfg.max_recovery_turns:
        return "too_many_turns"
    if record_chars(record) > cfg.max_chars:
        return "too_long"
    rec = recovery_commands(record)
    counts = Counter(_norm_command(c) for c in rec)
    if counts and max(counts.values()) > cfg.max_repeats:
        return "repetition"
    if not cfg.allow_parse_errors:
        # a parse error is answered with a user message (there was no tool call to answer)
        if any(m["role"] == "user" for m in record["messages"][record["train_from_message_index"]:]):
            return "parse_errors"
    if cfg.drop_restarts and is_restart(list(record["replay_commands"]), rec):
        return "restart_from_scratch"
    return None


def is_restart(prefix: list[str], recovery: list[str]) -> bool:
    """True when the recovery begins by re-running the prefix's own first commands in order (at least
    two of them, up to three): it starts the work over instead of recovering from the failure."""
    k = min(len(prefix) - 1, 3)
    if k < 2 or len(recovery) < k:
        return False
    return [_norm_command(c) for c in recovery[:k]] == [_norm_command(c) for c in prefix[:k]]


# ---------------------------------------------------------------------------------- near dups
def shingles(record: dict[str, Any], n: int = 3) -> set[str]:
    """3-grams of normalised tokens of what a record teaches: the failing command, the last lines of its
    output, and the recovery's commands (numbers folded to 0)."""
    tokens: list[str] = []
    error = "\n".join((record.get("failure_output") or "").splitlines()[-3:])
    for text in [record.get("failure_command") or "", error, *recovery_commands(record)]:
        tokens += [re.sub(r"\d+", "0", t.lower()) for t in _TOKEN.findall(text)]
        tokens.append("<cmd>")
    if len(tokens) < n:
        return {" ".join(tokens)}
    return {" ".join(tokens[i : i + n]) for i in range(len(tokens) - n + 1)}


def jaccard(a: set[str], b: set[str]) -> float:
    return len(a & b) / len(a | b) if a or b else 1.0


class NearDuplicates:
    """Incremental MinHash + LSH near-duplicate index (see the module docstring).

    Args:
        threshold: Jaccard similarity at or above which two records are near-duplicates.
        num_perm: hash functions; ``bands`` x ``rows`` must equal it.
    """

    def __init__(self, threshold: float, num_perm: int = 128, bands: int = 32) -> None:
        if num_perm % bands:
            raise ValueError(f"num_perm ({num_perm}) must be a multiple of bands ({bands})")
        self.threshold, self.num_perm, self.bands, self.rows = threshold, num_perm, bands, num_perm // bands
        self._buckets: dict[tuple[int, tuple[int, ...]], list[int]] = defaultdict(list)
        self._sets: list[set[str]] = []
        self._ids: list[str] = []
        self._groups: list[str] = []

    _P = (1 << 31) - 1  # a Mersenne prime: h -> (a*h + b) mod P are the permutations

    def signature(self, items: set[str]) -> list[int]:
        """MinHash signature: per permutation ``(a*h + b) mod P`` of each item's 31-bit blake2b hash, minimised."""
        import numpy as np

        if not hasattr(self, "_ab"):
            rng = np.random.default_rng(20261001)  # fixed: signatures must not change between runs
            self._ab = rng.integers(1, self._P, size=(2, self.num_perm), dtype=np.uint64)
        h = np.array([int.from_bytes(hashlib.blake2b(s.encode(), digest_size=8).digest(), "little") % self._P
                      for s in sorted(items)] or [0], dtype=np.uint64)  # fmt: skip
        a, b = self._ab
        return [int(x) for x in ((h[:, None] * a[None, :] + b[None, :]) % self._P).min(axis=0)]

    def find(self, items: set[str], group: str = "") -> str | None:
        """The id of a kept record of the same ``group`` near-identical to ``items``, or ``None``."""
        sig = self.signature(items)
        seen: set[int] = set()
        for b in range(self.bands):
            for j in self._buckets.get((b, tuple(sig[b * self.rows : (b + 1) * self.rows])), []):
                if j not in seen and self._groups[j] == group:
                    seen.add(j)
                    if jaccard(items, self._sets[j]) >= self.threshold:
                        return self._ids[j]
        return None

    def add(self, record_id: str, items: set[str], group: str = "") -> None:
        sig = self.signature(items)
        j = len(self._sets)
        self._sets.append(items)
        self._ids.append(record_id)
        self._groups.append(group)
        for b in range(self.bands):
            self._buckets[(b, tuple(sig[b * self.rows : (b + 1) * self.rows]))].append(j)


# ---------------------------------------------------------------------------- decontamination
def _ngrams(text: str, n: int) -> set[tuple[str, ...]]:
    words = _WORD.findall(text.lower())
    if len(words) < 3:
        return set()
    n = min(n, len(words))
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


def _norm_name(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower().split("/")[-1])


@dataclass
class EvalTask:
    """An evaluation task as decontamination sees it."""

    benchmark: str
    name: str
    instruction: str
    solution: str = ""


class Decontaminator:
    """Overlap checks of records against evaluation tasks (see the module docstring)."""

    def __init__(self, tasks: Iterable[EvalTask], ngram: int, threshold: float) -> None:
        self.tasks = list(tasks)
        self.ngram, self.threshold = ngram, threshold
        self._names = {_norm_name(t.name): t for t in self.tasks}
        self._instr = [(t, _ngrams(t.instruction, ngram)) for t in self.tasks]
        self._sol = [(t, _ngrams(t.solution, ngram)) for t in self.tasks if t.solution]
        self._cache: dict[tuple[int, str], set] = {}

    @property
    def benchmarks(self) -> list[str]:
        return sorted({t.benchmark for t in self.tasks})

    def _containment(self, grams: set, others: list[tuple[EvalTask, set]]) -> tuple[float, EvalTask | None]:
        best, who = 0.0, None
        if not grams:
            return best, who
        for task, theirs in others:
            if theirs:
                c = len(grams & theirs) / len(grams)
                if c > best:
                    best, who = c, task
        return best, who

    def problem(self, record: dict[str, Any]) -> str | None:
        """Why ``record`` overlaps an evaluation task (names the task), or ``None``."""
        task = self._names.get(_norm_name(record["task_id"]))
        if task is not None:
            return f"task name {record['task_id']!r} is evaluation task {task.benchmark}:{task.name}"
        c, who = self._containment(_ngrams(record["instruction"], self.ngram), self._instr)
        if who is not None and c >= self.threshold:
            return f"instruction overlaps {who.benchmark}:{who.name} ({c:.0%} of {self.ngram}-grams)"
        c, who = self._containment(_ngrams("\n".join(record_commands(record)), self.ngram), self._sol)
        if who is not None and c >= self.threshold:
            return f"commands overlap the solution of {who.benchmark}:{who.name} ({c:.0%} of {self.ngram}-grams)"
        return None


def eval_task_from_folder(benchmark: str, path: Path) -> EvalTask:
    """An :class:`EvalTask` from a Harbor task folder (instruction.md, optional solution/solve.sh)."""
    solve = path / "solution" / "solve.sh"
    return EvalTask(benchmark, path.name, (path / "instruction.md").read_text(errors="replace"),
                    solve.read_text(errors="replace") if solve.is_file() else "")  # fmt: skip


# -------------------------------------------------------------------------------------- funnel
@dataclass
class FilterResult:
    """The funnel: kept records (in :func:`sort_key` order) and why each other one was removed."""

    kept: list[dict[str, Any]] = field(default_factory=list)
    removed: dict[str, dict[str, str]] = field(default_factory=dict)  # id -> {"stage", "reason"}
    counts: dict[str, int] = field(default_factory=lambda: {"quality": 0, "dedup": 0, "decontamination": 0})
    reasons: Counter = field(default_factory=Counter)

    def drop(self, record: dict[str, Any], stage: str, reason: str) -> None:
        self.removed[record["id"]] = {"stage": stage, "reason": reason}
        self.counts[stage] += 1
        self.reasons[f"{stage}: {re.split(r'[ (]', reason, maxsplit=1)[0]}"] += 1


def apply_filters(candidates: list[dict[str, Any]], cfg: FiltersConfig, decon: Decontaminator,
                  replay_failed: dict[str, str] | None = None) -> FilterResult:  # fmt: skip
    """Run the funnel over candidate records (see the module docstring).

    Args:
        candidates: verified recoveries as records.
        cfg: the filter settings.
        decon: the evaluation-task overlap checker.
        replay_failed: record id -> why its replay check failed (removed as quality).
    """
    out = FilterResult()
    near = NearDuplicates(cfg.near_duplicate_threshold)
    seen: set[str] = set()
    for record in sorted(candidates, key=sort_key):
        problem = quality_problem(record, cfg)
        if problem is None and replay_failed and record["id"] in replay_failed:
            problem = f"replay_check_failed ({replay_failed[record['id']]})"
        if problem:
            out.drop(record, "quality", problem)
            continue
        if record["id"] in seen:
            out.drop(record, "dedup", "exact duplicate")
            continue
        items = shingles(record)
        group = f"{record['task_id']}\t{record['failure_category']}"
        twin = near.find(items, group)
        if twin is not None:
            out.drop(record, "dedup", f"near duplicate of {twin}")
            continue
        overlap = decon.problem(record)
        if overlap:
            out.drop(record, "decontamination", overlap)
            continue
        seen.add(record["id"])
        near.add(record["id"], items, group)
        out.kept.append(record)
    return out
