"""Terminal tasks: load public task dialects into Harbor's model, split reference solutions into steps,
the offline verifier shim, and the ``reterm tasks check|verify`` reports.

Main entry points::

    from reterm.tasks import load_task, load_tasks, solution_steps, TaskLoadError

    loaded = load_task("tasks/sqlite-import-csv")      # LoadedTask: .task (harbor Task), .dialect, ...
    steps = solution_steps(loaded)                     # ["cd /app", "head -3 /data/customers.csv", ...]
    split = load_splits()                              # tasks/splits.json of this project's suite
"""

from __future__ import annotations

import json
from pathlib import Path

from reterm.tasks.loader import (
    DIALECTS,
    LoadedTask,
    TaskLoadError,
    detect_dialect,
    find_task_dirs,
    load_task,
    load_tasks,
)
from reterm.tasks.steps import SolutionSplitError, solution_steps, split_commands

SUITE_DIR = Path(__file__).resolve().parents[2] / "tasks"


def load_splits(path: Path | str | None = None) -> dict:
    """Read ``tasks/splits.json`` of this project's suite (or the given file).

    Returns:
        ``{"train": [names], "test": [names], "tasks": {name: {"categories": [...], "difficulty": str}}}``.
        The test split is never used for data generation or training.

    Raises:
        FileNotFoundError: no such file. ``json.JSONDecodeError``: not JSON.
    """
    path = Path(path) if path is not None else SUITE_DIR / "splits.json"
    return json.loads(path.read_text())


__all__ = [
    "DIALECTS",
    "LoadedTask",
    "SUITE_DIR",
    "SolutionSplitError",
    "TaskLoadError",
    "detect_dialect",
    "find_task_dirs",
    "load_splits",
    "load_task",
    "load_tasks",
    "solution_steps",
    "split_commands",
]
