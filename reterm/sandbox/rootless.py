"""Which mode the local sandbox runs in (root or rootless), and what the rootless mode needs.

The requirement: the sandbox "works as root (as on CI) and, for users without root, through unprivileged
user namespaces (bubblewrap's usual mode, overlayfs inside a user namespace); where neither is
possible it fails at start with a message saying what is missing, never half-started".

``RETERM_SANDBOX_MODE`` chooses: ``auto`` (default: ``root`` when the process runs as uid 0, else
``rootless``), ``root`` or ``rootless`` (also as root, e.g. to test the rootless path on CI).

Rootless mode (measured on a 6.18 kernel with ``user.max_user_namespaces`` > 0 and no ``uidmap``):
each sandbox's holder runs ``unshare --user --map-root-user --mount`` (the caller becomes uid 0 of
a new user namespace; only that one uid is mapped), mounts the writable tmpfs and the overlay
(``userxattr``: opaque folders are ``user.overlay.*`` xattrs, as the kernel requires for overlayfs
in a user namespace) inside it and execs bubblewrap there, with the same flags as in root mode.
The user namespace is made by ``unshare`` rather than by bubblewrap's ``--unshare-user`` because the
overlay must be mounted inside it before bubblewrap starts (bubblewrap 0.8 has no overlay support),
and execs join it with ``nsenter --user``. What differs from root mode (one uid; rlimits instead of
cgroups where the user cannot create cgroups; no freezer for snapshots; a per-user base) is listed in
docs/SANDBOX.md ("Rootless mode"). Own code, like the root mode (bubblewrap has no way to enter
a running sandbox).
"""

from __future__ import annotations

import functools
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Literal

from reterm.sandbox.errors import SandboxError

MODE_ENV = "RETERM_SANDBOX_MODE"
Mode = Literal["root", "rootless"]

# The overlay mount options of rootless mode (see module doc); index/metacopy must stay off with userxattr.
USERXATTR = "userxattr"
# Written into the sandbox by pid 1 (when missing) under a single-uid mapping: apt would otherwise
# switch to its _apt user for downloads, which does not exist in a one-uid user namespace.
APT_SANDBOX_CONF = "/etc/apt/apt.conf.d/00reterm-rootless"
APT_SANDBOX_LINE = 'APT::Sandbox::User "root";'


def sandbox_mode() -> Mode:
    """The mode new sandboxes of this process start in (``RETERM_SANDBOX_MODE``, see module doc).

    Raises:
        ValueError: ``RETERM_SANDBOX_MODE`` holds something else than auto, root or rootless.
    """
    value = (os.environ.get(MODE_ENV) or "auto").strip().lower()
    if value == "auto":
        return "root" if os.geteuid() == 0 else "rootless"
    if value in ("root", "rootless"):
        return value  # type: ignore[return-value]
    raise ValueError(f"{MODE_ENV}={value!r}: expected auto, root or rootless")


def host_tool(name: str) -> str | None:
    """Absolute path of a host program (system folders first, then ``$PATH``), or None.

    ``RETERM_BWRAP`` overrides the path of ``bwrap`` (another bubblewrap build; tests use a
    missing one to check the refusal).
    """
    if name == "bwrap" and os.environ.get("RETERM_BWRAP"):
        p = os.environ["RETERM_BWRAP"]
        return p if os.path.isfile(p) and os.access(p, os.X_OK) else None
    return shutil.which(name, path="/usr/bin:/bin:/usr/sbin:/sbin:" + os.environ.get("PATH", ""))


_TOOLS = {"bwrap": "bubblewrap", "unshare": "util-linux", "nsenter": "util-linux", "prlimit": "util-linux"}


def userns_sysctl_problems(proc_sys: Path = Path("/proc/sys")) -> list[str]:
    """Kernel settings that forbid unprivileged user namespaces, read from ``proc_sys``.

    Checks ``user/max_user_namespaces`` (0 disables them), Debian's older
    ``kernel/unprivileged_userns_clone`` (0 disables them) and Ubuntu's
    ``kernel/apparmor_restrict_unprivileged_userns`` (1: namespaces get no capabilities, so
    mounting fails). ``proc_sys`` is a seam for tests (a folder with fake values).
    Returns one line per problem; empty when these settings allow user namespaces.
    """
    out = []

    def read(rel: str) -> str | None:
        try:
            return (proc_sys / rel).read_text().strip()
        except OSError:
            return None

    if read("user/max_user_namespaces") == "0":
        out.append("user namespaces are disabled: sysctl user.max_user_namespaces is 0 "
                   "(an administrator can raise it: sysctl -w user.max_user_namespaces=15000)")  # fmt: skip
    if read("kernel/unprivileged_userns_clone") == "0":
        out.append("unprivileged user namespaces are disabled: sysctl kernel.unprivileged_userns_clone is 0")
    if read("kernel/apparmor_restrict_unprivileged_userns") == "1":
        out.append("AppArmor restricts unprivileged user namespaces "
                   "(sysctl kernel.apparmor_restrict_unprivileged_userns=1; allow bwrap/unshare in an AppArmor "
                   "profile or set it to 0)")  # fmt: skip
    return out


# Mounts what a rootless sandbox's holder mounts (tmpfs + overlay with userxattr) in a throw-away
# user + mount namespace and makes a whiteout and an opaque folder: what fails here would fail later.
_PROBE_SCRIPT = r"""
set -e
d=$1
mount -t tmpfs -o size=1m,mode=0755 reterm-probe "$d" || { echo "cannot mount a tmpfs in a user namespace" >&2; exit 3; }
mkdir "$d/l" "$d/l/o" "$d/u" "$d/w" "$d/m" && echo x > "$d/l/f" && echo x > "$d/l/o/f"
o="lowerdir=$d/l,upperdir=$d/u,workdir=$d/w,index=off,metacopy=off,userxattr"
mount -t overlay -o "$o" reterm-probe "$d/m" || {
  echo "cannot mount overlayfs in a user namespace (needs Linux >= 5.11; on a tmpfs, >= 6.6)" >&2; exit 4; }
rm "$d/m/f" && rm -r "$d/m/o" && mkdir "$d/m/o" || {
  echo "overlayfs in a user namespace cannot make whiteouts or opaque folders (user xattrs on tmpfs: Linux >= 6.6)" >&2
  exit 5; }
"""


@functools.lru_cache(maxsize=1)
def rootless_problems() -> tuple[str, ...]:
    """What stops rootless sandboxes on this host, measured once per process (about 10 ms).

    Checks the host programs (bwrap, unshare, nsenter, prlimit), then really creates a user
    namespace mapping the caller to root and mounts a tmpfs and an overlay (``userxattr``) inside
    it, as every rootless sandbox does. Returns one line per missing piece (empty: rootless works).
    """
    missing = [f"{t} (Debian package {pkg})" for t, pkg in _TOOLS.items() if not host_tool(t)]
    if missing:
        return (f"missing programs: {', '.join(missing)}",)
    d = tempfile.mkdtemp(prefix="reterm-userns-probe-")
    try:
        r = subprocess.run(
            [host_tool("unshare"), "--user", "--map-root-user", "--mount", "--propagation", "private",
             "/bin/sh", "-c", _PROBE_SCRIPT, "sh", d],
            capture_output=True, text=True, timeout=30, env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        return (f"cannot run unshare: {exc}",)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    if r.returncode == 0:
        return ()
    out = [f"creating a user namespace with overlayfs failed: {r.stderr.strip()[-500:] or f'exit {r.returncode}'}"]
    return tuple(out + userns_sysctl_problems())


def require_rootless_or_explain() -> None:
    """Raise :class:`SandboxError` when rootless sandboxes cannot run here, saying what is missing.

    Nothing has been started when it raises (called before any folder, mount or process exists).
    """
    if problems := rootless_problems():
        raise SandboxError(
            f"the local sandbox cannot start: running as {user_name()} it needs unprivileged user "
            f"namespaces with overlayfs (rootless mode), and on this host: {'; '.join(problems)}. "
            "Alternatives: run it as root (sudo), or use another Harbor environment (-e docker / podman). "
            "Nothing was started."
        )


def check_layers_owned(lowers: list[Path]) -> None:
    """Rootless mode: every read-only layer must belong to the calling user.

    Inside a rootless sandbox only the caller's uid exists (as root); the kernel refuses to copy a
    file owned by another user into the writable layer, so a base or layer owned by root (e.g. a
    cache built with sudo) could be read but not changed.

    Raises:
        SandboxError: naming the layer, its owner and how to get one of the caller's own.
    """
    me = os.geteuid()
    for p in lowers:
        owner = Path(p).stat().st_uid
        if owner != me:
            raise SandboxError(
                f"sandbox layer {p} is owned by uid {owner}, not by {user_name()}: a rootless sandbox "
                "can only change files of its own user. Use a cache of this user (RETERM_CACHE, default "
                "~/.cache/reterm) and build the base there with `reterm sandbox prepare` (rootless debootstrap). "
                "Nothing was started."
            )


def user_name() -> str:
    """The caller as ``name (uid N)``, or ``uid N`` when it has no passwd entry."""
    try:
        return f"{pwd.getpwuid(os.geteuid()).pw_name} (uid {os.geteuid()})"
    except KeyError:
        return f"uid {os.geteuid()}"


# ------------------------------------------------------------------------- rootless base build
# debootstrap as the fake root of a user namespace (it needs uid 0 and chroot) under fakeroot
# (dpkg chowns files to system groups such as shadow, which a one-uid namespace cannot map;
# FAKEROOTDONTTRYCHOWN makes fakeroot record ownership without trying the real chown, which
# fails with EINVAL there). Stage 1 unpacks with the host's dpkg-deb and tar; stage 2 runs the
# target's dpkg in a chroot, with the host's libfakeroot copied into the target (same path) so the
# chrooted programs find it, and the host's /dev nodes bound over the fake ones.
# Every file removed between the stages is removed *inside* fakeroot: fakeroot keys its records by
# inode, and a file deleted behind its back leaves a stale record that a new file reusing the inode
# inherits (seen on CI, 2026-11-29: dpkg.list got the record of the old fake /dev/tty, "not a regular
# file", and stage 2 died at base-passwd; whether it happens depends on the file system's inode reuse).
DEBOOTSTRAP_ROOTLESS_SCRIPT = r"""
set -e
target=$1 mirror=$2 include=$3 suite=$4 variant=$5
export FAKEROOTDONTTRYCHOWN=1
state=$target/../fakeroot.state
fakeroot -s "$state" -- debootstrap --foreign --variant="$variant" --include="$include" "$suite" "$target" "$mirror"
lib=$(ls /usr/lib/*/libfakeroot/libfakeroot-sysv.so /usr/lib*/libfakeroot/libfakeroot-sysv.so 2>/dev/null | head -n1)
[ -n "$lib" ] || { echo "E: libfakeroot-sysv.so not found on the host (Debian package libfakeroot)"; exit 1; }
libdir=$(dirname "$lib")
mkdir -p "$target$libdir" && cp -r "$libdir/." "$target$libdir/"
devs="null zero full random urandom tty"
fakeroot -i "$state" -s "$state" -- sh -c 'cd "$1/dev" && shift && rm -f "$@" && touch "$@"' sh "$target" $devs
for d in $devs; do mount --bind "/dev/$d" "$target/dev/$d"; done
fakeroot -i "$state" -s "$state" -- chroot "$target" /debootstrap/debootstrap --second-stage
for d in $devs; do umount "$target/dev/$d"; done
rm -rf "$target$libdir"
"""


def debootstrap_rootless_argv(
    target: Path, mirror: str, packages: tuple[str, ...], suite: str, variant: str
) -> list[str]:
    """The command building a base root filesystem without root (see the script above).

    Needs ``fakeroot`` and ``debootstrap`` on the host and rootless mode to work.

    Raises:
        RuntimeError: fakeroot or debootstrap is missing.
    """
    for tool, pkg in (("debootstrap", "debootstrap"), ("fakeroot", "fakeroot")):
        if not host_tool(tool):
            raise RuntimeError(f"building the sandbox base without root needs `{tool}` (Debian package {pkg})")
    return [host_tool("unshare"), "--user", "--map-root-user", "--mount", "--pid", "--fork", "/bin/sh", "-c",
            DEBOOTSTRAP_ROOTLESS_SCRIPT, "sh", str(target), mirror, ",".join(packages), suite, variant]  # fmt: skip
