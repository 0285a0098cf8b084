"""The task conversion cache: ``${RETERM_CACHE:-$HOME/.cache/reterm}/tasks``, folders named by content hash and
made in one rename (:func:`reterm.io.build_once`), so that concurrent loaders never see half a folder."""

from __future__ import annotations

import os
from pathlib import Path

from reterm.io import build_once, content_hash  # noqa: F401  (the loaders import them from here)


def cache_root() -> Path:
    """Conversion cache: ``${RETERM_CACHE:-$HOME/.cache/reterm}/tasks`` (created)."""
    root = Path(os.environ.get("RETERM_CACHE") or Path.home() / ".cache" / "reterm") / "tasks"
    root.mkdir(parents=True, exist_ok=True)
    return root
