"""The Debian base root filesystem of the local sandbox (built once with debootstrap, cached).

Every sandbox's root is an overlay of read-only layers on this base: it is the userland a task's
``FROM debian|ubuntu|python`` maps onto (see :mod:`reterm.sandbox.dockerfile`). It is made with
``debootstrap --variant=minbase --include=<PACKAGES> bookworm`` from the Debian mirror configured in
apt's sources (about 75 s and 390 MB here; docs/SANDBOX.md), cached under
``<cache>/sandbox/base/<key>/rootfs`` where ``key`` hashes the suite, variant and package list, and
built under a lock so that several processes starting at once build it only once.

The package list is part of the task-suite contract: tasks are written against exactly this base,
and a tool missing from it is a legitimate failure for the agent to recover from.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from reterm.sandbox import rootless
from reterm.sandbox.paths import file_lock, rmtree_writable, sub

logger = logging.getLogger(__name__)

SUITE = "bookworm"
# The Debian releases a base can be made of (``FROM debian:13`` / ``debian:trixie`` get a real trixie base, built
# the same way from the same mirror; everything else maps onto bookworm). debootstrap must know the suite
# (``/usr/share/debootstrap/scripts/<suite>``; Debian 12's debootstrap 1.0.128 knows trixie).
SUITES: dict[str, str] = {"bookworm": "12", "trixie": "13"}
VARIANT = "minbase"
# Exactly this list (the lead's decision, shared with the task suite): no jq, no build-essential.
PACKAGES: tuple[str, ...] = (
    "python3", "python3-pip", "python3-venv", "python3-pytest", "tmux", "git", "curl",
    "ca-certificates", "procps", "iproute2", "less", "vim-tiny", "sqlite3", "make", "file",
    "xz-utils", "bzip2", "unzip",
)  # fmt: skip
# The strict base (RETERM_SANDBOX_STRICT=1): a minimal Debian root like the debian:bookworm-slim image, plus only
# tmux, which the harness itself needs inside the sandbox (the way Harbor's agents install theirs at set-up).
# Every task's Dockerfile must then install what its build, solution and tests use, as under Docker.
STRICT_PACKAGES: tuple[str, ...] = ("tmux",)
STRICT_ENV = "RETERM_SANDBOX_STRICT"
# Bump when the recipe below changes in a way that changes the result.
RECIPE_VERSION = 1
DEFAULT_MIRROR = "http://deb.debian.org/debian"


@dataclass(frozen=True)
class BaseImage:
    """A built base: ``rootfs`` is the folder to use as the lowest overlay layer."""

    key: str
    rootfs: Path
    meta: dict


def base_key(packages: tuple[str, ...] = PACKAGES, suite: str = SUITE) -> str:
    """Cache key of the base: 16 hex chars of sha256 over recipe version, suite, variant, packages."""
    text = json.dumps([RECIPE_VERSION, suite, VARIANT, sorted(packages)])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def apt_mirror(sources: list[Path] | None = None) -> str:
    """The Debian mirror configured in apt's sources (first ``deb`` URI serving a Debian suite).

    Reads ``/etc/apt/sources.list`` and ``/etc/apt/sources.list.d/*.list|*.sources`` (one-line and
    deb822 formats). ``RETERM_DEBIAN_MIRROR`` overrides; falls back to ``deb.debian.org``.
    """
    if os.environ.get("RETERM_DEBIAN_MIRROR"):
        return os.environ["RETERM_DEBIAN_MIRROR"]
    if sources is None:
        d = Path("/etc/apt/sources.list.d")
        sources = [Path("/etc/apt/sources.list")]
        if d.is_dir():
            sources += sorted(d.glob("*.list")) + sorted(d.glob("*.sources"))
    for path in sources:
        try:
            text = path.read_text()
        except OSError:
            continue
        if path.suffix == ".sources":
            for stanza in re.split(r"\n\s*\n", text):
                fields = {}
                for line in stanza.splitlines():
                    if line.startswith("#") or ":" not in line:
                        continue
                    k, _, v = line.partition(":")
                    fields[k.strip().lower()] = v.strip()
                if "deb" not in fields.get("types", "").split() or fields.get("enabled", "yes") == "no":
                    continue
                suites = fields.get("suites", "").split()
                for uri in fields.get("uris", "").split():
                    if any(s in (SUITE, "stable") for s in suites) and "security" not in uri:
                        return uri.rstrip("/")
        else:
            for line in text.splitlines():
                parts = line.split("#", 1)[0].split()
                if len(parts) >= 3 and parts[0] == "deb":
                    uri_i = 2 if parts[1].startswith("[") else 1
                    while uri_i < len(parts) and not parts[uri_i].startswith(("http", "file", "ftp")):
                        uri_i += 1
                    if uri_i + 1 < len(parts) and parts[uri_i + 1] in (SUITE, "stable"):
                        if "security" not in parts[uri_i]:
                            return parts[uri_i].rstrip("/")
    return DEFAULT_MIRROR


def strict_mode() -> bool:
    """Whether sandboxes use the strict base (``RETERM_SANDBOX_STRICT`` = 1/true/yes; default off)."""
    return os.environ.get(STRICT_ENV, "").strip().lower() in ("1", "true", "yes")


def base_packages() -> tuple[str, ...]:
    """The packages of the base in use: :data:`STRICT_PACKAGES` in strict mode, else :data:`PACKAGES`."""
    return STRICT_PACKAGES if strict_mode() else PACKAGES


def _check_suite(suite: str) -> None:
    if suite not in SUITES:
        raise ValueError(f"Debian suite {suite!r}: the local sandbox builds bases of {', '.join(SUITES)} only")


def find_base(packages: tuple[str, ...] | None = None, suite: str = SUITE) -> BaseImage | None:
    """The cached base for ``packages`` (default :func:`base_packages`) and Debian ``suite`` if it was built,
    else None (never builds)."""
    _check_suite(suite)
    packages = base_packages() if packages is None else packages
    key = base_key(packages, suite)
    root = sub("base") / key
    meta_path = sub("base") / f"{key}.json"
    if (root / "rootfs" / "usr" / "bin" / "dpkg").exists() and meta_path.exists():
        return BaseImage(key=key, rootfs=root / "rootfs", meta=json.loads(meta_path.read_text()))
    return None


def ensure_base(packages: tuple[str, ...] | None = None, *, suite: str = SUITE, log=None) -> BaseImage:
    """Return the cached base root filesystem (``packages`` default :func:`base_packages`; Debian ``suite``, one
    of :data:`SUITES`), building it with debootstrap first if missing.

    Needs the network to the Debian mirror for the first build only. As root it runs debootstrap;
    as another user it runs debootstrap as the fake root of a user namespace under fakeroot
    (:data:`reterm.sandbox.rootless.DEBOOTSTRAP_ROOTLESS_SCRIPT`; same packages, every file owned by
    the caller, setuid/setgid bits dropped; 202-262 s here under load, against about 75 s as root). Concurrent callers wait on a
    lock; the first builds, the others reuse its result.

    Raises:
        RuntimeError: debootstrap (or, without root, fakeroot or user namespaces) is missing, or the
            build failed (with its log tail).
        ValueError: ``suite`` is not one of :data:`SUITES`.
    """
    log = log or logger.info
    packages = base_packages() if packages is None else packages
    found = find_base(packages, suite)
    if found:
        return found
    key = base_key(packages, suite)
    with file_lock(f"base-{key}", wait_message="waiting for another process building the sandbox base", log=log):
        found = find_base(packages, suite)
        if found:
            return found
        debootstrap = shutil.which("debootstrap", path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")
        if not debootstrap:
            raise RuntimeError("debootstrap is not installed (Debian package `debootstrap`); run scripts/setup.sh")
        mirror = apt_mirror()
        final = sub("base") / key
        tmp = sub("base") / f".tmp-{key}-{os.getpid()}"
        rootless_build = os.geteuid() != 0
        if rootless_build:
            if problems := rootless.rootless_problems():
                raise RuntimeError("building the sandbox base without root needs unprivileged user namespaces; "
                                   f"on this host: {'; '.join(problems)}. Run `sudo reterm sandbox prepare` instead "
                                   "(a root cache), or build as a user where they work.")  # fmt: skip
        rmtree_writable(tmp)
        (tmp / "rootfs").mkdir(parents=True)
        cmd = [debootstrap, f"--variant={VARIANT}", f"--include={','.join(packages)}", suite, str(tmp / "rootfs"), mirror]
        if rootless_build:
            cmd = rootless.debootstrap_rootless_argv(tmp / "rootfs", mirror, packages, suite, VARIANT)
        how = ", without root (user namespace + fakeroot), about 4 minutes" if rootless_build else ", about a minute"
        log(f"building the sandbox base (debootstrap {suite} from {mirror}{how}): {tmp / 'rootfs'}")
        t0 = time.monotonic()
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8", "DEBIAN_FRONTEND": "noninteractive"}
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        tail: list[str] = []
        assert proc.stdout is not None
        for line in proc.stdout:
            tail = (tail + [line.rstrip()])[-40:]
            if line.startswith(("I: Retrieving", "I: Extracting", "I: Installing", "I: Configuring", "I: Base system")):
                if "Retrieving Packages" in line or line.startswith(("I: Installing core", "I: Base system", "I: Configuring")):
                    log(line.rstrip())
        if proc.wait() != 0:
            dlog = tmp / "rootfs/debootstrap/debootstrap.log"  # the cause is there, not on stdout
            why = dlog.read_text(errors="replace").splitlines()[-15:] if dlog.is_file() else []
            rmtree_writable(tmp)
            raise RuntimeError(f"debootstrap failed (exit {proc.returncode}): " + "\n".join(tail[-25:])
                               + ("\n--- end of debootstrap.log ---\n" + "\n".join(why) if why else ""))
        _finish_rootfs(tmp / "rootfs", rootless_build=rootless_build)
        (tmp / "fakeroot.state").unlink(missing_ok=True)
        meta = {
            "key": key, "suite": suite, "variant": VARIANT, "packages": list(packages), "mirror": mirror,
            "recipe_version": RECIPE_VERSION, "built_at": time.time(), "build_s": round(time.monotonic() - t0, 1),
            "built_by_uid": os.geteuid(), "rootless_build": rootless_build,
        }  # fmt: skip
        if final.exists():
            shutil.rmtree(final)
        os.rename(tmp, final)
        (sub("base") / f"{key}.json").write_text(json.dumps(meta, indent=1))
        log(f"sandbox base ready in {meta['build_s']} s: {final / 'rootfs'}")
        return BaseImage(key=key, rootfs=final / "rootfs", meta=meta)


def _finish_rootfs(rootfs: Path, rootless_build: bool = False) -> None:
    """Post-debootstrap clean-up: drop downloaded .debs, set a hostname, empty resolv.conf.

    ``/etc/resolv.conf`` is bind-mounted from the host during build steps only (trials are offline).
    A base built without root also loses its setuid/setgid bits (they would be the builder's on the
    host; inside a sandbox ``no_new_privs`` voids them anyway), the empty files fakeroot left for
    device nodes (every sandbox mounts its own ``/dev``), and gets apt's one-uid setting
    (:data:`reterm.sandbox.rootless.APT_SANDBOX_CONF`).
    """
    for deb in (rootfs / "var/cache/apt/archives").glob("*.deb"):
        deb.unlink()
    if rootless_build:
        for dirpath, _, filenames in os.walk(rootfs):
            for name in filenames:
                p = os.path.join(dirpath, name)
                st = os.lstat(p)
                if not os.path.islink(p) and st.st_mode & 0o6000:
                    os.chmod(p, st.st_mode & 0o1777)
        for p in (rootfs / "dev").iterdir():
            if p.is_file() and not p.is_symlink():
                p.unlink()
        conf = rootfs / rootless.APT_SANDBOX_CONF.lstrip("/")
        conf.write_text(rootless.APT_SANDBOX_LINE + "\n")
    (rootfs / "etc/hostname").write_text("sandbox\n")
    resolv = rootfs / "etc/resolv.conf"
    if resolv.is_symlink() or resolv.exists():
        resolv.unlink()
    resolv.write_text("")

