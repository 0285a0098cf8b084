"""The error type of task folders, shared by the loader and the dialect converters."""

from __future__ import annotations

from pathlib import Path


class TaskLoadError(ValueError):
    """A task folder that cannot be loaded (or cannot run on the local sandbox).

    Attributes:
        path: the file (or folder) the problem is in.
        problem: what is wrong, in words.
    """

    def __init__(self, path: Path | str, problem: str) -> None:
        self.path = Path(path)
        self.problem = problem
        super().__init__(f"{path}: {problem}")
