"""Whether a task's verifier needs the offline verifier shim, and why (:func:`shim_reasons`).

The shim itself (its files, where it is mounted, how it is activated in the verifier phase only) is
:mod:`reterm.sandbox.shim`; the local sandbox applies it in every Harbor trial. Scripts run by ``sh``
(dash) do not read ``BASH_ENV``: such tasks are reported as not covered (:func:`shim_covered`).
"""

from __future__ import annotations

import re
from pathlib import Path

from reterm.sandbox.shim import MISSING_LOG, SHIM_SOURCE, SHIM_TARGET, shim_dir, shim_trial_settings  # noqa: F401

_PATTERNS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"astral\.sh/uv|astral-sh/uv/releases"), "downloads uv's installer"),
    (re.compile(r"(^|[\s;&|(`$])uvx\s"), "runs uvx"),
    (re.compile(r"(^|[\s;&|(`$])uv\s+(run|pip|venv|add|init|sync|tool|python)\b"), "runs uv"),
    (re.compile(r"(^|[\s;&|(`])(apt-get|apt)\s+(update|install)\b"), "runs apt-get (offline: no mirror)"),
    (re.compile(r"(^|[\s;&|(`])(?<!uv\s)pip3?\s+install\b(?![^\n]*--no-index)"), "runs pip install"),
]
# `python -m pip` starts pip without a command the shim can stand in for
_PIP_RE = re.compile(r"(^|[\s;&|(`])python3?\s+-m\s+pip\s+install\b(?![^\n]*--no-index)")


def _verifier_scripts(task_dir: Path) -> list[Path]:
    tests = task_dir / "tests"
    if not tests.is_dir():
        return []
    return sorted(p for p in tests.rglob("*") if p.is_file() and p.suffix in ("", ".sh", ".bash"))


def shim_reasons(task_dir: Path) -> list[str]:
    """Why the task's verifier needs the offline shim (empty list: it does not).

    Reads ``tests/test.sh`` and the other shell scripts in ``tests/``. A plain ``pip install`` is the shim's
    (pytest from the sandbox, ``--ctrf`` from its plugin); a ``python -m pip install`` without ``--no-index`` is
    reported as needing the network (the shim cannot stand in for it; it fails offline unless the package is
    already installed).
    """
    reasons: list[str] = []
    for path in _verifier_scripts(Path(task_dir)):
        text = path.read_text(errors="replace")
        text = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
        for pattern, why in _PATTERNS:
            if pattern.search(text) and why not in reasons:
                reasons.append(why)
        if _PIP_RE.search(text) and "pip install needs the network" not in reasons:
            reasons.append("pip install needs the network")
    return reasons


def needs_shim(task_dir: Path) -> bool:
    """True when the verifier downloads uv / runs uv, pip or apt-get (see :func:`shim_reasons`)."""
    return any(r != "pip install needs the network" for r in shim_reasons(task_dir))


def shim_covered(task_dir: Path) -> bool:
    """True when test.sh runs under bash (``BASH_ENV`` is read); ``#!/bin/sh`` scripts are not covered."""
    test_sh = Path(task_dir) / "tests" / "test.sh"
    first = test_sh.read_text(errors="replace").splitlines()[:1] if test_sh.is_file() else []
    return not first or not first[0].startswith("#!") or "bash" in first[0]
