"""Atomic file writes: the one way the kit writes a file that a kill must never leave half-written.

Each writes a temporary file in the target's folder (so the rename stays on one file system), then
renames it over the target with :func:`os.replace`: a reader sees the old file or the new one, never a
part. The temporary file is removed when writing fails. Parent folders are created.
:func:`atomic_output` is the same rule for anything a library writes to a path of its own (a parquet file,
a model folder): write to the path it yields, and the result replaces the target only when the block ends
without an error.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def default_mode() -> int:
    """``0o666`` less the process's umask: the bits a plain ``open(path, "w")`` gives a new file."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return 0o666 & ~int(line.split()[1], 8)
    except OSError:
        pass
    old = os.umask(0o022)  # no /proc: read the umask by setting it (and putting it back at once)
    os.umask(old)
    return 0o666 & ~old


def write_bytes_atomic(path: str | Path, data: bytes, *, mode: int | None = None, fsync: bool = True) -> Path:
    """Write ``data`` to ``path`` atomically. Returns the path.

    Args:
        mode: permission bits of the new file (default: what ``open()`` would give, ``0o666`` less the
            process's umask, so outputs others should read, cards, records, stats, are not left 0600 as
            :func:`tempfile.mkstemp` makes them).
        fsync: flush the data to disk before the rename (a crash of the machine then leaves the old or
            the new file, not an empty one); off for files that only matter while the machine is up.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            if fsync:
                fh.flush()
                os.fsync(fh.fileno())
        os.chmod(tmp, default_mode() if mode is None else mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_text_atomic(path: str | Path, text: str, *, mode: int | None = None, fsync: bool = True) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically (:func:`write_bytes_atomic`). Returns the path."""
    return write_bytes_atomic(path, text.encode("utf-8"), mode=mode, fsync=fsync)


def write_json_atomic(path: str | Path, obj: Any, *, indent: int | None = 1, fsync: bool = True) -> Path:
    """Write ``obj`` as JSON (UTF-8, non-ASCII kept) to ``path`` atomically. Returns the path.

    Used by every long job so a kill never leaves a half-written file.
    """
    return write_text_atomic(path, json.dumps(obj, indent=indent, ensure_ascii=False), fsync=fsync)


@contextmanager
def atomic_output(path: str | Path, *, directory: bool = False) -> Iterator[Path]:
    """Write a file (or, with ``directory=True``, a folder) at ``path`` atomically.

    Yields a temporary path in ``path``'s folder (``.<name>.<random>.tmp``; with ``directory`` an empty
    folder made there). When the block ends without an error the temporary path replaces ``path``: a file
    through :func:`os.replace`; a folder by moving an existing ``path`` aside, renaming the new one in and
    then deleting the old one (a reader sees the old folder or the new one, never a part). On an error the
    temporary path is removed and ``path`` is left as it was. Parent folders are created.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    if directory:
        tmp.mkdir()
    try:
        yield tmp
        if directory and path.exists():
            old = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.old")
            os.rename(path, old)
            os.rename(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    except BaseException:
        if tmp.is_dir() and not tmp.is_symlink():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)
        raise


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
