"""The task conversion cache: ``${RETERM_CACHE:-$HOME/.cache/reterm}/tasks``, folders named by content hash and
made in one rename (:func:`build_once`), so that concurrent loaders never see half a folder."""

from __future__ import annotations

import hashlib
import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path


def cache_root() -> Path:
    """Conversion cache: ``${RETERM_CACHE:-$HOME/.cache/reterm}/tasks`` (created)."""
    root = Path(os.environ.get("RETERM_CACHE") or Path.home() / ".cache" / "reterm") / "tasks"
    root.mkdir(parents=True, exist_ok=True)
    return root


def content_hash(folder: Path) -> str:
    """16 hex chars of a sha256 over the relative paths, modes and contents of every file in ``folder``
    (Python bytecode caches left out)."""
    h = hashlib.sha256()
    files = (p for p in folder.rglob("*") if (p.is_file() or p.is_symlink()) and not _is_bytecode(p))
    for path in sorted(files):
        rel = path.relative_to(folder).as_posix()
        h.update(rel.encode() + b"\0")
        if path.is_symlink():
            h.update(b"link:" + os.readlink(path).encode())
        else:
            h.update(oct(path.stat().st_mode & 0o777).encode() + path.read_bytes())
        h.update(b"\0")
    return h.hexdigest()[:16]


def _is_bytecode(path: Path) -> bool:
    return path.suffix == ".pyc" or "__pycache__" in path.parts


def build_once(build: Callable[[Path], object], dest: Path) -> Path:
    """Run ``build(tmp_dir)`` and move the result to ``dest`` in one rename (a folder another process made
    first is kept). Returns ``dest``; nothing is built when it exists."""
    if dest.is_dir():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.parent / f".tmp-{dest.name}-{uuid.uuid4().hex[:6]}"
    try:
        build(tmp)
        try:
            os.rename(tmp, dest)
        except OSError:
            if not dest.is_dir():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest
