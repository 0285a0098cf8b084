"""The offline verifier shim: run Terminal-Bench style verifiers that download uv/pytest, offline.

What it is: the files in ``reterm/tasks/shim/`` (read its README.md): stand-ins for ``curl`` (uv's
installer URL only), ``uv``/``uvx``, ``apt-get``/``apt`` and the ``pytest-json-ctrf`` option, that use
the pytest preinstalled in the local sandbox's base. How it is wired (no change to the task, to
test.sh, or to how the reward is computed):

1. :func:`shim_dir` copies the files to ``${RETERM_CACHE:-~/.cache/reterm}/tasks/shim-<hash>`` (the
   checkout itself is never mounted into a sandbox);
2. :func:`shim_trial_settings` gives the two Harbor trial settings that activate it: a read-only bind
   mount of that folder at ``/opt/reterm-shim`` (``TrialConfig.environment.mounts``, which the local
   sandbox implements) and ``BASH_ENV=/opt/reterm-shim/activate.sh`` in the **verifier's** environment
   (``TrialConfig.verifier.env``). Bash sources ``BASH_ENV`` when it runs a script, so test.sh (a bash
   script) finds the shim first on its PATH; the agent phase never has ``BASH_ENV``, so the agent does
   not see the shim on PATH.

:func:`shim_reasons` tells from a task's verifier scripts whether (and why) it needs the shim.
Scripts run by ``sh`` (dash) do not read ``BASH_ENV``: such tasks are reported as not covered.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from reterm.tasks.cache import build_once, cache_root, content_hash

SHIM_SOURCE = Path(__file__).parent / "shim"
SHIM_TARGET = "/opt/reterm-shim"
MISSING_LOG = "reterm-shim-missing.txt"

_PATTERNS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"astral\.sh/uv|astral-sh/uv/releases"), "downloads uv's installer"),
    (re.compile(r"(^|[\s;&|(`$])uvx\s"), "runs uvx"),
    (re.compile(r"(^|[\s;&|(`$])uv\s+(run|pip|venv|add|init|sync|tool|python)\b"), "runs uv"),
    (re.compile(r"(^|[\s;&|(`])(apt-get|apt)\s+(update|install)\b"), "runs apt-get (offline: no mirror)"),
]
_PIP_RE = re.compile(r"(^|[\s;&|(`])(pip3?|python3?\s+-m\s+pip)\s+install\b(?![^\n]*--no-index)")


def shim_dir() -> Path:
    """The shim's files, copied once to the cache (content-addressed). Returns the folder to mount."""
    dest = cache_root() / f"shim-{content_hash(SHIM_SOURCE)}"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    return build_once(lambda tmp: shutil.copytree(SHIM_SOURCE, tmp, symlinks=True, ignore=ignore), dest)


def shim_trial_settings() -> tuple[list[dict], dict[str, str]]:
    """Harbor settings that activate the shim for one trial.

    Returns:
        ``(mounts, verifier_env)``: add ``mounts`` to ``TrialConfig.environment.mounts`` and
        ``verifier_env`` to ``TrialConfig.verifier.env``.
    """
    mount = {"type": "bind", "source": str(shim_dir()), "target": SHIM_TARGET, "read_only": True}
    return [mount], {"BASH_ENV": f"{SHIM_TARGET}/activate.sh"}


def _verifier_scripts(task_dir: Path) -> list[Path]:
    tests = task_dir / "tests"
    if not tests.is_dir():
        return []
    return sorted(p for p in tests.rglob("*") if p.is_file() and p.suffix in ("", ".sh", ".bash"))


def shim_reasons(task_dir: Path) -> list[str]:
    """Why the task's verifier needs the offline shim (empty list: it does not).

    Reads ``tests/test.sh`` and the other shell scripts in ``tests/``. A ``pip install`` without
    ``--no-index`` is reported too (the shim cannot serve it; it fails offline unless the package is
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
    """True when the verifier downloads uv / runs uv or apt-get (see :func:`shim_reasons`)."""
    return any(r != "pip install needs the network" for r in shim_reasons(task_dir))


def shim_covered(task_dir: Path) -> bool:
    """True when test.sh runs under bash (``BASH_ENV`` is read); ``#!/bin/sh`` scripts are not covered."""
    test_sh = Path(task_dir) / "tests" / "test.sh"
    first = test_sh.read_text(errors="replace").splitlines()[:1] if test_sh.is_file() else []
    return not first or not first[0].startswith("#!") or "bash" in first[0]
