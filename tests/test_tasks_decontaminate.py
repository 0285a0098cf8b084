"""`reterm tasks decontaminate`: a training collection's tasks that are (by id) or ask for (by instruction) benchmark
tasks are removed and reported; the kept ones become the split the 9B data stage reads (reterm/tasks/decontaminate.py,
fixtures in tests/fixtures/collections/)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from reterm.tasks.decontaminate import (
    BENCHMARK_ID_LISTS,
    decontaminate,
    load_benchmark,
    normalise_id,
    word_ngrams,
)

REPO = Path(__file__).resolve().parents[1]
FIX = REPO / "tests" / "fixtures" / "collections"


def test_ids_and_similar_instructions_are_removed_and_reported():
    bench = load_benchmark(FIX / "tb2-mini")
    assert sorted(b.name for b in bench) == ["access-log-report", "fix-git"]  # found below the download's hash folder
    report = decontaminate(FIX / "train-mini", bench)
    assert report.kept == ["task_000001_5e6f7a8b"]
    removed = {r.task: r for r in report.removed}
    assert (removed["Fix_Git"].reason, removed["Fix_Git"].benchmark_task) == ("task id", "fix-git")
    copy = removed["task_000000_0a1b2c3d"]  # the same request with other paths and one more sentence
    assert (copy.reason, copy.benchmark_task) == ("instruction", "access-log-report") and 0.5 <= copy.score < 1
    assert [u["folder"] for u in report.unreadable] == ["task_000002_9c8d7e6f/instruction.md"]
    assert report.n_tasks == 4 and report.benchmarks["tb2-mini"] == {"tasks": 2, "instructions": True}
    md = report.to_markdown()
    assert "**1 kept**, 2 removed" in md and "| task_000000_0a1b2c3d | instruction | tb2-mini:access-log-report |" in md
    # a stricter threshold keeps the edited copy: the score is what decides, not the wording of the test
    assert "task_000000_0a1b2c3d" in decontaminate(FIX / "train-mini", bench, threshold=0.95).kept


def test_the_shipped_terminal_bench_ids_match_without_a_local_copy():
    tb2 = load_benchmark("terminal-bench@2.0")
    assert len(tb2) == 89 == len({b.name for b in tb2}) and all(b.instruction is None for b in tb2)
    assert {"fix-git", "adaptive-rejection-sampler", "write-compressor"} <= {b.name for b in tb2}
    report = decontaminate(FIX / "train-mini", tb2)
    assert [r.task for r in report.removed] == ["Fix_Git"]  # ids only: the edited instruction is not caught
    assert report.benchmarks["terminal-bench@2.0"]["instructions"] is False
    assert BENCHMARK_ID_LISTS["terminal-bench@2.0"].is_file()


def test_normalisation_and_ngrams():
    assert normalise_id("terminal-bench/Fix_Git") == normalise_id("fix-git") == "fixgit"
    assert word_ngrams("a b c", 8) == {("a", "b", "c")} and word_ngrams("", 8) == set()
    assert len(word_ngrams(" ".join(str(i) for i in range(10)), 8)) == 3
    with pytest.raises(ValueError, match="ngram must be >= 3"):
        decontaminate(FIX / "train-mini", [], ngram=2)
    with pytest.raises(ValueError, match="not a folder of task folders nor one of"):
        load_benchmark(FIX / "nothing-here")


def test_cli_writes_the_split_the_data_stage_reads(tmp_path):
    collection = tmp_path / "endless-terminals"
    shutil.copytree(FIX / "train-mini", collection)
    r = subprocess.run([sys.executable, "-m", "reterm.cli", "tasks", "decontaminate", str(collection), "--benchmark",
                        str(FIX / "tb2-mini"), "--benchmark", "terminal-bench@2.0"],
                       cwd=REPO, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "**1 kept**" in r.stdout and "train: 1 tasks" in r.stdout
    split = json.loads((collection / "splits.json").read_text())
    assert split == {"train": ["task_000001_5e6f7a8b"], "removed": ["Fix_Git", "task_000000_0a1b2c3d"]}
    report = json.loads((collection / "decontamination.json").read_text())
    assert report["kept"] == 1 and len(report["removed"]) == 2 and (collection / "decontamination.md").is_file()
    # the 9B data stage's task selection (tasks.path + split train) reads the kept tasks only
    from reterm.data.config import TasksConfig
    from reterm.data.tasks import select_tasks

    chosen = select_tasks(TasksConfig(path=collection, split="train", eval_split=None))
    assert [t.id for t in chosen] == ["task_000001_5e6f7a8b"]
    bad = subprocess.run([sys.executable, "-m", "reterm.cli", "tasks", "decontaminate", str(collection),
                          "--benchmark", "terminal-bench@9"], cwd=REPO, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert bad.returncode == 2 and "benchmark terminal-bench@9: not a folder" in bad.stderr


def test_the_9b_configs_name_the_decontaminated_collection():
    import yaml

    from reterm.data.config import load_config

    cfg = load_config(REPO / "pipeline" / "configs" / "reterm-10k.yaml")
    assert cfg.tasks.path.name == "endless-terminals" and cfg.tasks.split == "train" and cfg.tasks.eval_split is None
    grpo = yaml.safe_load((REPO / "train" / "recipes" / "qwen3.5-9b" / "grpo.yaml").read_text())
    assert grpo["task_dirs"] == ["data/endless-terminals"]  # GRPO forks from the data stage's tasks
    text = (REPO / "pipeline" / "configs" / "reterm-10k.yaml").read_text()
    assert "hf download obiwan96/endless-terminals --repo-type dataset" in text
    assert "reterm tasks decontaminate data/endless-terminals --benchmark data/terminal-bench-2.0" in text
