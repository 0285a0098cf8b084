"""Decontaminate a training task collection against benchmark tasks (Terminal-Bench 2.0) before any data is made.

    reterm tasks decontaminate data/endless-terminals --benchmark data/terminal-bench-2.0 [--benchmark ...]

A collection task is removed when it **is** a benchmark task or **asks for** one:

1. **task id**: its normalised id (folder name or ``[task].name`` without the org, lower case, letters and digits
   only) equals a benchmark task's (``fix-git`` = ``Fix_Git`` = ``terminal-bench/fix-git``);
2. **instruction similarity**: the share of word ``ngram``-grams (default 8) the two instructions have in common,
   over the smaller instruction's, is at least ``threshold`` (default 0.5): a copied or lightly edited instruction
   shares most of its 8-word runs, two unrelated ones almost none.

Benchmarks are local task folders (``harbor download terminal-bench@2.0 -o DIR``; searched three levels deep for
``instruction.md``) or a shipped id list (``terminal-bench@2.0``: :data:`BENCHMARK_ID_LISTS`, ids only, so no
similarity check: the report says so). The collection is read with :func:`reterm.tasks.loader.load_tasks` (the
kit's loader: Harbor, Terminal-Bench 1 and generated dialects); a folder it cannot load is listed as unreadable and
not kept. :func:`write_outputs` writes ``splits.json`` (``train``: the kept tasks, what the data stage's
``tasks.split`` and GRPO's seeds read) and a JSON + Markdown report of what was removed and why.
Written for this kit.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

from reterm.io import write_json_atomic, write_text_atomic

#: Benchmarks known by name: a file of task ids shipped with the kit (id matching only).
BENCHMARK_ID_LISTS = {"terminal-bench@2.0": Path(__file__).parent / "benchmarks" / "terminal-bench-2.0.txt"}

_WORD = re.compile(r"[a-z0-9_./-]+")


def normalise_id(name: str) -> str:
    """``"terminal-bench/Fix_Git"`` -> ``"fixgit"``: the name without an org prefix, lower case, [a-z0-9] only."""
    return re.sub(r"[^a-z0-9]", "", name.strip().lower().split("/")[-1])


def word_ngrams(text: str, n: int) -> set[tuple[str, ...]]:
    """The set of word ``n``-grams of ``text`` (lower case); a text shorter than ``n`` words gives its whole word
    sequence as one gram (so two identical short instructions still match), an empty text none."""
    words = _WORD.findall(text.lower())
    if not words:
        return set()
    if len(words) < n:
        return {tuple(words)}
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


@dataclass
class BenchmarkTask:
    """A task of a benchmark: ``benchmark`` label, ``name`` (its id) and ``instruction`` (``None`` for an id list)."""

    benchmark: str
    name: str
    instruction: str | None = None


@dataclass
class Removal:
    """Why one collection task was removed: ``reason`` is ``"task id"`` or ``"instruction"``; ``score`` the
    shared share of n-grams (1.0 for an id match)."""

    task: str
    reason: str
    benchmark: str
    benchmark_task: str
    score: float


@dataclass
class DecontaminationReport:
    """The outcome: kept task ids (sorted), removals, folders the loader could not read, benchmark sizes."""

    collection: str
    kept: list[str]
    removed: list[Removal]
    unreadable: list[dict[str, str]]
    benchmarks: dict[str, dict[str, int | bool]]
    method: dict[str, float | int | str] = field(default_factory=dict)

    @property
    def n_tasks(self) -> int:
        return len(self.kept) + len(self.removed) + len(self.unreadable)

    def to_json(self) -> dict:
        return {"collection": self.collection, "n_tasks": self.n_tasks, "kept": len(self.kept),
                "removed": [asdict(r) for r in self.removed], "unreadable": self.unreadable,
                "benchmarks": self.benchmarks, "method": self.method}  # fmt: skip

    def to_markdown(self) -> str:
        lines = [f"# Decontamination of {self.collection}", "",
                 f"{self.n_tasks} task folders: **{len(self.kept)} kept**, {len(self.removed)} removed as benchmark "
                 f"overlaps, {len(self.unreadable)} unreadable.", "",
                 f"Method: {self.method.get('description', '')}", "", "| benchmark | tasks | instructions |",
                 "|---|---|---|"]  # fmt: skip
        for label, b in self.benchmarks.items():
            lines.append(f"| {label} | {b['tasks']} | {'yes' if b['instructions'] else 'no (ids only)'} |")
        lines += ["", "## Removed", ""]
        if self.removed:
            lines += ["| task | reason | benchmark task | shared n-grams |", "|---|---|---|---|"]
            lines += [f"| {r.task} | {r.reason} | {r.benchmark}:{r.benchmark_task} | {r.score:.0%} |" for r in self.removed]
        else:
            lines.append("none")
        if self.unreadable:
            lines += ["", "## Unreadable (not kept)", ""] + [f"- {u['folder']}: {u['error']}" for u in self.unreadable]
        return "\n".join(lines) + "\n"


def load_benchmark(spec: str | Path) -> list[BenchmarkTask]:
    """The tasks of a benchmark: a folder of task folders (``instruction.md`` up to three levels deep; the id is the
    folder name) or a name of :data:`BENCHMARK_ID_LISTS` (ids only).

    Raises:
        ValueError: neither an existing folder nor a known name, or a folder without any task (naming it).
    """
    text = str(spec)
    if text in BENCHMARK_ID_LISTS:
        path = BENCHMARK_ID_LISTS[text]
        names = [ln.strip() for ln in path.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
        return [BenchmarkTask(text, n) for n in names]
    folder = Path(spec)
    if not folder.is_dir():
        raise ValueError(f"benchmark {text}: not a folder of task folders nor one of {sorted(BENCHMARK_ID_LISTS)} "
                         "(download one with `harbor download terminal-bench@2.0 -o DIR`)")  # fmt: skip
    found = sorted({p.parent for depth in ("*", "*/*", "*/*/*") for p in folder.glob(f"{depth}/instruction.md")})
    if not found:
        raise ValueError(f"benchmark {folder}: no task folder (no instruction.md up to three levels deep)")
    return [BenchmarkTask(folder.name, d.name, (d / "instruction.md").read_text(errors="replace")) for d in found]


def decontaminate(collection: Path | str, benchmarks: list[BenchmarkTask], *, ngram: int = 8,
                  threshold: float = 0.5) -> DecontaminationReport:  # fmt: skip
    """Check every task of ``collection`` against ``benchmarks`` by task id and instruction similarity.

    Args:
        collection: a folder of task folders (any dialect :func:`reterm.tasks.loader.load_tasks` reads).
        benchmarks: :func:`load_benchmark` of each benchmark.
        ngram: words per n-gram (>= 3).
        threshold: the shared share of n-grams (over the smaller instruction's) at which a task is removed, in (0, 1].

    Returns:
        A :class:`DecontaminationReport`; a task matching several benchmark tasks is listed once, with its id match
        if any, else its most similar instruction.

    Raises:
        ValueError: bad ``ngram``/``threshold``, or a collection folder that holds no task folder.
    """
    from reterm.tasks.loader import load_tasks

    if ngram < 3 or not 0 < threshold <= 1:
        raise ValueError(f"ngram must be >= 3 and threshold in (0, 1], not {ngram} and {threshold}")
    root = Path(collection)
    loaded, errors = load_tasks(root, check_local=False)
    if not loaded and not errors:
        raise ValueError(f"{root}: no task folders found")
    by_id = {normalise_id(b.name): b for b in benchmarks}
    grams = {i: word_ngrams(b.instruction, ngram) for i, b in enumerate(benchmarks) if b.instruction}
    index: dict[tuple[str, ...], list[int]] = defaultdict(list)
    for i, gs in grams.items():
        for g in gs:
            index[g].append(i)
    kept, removed = [], []
    for task in sorted(loaded, key=lambda t: t.source_dir.name):
        tid = task.source_dir.name
        hit = by_id.get(normalise_id(tid)) or by_id.get(normalise_id(task.name))
        if hit is not None:
            removed.append(Removal(tid, "task id", hit.benchmark, hit.name, 1.0))
            continue
        mine = word_ngrams(task.instruction, ngram)
        shared: dict[int, int] = defaultdict(int)
        for g in mine:
            for i in index.get(g, ()):
                shared[i] += 1
        best, best_i = 0.0, None
        for i, k in shared.items():
            score = k / max(1, min(len(mine), len(grams[i])))
            if score > best:
                best, best_i = score, i
        if best_i is not None and best >= threshold:
            b = benchmarks[best_i]
            removed.append(Removal(tid, "instruction", b.benchmark, b.name, round(best, 4)))
        else:
            kept.append(tid)
    sizes: dict[str, dict[str, int | bool]] = {}
    for b in benchmarks:
        entry = sizes.setdefault(b.benchmark, {"tasks": 0, "instructions": True})
        entry["tasks"] = int(entry["tasks"]) + 1
        entry["instructions"] = bool(entry["instructions"]) and b.instruction is not None
    unreadable = [{"folder": _relative(e.path, root), "error": e.problem} for e in errors]
    method = {"ngram": ngram, "threshold": threshold,
              "description": f"removed when the normalised task id equals a benchmark task's, or when at least "
                             f"{threshold:.0%} of the word {ngram}-grams of the smaller of the two instructions are "
                             "shared"}  # fmt: skip
    return DecontaminationReport(str(root), sorted(kept), removed, unreadable, sizes, method)


def _relative(path: Path, root: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(root.resolve()))
    except ValueError:
        return str(path)


def write_outputs(report: DecontaminationReport, split_file: Path, report_file: Path) -> None:
    """Write ``split_file`` (``{"train": kept, "removed": [...]}``: what ``tasks.split_file`` / ``splits.json``
    readers take) and ``report_file`` (JSON) with a Markdown twin next to it (``.md``), atomically."""
    write_json_atomic(split_file, {"train": report.kept, "removed": sorted(r.task for r in report.removed)})
    write_json_atomic(report_file, report.to_json())
    write_text_atomic(report_file.with_suffix(".md"), report.to_markdown())
