"""Control groups for the local sandbox: memory, process count and CPU limits, freeze, kill-all.

Own code because neither Harbor nor a maintained package offers cgroup v1 *and* v2 handling of this
small surface. Hosts may run cgroups v1 "hybrid" (memory, pids, cpu,
freezer hierarchies writable by root). A cgroup v2-only host is handled through the unified hierarchy
when the controllers are delegated to our cgroup. Where neither is writable (non-root without
delegation), :func:`open_cgroups` returns None and the sandbox falls back to rlimits only.

Each sandbox gets one cgroup per controller, named ``reterm-<sandbox id>`` under the caller's own
cgroup (so the limits of whoever runs us still apply on top). Each ``exec`` gets a child
``x<n>`` in the pids (and freezer) hierarchy so that a timeout can kill exactly that command's
process tree, double-forked daemons included.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
V1_CONTROLLERS = ("memory", "pids", "cpu", "freezer")
# Every sandbox's cgroups live in this parent (under the caller's own cgroup), whose limits are the
# host budget: all sandboxes together never use more memory or pids than it allows.
BUDGET_NAME = "reterm_budget"
HOST_MEMORY_RESERVE = (2 << 30, 0.2)  # kept for the host: at least 2 GiB, at least 20% of its memory
HOST_PIDS_RESERVE = (4096, 0.25)  # kept for the host: at least 4096 pids, at least 25% of its pid space


@dataclass
class HostBudget:
    """What all sandboxes on this host may use together: ``memory_bytes`` and ``pids`` (``None`` where
    unknown). Derived from the machine by :func:`host_budget`."""

    memory_bytes: int | None
    pids: int | None


def host_budget() -> HostBudget:
    """The host budget for sandboxes, derived from the machine and the caller's own cgroup limits.

    Memory: the host's ``MemTotal`` (or the caller's memory cgroup limit, if lower) less
    :data:`HOST_MEMORY_RESERVE`. Pids: the smaller of ``kernel.pid_max`` and ``kernel.threads-max``
    (threads count as pids; or the caller's ``pids.max``, if lower) less :data:`HOST_PIDS_RESERVE`.
    So a group of fork bombs or memory hogs always leaves the host room to start processes.
    """
    mem = None
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem = int(line.split()[1]) * 1024
    pid_space = [v for v in (_read_int(Path("/proc/sys/kernel/pid_max")),
                             _read_int(Path("/proc/sys/kernel/threads-max"))) if v]  # fmt: skip
    pids = min(pid_space) if pid_space else None
    own = _own_cgroups()
    if (CGROUP_ROOT / "memory").is_dir():
        own_mem = _read_int(CGROUP_ROOT / "memory" / own.get("memory", "/").lstrip("/") / "memory.limit_in_bytes")
        own_pids = _read_int(CGROUP_ROOT / "pids" / own.get("pids", "/").lstrip("/") / "pids.max")
    else:
        d = CGROUP_ROOT / own.get("", "/").lstrip("/")
        own_mem, own_pids = _read_int(d / "memory.max"), _read_int(d / "pids.max")
    if mem and own_mem and own_mem < mem:
        mem = own_mem
    if pids and own_pids and own_pids < pids:
        pids = own_pids
    if mem:
        mem -= max(HOST_MEMORY_RESERVE[0], int(mem * HOST_MEMORY_RESERVE[1]))
    if pids:
        pids -= max(HOST_PIDS_RESERVE[0], int(pids * HOST_PIDS_RESERVE[1]))
    return HostBudget(memory_bytes=mem if mem and mem > 0 else None, pids=pids if pids and pids > 0 else None)


def _own_cgroups() -> dict[str, str]:
    """Map controller name (or ``""`` for the v2 unified hierarchy) to this process's cgroup path."""
    out: dict[str, str] = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for c in controllers.split(",") if controllers else [""]:
            out[c] = path
    return out


@dataclass
class Cgroups:
    """The cgroups of one sandbox (or of one exec inside it).

    ``dirs`` maps a role (``memory``, ``pids``, ``cpu``, ``freezer`` on v1; ``unified`` on v2) to the
    cgroup folder. ``version`` is 1 or 2.
    """

    version: int
    dirs: dict[str, Path] = field(default_factory=dict)

    # ----------------------------------------------------------------------------- creation
    def child(self, name: str) -> "Cgroups":
        """A child cgroup for one exec: pids + freezer on v1 (the others are inherited), unified on v2."""
        roles = ("pids", "freezer") if self.version == 1 else ("unified",)
        dirs = {}
        for role in roles:
            if role in self.dirs:
                d = self.dirs[role] / name
                d.mkdir(exist_ok=True)
                dirs[role] = d
        return Cgroups(self.version, dirs)

    def procs_files(self) -> list[Path]:
        """The ``cgroup.procs`` files a new process writes its pid into to join every hierarchy."""
        return [d / "cgroup.procs" for d in self.dirs.values()]

    def set_limits(self, *, memory_bytes: int | None, pids_max: int | None, cpus: float | None) -> None:
        """Apply limits (None leaves a limit unset). Memory includes tmpfs pages the sandbox writes."""
        if self.version == 1:
            if memory_bytes and "memory" in self.dirs:
                _write(self.dirs["memory"] / "memory.limit_in_bytes", str(memory_bytes))
                # no swap here; where swap exists, cap memory+swap at the same value
                sw = self.dirs["memory"] / "memory.memsw.limit_in_bytes"
                if sw.exists():
                    _write(sw, str(memory_bytes), missing_ok=True)
            if pids_max and "pids" in self.dirs:
                _write(self.dirs["pids"] / "pids.max", str(pids_max))
            if cpus and "cpu" in self.dirs:
                _write(self.dirs["cpu"] / "cpu.cfs_period_us", "100000")
                _write(self.dirs["cpu"] / "cpu.cfs_quota_us", str(max(1000, int(cpus * 100000))))
        else:
            d = self.dirs["unified"]
            if memory_bytes:
                _write(d / "memory.max", str(memory_bytes), missing_ok=True)
                _write(d / "memory.swap.max", "0", missing_ok=True)
            if pids_max:
                _write(d / "pids.max", str(pids_max), missing_ok=True)
            if cpus:
                _write(d / "cpu.max", f"{max(1000, int(cpus * 100000))} 100000", missing_ok=True)

    # ------------------------------------------------------------------------------ usage
    def usage(self) -> dict[str, int | None]:
        """What the sandbox uses and whether it ran into its own limits (``None`` where unreadable).

        Keys: ``memory_bytes``, ``memory_peak_bytes``, ``memory_limit_bytes``, ``oom_events`` (times
        the cgroup's own limit forced the OOM killer: v1 ``memory.oom_control`` ``oom_kill``, v2
        ``memory.events`` ``oom``), ``pids``, ``pids_max``, ``pids_max_events`` (forks refused at the
        cap: ``pids.events`` ``max``).
        """
        out: dict[str, int | None] = dict.fromkeys(
            ("memory_bytes", "memory_peak_bytes", "memory_limit_bytes", "oom_events", "pids", "pids_max",
             "pids_max_events"))  # fmt: skip
        if self.version == 1:
            mem, pids = self.dirs.get("memory"), self.dirs.get("pids")
            files = {"memory_bytes": (mem, "memory.usage_in_bytes"),
                     "memory_peak_bytes": (mem, "memory.max_usage_in_bytes"),
                     "memory_limit_bytes": (mem, "memory.limit_in_bytes"), "pids": (pids, "pids.current"),
                     "pids_max": (pids, "pids.max")}  # fmt: skip
        else:
            d = self.dirs.get("unified")
            files = {"memory_bytes": (d, "memory.current"), "memory_peak_bytes": (d, "memory.peak"),
                     "memory_limit_bytes": (d, "memory.max"), "pids": (d, "pids.current"), "pids_max": (d, "pids.max")}
        for key, (folder, name) in files.items():
            if folder is not None:
                out[key] = _read_int(folder / name)
        for key, (role, name, field_name) in _EVENT_FILES[self.version].items():
            folder = self.dirs.get(role)
            if folder is not None and folder.is_dir():
                # a refused fork is counted where it was tried: in the per-exec child cgroups too
                subtree = (folder, *(p for p in folder.rglob("*") if p.is_dir()))
                counts = [_read_field(d / name, field_name) for d in subtree]
                known = [c for c in counts if c is not None]
                out[key] = sum(known) if known else None
        return out

    # ------------------------------------------------------------------------------ control
    def procs(self) -> set[int]:
        """Pids of every process in these cgroups and their descendants' cgroups."""
        pids: set[int] = set()
        for d in self.dirs.values():
            for sub in [d, *[p for p in d.rglob("*") if p.is_dir()]] if d.exists() else []:
                try:
                    pids.update(int(x) for x in (sub / "cgroup.procs").read_text().split())
                except OSError:
                    pass
        return pids

    def freeze(self) -> bool:
        """Freeze every process (v1 freezer or v2 cgroup.freeze). Returns False if unsupported."""
        if self.version == 1 and "freezer" in self.dirs:
            _write(self.dirs["freezer"] / "freezer.state", "FROZEN")
            for _ in range(1000):
                if (self.dirs["freezer"] / "freezer.state").read_text().strip() == "FROZEN":
                    return True
                time.sleep(0.001)
            return True
        if self.version == 2 and (self.dirs["unified"] / "cgroup.freeze").exists():
            _write(self.dirs["unified"] / "cgroup.freeze", "1")
            return True
        return False

    def thaw(self) -> None:
        """Undo :meth:`freeze`."""
        if self.version == 1 and "freezer" in self.dirs:
            _write(self.dirs["freezer"] / "freezer.state", "THAWED", missing_ok=True)
        elif self.version == 2 and (self.dirs["unified"] / "cgroup.freeze").exists():
            _write(self.dirs["unified"] / "cgroup.freeze", "0", missing_ok=True)

    def kill_all(self, timeout: float = 5.0) -> bool:
        """SIGKILL every process in these cgroups (frozen first so none can fork meanwhile).

        Returns True when the cgroups are empty afterwards (within ``timeout`` seconds).
        """
        deadline = time.monotonic() + timeout
        if self.version == 2 and (self.dirs["unified"] / "cgroup.kill").exists():
            _write(self.dirs["unified"] / "cgroup.kill", "1", missing_ok=True)
        while True:
            frozen = self.freeze()
            pids = self.procs()
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            if frozen:
                self.thaw()
            if not pids:
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)

    def remove(self) -> dict[str, int]:
        """Remove the cgroup folders (children first). Non-empty ones are left (and reported by sweep).

        Returns the limit events counted in the folders removed (``oom_events``, ``pids_max_events``,
        as :meth:`usage`): a refused fork is counted in the cgroup where it was tried, so a parent
        that keeps counting a removed per-exec child's events must add these.
        """
        gone = dict.fromkeys(_EVENT_FILES[self.version], 0)
        for role, d in self.dirs.items():
            if not d.exists():
                continue
            events = {key: (name, field) for key, (r, name, field) in _EVENT_FILES[self.version].items() if r == role}
            for sub in [*sorted((p for p in d.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)), d]:
                counts = {key: _read_field(sub / name, field) or 0 for key, (name, field) in events.items()}
                if _rmdir(sub):
                    for key, n in counts.items():
                        gone[key] += n
        return gone

    def to_json(self) -> dict:
        return {"version": self.version, "dirs": {k: str(v) for k, v in self.dirs.items()}}

    @classmethod
    def from_json(cls, data: dict) -> "Cgroups":
        return cls(int(data["version"]), {k: Path(v) for k, v in data["dirs"].items()})


def _read_int(path: Path) -> int | None:
    """An integer cgroup file (``max`` reads as None)."""
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _read_field(path: Path, name: str) -> int | None:
    """The value of ``name`` in a flat-keyed cgroup file (``key value`` per line)."""
    try:
        for line in path.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == name and value.strip().isdigit():
                return int(value)
    except OSError:
        return None
    return None


def _write(path: Path, value: str, missing_ok: bool = False) -> None:
    try:
        path.write_text(value)
    except FileNotFoundError:
        if not missing_ok:
            raise


# limit events (Cgroups.usage, Cgroups.remove), per cgroup version: key -> (hierarchy role, file, field)
_EVENT_FILES = {
    1: {"oom_events": ("memory", "memory.oom_control", "oom_kill"), "pids_max_events": ("pids", "pids.events", "max")},
    2: {"oom_events": ("unified", "memory.events", "oom"), "pids_max_events": ("unified", "pids.events", "max")},
}


def _rmdir(path: Path) -> bool:
    """Remove an (empty) cgroup folder, retrying briefly on EBUSY right after its last process exits;
    True when it is gone.

    A cgroup that still holds processes (an exec that left ``server &`` or tmux running) is left in
    place at once, without retrying: it is removed with the sandbox (``Cgroups.remove`` after
    ``kill_all``) or by the sweep. Retrying there would block the event loop ~0.5 s per exec.
    """
    for _ in range(50):
        try:
            path.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError:  # EBUSY: still populated, or right after the last process exits
            try:
                if (path / "cgroup.procs").read_text().strip():
                    return False
            except OSError:
                return False
            time.sleep(0.01)
    return False


_budget: Cgroups | None = None


def open_budget() -> Cgroups | None:
    """The parent cgroups of every sandbox (:data:`BUDGET_NAME` under the caller's own cgroups) with
    the limits of :func:`host_budget`, created on first use (``None`` where cgroups are not writable).

    Shared by every process of the same cgroup (the limits are rewritten with the same values).
    """
    global _budget
    if _budget is not None and all(d.is_dir() for d in _budget.dirs.values()):
        return _budget
    own = _own_cgroups()
    budget = host_budget()
    try:
        if (CGROUP_ROOT / "memory").is_dir() and (CGROUP_ROOT / "pids").is_dir():
            dirs = {}
            for ctrl in V1_CONTROLLERS:
                if (CGROUP_ROOT / ctrl).is_dir():
                    d = CGROUP_ROOT / ctrl / own.get(ctrl, "/").lstrip("/") / BUDGET_NAME
                    d.mkdir(exist_ok=True)
                    dirs[ctrl] = d
            cg = Cgroups(1, dirs)
        elif (CGROUP_ROOT / "cgroup.controllers").exists():
            parent = CGROUP_ROOT / own.get("", "/").lstrip("/")
            enabled = (parent / "cgroup.subtree_control").read_text().split()
            if not {"memory", "pids"} <= set(enabled):
                return None
            d = parent / BUDGET_NAME
            d.mkdir(exist_ok=True)
            _write(d / "cgroup.subtree_control", " ".join(f"+{c}" for c in ("memory", "pids", "cpu") if c in enabled))
            cg = Cgroups(2, {"unified": d})
        else:
            return None
        cg.set_limits(memory_bytes=budget.memory_bytes, pids_max=budget.pids, cpus=None)
    except OSError:
        return None
    _budget = cg
    return cg


def open_cgroups(name: str) -> Cgroups | None:
    """Create the cgroups of sandbox ``name`` (``reterm-<id>``), or None where cgroups are not writable.

    v1: one folder per controller in :data:`V1_CONTROLLERS` that is mounted and writable, under the
    host budget's parent (:func:`open_budget`), else under this process's own cgroup of that
    controller. v2: one folder there when it delegates the memory and pids controllers.
    """
    own = _own_cgroups()
    budget = open_budget()
    if (CGROUP_ROOT / "memory").is_dir() and (CGROUP_ROOT / "pids").is_dir():
        dirs: dict[str, Path] = {}
        try:
            for ctrl in V1_CONTROLLERS:
                base = CGROUP_ROOT / ctrl
                if not base.is_dir():
                    continue
                parent = budget.dirs[ctrl] if budget and ctrl in budget.dirs else base / own.get(ctrl, "/").lstrip("/")
                d = parent / name
                d.mkdir(exist_ok=True)
                dirs[ctrl] = d
        except OSError:
            for d in dirs.values():
                _rmdir(d)
            return None
        return Cgroups(1, dirs)
    if (CGROUP_ROOT / "cgroup.controllers").exists():
        parent = budget.dirs["unified"] if budget else CGROUP_ROOT / own.get("", "/").lstrip("/")
        try:
            enabled = (parent / "cgroup.subtree_control").read_text().split()
            if not {"memory", "pids"} <= set(enabled):
                return None
            d = parent / name
            d.mkdir(exist_ok=True)
            return Cgroups(2, {"unified": d})
        except OSError:
            return None
    return None


def find_leftover_cgroups(prefix: str = "reterm-") -> list[Path]:
    """Folders named ``<prefix>*`` anywhere in the cgroup hierarchies (for the sweep), deepest first."""
    found: list[Path] = []
    roots = [CGROUP_ROOT / c for c in V1_CONTROLLERS if (CGROUP_ROOT / c).is_dir()]
    if (CGROUP_ROOT / "cgroup.controllers").exists():
        roots = [CGROUP_ROOT]
    for root in roots:
        for dirpath, dirnames, _ in os.walk(root):
            for dn in list(dirnames):
                if dn.startswith(prefix):
                    found.append(Path(dirpath) / dn)
                    dirnames.remove(dn)
    return found
