"""The tasks a build uses: the train split of a task folder, never the evaluation split.

Reads ``splits.json`` (:func:`reterm.tasks.load_splits`) and Harbor's task model; the evaluation split's
tasks are refused here (a config naming one is an error) and handed to decontamination.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from pathlib import Path

from reterm.data.config import ConfigError, TasksConfig, resolve_path


@dataclass(frozen=True)
class TaskInfo:
    """One task: ``id`` (folder name), its folder, instruction and licence (``[metadata] license``)."""

    id: str
    path: Path
    instruction: str
    license: str


def _license(path: Path) -> str:
    import tomllib

    try:
        meta = tomllib.loads((path / "task.toml").read_text()).get("metadata", {})
    except (OSError, ValueError):
        return "unknown"
    value = meta.get("license") if isinstance(meta, dict) else None
    return str(value).lower() if value else "unknown"


def task_info(path: Path) -> TaskInfo:
    """:class:`TaskInfo` of a Harbor task folder. Raises ``ValueError`` naming the folder if it is none."""
    if not (path / "task.toml").is_file() or not (path / "instruction.md").is_file():
        raise ValueError(f"{path}: not a Harbor task folder (task.toml and instruction.md expected)")
    return TaskInfo(path.name, path.resolve(), (path / "instruction.md").read_text(), _license(path))


def _split_file(cfg: TasksConfig, root: Path) -> Path:
    return resolve_path(cfg.split_file) if cfg.split_file is not None else root / "splits.json"


def select_tasks(cfg: TasksConfig) -> list[TaskInfo]:
    """The tasks of ``cfg.split`` (restricted by ``names``/``max_tasks``), sorted by id.

    Raises:
        ConfigError: no task folder, no split file or split, a pattern matching nothing, or a task
            that is also in the evaluation split (never used for data generation).
    """
    import json

    root = resolve_path(cfg.path)
    if not root.is_dir():
        raise ConfigError(f"tasks.path {cfg.path}: no such folder of tasks")
    split_file = _split_file(cfg, root)
    try:
        splits = json.loads(split_file.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"tasks.split_file {split_file}: cannot read it ({exc})") from exc
    names = splits.get(cfg.split)
    if not isinstance(names, list) or not names:
        raise ConfigError(f"{split_file}: no task list under split {cfg.split!r}")
    held_out = set(splits.get(cfg.eval_split) or []) if cfg.eval_split else set()
    leaked = sorted(set(names) & held_out)
    if leaked:
        raise ConfigError(f"{split_file}: tasks {leaked} are in both {cfg.split!r} and the evaluation split "
                          f"{cfg.eval_split!r}; evaluation tasks are never used for data generation")
    chosen = sorted(names)
    if cfg.names:
        chosen = [n for n in chosen if any(fnmatch.fnmatch(n, p) for p in cfg.names)]
        if not chosen:
            raise ConfigError(f"tasks.names {cfg.names} match no task of split {cfg.split!r}")
    if cfg.max_tasks is not None:
        chosen = chosen[: cfg.max_tasks]
    return [task_info(root / n) for n in chosen]


def check_tasks(tasks: list[TaskInfo], *, local: bool) -> None:
    """Check every task with :func:`reterm.tasks.load_task` before a build starts (instruction, task.toml,
    a verifier that writes a reward, and with ``local`` a Dockerfile the local sandbox can build), so
    a bad task fails the build at once instead of as a traceback in a later stage.

    Raises:
        ConfigError: one line per bad task, each naming its file (and line) and the problem.
    """
    from reterm.tasks.loader import TaskLoadError, load_task

    problems = []
    for t in tasks:
        try:
            load_task(t.path, check_local=local)
        except TaskLoadError as exc:
            problems.append(str(exc))
    if problems:
        raise ConfigError(f"{len(problems)} of the {len(tasks)} tasks cannot be used (fix or leave them out "
                          "with tasks.names):\n  " + "\n  ".join(problems))  # fmt: skip


def eval_tasks(cfg: TasksConfig) -> list[TaskInfo]:
    """The evaluation split's tasks (for decontamination); empty without ``eval_split``."""
    import json

    if not cfg.eval_split:
        return []
    root = resolve_path(cfg.path)
    splits = json.loads(_split_file(cfg, root).read_text())
    return [task_info(root / n) for n in sorted(splits.get(cfg.eval_split) or []) if (root / n).is_dir()]


def benchmark_tasks(folder: Path) -> list[TaskInfo]:
    """Every task folder under ``folder`` (a local copy of Terminal-Bench 2.x: ``<folder>/<task>/``,
    searched two levels deep). Raises ``ConfigError`` when the folder has no tasks."""
    folder = resolve_path(folder)
    found = sorted({p.parent for p in folder.glob("*/instruction.md")} | {p.parent for p in folder.glob("*/*/instruction.md")})
    tasks = []
    for path in found:
        instruction = (path / "instruction.md").read_text(errors="replace")
        tasks.append(TaskInfo(path.name, path, instruction, _license(path)))
    if not tasks:
        raise ConfigError(f"filters.decontamination.terminal_bench {folder}: no task folders (*/instruction.md) found")
    return tasks
