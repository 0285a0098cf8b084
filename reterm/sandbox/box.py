"""One running sandbox: overlayfs layers + bubblewrap namespaces + cgroups (the engine under
:class:`reterm.sandbox.local.LocalEnvironment`; Harbor-independent).

Own code: Harbor has no container-engine-free environment and bubblewrap has no "exec into a
running sandbox" or overlay support in the 0.8 release Debian ships.

How one sandbox is laid out (all measured on this machine, see ``bench/sandbox_fork.py``)::

    holder  = unshare --mount (private)        # host process, a private mount namespace that holds
              mount tmpfs   run/<id>/mnt       #   the size-limited writable space (upper, work, shm)
              mount overlay run/<id>/mnt/root  #   lowerdir = snapshot:task layer:base (read-only)
              exec bwrap --unshare-pid,net,ipc,uts,cgroup --as-pid-1 --die-with-parent
    init    = /bin/bash reaper loop, pid 1 of the sandbox (immune to ``kill -9 -1`` from inside)

    exec    = nsenter --mount=<holder> --net/uts/ipc=<init>   # host binaries only
              bwrap --pidns <init> --bind mnt/root / --proc --dev --ro /proc/sys,/sys
                    --cap-drop ALL --cap-add <Docker's default set minus MKNOD, SETFCAP>
              /bin/sh wrapper (cd, user switch with setpriv) -> /bin/bash -c COMMAND

Because the overlay and the tmpfs only exist in the holder's private mount namespace, they vanish
when the holder dies: a killed owner leaves no mounts, only ``run/<id>`` folders and empty cgroups,
which :func:`reterm.sandbox.sweep.sweep` removes. ``--die-with-parent`` ties the sandbox to the
thread that spawned it; spawns go through one long-lived thread so that a short-lived worker thread
(Gradio, thread pools) does not take its sandboxes with it.

Security notes (as real root, without a user namespace, like Docker's default):

* every program from the sandbox's files runs after bwrap dropped capabilities and set
  ``no_new_privs`` (file capabilities and setuid bits grant nothing);
* ``/proc/sys`` and ``/sys`` are read-only, the sandbox has its own ``/proc`` (pid namespace) and a
  minimal ``/dev``; the overlay is mounted ``nodev`` and ``CAP_MKNOD`` is not granted;
* the process environment is built from scratch (nothing of the caller's environment leaks in);
* trials have only a loopback interface (own network namespace); build steps share the host's.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import functools
import itertools
import json
import logging
import os
import queue
import resource
import select
import shlex
import shutil
import signal
import subprocess
import threading
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from reterm.io import write_text_atomic
from reterm.sandbox import rootless
from reterm.sandbox.cgroups import Cgroups, host_budget, open_budget, open_cgroups
from reterm.sandbox.errors import ExecTimeoutError, SandboxError  # noqa: F401  (ExecTimeoutError: re-exported)
from reterm.sandbox.paths import proc_start_time, sub
from reterm.sandbox.preflight import require_capabilities_or_explain, require_root_or_explain

logger = logging.getLogger(__name__)

# Docker's default capability set without CAP_MKNOD (no device nodes: the host's disks) and
# CAP_SETFCAP (no file capabilities). Source: moby oci/caps/defaults.go.
SANDBOX_CAPS: tuple[str, ...] = (
    "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL", "CAP_SETGID",
    "CAP_SETUID", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_NET_RAW", "CAP_SYS_CHROOT",
    "CAP_AUDIT_WRITE",
)  # fmt: skip

# Admission against the host budget (Box._admit, _share_pids).
ADMISSION_TIMEOUT_S = 120.0
MIN_SANDBOX_PIDS = 256
MIN_SANDBOX_MEMORY_MB = 256
# The default pids limit lets this many sandboxes (a GRPO group) run at their cap within the budget.
SANDBOXES_PER_BUDGET = 8
MAX_DEFAULT_PIDS = 4096


def default_pids_max() -> int:
    """The default pids limit of a sandbox: the host budget's pids over :data:`SANDBOXES_PER_BUDGET`,
    at most :data:`MAX_DEFAULT_PIDS` and at least :data:`MIN_SANDBOX_PIDS` (3072 on a host with
    ``kernel.pid_max`` 32768). With more sandboxes running, :func:`_share_pids` lowers it further."""
    pids = host_budget().pids
    if not pids:
        return MAX_DEFAULT_PIDS
    return max(MIN_SANDBOX_PIDS, min(MAX_DEFAULT_PIDS, pids // SANDBOXES_PER_BUDGET))


def _share_pids() -> None:
    """Give every running sandbox of this process a fair share of the budget's pids.

    Each sandbox's pids limit is its request (``BoxSpec.pids_max``), at most the budget over the
    number of running sandboxes (a share of at least :data:`MIN_SANDBOX_PIDS`); limits are rewritten as
    sandboxes start and stop. So the limits add up to the budget at most (beyond
    ``budget / MIN_SANDBOX_PIDS`` sandboxes the floor wins and the budget's own cgroup limit still
    holds the total), and fork bombs in some sandboxes cannot take the others' processes. A limit
    lowered below what a sandbox runs only stops its new forks.
    """
    budget = open_budget()
    total = budget.usage().get("pids_max") if budget is not None else None
    with _live_lock:
        boxes = [b for b in _live.values() if b.cgroups is not None and b.spec.pids_max]
        share = total // max(1, len(boxes)) if total else None
        for b in boxes:
            grant = b.spec.pids_max if share is None else min(b.spec.pids_max, max(MIN_SANDBOX_PIDS, share))
            if grant != b.pids_max or not b._pids_written:
                with contextlib.suppress(OSError):
                    b.cgroups.set_limits(memory_bytes=None, pids_max=grant, cpus=None)
                    b._pids_written = True
                b.pids_max = grant


def budget_usage() -> dict[str, int | None]:
    """What all sandboxes of the host budget use now (:meth:`reterm.sandbox.cgroups.Cgroups.usage` of
    the budget's parent cgroup: ``pids``, ``pids_max``, ``memory_bytes``, ``memory_limit_bytes``...),
    plus ``pids_granted`` by this process's running sandboxes; ``{}`` without cgroups."""
    budget = open_budget()
    if budget is None:
        return {}
    out = budget.usage()
    with _live_lock:
        out["pids_granted"] = sum(b.pids_max or 0 for b in _live.values())
    return out


# Rootless mode without cgroups: each exec's processes carry this variable (see Box._kill_marked).
EXEC_MARKER_VAR = "RETERM_EXEC_ID"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# After the main process exits, how long to keep reading output that background processes might
# still hold open (docker exec returns when the main process exits, too).
DRAIN_AFTER_EXIT_S = 0.2

# Runs on the host inside the new private mount namespace (same pid as the holder), then execs bwrap.
_HOLDER_SCRIPT = r"""
set -e
for f in $RETERM_CG; do echo $$ > "$f"; done
m=$1; shift
if [ -n "$RETERM_TMPFS_SIZE" ]; then
  mount -t tmpfs -o "size=$RETERM_TMPFS_SIZE,mode=0755,nodev,nosuid" reterm-rw "$m"
fi
mkdir -p "$m/upper" "$m/work" "$m/root" "$m/shm"
chmod 1777 "$m/shm"
mount -t overlay -o "$RETERM_OVERLAY" reterm-root "$m/root"
exec "$@"
"""

# Runs on the host: join the sandbox's cgroups, then exec nsenter (a host binary). Every exec'd process
# (the agent's commands, its tmux, the verifier) gets the highest OOM score (raising it needs no
# privilege), so when the sandbox's memory cgroup runs out (a fork bomb, a memory hog) the kernel kills
# those and never the sandbox's holder or init (score 0): otherwise one OOM kill of the holder ends the
# whole sandbox and an agent's own fork bomb reads as an infrastructure fault
# (tests/test_new_user_cases.py).
_EXEC_LAUNCH = (
    'echo 1000 > /proc/self/oom_score_adj 2>/dev/null; '
    'for f in $RETERM_CG; do echo $$ > "$f" || exit 125; done; unset RETERM_CG; exec "$@"'
)

# Runs inside the sandbox with the sandbox's capabilities: cwd, user switch, then the command.
_WRAPPER = r"""
user=$1 dir=$2 sethome=$3; shift 3
if [ -n "$dir" ]; then
  cd -- "$dir" 2>/dev/null || { echo "reterm: cannot change directory to $dir" >&2; exit 126; }
fi
if [ -z "$user" ] || [ "$user" = root ] || [ "$user" = 0 ]; then exec "$@"; fi
user=${user%%:*}
ent=$(getent passwd "$user" 2>/dev/null) || ent=""
if [ -n "$ent" ]; then
  name=${ent%%:*}; rest=${ent#*:}; rest=${rest#*:}; uid=${rest%%:*}; rest=${rest#*:}; gid=${rest%%:*}
  rest=${rest#*:}; rest=${rest#*:}; home=${rest%%:*}
  [ "$sethome" = 1 ] && export HOME="$home"
  export USER="$name" LOGNAME="$name"
  exec setpriv --reuid="$uid" --regid="$gid" --init-groups -- "$@"
fi
case "$user" in *[!0-9]*) echo "reterm: unable to find user $user: no matching entries in passwd file" >&2; exit 126;; esac
exec setpriv --reuid="$user" --regid=0 --clear-groups -- "$@"
"""

# pid 1 of the sandbox: runs the spec's prepare script, reports on stdout, then reaps orphans forever
# (bash reaps any child on SIGCHLD; pid 1 ignores signals it has no handler for, so `kill -9 -1`
# from inside cannot end the sandbox).
_INIT_TEMPLATE = (
    '{{ {prep}\n}} 2>&1; echo "__reterm_ready__ $?"; exec >/dev/null 2>&1 </dev/null; '
    'trap "" TERM INT HUP QUIT USR1 USR2 PIPE; while :; do sleep 86400 & wait $!; done'
)


# Rootless mode, run by pid 1 before the task's prepare script: apt's download sandbox user (_apt)
# does not exist in a one-uid user namespace, so apt keeps root (written once, into the writable layer).
_ROOTLESS_PREPARE = (
    f"[ -e {rootless.APT_SANDBOX_CONF} ] || {{ [ -d /etc/apt/apt.conf.d ] && "
    f"echo '{rootless.APT_SANDBOX_LINE}' > {rootless.APT_SANDBOX_CONF}; }} 2>/dev/null\n"
)
_warned: set[str] = set()


def hosts_file(hostname: str) -> str:
    """The ``/etc/hosts`` Docker writes into a container, with the sandbox's host name on 127.0.1.1 (the
    Debian convention for a host without another address; a sandbox has only ``lo``, or the host's
    interfaces in a build)."""
    return (
        "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\nfe00::0\tip6-localnet\n"
        "ff00::0\tip6-mcastprefix\nff02::1\tip6-allnodes\nff02::2\tip6-allrouters\n"
        f"127.0.1.1\t{hostname}\n"
    )


def _hosts_prepare(hostname: str) -> str:
    """Shell run by pid 1 at every start: give ``/etc/hosts`` Docker's entries when it has no ``localhost``
    line (the debootstrap base has no such file, and a build once left an empty one in its layer), else add
    the host name if it is missing. A file the image or the agent wrote with a localhost line is kept (so
    forks keep the agent's edits); it is a plain file of the writable layer, as storage counts it."""
    content = shlex.quote(hosts_file(hostname))
    name = shlex.quote(hostname)
    return (
        "if ! grep -qsE '^[[:space:]]*127\\.0\\.0\\.1[[:space:]].*\\blocalhost\\b' /etc/hosts; then "
        f"printf %s {content} > /etc/hosts; "
        f"elif ! grep -qsw -- {name} /etc/hosts; then printf '127.0.1.1\\t%s\\n' {name} >> /etc/hosts; fi\n"
    )


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        logger.warning(message)


# Build steps see the host's CA bundle here (and through SSL_CERT_FILE & co): registries behind a
# TLS-intercepting proxy then work as they do on the host. Not part of the layer (a bind mount).
HOST_CA_PATH = "/run/reterm-host-ca.crt"
CA_ENV_VARS = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "PIP_CERT", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO",
               "NODE_EXTRA_CA_CERTS")  # fmt: skip


def host_ca_bundle() -> Path | None:
    """The host's CA bundle (``$SSL_CERT_FILE`` or Debian's), if present."""
    for p in (os.environ.get("SSL_CERT_FILE"), "/etc/ssl/certs/ca-certificates.crt"):
        if p and Path(p).is_file():
            return Path(p).resolve()
    return None


@dataclass
class BoxSpec:
    """What a sandbox is made of.

    Args:
        lowers: read-only layers, top first (e.g. ``[snapshot, task layer, base rootfs]``).
        network: share the host's network namespace (build steps only); False = loopback only.
        upper: a host folder holding ``upper/`` and ``work/`` for a disk-backed writable layer
            (used by builds, whose result is that folder); None = a tmpfs of ``storage_mb``.
        storage_mb: size limit of the tmpfs writable layer (MiB).
        memory_mb / pids_max / cpus: cgroup limits (None = unlimited). Memory counts the tmpfs
            pages the sandbox writes.
        binds: extra host folders ``(host_path, sandbox_path, read_only)``.
        hostname: the sandbox's host name.
        prepare: shell commands pid 1 runs (as the sandbox's root) before the sandbox counts as
            started, e.g. creating Harbor's ``/logs`` folders; a failure fails the start.
    """

    lowers: list[Path]
    network: bool = False
    upper: Path | None = None
    storage_mb: int = 4096
    memory_mb: int | None = 4096
    pids_max: int | None = 4096
    cpus: float | None = None
    binds: list[tuple[str, str, bool]] = field(default_factory=list)
    hostname: str = "sandbox"
    prepare: str = ""


@dataclass
class BoxHealth:
    """A look at a running (or dead) sandbox, from the host. Bytes and counts; ``None`` where unknown.

    ``alive``: the sandbox's init and holder still run (only the host or the harness can end them:
    init ignores signals from inside, the holder lives outside). ``limits_hit``: which of the
    sandbox's own limits it ran into so far, among ``"memory"`` (its cgroup's OOM killer ran),
    ``"pids"`` (a fork was refused at ``pids_max``) and ``"storage"`` (the writable layer is full).
    """

    alive: bool
    limits_hit: list[str] = field(default_factory=list)
    memory_bytes: int | None = None
    memory_peak_bytes: int | None = None
    memory_limit_bytes: int | None = None
    oom_events: int | None = None
    pids: int | None = None
    pids_max: int | None = None
    pids_max_events: int | None = None
    storage_bytes: int | None = None
    storage_limit_bytes: int | None = None


@dataclass
class RawResult:
    """Result of :meth:`Box.run`: exit status and captured bytes (possibly truncated)."""

    return_code: int
    stdout: bytes
    stderr: bytes
    timed_out: bool = False


class _Capped:
    """Keeps the first and last ``limit/2`` bytes of a stream and counts what it dropped."""

    def __init__(self, limit: int | None):
        self.limit = limit
        self.head = bytearray()
        self.tail = bytearray()
        self.dropped = 0

    def add(self, chunk: bytes) -> None:
        if self.limit is None:
            self.head += chunk
            return
        half = self.limit // 2
        room = half - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk
            if len(self.tail) > half:
                self.dropped += len(self.tail) - half
                del self.tail[: len(self.tail) - half]

    def value(self) -> bytes:
        if not self.dropped:
            return bytes(self.head + self.tail)
        note = f"\n[reterm: output truncated, {self.dropped} bytes omitted]\n".encode()
        return bytes(self.head) + note + bytes(self.tail)


class _Spawner:
    """One long-lived thread that forks sandbox holders (``--die-with-parent`` follows the parent
    *thread*; a worker thread that ends must not take its sandboxes with it)."""

    def __init__(self) -> None:
        self._q: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="reterm-sandbox-spawner", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            fn, fut = self._q.get()
            try:
                fut.set_result(fn())
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                fut.set_exception(exc)

    def call(self, fn):
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self._q.put((fn, fut))
        return fut.result()


_spawner: _Spawner | None = None
_spawner_lock = threading.Lock()
_live: dict[str, "Box"] = {}
_live_lock = threading.Lock()


def _get_spawner() -> _Spawner:
    global _spawner
    with _spawner_lock:
        if _spawner is None:
            _spawner = _Spawner()
        return _spawner


@atexit.register
def _close_all_at_exit() -> None:
    with _live_lock:
        boxes = list(_live.values())
    for box in boxes:
        with contextlib.suppress(Exception):
            box.close()


def live_boxes() -> list["Box"]:
    """Sandboxes of this process that are running (for diagnostics and tests)."""
    with _live_lock:
        return list(_live.values())


def _host_tool(name: str) -> str:
    path = rootless.host_tool(name)
    if not path:
        raise SandboxError(f"`{name}` is not installed; run scripts/setup.sh (Debian packages bubblewrap, util-linux)")
    return path


class Box:
    """A running sandbox. Create with :meth:`Box.start`; end with :meth:`close` (idempotent).

    Attributes:
        id: 12 hex chars; the run folder is ``<cache>/sandbox/run/<id>``.
        spec: the :class:`BoxSpec` it was started with.
        mode: ``"root"`` or ``"rootless"`` (:func:`reterm.sandbox.rootless.sandbox_mode` at start).
    """

    def __init__(self, spec: BoxSpec, box_id: str, mode: rootless.Mode = "root"):
        self.id = box_id
        self.spec = spec
        self.mode: rootless.Mode = mode
        self.rundir = sub("run") / box_id
        self.mnt = self.rundir / "mnt"
        self.cgroups: Cgroups | None = None
        self.holder: subprocess.Popen | None = None
        self.init_pid: int | None = None
        self._init_pidfd: int | None = None
        self._ns_fds: dict[str, int] = {}
        self._exec_counter = itertools.count(1)  # thread-safe under the GIL
        # limit events counted in per-exec cgroups already removed (Cgroups.remove)
        self._removed_events: Counter[str] = Counter()
        self._closed = False
        self._close_lock = threading.Lock()
        self.on_close: list[Callable[[], None]] = []
        self.started_at = time.time()
        self.pids_max: int | None = spec.pids_max  # as granted (:func:`_share_pids`)
        self._pids_written = False

    # ------------------------------------------------------------------------------- start
    @classmethod
    def start(cls, spec: BoxSpec, *, timeout: float = 20.0) -> "Box":
        """Mount the layers and start the sandbox's init. Blocking; about 25-35 ms here.

        Runs in root mode or, for users without root (or with ``RETERM_SANDBOX_MODE=rootless``),
        in an unprivileged user namespace (:mod:`reterm.sandbox.rootless`).

        Raises:
            SandboxError: a tool is missing, neither mode is possible here (the message says what is
                missing; checked before anything is created), a mount or bwrap failed (with bwrap's
                message). Nothing is left running or on disk when it raises.
        """
        try:
            mode = rootless.sandbox_mode()
        except ValueError as exc:
            raise SandboxError(f"{exc}. Nothing was started.") from None
        if mode == "root":
            if os.geteuid() != 0:
                require_root_or_explain()
            require_capabilities_or_explain()
        else:
            rootless.require_rootless_or_explain()
        for p in spec.lowers:
            if not Path(p).is_dir():
                raise SandboxError(f"sandbox layer {p} does not exist")
            if any(c in str(p) for c in ":,\\"):
                raise SandboxError(f"sandbox layer path {p} contains ':' ',' or '\\' (overlayfs cannot take it)")
        if mode == "rootless":
            rootless.check_layers_owned(list(spec.lowers))
        box = cls(spec, uuid.uuid4().hex[:12], mode)
        try:
            box._start(timeout)
        except BaseException:
            box.close()
            raise
        return box

    def _start(self, timeout: float) -> None:
        spec = self.spec
        self.mnt.mkdir(parents=True)
        # the owner is on record from the start: admission can wait for the host budget, and a run folder without
        # state.json reads as a crashed start to this process's own checks while another process's sandbox waits
        self._write_state()
        self.cgroups = open_cgroups(f"reterm-{os.getpid()}-{self.id}")
        if self.cgroups is not None:
            self.pids_max = self._admit()
            self.cgroups.set_limits(
                memory_bytes=spec.memory_mb * 2**20 if spec.memory_mb else None,
                pids_max=self.pids_max,
                cpus=spec.cpus,
            )
        elif self.mode == "rootless":
            _warn_once("cgroups are not writable here: rootless sandboxes limit memory and processes with rlimits "
                       "(RLIMIT_DATA per process, RLIMIT_NPROC per sandbox and user); no CPU limit, no freeze "
                       "during snapshots (docs/SANDBOX.md, rootless mode)")
        else:
            logger.warning("cgroups are not writable here: the sandbox runs without memory/pids/cpu limits")
        self._write_state()
        with _live_lock:
            _live[self.id] = self  # (already there when admitted against the host budget)

        if spec.upper is not None:
            (spec.upper / "upper").mkdir(parents=True, exist_ok=True)
            (spec.upper / "work").mkdir(parents=True, exist_ok=True)
            upper, work, tmpfs = spec.upper / "upper", spec.upper / "work", ""
        else:
            upper, work, tmpfs = self.mnt / "upper", self.mnt / "work", f"{int(spec.storage_mb)}m"
        lowerdir = ":".join(str(p) for p in spec.lowers)
        overlay = f"lowerdir={lowerdir},upperdir={upper},workdir={work},index=off,metacopy=off"
        prepare = _hosts_prepare(spec.hostname) + (spec.prepare.strip() or "true")
        if self.mode == "rootless":
            overlay += "," + rootless.USERXATTR
            prepare = _ROOTLESS_PREPARE + prepare
        info_r, info_w = os.pipe()
        argv = [
            _host_tool("unshare"), "--mount", "--propagation", "private", "/bin/sh", "-c", _HOLDER_SCRIPT,
            "sh", str(self.mnt), _host_tool("bwrap"), "--die-with-parent", "--unshare-pid", "--unshare-ipc",
            "--unshare-uts", "--unshare-cgroup-try", "--as-pid-1", "--hostname", spec.hostname,
            "--info-fd", str(info_w),
        ]  # fmt: skip
        if self.mode == "rootless":
            # join the cgroups (if any) on the host side, apply the rlimit fallback, then create the
            # user namespace (the caller becomes its uid 0) together with the private mount namespace
            argv = ["/bin/sh", "-c", _EXEC_LAUNCH, "sh", *self._rlimit_argv(),
                    argv[0], "--user", "--map-root-user", *argv[1:]]  # fmt: skip
        if not spec.network:
            argv.append("--unshare-net")
        init = _INIT_TEMPLATE.format(prep=prepare)
        argv += self._mount_args() + ["--", "/bin/bash", "-c", init]
        env = {
            "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
            "RETERM_CG": " ".join(str(p) for p in (self.cgroups.procs_files() if self.cgroups else [])),
            "RETERM_TMPFS_SIZE": tmpfs,
            "RETERM_OVERLAY": overlay,
        }
        log_path = self.rundir / "init.log"

        def spawn() -> subprocess.Popen:
            with open(log_path, "wb") as log:
                return subprocess.Popen(
                    argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log,
                    pass_fds=(info_w,), close_fds=True, start_new_session=True,
                )  # fmt: skip

        try:
            self.holder = _get_spawner().call(spawn)
        finally:
            os.close(info_w)
        try:
            info = self._read_info(info_r, timeout)
        finally:
            os.close(info_r)
        self.init_pid = int(info["child-pid"])
        self._init_pidfd = os.pidfd_open(self.init_pid)
        for ns in ("net", "uts", "ipc", "pid") + (("user",) if self.mode == "rootless" else ()):
            self._ns_fds[ns] = os.open(f"/proc/{self.init_pid}/ns/{ns}", os.O_RDONLY | os.O_CLOEXEC)
        self._ns_fds["mnt"] = os.open(f"/proc/{self.holder.pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
        self._write_state()
        self._wait_ready(timeout)

    def _wait_ready(self, timeout: float) -> None:
        """Wait for pid 1's ready line (its prepare script ran); raise with its output if it failed."""
        assert self.holder is not None and self.holder.stdout is not None
        fd = self.holder.stdout.fileno()
        buf = b""
        deadline = time.monotonic() + timeout
        try:
            while b"__reterm_ready__" not in buf or not buf.endswith(b"\n"):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise SandboxError(f"sandbox {self.id} did not become ready within {timeout:.0f} s")
                ready, _, _ = select.select([fd], [], [], min(left, 0.05))
                if ready:
                    chunk = os.read(fd, 65536)
                    if not chunk:
                        raise SandboxError(f"sandbox {self.id} died while starting: {buf.decode(errors='replace')} "
                                           f"{self._init_log()}")  # fmt: skip
                    buf += chunk
        finally:
            self.holder.stdout.close()
        out, _, rc = buf.decode(errors="replace").rpartition("__reterm_ready__")
        if rc.strip() != "0":
            raise SandboxError(f"sandbox {self.id}: preparing the sandbox failed (exit {rc.strip()}): {out.strip()}")

    def _read_info(self, fd: int, timeout: float) -> dict:
        buf = b""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise SandboxError(f"sandbox {self.id} did not start within {timeout:.0f} s: {self._init_log()}")
            ready, _, _ = select.select([fd], [], [], min(left, 0.05))
            if ready:
                chunk = os.read(fd, 4096)
                if chunk:
                    buf += chunk
                    with contextlib.suppress(ValueError):
                        return json.loads(buf)
                    continue
                # EOF without JSON: bwrap failed before starting the sandbox
                self.holder.wait(timeout=5)
                raise SandboxError(f"sandbox {self.id} failed to start: {self._init_log()}")
            if self.holder.poll() is not None:
                raise SandboxError(f"sandbox {self.id} failed to start (exit {self.holder.returncode}): {self._init_log()}")

    def _init_log(self) -> str:
        try:
            return (self.rundir / "init.log").read_text(errors="replace").strip()[-2000:] or "(no output)"
        except OSError:
            return "(no output)"

    def _mount_args(self) -> list[str]:
        spec = self.spec
        args = [
            "--bind", str(self.mnt / "root"), "/", "--dev", "/dev", "--bind", str(self.mnt / "shm"), "/dev/shm",
            "--proc", "/proc", "--ro-bind", "/proc/sys", "/proc/sys", "--ro-bind", "/sys", "/sys",
        ]  # fmt: skip
        if spec.network:
            # the host's resolver; /etc/hosts is the sandbox's own (``hosts_file``), as in a Docker build
            if Path("/etc/resolv.conf").exists():
                args += ["--ro-bind", "/etc/resolv.conf", "/etc/resolv.conf"]
            if (ca := host_ca_bundle()) is not None:
                args += ["--ro-bind", str(ca), HOST_CA_PATH]
        for src, dst, ro in spec.binds:
            args += ["--ro-bind" if ro else "--bind", src, dst]
        args += ["--cap-drop", "ALL"]
        for cap in SANDBOX_CAPS:
            args += ["--cap-add", cap]
        return args

    def _rlimit_argv(self) -> list[str]:
        """``prlimit`` arguments for the rootless fallback when cgroups are not writable (else []).

        ``RLIMIT_NPROC`` counts the tasks (threads included) of uid 0 in the sandbox's own user namespace,
        so it caps the whole sandbox like ``pids.max``; the kernel also checks it against every task
        of the user on the host (it counts per user namespace level), so a sandbox at its cap can
        stall the user's other sandboxes. ``RLIMIT_DATA`` caps each process's private memory (not a
        total; the tmpfs is bounded by its size instead). Values never exceed the caller's hard
        limits (raising them needs ``CAP_SYS_RESOURCE``).
        """
        if self.mode != "rootless" or self.cgroups is not None:
            return []
        spec, out = self.spec, [_host_tool("prlimit")]
        memory = spec.memory_mb * 2**20 if spec.memory_mb else None
        for flag, res, value in (("--nproc", resource.RLIMIT_NPROC, spec.pids_max),
                                 ("--data", resource.RLIMIT_DATA, memory)):  # fmt: skip
            if value:
                hard = resource.getrlimit(res)[1]
                v = value if hard == resource.RLIM_INFINITY else min(value, hard)
                out.append(f"{flag}={v}:{v}")
        return out + ["--"] if len(out) > 1 else []

    def _admit(self) -> int | None:
        """Admit this sandbox against the host budget (:func:`reterm.sandbox.cgroups.host_budget`);
        returns the pids limit it gets.

        Memory is admitted by use: the budget's free memory must hold :data:`MIN_SANDBOX_MEMORY_MB`,
        else the start waits up to :data:`ADMISSION_TIMEOUT_S` for sandboxes to end. Pids are shared
        fairly (:func:`_share_pids`): never waiting, so a group that starts together always starts.

        Raises:
            SandboxError: the budget's memory stayed full (an infrastructure fault; nothing was started).
        """
        budget = open_budget()
        deadline = time.monotonic() + ADMISSION_TIMEOUT_S
        while budget is not None:
            usage = budget.usage()
            mem_limit, mem_used = usage.get("memory_limit_bytes"), usage.get("memory_bytes")
            if not (mem_limit and mem_used is not None) or mem_limit - mem_used >= MIN_SANDBOX_MEMORY_MB * 2**20:
                break
            if time.monotonic() > deadline:
                raise SandboxError(
                    f"the host budget for sandboxes stayed full for {ADMISSION_TIMEOUT_S:g} s: "
                    f"{mem_used >> 20} of {mem_limit >> 20} MiB in use. Nothing was started."
                )
            time.sleep(0.1)
        with _live_lock:
            _live[self.id] = self
        _share_pids()
        return self.pids_max

    def _write_state(self) -> None:
        state = {
            "id": self.id,
            "mode": self.mode,
            "owner_pid": os.getpid(),
            "owner_start": proc_start_time(os.getpid()),
            "holder_pid": self.holder.pid if self.holder else None,
            "holder_start": proc_start_time(self.holder.pid) if self.holder else None,
            "init_pid": self.init_pid,
            "cgroups": self.cgroups.to_json() if self.cgroups else None,
            "lowers": [str(p) for p in self.spec.lowers],
            "upper": str(self.spec.upper) if self.spec.upper else None,
            "created": self.started_at,
        }
        write_text_atomic(self.rundir / "state.json", json.dumps(state), fsync=False)

    # -------------------------------------------------------------------------------- exec
    @property
    def alive(self) -> bool:
        """True while the sandbox's init runs."""
        if self._closed or self.holder is None or self.holder.poll() is not None:
            return False
        try:
            signal.pidfd_send_signal(self._init_pidfd, 0)
            return True
        except (ProcessLookupError, OSError):
            return False

    def _exec_argv(self, inner: list[str], pidns_fd: int) -> list[str]:
        fds = self._ns_fds
        # rootless: enter the user namespace first, keeping our ids (the caller is uid 0 in it, and
        # setgroups, which nsenter would call to switch ids, is denied under a one-uid mapping)
        userns = [f"--user=/proc/self/fd/{fds['user']}", "--preserve-credentials"] if "user" in fds else []
        # rootless with the host's network (build steps): that namespace is the host's, which the
        # exec already is in and has no right to re-enter
        net = [] if (userns and self.spec.network) else [f"--net=/proc/self/fd/{fds['net']}"]
        return [
            "/bin/sh", "-c", _EXEC_LAUNCH, "sh", *self._rlimit_argv(), _host_tool("nsenter"), *userns,
            f"--mount=/proc/self/fd/{fds['mnt']}", *net,
            f"--uts=/proc/self/fd/{fds['uts']}", f"--ipc=/proc/self/fd/{fds['ipc']}", "--",
            _host_tool("bwrap"), "--pidns", str(pidns_fd), "--unshare-cgroup-try", *self._mount_args(),
            "--chdir", "/", "--", *inner,
        ]  # fmt: skip

    async def run(
        self,
        inner: list[str],
        *,
        env: dict[str, str],
        timeout: float | None = None,
        stdin: bytes | Path | None = None,
        stdout_to: Path | None = None,
        max_output_bytes: int | None = 8 * 2**20,
        on_output: Callable[[str, str], Awaitable[None]] | None = None,
    ) -> RawResult:
        """Run ``inner`` (an argv, resolved inside the sandbox) as a new process in the sandbox.

        Args:
            inner: argv to run inside (with the sandbox's capabilities, as root).
            env: the complete environment of the process (nothing else is inherited).
            timeout: seconds; on expiry the command's whole process tree is killed and
                ``RawResult.timed_out`` is set.
            stdin: bytes or a host file to feed on standard input (default: /dev/null).
            stdout_to: write standard output to this host file instead of capturing it.
            max_output_bytes: per-stream capture limit (head and tail kept), None = unlimited.
            on_output: async callback ``(text, "stdout"|"stderr")`` for streamed chunks.

        Raises:
            SandboxError: the sandbox is not running.
        """
        if not self.alive:
            raise SandboxError(f"sandbox {self.id} is not running")
        child = self.cgroups.child(f"x{next(self._exec_counter)}") if self.cgroups else None
        cg_files: list[Path] = []
        if self.cgroups:
            if self.cgroups.version == 1:
                cg_files = [d / "cgroup.procs" for r, d in self.cgroups.dirs.items() if r in ("memory", "cpu")]
            cg_files += child.procs_files()
        pidns = os.dup(self._ns_fds["pid"])  # inheritable copy for bwrap --pidns
        pass_fds = (pidns, *self._ns_fds.values())
        argv = self._exec_argv(inner, pidns)
        penv = {**env, "RETERM_CG": " ".join(map(str, cg_files))}
        marker = None
        if child is None and self.mode == "rootless":  # no per-exec cgroup: mark the tree (see _kill_marked)
            marker = f"{self.id}-{next(self._exec_counter)}"
            penv[EXEC_MARKER_VAR] = marker
        stdin_file = None
        try:
            if isinstance(stdin, Path):
                stdin_file = open(stdin, "rb")
            out_file = open(stdout_to, "wb") if stdout_to else None
            try:
                proc = await asyncio.create_subprocess_exec(
                    *argv, env=penv, pass_fds=pass_fds,
                    stdin=stdin_file or (asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL),
                    stdout=out_file or asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                )  # fmt: skip
            finally:
                os.close(pidns)
            if child is not None:
                kill = child.kill_all
            elif marker is not None:
                kill = functools.partial(self._kill_marked, marker, proc.pid)
            else:
                kill = None
            result = await self._collect(proc, stdin if isinstance(stdin, bytes) else None, timeout,
                                         max_output_bytes, on_output, kill)  # fmt: skip
            if out_file:
                out_file.close()
            return result
        finally:
            if stdin_file:
                stdin_file.close()
            if child is not None:
                # only empty ones go; a background daemon keeps its cgroup until close()
                self._removed_events.update(child.remove())

    def _kill_marked(self, marker: str, root_pid: int, rounds: int = 100) -> None:
        """Kill one exec's process tree without cgroups (rootless fallback).

        SIGKILLs, until none is left, every descendant of the exec's host-side process ``root_pid``
        and every process of this sandbox (same pid namespace) whose environment carries
        ``RETERM_EXEC_ID=<marker>``, which reaches double-forked daemons too. A process that replaced
        its whole environment (``env -i``) and left the tree escapes, and lives until the sandbox stops.
        """
        try:
            ns = os.fstat(self._ns_fds["pid"]).st_ino
        except (KeyError, OSError):
            return
        needle = b"\0" + f"{EXEC_MARKER_VAR}={marker}".encode() + b"\0"
        for _ in range(rounds):
            children: dict[int, list[int]] = {}
            marked: set[int] = set()
            for d in os.scandir("/proc"):
                if not d.name.isdigit():
                    continue
                pid = int(d.name)
                try:
                    stat = Path(f"/proc/{pid}/stat").read_text()
                    state, ppid = stat[stat.rindex(")") + 2 :].split()[:2]
                    if state in ("Z", "X"):  # dead already, waiting to be reaped
                        continue
                    children.setdefault(int(ppid), []).append(pid)
                    if pid != self.init_pid and os.stat(f"/proc/{pid}/ns/pid").st_ino == ns:
                        if needle in b"\0" + Path(f"/proc/{pid}/environ").read_bytes():
                            marked.add(pid)
                except (OSError, ValueError, IndexError):
                    continue
            tree, todo = set(), [root_pid]
            while todo:
                for c in children.get(todo.pop(), []):
                    if c not in tree:
                        tree.add(c)
                        todo.append(c)
            victims = (tree | marked) - {self.init_pid}
            if not victims:
                return
            for pid in victims:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.005)

    async def _collect(self, proc, stdin_data, timeout, limit, on_output, kill) -> RawResult:
        out, err = _Capped(limit), _Capped(limit)

        async def pump(stream, buf: _Capped, name: str) -> None:
            if stream is None:
                return
            while True:
                chunk = await stream.read(65536)
                if not chunk:
                    return
                buf.add(chunk)
                if on_output is not None:
                    await on_output(chunk.decode(errors="replace"), name)

        async def feed() -> None:
            if stdin_data is None or proc.stdin is None:
                return
            try:
                for i in range(0, len(stdin_data), 1 << 20):
                    proc.stdin.write(stdin_data[i : i + (1 << 20)])
                    await proc.stdin.drain()
                proc.stdin.close()
            except (BrokenPipeError, ConnectionResetError):
                pass

        readers = [asyncio.ensure_future(pump(proc.stdout, out, "stdout")),
                   asyncio.ensure_future(pump(proc.stderr, err, "stderr"))]  # fmt: skip
        feeder = asyncio.ensure_future(feed())
        timed_out = False
        try:
            await asyncio.wait_for(_wait_exit(proc), timeout=timeout)
        except asyncio.TimeoutError:
            timed_out = True
            if kill is not None:
                await asyncio.to_thread(kill)
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await _wait_exit(proc)
        except BaseException:  # cancelled: do not leave the command running
            if kill is not None:
                await asyncio.to_thread(kill)
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            raise
        finally:
            feeder.cancel()
        # Background processes may hold the pipes open: read what is there, then stop.
        done, pending = await asyncio.wait(readers, timeout=DRAIN_AFTER_EXIT_S)
        for t in pending:
            t.cancel()
        for t in done:
            if t.exception() is not None and not isinstance(t.exception(), asyncio.CancelledError):
                raise t.exception()
        transport = getattr(proc, "_transport", None)
        if transport is not None:  # close our pipe ends (the process has exited; nothing is killed)
            transport.close()
        rc = proc.returncode if proc.returncode is not None else -1
        if rc < 0:
            rc = 128 - rc
        return RawResult(rc, out.value(), err.value(), timed_out)

    def wrap_command(
        self,
        command: str | list[str],
        *,
        user: str | int | None,
        cwd: str | None,
        set_home: bool,
        shell: tuple[str, ...] = ("/bin/bash", "-c"),
    ) -> list[str]:
        """The inner argv running ``command`` as ``user`` (name, uid or ``name:group``) in ``cwd``.

        A string runs through ``shell`` (bash like Harbor's docker exec; builds pass ``/bin/sh -c``
        like ``docker build``); a list runs as an argv (Dockerfile exec form). ``set_home`` sets
        ``HOME`` from the user's passwd entry. Unknown users exit 126 with Docker's message.
        """
        argv = [*shell, command] if isinstance(command, str) else list(command)
        return ["/bin/sh", "-c", _WRAPPER, "sh", "" if user is None else str(user), cwd or "",
                "1" if set_home else "0", *argv]  # fmt: skip

    # -------------------------------------------------------------------- snapshot support
    def copy_upper(self, dest: Path) -> float:
        """Copy the writable layer to host folder ``dest`` (created) while the sandbox is frozen.

        The copy keeps overlay whiteouts and opaque-directory xattrs (``cp -a`` as root), so ``dest``
        can serve as a read-only lower layer. Returns the seconds the sandbox was frozen (or, without
        a cgroup freezer, as in rootless mode on a host without delegated cgroups, the seconds the
        copy took while its processes kept running).

        Raises:
            SandboxError: the copy failed.
        """
        if not self.alive:
            raise SandboxError(f"sandbox {self.id} is not running")
        src = (self.spec.upper / "upper") if self.spec.upper else (self.mnt / "upper")
        dest.mkdir(parents=True, exist_ok=True)
        frozen = self.cgroups.freeze() if self.cgroups else False
        t0 = time.monotonic()
        try:
            # Run cp inside the holder's mount namespace, where the tmpfs is mounted.
            # rootless: enter the sandbox's user namespace first (it owns the mount namespace)
            userns = ([f"--user=/proc/self/fd/{self._ns_fds['user']}", "--preserve-credentials"]
                      if "user" in self._ns_fds else [])
            r = subprocess.run(
                [_host_tool("nsenter"), *userns, f"--mount=/proc/self/fd/{self._ns_fds['mnt']}", "--",
                 "cp", "-a", f"{src}/.", str(dest)],
                pass_fds=(self._ns_fds["mnt"], *([self._ns_fds["user"]] if userns else [])),
                capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"},
            )  # fmt: skip
        finally:
            if frozen:
                self.cgroups.thaw()
        if r.returncode != 0:
            raise SandboxError(f"snapshot copy of sandbox {self.id} failed: {r.stderr.strip()[-1000:]}")
        return time.monotonic() - t0

    def health(self) -> "BoxHealth":
        """Whether the sandbox still runs, what it uses and which of its own limits it ran into.

        Cheap (reads cgroup files and one ``statvfs``); safe to call on a stopped sandbox.
        """
        usage = self.cgroups.usage() if self.cgroups else {}
        for key, n in self._removed_events.items():
            if n:
                usage[key] = (usage.get(key) or 0) + n
        storage_used = storage_size = None
        if self.spec.upper is None and self.holder is not None and self.holder.poll() is None:
            # the tmpfs exists only in the holder's mount namespace, seen through /proc/PID/root
            with contextlib.suppress(OSError):
                st = os.statvfs(f"/proc/{self.holder.pid}/root{self.mnt}")
                storage_size = st.f_blocks * st.f_frsize
                storage_used = (st.f_blocks - st.f_bfree) * st.f_frsize
        hit = []
        if usage.get("oom_events"):
            hit.append("memory")
        pids, pids_max = usage.get("pids"), usage.get("pids_max")
        if usage.get("pids_max_events") or (pids and pids_max and pids >= pids_max - max(8, pids_max // 100)):
            hit.append("pids")
        if storage_size and storage_used is not None and storage_size - storage_used < max(1 << 20, storage_size // 200):
            hit.append("storage")
        return BoxHealth(alive=self.alive, limits_hit=hit, storage_bytes=storage_used, storage_limit_bytes=storage_size,
                         **usage)  # fmt: skip

    def memory_peak_bytes(self) -> int | None:
        """Peak memory of the sandbox (processes + its tmpfs pages), if cgroups are on."""
        if not self.cgroups:
            return None
        d = self.cgroups.dirs.get("memory") or self.cgroups.dirs.get("unified")
        for name in ("memory.max_usage_in_bytes", "memory.peak"):
            with contextlib.suppress(OSError, ValueError):
                return int((d / name).read_text())
        return None

    # -------------------------------------------------------------------------------- stop
    def close(self) -> None:
        """Kill every process of the sandbox, drop its mounts, cgroups and run folder. Idempotent."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        try:
            if self._init_pidfd is not None:
                with contextlib.suppress(OSError):
                    signal.pidfd_send_signal(self._init_pidfd, signal.SIGKILL)
            if self.holder is not None and self.holder.poll() is None:
                with contextlib.suppress(OSError):
                    self.holder.kill()
            if self.cgroups is not None:
                if not self.cgroups.kill_all(timeout=10):
                    logger.warning("sandbox %s: processes survived kill: %s", self.id, self.cgroups.procs())
            if self.holder is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.holder.wait(timeout=10)
            for fd in [*self._ns_fds.values(), *([self._init_pidfd] if self._init_pidfd is not None else [])]:
                with contextlib.suppress(OSError):
                    os.close(fd)
            self._ns_fds.clear()
            self._init_pidfd = None
            if self.cgroups is not None:
                self.cgroups.remove()
            for cb in self.on_close:
                try:
                    cb()
                except Exception:  # noqa: BLE001
                    logger.exception("sandbox %s: close callback failed", self.id)
            _rmtree(self.rundir)
        finally:
            with _live_lock:
                _live.pop(self.id, None)
            with contextlib.suppress(Exception):
                _share_pids()  # its share goes back to the others


async def _wait_exit(proc: asyncio.subprocess.Process) -> int:
    """Wait until ``proc`` exits, not until its pipes close.

    ``Process.wait()`` (Python 3.12) also waits for stdout/stderr to reach EOF, which never happens
    while a background process started by the command holds them open; docker exec returns at the
    main process's exit, and so do we. Uses a pidfd to be woken at exit.
    """
    if proc.returncode is not None:
        return proc.returncode
    loop = asyncio.get_running_loop()
    try:
        fd = os.pidfd_open(proc.pid)
    except (ProcessLookupError, OSError):
        fd = None
    if fd is not None:
        fut = loop.create_future()
        loop.add_reader(fd, lambda: fut.done() or fut.set_result(None))
        try:
            await fut
        finally:
            loop.remove_reader(fd)
            os.close(fd)
    while proc.returncode is None:  # the child watcher reaps it and records the status
        await asyncio.sleep(0.001)
    return proc.returncode


def _rmtree(path: Path) -> None:
    """Remove a run folder; refuses to cross into a mount point (the mounts live elsewhere)."""
    if not path.exists():
        return
    dev = path.stat().st_dev
    for dirpath, dirnames, _ in os.walk(path):
        for dn in dirnames:
            p = Path(dirpath) / dn
            if not p.is_symlink() and p.stat().st_dev != dev:
                raise SandboxError(f"refusing to remove {path}: {p} is a mount point")
    shutil.rmtree(path, ignore_errors=True)
