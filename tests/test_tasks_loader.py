"""reterm.tasks.loader / tb1: each public dialect fixture loads into Harbor's Task; malformed tasks give
errors that name the file and the problem."""

import shutil
import tomllib
from pathlib import Path

import pytest
from harbor.models.task.task import Task

from reterm.tasks import TaskLoadError, detect_dialect, find_task_dirs, load_task, load_tasks

FIXTURES = Path(__file__).parent / "fixtures" / "dialects"
MALFORMED = FIXTURES / "malformed"


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RETERM_CACHE", str(tmp_path / "cache"))


def test_tb2_task_loads_in_place():
    loaded = load_task(FIXTURES / "tb2-hello")
    assert isinstance(loaded.task, Task)
    assert loaded.dialect == "harbor" and not loaded.converted
    assert loaded.task_dir == (FIXTURES / "tb2-hello").resolve()
    assert loaded.name == "tb2-hello"
    assert loaded.task.config.schema_version == "1.0"  # TB2's `version = "1.0"`
    assert loaded.task.config.environment.memory_mb == 2048  # TB2's legacy `memory = "2G"`
    assert loaded.difficulty == "easy" and loaded.metadata["category"] == "file-operations"
    assert loaded.has_solution
    assert loaded.task.instruction.startswith("Create a file `/app/greeting.txt`")
    assert loaded.instruction == loaded.task.instruction


def test_tb21_schema_and_package_name():
    loaded = load_task(FIXTURES / "tb21-schema")
    assert loaded.task.config.schema_version == "1.1"
    assert loaded.task.name == "fixtures/count-lines"
    assert loaded.name == "count-lines"


def test_tb1_task_converted_with_harbor_mapper(tmp_path):
    loaded = load_task(FIXTURES / "tb1-word-count")
    assert loaded.dialect == "terminal-bench-1" and loaded.converted
    d = loaded.task_dir
    assert d.is_relative_to(tmp_path / "cache" / "tasks" / "terminal-bench-1")
    assert loaded.name == "tb1-word-count"
    assert "distinct words" in loaded.task.instruction
    cfg = loaded.task.config
    assert (cfg.agent.timeout_sec, cfg.verifier.timeout_sec) == (180.0, 60.0)
    assert loaded.metadata["source_dialect"] == "terminal-bench-1" and loaded.difficulty == "easy"
    test_sh = (d / "tests" / "test.sh").read_text()
    assert "/logs/verifier/reward.txt" in test_sh and "$TEST_DIR" not in test_sh
    # the harness-provided scripts the task refers to were written
    assert (d / "tests" / "setup-uv-pytest.sh").is_file() and (d / "tests" / "run-uv-pytest.sh").is_file()
    assert (d / "environment" / "Dockerfile").read_text().count("ENV TEST_DIR=/tests") == 1
    assert (d / "environment" / "words.txt").is_file()
    assert (d / "solution" / "solve.sh").is_file()
    # cached: loading again reuses the folder
    assert load_task(FIXTURES / "tb1-word-count").task_dir == d


def test_tb1_conversion_follows_source_changes(tmp_path):
    src = tmp_path / "src" / "tb1-word-count"
    shutil.copytree(FIXTURES / "tb1-word-count", src)
    first = load_task(src).task_dir
    (src / "words.txt").write_text("kiwi\n")
    second = load_task(src).task_dir
    assert first != second and (second / "environment" / "words.txt").read_text() == "kiwi\n"


def test_tb1_descriptions_and_solution_yaml():
    loaded = load_task(FIXTURES / "tb1-descriptions")
    assert loaded.task.instruction.startswith("Create the directory /app/out")
    solve = (loaded.task_dir / "solution" / "solve.sh").read_text()
    assert "mkdir -p /app/out\ntouch /app/out/done\n" in solve
    assert any("solution.yaml" in n for n in loaded.notes)


def test_generated_task_without_toml_or_solution():
    loaded = load_task(FIXTURES / "termigen-csv-sum")
    assert loaded.dialect == "termigen" and loaded.converted
    assert not loaded.has_solution
    toml = tomllib.loads((loaded.task_dir / "task.toml").read_text())
    assert toml["metadata"]["source_dialect"] == "termigen"
    assert loaded.task.config.agent.timeout_sec == 900.0


def test_harbor_layout_without_solution_is_generated_dialect(tmp_path):
    d = tmp_path / "nosol"
    shutil.copytree(FIXTURES / "tb21-schema", d)
    shutil.rmtree(d / "solution")
    loaded = load_task(d)
    assert loaded.dialect == "termigen" and not loaded.converted and not loaded.has_solution


def test_detect_and_find():
    assert detect_dialect(FIXTURES / "tb2-hello") == "harbor"
    assert detect_dialect(FIXTURES / "tb1-word-count") == "terminal-bench-1"
    assert detect_dialect(FIXTURES / "termigen-csv-sum") == "termigen"
    names = [p.name for p in find_task_dirs(FIXTURES)]
    assert names == ["tb1-descriptions", "tb1-word-count", "tb2-hello", "tb21-schema", "termigen-csv-sum"]
    assert find_task_dirs(FIXTURES / "tb2-hello") == [(FIXTURES / "tb2-hello").resolve()]
    loaded, errors = load_tasks(MALFORMED)
    assert loaded == [] and len(errors) == len(list(MALFORMED.iterdir()))


@pytest.mark.parametrize(
    "folder, file, phrase",
    [
        ("missing-instruction", "instruction.md", "missing: the task has no instruction"),
        ("empty-instruction", "instruction.md", "is empty"),
        ("bad-toml", "task.toml", "invalid TOML: Expected ']' at the end of a table declaration (at line 3"),
        ("bad-field", "task.toml", "[verifier.timeout_sec] Input should be a valid number"),
        ("no-reward", "tests/test.sh", "never writes /logs/verifier/reward.txt or reward.json"),
        ("no-test", "tests/test.sh", "missing: the verifier script"),
        ("unsupported-instruction", "environment/Dockerfile:3", "ONBUILD is not supported by the local sandbox"),
        ("unsupported-base", "environment/Dockerfile:1", "FROM alpine:3.20: the local sandbox's userland is a Debian"),
        ("multi-stage", "environment/Dockerfile:3", "a second FROM (a multi-stage build; the first stage starts at line 1) is not supported"),
        ("incomplete-copy", "environment/vendor/data.tar.gz",
         "missing: its checksum file data.tar.gz.sha256 is here, the file is not"),
        ("lfs-pointer", "environment/weights.pt", "a Git LFS pointer, not the file's content"),
        ("tb1-no-instruction", "task.yaml", "no instruction"),
        ("tb1-bad-yaml", "task.yaml", "invalid YAML (line 3, column 1): found unexpected end of stream"),
    ],
)
def test_malformed_tasks_name_file_and_problem(folder, file, phrase):
    with pytest.raises(TaskLoadError) as info:
        load_task(MALFORMED / folder)
    err = info.value
    assert str(err).startswith(f"{(MALFORMED / folder).resolve()}/{file}: "), str(err)
    assert phrase in err.problem, err.problem


def test_local_check_can_be_skipped():
    # a Dockerfile the local sandbox cannot build is still a valid Harbor task
    loaded = load_task(MALFORMED / "unsupported-base", check_local=False)
    assert loaded.task.config.schema_version == "1.0"


def test_not_a_task_folder(tmp_path):
    with pytest.raises(TaskLoadError, match="not a task folder"):
        load_task(tmp_path)
    with pytest.raises(TaskLoadError, match="not a directory"):
        load_task(tmp_path / "nothing")


def test_a_checksum_file_of_other_files_is_not_an_incomplete_copy(tmp_path):
    # `data.md5` lists files that are all present; only a checksum file naming its own absent sibling refuses
    task = tmp_path / "tb2-hello"
    shutil.copytree(FIXTURES / "tb2-hello", task)
    (task / "environment" / "data.md5").write_text("d41d8cd98f00b204e9800998ecf8427e  Dockerfile\n")
    assert load_task(task).source_dir == task.resolve()
    (task / "environment" / "data.md5").write_text("d41d8cd98f00b204e9800998ecf8427e  data\n")
    with pytest.raises(TaskLoadError, match="missing: its checksum file data.md5 is here"):
        load_task(task)
