"""Convert a Terminal-Bench 1 task (``task.yaml`` + ``run-tests.sh``) into Harbor's layout.

The conversion itself is Harbor's own (:class:`harbor.mappers.terminal_bench.TerminalBenchMapper`,
what ``harbor tasks migrate`` runs): ``task.yaml`` -> ``task.toml`` + ``instruction.md``; the
Dockerfile and its build context -> ``environment/``; ``solution.sh`` -> ``solution/solve.sh``;
``run-tests.sh`` -> ``tests/test.sh`` with a suffix that writes ``/logs/verifier/reward.txt`` (1 when
run-tests.sh exits 0, which for the usual ``pytest ... -rA`` ending means every test passed, as
Terminal-Bench 1's pytest parser required); ``$TEST_DIR`` -> ``/tests``.

Before handing the folder to Harbor's mapper, this module fills the gaps that mapper leaves (own code):

- the older ``descriptions: [{key: base, description: ...}]`` form of the instruction;
- ``solution.yaml`` (a list of ``command:`` entries typed into the terminal) -> ``solution.sh``;
- ``setup-uv-pytest.sh`` / ``run-uv-pytest.sh``: Terminal-Bench 1's harness copied these into the
  test folder; tasks reference them but do not ship them. Equivalents are written (they install uv and
  pytest from the internet, so these tasks need the offline verifier shim, see
  :mod:`reterm.tasks.shim`);
- ``metadata.source_dialect = "terminal-bench-1"`` in the resulting ``task.toml``.

Results go to the conversion cache (:func:`reterm.tasks.cache.cache_root` ``/terminal-bench-1/<content hash>/<name>``).
"""

from __future__ import annotations

import contextlib
import io
import shutil
from pathlib import Path

import yaml
from harbor.mappers.terminal_bench import TerminalBenchMapper
from harbor.models.task.config import TaskConfig

from reterm.tasks.cache import build_once, cache_root, content_hash
from reterm.tasks.errors import TaskLoadError

SETUP_UV_PYTEST = """\
#!/bin/bash
# Prepares uv and pytest for the tests, as Terminal-Bench 1's harness did before running run-tests.sh.
# Written by reterm.tasks (the harness's own file is not part of the task); it downloads uv, so offline
# it relies on the reterm verifier shim.
apt-get update > /dev/null 2>&1
apt-get install -y curl > /dev/null 2>&1
curl -LsSf https://astral.sh/uv/0.7.13/install.sh | sh
source "$HOME/.local/bin/env"
uv init
uv add pytest==8.4.1
"""

RUN_UV_PYTEST = """\
#!/bin/bash
# Runs the task's tests with uv's pytest (Terminal-Bench 1 harness convention; written by reterm.tasks).
uv run pytest "$TEST_DIR/test_outputs.py" -rA
"""


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """One line: ``invalid YAML (line L, column C): problem``."""
    mark = getattr(exc, "problem_mark", None)
    where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    context = getattr(exc, "context", None)
    return f"invalid YAML{where}: {problem}" + (f" ({context})" if context else "")


def read_task_yaml(path: Path) -> dict:
    """Parse ``task.yaml`` and return it with a plain ``instruction`` field.

    Raises:
        TaskLoadError: invalid YAML, not a mapping, or no instruction.
    """
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise TaskLoadError(path, _yaml_problem(exc)) from None
    if not isinstance(data, dict):
        raise TaskLoadError(path, "not a YAML mapping of task fields")
    instruction = data.get("instruction")
    if not instruction and isinstance(data.get("descriptions"), list):
        base = [d for d in data["descriptions"] if isinstance(d, dict) and d.get("key", "base") == "base"]
        if base:
            instruction = base[0].get("description")
    if not isinstance(instruction, str) or not instruction.strip():
        raise TaskLoadError(path, "no instruction: neither `instruction` nor a `descriptions` entry with key base")
    data["instruction"] = instruction
    data.pop("descriptions", None)
    return data


def solution_yaml_to_sh(path: Path) -> str:
    """Turn a Terminal-Bench 1 ``solution.yaml`` (``- command: ...`` entries) into a bash script.

    Raises:
        TaskLoadError: invalid YAML or an entry without ``command``.
    """
    try:
        entries = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise TaskLoadError(path, _yaml_problem(exc)) from None
    if not isinstance(entries, list):
        raise TaskLoadError(path, "expected a list of {command: ...} entries")
    lines = ["#!/bin/bash", "# Converted from solution.yaml by reterm.tasks (one entry per command)."]
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or not isinstance(entry.get("command"), str):
            raise TaskLoadError(path, f"entry {i} has no `command` string")
        lines.append(entry["command"].rstrip("\n"))
    return "\n".join(lines) + "\n"


def _stage(source: Path, staging: Path) -> list[str]:
    """Copy ``source`` to ``staging`` and fill what Harbor's mapper does not handle. Returns notes."""
    notes = []
    shutil.copytree(source, staging, symlinks=True)
    data = read_task_yaml(source / "task.yaml")
    (staging / "task.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    if not (source / "run-tests.sh").is_file():
        raise TaskLoadError(source / "run-tests.sh", "missing: Terminal-Bench 1 tasks run their tests with it")
    if (source / "solution.yaml").is_file() and not (source / "solution.sh").is_file():
        (staging / "solution.sh").write_text(solution_yaml_to_sh(source / "solution.yaml"))
        (staging / "solution.yaml").unlink()
        notes.append("solution.yaml converted to solution/solve.sh")
    elif (source / "solution.yaml").is_file():
        (staging / "solution.yaml").unlink()
    run_tests = (source / "run-tests.sh").read_text(errors="replace")
    tests = staging / "tests"
    for name, text in (("setup-uv-pytest.sh", SETUP_UV_PYTEST), ("run-uv-pytest.sh", RUN_UV_PYTEST)):
        if name in run_tests and not (tests / name).exists():
            tests.mkdir(exist_ok=True)
            (tests / name).write_text(text)
            (tests / name).chmod(0o755)
            notes.append(f"tests/{name} (provided by the Terminal-Bench 1 harness) written")
    return notes


def convert_tb1(source: Path) -> tuple[Path, list[str]]:
    """Convert the Terminal-Bench 1 task at ``source`` (cached). Returns ``(harbor_task_dir, notes)``.

    Raises:
        TaskLoadError: invalid task.yaml / solution.yaml, no run-tests.sh, or Harbor's mapper fails
            (for example, no Dockerfile).
    """
    source = Path(source).resolve()
    dest = cache_root() / "terminal-bench-1" / content_hash(source) / source.name
    notes: list[str] = [f"converted with Harbor's TerminalBenchMapper to {dest}"]
    if dest.is_dir():
        return dest, notes + ["(conversion cache hit)"]
    staging_notes: list[str] = []

    def build(tmp: Path) -> None:
        staging = tmp.parent / f"{tmp.name}-src" / source.name
        try:
            staging_notes.extend(_stage(source, staging))
            if not (staging / "docker-compose.yaml").exists():
                # Harbor's mapper needs one; Terminal-Bench 1 tasks without it used a single service
                (staging / "docker-compose.yaml").write_text(
                    "services:\n  client:\n    build:\n      dockerfile: Dockerfile\n"
                )
            if not (staging / "Dockerfile").exists():
                raise TaskLoadError(source / "Dockerfile", "missing: the task defines no environment")
            with contextlib.redirect_stdout(io.StringIO()):
                try:
                    TerminalBenchMapper()._map_task(staging, tmp)
                except TaskLoadError:
                    raise
                except Exception as exc:  # the mapper raises plain exceptions of many kinds
                    raise TaskLoadError(source, f"Harbor's Terminal-Bench mapper failed: {exc}") from None
            config_path = tmp / "task.toml"
            config = TaskConfig.model_validate_toml(config_path.read_text())
            config.metadata = {k: v for k, v in config.metadata.items() if v is not None}
            config.metadata["source_dialect"] = "terminal-bench-1"
            config_path.write_text(config.model_dump_toml())
            (tmp / ".reterm-notes").write_text("\n".join(staging_notes) + "\n")
        finally:
            shutil.rmtree(staging.parent, ignore_errors=True)

    build_once(build, dest)
    notes_file = dest / ".reterm-notes"
    if notes_file.exists():
        notes += [n for n in notes_file.read_text().splitlines() if n]
    return dest, notes
