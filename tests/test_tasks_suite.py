"""The project's task suite (tasks/): size, metadata, splits, categories; `reterm tasks check` (static)."""

import json
import tomllib
from pathlib import Path

import pytest

from reterm.recovery.taxonomy import FAILURE_CATEGORIES
from reterm.tasks import SUITE_DIR, find_task_dirs, load_splits
from reterm.tasks.check import check_path, check_splits, checks_markdown
from reterm.tasks.cli import main as tasks_main

ALLOWED = {c.value for c in FAILURE_CATEGORIES} | {"misread_instruction"}
SUITE_CATEGORIES = {"missing_dependency", "wrong_command", "path_permission", "faulty_implementation",
                    "wrong_state", "timeout_hang", "misread_instruction"}
TASK_DIRS = find_task_dirs(SUITE_DIR)


def _meta(d: Path) -> dict:
    return tomllib.loads((d / "task.toml").read_text())


def test_at_least_thirty_tasks():
    assert len(TASK_DIRS) >= 30


@pytest.mark.parametrize("task_dir", TASK_DIRS, ids=lambda p: p.name)
def test_task_metadata(task_dir):
    cfg = _meta(task_dir)
    m = cfg["metadata"]
    assert cfg["task"]["name"] == f"reterm/{task_dir.name}"
    assert m["difficulty"] in ("easy", "medium", "hard")
    assert m["license"] == "Apache-2.0"
    assert m["error_categories"] and set(m["error_categories"]) <= ALLOWED, m["error_categories"]
    assert m["category"] and m["tags"]
    assert cfg["environment"]["network_mode"] == "no-network"
    assert (task_dir / "solution" / "solve.sh").is_file()
    assert "reward.txt" in (task_dir / "tests" / "test.sh").read_text()


def test_splits_partition_the_suite_and_match_metadata():
    splits = load_splits()
    names = {d.name for d in TASK_DIRS}
    train, test = set(splits["train"]), set(splits["test"])
    assert train | test == names and not train & test
    assert 0.2 <= len(test) / len(names) <= 0.3
    for name in names:
        m = _meta(SUITE_DIR / name)["metadata"]
        assert splits["tasks"][name] == {"categories": m["error_categories"], "difficulty": m["difficulty"]}


def test_every_category_exposed_and_test_split_spread():
    splits = load_splits()
    cats = lambda names: {c for n in names for c in splits["tasks"][n]["categories"]}  # noqa: E731
    assert cats(splits["train"] + splits["test"]) == SUITE_CATEGORIES
    assert cats(splits["test"]) == SUITE_CATEGORIES
    assert {splits["tasks"][n]["difficulty"] for n in splits["test"]} == {"easy", "medium", "hard"}


def test_static_check_of_the_suite_is_clean():
    checks, problems = check_path(SUITE_DIR, build=False, progress=False)
    assert problems == []
    assert [c.name for c in checks if not c.valid] == []
    assert all(c.has_solution and c.categories and not c.shim for c in checks)
    assert f"{len(checks)}/{len(checks)} tasks valid" in checks_markdown(checks, problems)


def test_check_splits_reports_inconsistencies(tmp_path):
    checks, _ = check_path(SUITE_DIR, build=False, progress=False)
    splits = load_splits()
    moved = splits["train"][0]
    splits["test"].append(moved)
    splits["tasks"][splits["train"][1]]["difficulty"] = "impossible"
    (tmp_path / "splits.json").write_text(json.dumps(splits))
    problems = check_splits(tmp_path, checks)
    assert any(f"{moved} is in both train and test" in p for p in problems)
    assert any("difficulty 'impossible'" in p for p in problems)


def test_check_cli_exit_status(capsys):
    assert tasks_main(["check", str(SUITE_DIR / "sqlite-import-csv"), "--no-build", "-q"]) == 0
    assert "1/1 tasks valid" in capsys.readouterr().out
    malformed = Path(__file__).parent / "fixtures" / "dialects" / "malformed"
    assert tasks_main(["check", str(malformed / "no-reward"), "--no-build", "-q"]) == 1
    out = capsys.readouterr().out
    assert "tests/test.sh: never writes /logs/verifier/reward.txt" in out
