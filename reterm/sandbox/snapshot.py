"""Snapshots of a sandbox's files: a frozen copy of its writable layer, kept on disk until released.

A snapshot is a folder ``<cache>/sandbox/snapshots/<id>/`` holding ``files/`` (the copied writable
layer, whiteouts included, usable as a read-only overlay layer), ``meta.json`` (the layers below it
and what a new sandbox needs to start from it) and ``leases/`` (one file per running sandbox, or
child snapshot, that uses ``files/`` as a layer). :meth:`Snapshot.release` marks it for deletion;
the folder goes when the last lease does (a layer must not change under a mounted overlay).
Processes are not part of a snapshot (CRIU needs kernel support and privileges a sandbox host may lack): a sandbox
started from one runs a fresh init with the snapshot's files.

Own code: Harbor environments have no snapshot or fork.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from reterm.io import write_text_atomic
from reterm.sandbox.paths import pid_alive, proc_start_time, rmtree_writable, sub


@dataclass
class Snapshot:
    """A stored snapshot (see module doc). Pass it to ``LocalEnvironment.from_snapshot``.

    Attributes:
        id: 12 hex chars.
        path: its folder.
        meta: ``lowers`` (layer folders below ``files``, top first), ``parents`` (snapshot ids
            those layers include), ``created`` (unix time), ``source`` (session id of the
            sandbox it was taken from), ``size_bytes``, ``copy_s`` (seconds the source was frozen),
            ``extra`` (the caller's dict), and the source's environment settings.
    """

    id: str
    path: Path
    meta: dict

    @property
    def files(self) -> Path:
        """The frozen writable layer (a read-only overlay layer)."""
        return self.path / "files"

    @property
    def lowers(self) -> list[Path]:
        """All layers of a sandbox started from this snapshot, top first."""
        return [self.files, *map(Path, self.meta["lowers"])]

    @property
    def released(self) -> bool:
        return (self.path / "released").exists()

    def release(self) -> None:
        """Mark for deletion; the folder is removed now if nothing uses it, else with the last user."""
        if self.path.exists():
            (self.path / "released").touch()
            collect(self.path)

    @classmethod
    def load(cls, ref: str | Path) -> "Snapshot":
        """Load a stored snapshot by id or folder.

        Raises:
            FileNotFoundError: no such snapshot (or it was deleted).
        """
        path = Path(ref) if "/" in str(ref) else sub("snapshots") / str(ref)
        meta_path = path / "meta.json"
        if not meta_path.is_file():
            raise FileNotFoundError(f"no sandbox snapshot at {path}")
        meta = json.loads(meta_path.read_text())
        return cls(meta["id"], path, meta)


def new_snapshot_dir() -> tuple[str, Path]:
    """A fresh, empty snapshot folder (the caller fills ``files/`` and writes meta)."""
    sid = uuid.uuid4().hex[:12]
    path = sub("snapshots") / sid
    (path / "leases").mkdir(parents=True)
    return sid, path


def write_meta(path: Path, meta: dict) -> None:
    write_text_atomic(path / "meta.json", json.dumps(meta, indent=1), fsync=False)


def take_lease(snapshot_dir: Path, name: str | None = None) -> Path:
    """Record that a sandbox of this process uses the snapshot; returns the lease file.

    Raises:
        FileNotFoundError: the snapshot was deleted meanwhile.
    """
    leases = snapshot_dir / "leases"
    if not leases.is_dir():
        raise FileNotFoundError(f"sandbox snapshot {snapshot_dir} was deleted")
    lease = leases / (name or f"{os.getpid()}-{uuid.uuid4().hex[:8]}")
    lease.write_text(json.dumps({"pid": os.getpid(), "start": proc_start_time(os.getpid()), "at": time.time()}))
    return lease


def drop_lease(lease: Path) -> None:
    """Remove a lease and delete its snapshot if it was released and this was the last lease."""
    lease.unlink(missing_ok=True)
    collect(lease.parent.parent)


def _lease_live(lease: Path) -> bool:
    try:
        data = json.loads(lease.read_text())
    except (OSError, ValueError):
        return False
    if "child_snapshot" in data:
        return (sub("snapshots") / data["child_snapshot"] / "meta.json").exists()
    return pid_alive(data.get("pid"), data.get("start"))


def collect(snapshot_dir: Path, *, drop_stale: bool = True) -> bool:
    """Delete a released snapshot without live leases (dropping its leases on parent snapshots).

    Returns True when the folder was deleted.
    """
    if not (snapshot_dir / "released").exists():
        return False
    leases = snapshot_dir / "leases"
    live = []
    for lease in leases.iterdir() if leases.is_dir() else []:
        if _lease_live(lease):
            live.append(lease)
        elif drop_stale:
            lease.unlink(missing_ok=True)
    if live:
        return False
    parents = []
    try:
        parents = json.loads((snapshot_dir / "meta.json").read_text()).get("parents", [])
    except (OSError, ValueError):
        pass
    rmtree_writable(snapshot_dir)
    for pid in parents:
        p = sub("snapshots") / pid
        (p / "leases" / f"snap-{snapshot_dir.name}").unlink(missing_ok=True)
        collect(p)
    return True


def list_snapshots() -> list[Snapshot]:
    """Every stored snapshot (released or not), oldest first."""
    out = []
    for d in sorted(sub("snapshots").iterdir()):
        try:
            out.append(Snapshot.load(d))
        except (FileNotFoundError, ValueError):
            continue
    return sorted(out, key=lambda s: s.meta.get("created", 0))


def dir_size(path: Path) -> int:
    """Bytes of regular files under ``path`` (no symlink following)."""
    total = 0
    for dirpath, _, filenames in os.walk(path):
        for f in filenames:
            try:
                st = os.lstat(os.path.join(dirpath, f))
            except OSError:
                continue
            if not os.path.islink(os.path.join(dirpath, f)):
                total += st.st_size
    return total
