"""The data of one recovery drill instance and of a drill family.

A drill is a very small terminal task made for small models: a one- or two-sentence instruction, an
environment of a few files, a verifier of plain bash checks, a reference solution of 1 to 4 commands,
and the family's natural first mistake (a command that fails with a clear message) in one error
category of :mod:`reterm.recovery.taxonomy`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Callable

from reterm.recovery.taxonomy import Category, parse_category


@dataclass(frozen=True)
class EnvFile:
    """A file of the drill's environment: its content and permission bits (``0o644`` or ``0o755``)."""

    content: bytes | str
    mode: int = 0o644

    @property
    def data(self) -> bytes:
        return self.content.encode() if isinstance(self.content, str) else self.content


@dataclass(frozen=True)
class Check:
    """One verifier check: a bash condition (exit 0 = passed) and the message printed when it fails."""

    condition: str
    message: str


@dataclass(frozen=True)
class Drill:
    """One generated drill instance (everything needed to write its Harbor task folder).

    Attributes:
        family: the family id (``mkdir-parent``...).
        category: the error category id of the natural first mistake (a failure category of
            :class:`reterm.recovery.taxonomy.Category`).
        instruction: what the agent is told (1-2 sentences).
        files: absolute sandbox path -> :class:`EnvFile`, copied into the environment at build time.
        run: shell commands run at build time after the files are copied (Dockerfile ``RUN``).
        checks: the verifier's checks; reward 1 when all pass.
        solution: the reference solution, 1 to 4 top-level commands.
        first_mistake: the family's natural wrong first command (it fails and leaves the task undone).
        mistake_signal: a substring of the first mistake's output (stdout + stderr) that shows the error.
        topic: Terminal-Bench style topic (``[metadata].category``).
        tags: free keywords.
        mistake_timeout_s: seconds after which the first mistake counts as hanging (timeout_hang
            families: the mistake never returns on its own).
        test_files: more files of the verifier (``tests/<name>``: text), e.g. hidden checks.
        recovery: the commands (1 to 4) that finish the task from the state the first mistake leaves;
            ``None``: the solution does (see :attr:`recovery_commands`).
        stages: the chained hurdles of a multi-stage drill (:mod:`reterm.drills.multistage`); each stage has
            1 to 4 commands of the solution.
        parts: a multi-stage drill's stages in order, each ``{"family", "solution", "first_mistake",
            "recovery"}`` (commands as lists of strings): what the multi-stage records of the SFT data are typed
            from (:mod:`reterm.data.drills`). Empty for a single-stage drill.
    """

    family: str
    category: str
    instruction: str
    files: dict[str, EnvFile]
    checks: list[Check]
    solution: list[str]
    first_mistake: str
    mistake_signal: str
    topic: str = "system-administration"
    tags: list[str] = field(default_factory=list)
    run: list[str] = field(default_factory=list)
    mistake_timeout_s: float | None = None
    test_files: dict[str, str] = field(default_factory=dict)
    recovery: list[str] | None = None
    stages: int = 1
    parts: list[dict[str, Any]] = field(default_factory=list)
    stage_checks: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        cat = parse_category(self.category)
        if not cat.is_failure:
            raise ValueError(f"drill family {self.family}: {self.category!r} is not a failure category")
        most = 4 * self.stages
        if self.stages < 1 or not 1 <= len(self.solution) <= most:
            raise ValueError(f"drill family {self.family}: solution has {len(self.solution)} commands (1 to {most})")
        if self.recovery is not None and not 1 <= len(self.recovery) <= most:
            raise ValueError(f"drill family {self.family}: recovery has {len(self.recovery)} commands (1 to {most})")
        if self.stage_checks and (len(self.stage_checks) != self.stages or sum(self.stage_checks) != len(self.checks)
                                  or min(self.stage_checks) < 1):  # fmt: skip
            raise ValueError(f"drill family {self.family}: stage_checks {self.stage_checks} do not split "
                             f"{len(self.checks)} checks into {self.stages} stages")
        for path in self.files:
            if not path.startswith("/") or ".." in path.split("/"):
                raise ValueError(f"drill family {self.family}: environment path {path!r} is not absolute and clean")


    @property
    def recovery_commands(self) -> list[str]:
        """The reference recovery after the first mistake: :attr:`recovery`, else the solution."""
        return list(self.recovery if self.recovery is not None else self.solution)


@dataclass(frozen=True)
class Family:
    """A drill family: ``make(rng)`` returns one :class:`Drill`; ``summary`` says what it drills."""

    name: str
    category: Category
    make: Callable[[random.Random], Drill]
    summary: str
