"""Split a reference solution (``solution/solve.sh``) into terminal commands, one per step.

The scripted oracle policy types a task's reference solution into a persistent bash session, one
top-level command per step (solve.sh is written as commands that each make sense at a
prompt). A "top-level command" is the shortest run of lines bash itself accepts as complete: a simple
command, a pipeline, an ``if``/``for``/``while`` block, a function, a command with a heredoc (up to its
terminator), or lines joined by a trailing ``\\``, ``&&``, ``||`` or ``|``. Boundaries are validated
with ``bash -n`` on the accumulated lines (own code: neither Harbor nor bash offers a splitter).

Left out: the shebang, blank lines and comment lines between commands, ``set -e``-style option lines
(``set -euo pipefail``...: an error in one typed command must not close the agent's shell), and a
top-level ``exit`` (it would close the session).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from harbor.models.task.task import Task

_SET_RE = re.compile(r"^set\s+([-+][A-Za-z]+(\s+[-+]?[A-Za-z]+)*)\s*(#.*)?$")
_EXIT_RE = re.compile(r"^exit(\s+\d+)?\s*(#.*)?$")
_HEREDOC_EOF = re.compile(r"here-document at line \d+ delimited by end-of-file")


class SolutionSplitError(ValueError):
    """solve.sh has a syntax error or ends inside an unfinished command (message names the file and line)."""


def _complete(text: str) -> bool:
    """True when bash parses ``text`` as complete commands (no open block, quote or heredoc)."""
    stripped = text.rstrip()
    if stripped.endswith("\\") and not stripped.endswith("\\\\"):
        return False
    proc = subprocess.run(["bash", "-n"], input=text, capture_output=True, text=True)
    if proc.returncode != 0:
        return False
    return not _HEREDOC_EOF.search(proc.stderr)


def _syntax_error(text: str) -> str | None:
    proc = subprocess.run(["bash", "-n"], input=text, capture_output=True, text=True)
    if proc.returncode == 0 and not _HEREDOC_EOF.search(proc.stderr):
        return None
    return proc.stderr.strip() or "incomplete command"


def split_commands(script: str, *, source: str = "solve.sh") -> list[str]:
    """Split bash script text into top-level commands (see the module doc).

    Args:
        script: the script's text.
        source: a name for error messages.

    Returns:
        The commands, in order; multi-line commands keep their inner lines (and inner comments).

    Raises:
        SolutionSplitError: the script ends inside an unfinished command or has a syntax error.
    """
    lines = script.splitlines()
    out: list[str] = []
    buf: list[str] = []
    start = 0
    for i, line in enumerate(lines, start=1):
        if not buf:
            s = line.strip()
            if not s or s.startswith("#") or _SET_RE.match(s) or _EXIT_RE.match(s):
                continue
            start = i
        buf.append(line)
        text = "\n".join(buf) + "\n"
        if _complete(text):
            out.append("\n".join(buf).strip("\n"))
            buf = []
    if buf:
        problem = _syntax_error("\n".join(buf) + "\n") or "incomplete command"
        raise SolutionSplitError(f"{source}:{start}: the command starting here never completes ({problem})")
    return out


def solution_steps(task: Task | Path | str) -> list[str]:
    """The reference solution of a task as terminal commands, one per step.

    Args:
        task: a Harbor ``Task``, a :class:`reterm.tasks.loader.LoadedTask`, or a task folder.

    Returns:
        The top-level commands of ``solution/solve.sh`` (see :func:`split_commands`).

    Raises:
        FileNotFoundError: the task has no ``solution/solve.sh``.
        SolutionSplitError: solve.sh cannot be split (file and line named).
    """
    if hasattr(task, "task") and isinstance(task.task, Task):  # LoadedTask
        task = task.task
    if isinstance(task, Task):
        path = task.paths.discovered_solve_path or task.paths.solve_path
    else:
        path = Path(task) / "solution" / "solve.sh"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no reference solution")
    return split_commands(path.read_text(), source=str(path))
