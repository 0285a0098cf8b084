"""Build a task's layer from its ``environment/Dockerfile`` on top of the Debian base, and cache it.

The build runs the Dockerfile's instructions in a sandbox whose writable layer is a folder on disk
and which shares the host's network (build steps may download from the package registries; trials
never have a network). The folder then becomes a read-only lower layer of every sandbox of the task.
Results are cached under ``<cache>/sandbox/layers/<key>`` where ``key`` hashes the base, the
Dockerfile and every file of the build context (``.dockerignore`` honoured), so a second start is
fast. Concurrent builds of the same key wait on a lock and reuse the first one's result.

Supported instructions and the ``FROM`` mapping: see :mod:`reterm.sandbox.dockerfile`.
Own code: Harbor delegates builds to docker/podman, which the kit does not require.

A task whose ``task.toml`` names a prebuilt image tagged with its build date (Terminal-Bench 2.0's
``alexgshaw/NAME:20251031``, which Harbor's Docker environment pulls) is rebuilt here from its Dockerfile on a later
day, so its unpinned Python dependencies would drift (``mteb-retrieve``: ``pip install mteb==1.36.8`` took
transformers 5, which ``mteb`` cannot import). On a ``FROM python*`` build whose Dockerfile installs Python
packages, the build's own steps therefore resolve against the index as of that date (:func:`upload_date`): pip 26
(its ``--uploaded-prior-to``, as ``PIP_UPLOADED_PRIOR_TO``) is put on the build steps' ``PYTHONPATH`` and uv gets
``UV_EXCLUDE_NEWER``; that pip is removed when the build ends, so the image keeps Debian's.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import hashlib
import io
import json
import logging
import os
import re
import shlex
import tarfile
import tempfile
import time
import uuid
import weakref
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from harbor.environments.base import SandboxBuildFailedError

from reterm.sandbox import dockerfile as df
from reterm.sandbox.base_image import SUITES, BaseImage, strict_mode
from reterm.sandbox.box import CA_ENV_VARS, DEFAULT_PATH, HOST_CA_PATH, Box, BoxSpec, host_ca_bundle
from reterm.sandbox.network import mentions_unreachable, unreachable_hosts
from reterm.sandbox.paths import file_lock, rmtree_writable, sub
from reterm.sandbox.rootless import sandbox_mode

logger = logging.getLogger(__name__)

# Bump when the build procedure changes the resulting layer (2: FROM python* installs Python in strict mode).
BUILD_VERSION = 2
ARCHIVE_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz")
# What a build step prints when it hits the one-uid mapping of rootless mode.
_ONE_UID_SYMPTOMS = re.compile(r"(chown|chgrp|ownership|setgroups|setresuid|setresgid|seteuid|_apt)\b.*"
                               r"(Invalid argument|Operation not permitted)|invalid (user|group)", re.I)
_PYTHON_ALIASES = (
    "ln -sf /usr/bin/python3 /usr/local/bin/python && ln -sf /usr/bin/pip3 /usr/local/bin/pip && "
    "rm -f /usr/lib/python3*/EXTERNALLY-MANAGED"
)
# A python image carries its interpreter's C headers (Python.h, for `pip install` of a C extension and for
# setup.py build_ext); the strict base has no Python at all. The build installs Debian's (3.11) with the build's
# network before the aliases: python3-dev in default mode, python3 itself as well in strict mode.
_PYTHON_HEADERS_INSTALL = (
    "export DEBIAN_FRONTEND=noninteractive && apt-get update -qq && "
    "apt-get install -y -qq --no-install-recommends python3-dev >/dev/null"
)
_PYTHON_STRICT_INSTALL = (
    "export DEBIAN_FRONTEND=noninteractive && apt-get update -qq && "
    "apt-get install -y -qq --no-install-recommends python3 python3-pip python3-venv python3-dev >/dev/null"
)
_HOST_DISK_FULL = "No space left on device"  # ENOSPC's text, as pip, apt, cp and tar print it
_FROM = re.compile(r"^\s*FROM\s+(?:--\S+\s+)*(\S+)", re.I | re.M)
_DATE_TAG = re.compile(r":(20\d\d)(0[1-9]|1[0-2])(0[1-9]|[12]\d|3[01])$")
# a build step that installs Python packages: pip / pip3 / python -m pip / uv pip / uv add / uv sync / uv tool
_PY_INSTALL = re.compile(r"\b(?:pip3?(?:\.\d+)?|python3?(?:\.\d+)?\s+-m\s+pip)\s+install\b|\buv\s+(?:pip\s+install|add|sync|"
                         r"tool\s+install)\b")
_BUILD_PIP_DIR = "/opt/reterm-build-pip"
_BUILD_PIP_INSTALL = (
    f"python3 -m pip install --quiet --disable-pip-version-check --no-warn-script-location --target {_BUILD_PIP_DIR} "
    "'pip>=26'"
)


# `apt-get update && apt-get install -y [--no-install-recommends] PKG... [&& rm -rf /var/lib/apt/lists/*]`, the
# form tasks/README.md prescribes for a task's own packages (DEBIAN_FRONTEND=... in front allowed)
_APT_INSTALL = re.compile(
    r"^\s*(?:(?:export\s+)?DEBIAN_FRONTEND=\S+\s*(?:&&|;)?\s*)?apt-get\s+(?:-\S+\s+)*update(?:\s+-\S+)*\s*&&\s*"
    r"(?:DEBIAN_FRONTEND=\S+\s+)?apt-get\s+install((?:\s+[-\w.+:=]+)+?)"
    r"(?:\s*&&\s*rm\s+-rf\s+/var/lib/apt/lists/\*?)?\s*$"
)


def apt_install_packages(command: str) -> list[str] | None:
    """The packages of a RUN command that is only ``apt-get update && apt-get install -y PKG...`` (optionally
    followed by ``rm -rf /var/lib/apt/lists/*``), else ``None``."""
    m = _APT_INSTALL.match(command.replace("\\\n", " "))
    if not m:
        return None
    words = m.group(1).split()
    return [w for w in words if not w.startswith("-")] or None


def installed_packages(rootfs: Path) -> set[str]:
    """Packages dpkg lists as installed in a root filesystem (``var/lib/dpkg/status``; ``name`` and
    ``name:arch``)."""
    out: set[str] = set()
    status = rootfs / "var" / "lib" / "dpkg" / "status"
    if not status.is_file():
        return out
    for block in status.read_text(errors="replace").split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line and not line.startswith(" "))
        if fields.get("Status", "").endswith(" installed") and "Package" in fields:
            out.add(fields["Package"])
            if "Architecture" in fields:
                out.add(f"{fields['Package']}:{fields['Architecture']}")
    return out


@dataclass(frozen=True)
class TaskLayer:
    """A built task layer.

    Attributes:
        key: cache key (16 hex chars).
        root: the folder to use as a lower layer (may be nearly empty).
        meta: ``env`` (dict), ``user`` (str|None), ``workdir`` (str|None), ``shell`` (list),
            ``from`` (image), ``family`` (debian|ubuntu|python), ``build_s``.
    """

    key: str
    root: Path
    meta: dict

    @property
    def env(self) -> dict[str, str]:
        return dict(self.meta.get("env", {}))

    @property
    def user(self) -> str | None:
        return self.meta.get("user")

    @property
    def workdir(self) -> str | None:
        return self.meta.get("workdir")


# ----------------------------------------------------------------------------- build context
def _dockerignore(context: Path) -> list[tuple[bool, str]]:
    path = context / ".dockerignore"
    if not path.is_file():
        return []
    rules = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        neg = line.startswith("!")
        pat = line[1:].strip() if neg else line
        pat = str(PurePosixPath("/" + pat)).lstrip("/") or "."
        rules.append((neg, pat))
    return rules


def _ignored(rel: str, rules: list[tuple[bool, str]]) -> bool:
    """``.dockerignore`` semantics (last matching rule wins; a pattern matching a folder covers its files)."""
    result = False
    parts = rel.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for neg, pat in rules:
        pat_re = pat.replace("**/", "*").replace("/**", "/*")
        if any(fnmatch.fnmatchcase(p, pat) or fnmatch.fnmatchcase(p, pat_re) for p in prefixes):
            result = not neg
    return result


def context_files(context: Path) -> list[Path]:
    """Files (and symlinks) of the build context, relative, sorted, ``.dockerignore`` applied."""
    rules = _dockerignore(context)
    out = []
    for dirpath, dirnames, filenames in os.walk(context):
        dirnames.sort()
        for name in sorted(filenames) + [d for d in dirnames if (Path(dirpath) / d).is_symlink()]:
            p = Path(dirpath) / name
            rel = p.relative_to(context).as_posix()
            if not _ignored(rel, rules):
                out.append(Path(rel))
    return out


def base_suite(environment_dir: Path, docker_image: str | None = None) -> str:
    """The Debian suite of the base the task's layer builds on (:func:`reterm.sandbox.dockerfile.debian_suite` of
    the Dockerfile's first ``FROM``, else of ``docker_image``); ``bookworm`` when neither names one."""
    dockerfile = Path(environment_dir) / "Dockerfile"
    image = None
    if dockerfile.is_file():
        image = df.first_from(dockerfile.read_text(errors="replace"))
    image = image or docker_image
    return df.debian_suite(image) if image else "bookworm"


def upload_date(docker_image: str | None) -> str | None:
    """The index date a build of ``docker_image`` resolves Python packages against: ``YYYY-MM-DDT00:00:00Z`` when
    the image's tag is a date (``alexgshaw/mteb-retrieve:20251031`` -> ``2025-10-31T00:00:00Z``: packages uploaded
    before the day the image was built), else ``None``."""
    m = _DATE_TAG.search((docker_image or "").split("@", 1)[0])
    return f"{m.group(1)}-{m.group(2)}-{m.group(3)}T00:00:00Z" if m else None


def pins_upload_date(dockerfile_text: str, as_of: str | None) -> bool:
    """Whether a build of ``dockerfile_text`` resolves Python packages as of ``as_of`` (see the module docstring):
    a date is known, the Dockerfile maps onto the python image and one of its lines installs Python packages."""
    return bool(as_of) and _maps_a_python_image(dockerfile_text) and bool(_PY_INSTALL.search(dockerfile_text))


def _maps_a_python_image(dockerfile_text: str) -> bool:
    """True when a ``FROM`` of the Dockerfile maps onto the python image mapping (its own build steps)."""
    for m in _FROM.finditer(dockerfile_text):
        try:
            if df.map_base_image(m.group(1), "Dockerfile").python_aliases:
                return True
        except df.DockerfileError:  # reported with its line when the Dockerfile is built
            pass
    return False


def layer_key(dockerfile_text: str, context: Path | None, base: BaseImage, as_of: str | None = None) -> str:
    """Cache key of a task layer: sha256 over base key, build version, Dockerfile and context files
    (and the mode, in rootless mode only: root-mode keys are unchanged; for a ``FROM python*`` image, the
    mapping's own install step; where :func:`pins_upload_date`, the date and the build's pip)."""
    h = hashlib.sha256()
    h.update(json.dumps([BUILD_VERSION, base.key]).encode())
    if sandbox_mode() == "rootless":  # user.overlay.* xattrs and the caller's ownership: a layer of its own
        h.update(b"rootless")
    h.update(dockerfile_text.encode())
    if _maps_a_python_image(dockerfile_text):
        h.update(b"\0python-image\0" + _PYTHON_HEADERS_INSTALL.encode())  # the mapping's steps are the layer's too
    if pins_upload_date(dockerfile_text, as_of):
        h.update(b"\0as-of\0" + f"{as_of}\0{_BUILD_PIP_INSTALL}".encode())
    if context is not None and context.is_dir():
        for rel in context_files(context):
            p = context / rel
            h.update(b"\0" + str(rel).encode() + b"\0")
            if p.is_symlink():
                h.update(b"L" + os.readlink(p).encode())
            elif p.is_file():
                h.update(oct(p.stat().st_mode & 0o7777).encode())
                with open(p, "rb") as f:
                    for chunk in iter(lambda: f.read(1 << 20), b""):
                        h.update(chunk)
    return h.hexdigest()[:16]


# A failed build is remembered this long (seconds): later trials of the task fail at once with the same reason
# instead of redoing the steps that failed (``force_build`` / ``harbor run --force-build`` rebuilds at once).
FAILED_BUILD_TTL_S = 24 * 3600


def _failure_path(key: str) -> Path:
    return sub("layers") / f"{key}.failed.json"


def cached_failure(key: str) -> dict | None:
    """The recorded failure of the build ``key`` (``{"reason", "dockerfile", "failed_at", "build_s"}``) while it is younger than
    :data:`FAILED_BUILD_TTL_S`, else ``None``."""
    try:
        rec = json.loads(_failure_path(key).read_text())
        if time.time() - float(rec["failed_at"]) < FAILED_BUILD_TTL_S:
            return rec
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def _raise_cached(rec: dict, dockerfile: Path) -> None:
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(rec["failed_at"])))
    # the same build (same key) may come from another copy of the task: name the Dockerfile being built now
    reason = rec["reason"].replace(rec["dockerfile"], str(dockerfile)) if rec.get("dockerfile") else rec["reason"]
    raise SandboxBuildFailedError(
        f"{reason}\n(the build of {dockerfile} failed at {when} after {rec.get('build_s', '?')} s and is not "
        "retried for a day: pass force_build (harbor run --force-build) to build it again)"
    )


def find_layer(key: str) -> TaskLayer | None:
    """The cached layer for ``key``, or None."""
    d = sub("layers") / key
    if (d / "meta.json").is_file() and (d / "root").is_dir():
        return TaskLayer(key, d / "root", json.loads((d / "meta.json").read_text()))
    return None


_LOOP_LOCKS: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, asyncio.Lock]]" = weakref.WeakKeyDictionary()


@contextlib.asynccontextmanager
async def _async_lock(name: str, log) -> AsyncIterator[None]:
    """The build lock ``name`` across processes (``flock``) and, first, within this event loop.

    The in-loop lock matters: without it, G sandboxes of one unbuilt task started together would each wait
    for the ``flock`` in a thread of the loop's default executor (6 threads on 2 cores) and could fill it,
    while the build holding the lock needs that executor to finish (a deadlock seen with 16 starts).
    """
    local = _LOOP_LOCKS.setdefault(asyncio.get_running_loop(), {}).setdefault(name, asyncio.Lock())
    async with local:
        cm = file_lock(name, wait_message=f"waiting for another process building {name}", log=log)
        await asyncio.to_thread(cm.__enter__)
        try:
            yield
        finally:
            cm.__exit__(None, None, None)


async def ensure_layer(
    environment_dir: Path,
    base: BaseImage,
    *,
    docker_image: str | None = None,
    force: bool = False,
    log=None,
) -> TaskLayer:
    """Return the cached layer of ``environment_dir/Dockerfile`` (or of a bare ``docker_image``),
    building it first when missing or when ``force`` is set.

    Raises:
        DockerfileError: unsupported instruction or base image (message names file and line).
        SandboxBuildFailedError: a build step failed (message names file, line and exit code), now or, without
            ``force``, within :data:`FAILED_BUILD_TTL_S` before (the recorded reason, said to be cached).
    """
    log = log or logger.info
    dockerfile = environment_dir / "Dockerfile"
    if dockerfile.is_file():
        text, context = dockerfile.read_text(), environment_dir
    elif docker_image:
        text, context = f"FROM {docker_image}\n", None
        dockerfile = environment_dir / "(task.toml docker_image)"
    else:
        raise FileNotFoundError(f"{environment_dir}: no Dockerfile and no docker_image in task.toml")
    as_of = upload_date(docker_image)
    as_of = as_of if pins_upload_date(text, as_of) else None  # the builder sets the pin up only where it applies
    key = layer_key(text, context, base, as_of)
    if not force and (found := find_layer(key)):
        return found
    if not force and (failed := cached_failure(key)):
        _raise_cached(failed, dockerfile)
    async with _async_lock(f"layer-{key}", log):
        if not force and (found := find_layer(key)):
            return found
        if not force and (failed := cached_failure(key)):  # another trial's build just failed
            _raise_cached(failed, dockerfile)
        if dockerfile.is_file():
            instructions = df.parse(dockerfile)
        else:
            instructions = [df.Instruction("FROM", docker_image or "", 1)]
        check_instructions(instructions, dockerfile)
        tmp = sub("layers") / f".tmp-{key}-{uuid.uuid4().hex[:6]}"
        t0 = time.monotonic()
        try:
            meta = await _Builder(dockerfile, context, base, tmp, log, as_of=as_of).run(instructions)
        except SandboxBuildFailedError as exc:  # a step failed: remembered, so the next trial does not redo it
            rmtree_writable(tmp)
            if _HOST_DISK_FULL in str(exc):  # the build's layer is a folder on this machine's disk: not the task's
                raise SandboxBuildFailedError(f"{exc}\n(note: this machine's disk filled up during the build; the "
                                              "failure is not remembered: free space and start the task again)") from exc  # fmt: skip
            rec = {"reason": str(exc), "dockerfile": str(dockerfile), "failed_at": time.time(),
                   "build_s": round(time.monotonic() - t0, 2)}
            _failure_path(key).write_text(json.dumps(rec, indent=1))
            raise
        except BaseException:
            rmtree_writable(tmp)
            raise
        _failure_path(key).unlink(missing_ok=True)
        meta["build_s"] = round(time.monotonic() - t0, 2)
        final = sub("layers") / key
        if final.exists():  # forced rebuild: running sandboxes may still use the old one
            os.rename(final, sub("trash") / f"{key}-{uuid.uuid4().hex[:6]}")
        final.mkdir()
        # bwrap created the mount point of the host CA bundle in the layer: drop it
        (tmp / "upper" / HOST_CA_PATH.lstrip("/")).unlink(missing_ok=True)
        os.rename(tmp / "upper", final / "root")
        (final / "meta.json").write_text(json.dumps(meta, indent=1))
        rmtree_writable(tmp)
        log(f"built task layer {key} from {dockerfile} in {meta['build_s']} s")
        return TaskLayer(key, final / "root", meta)


def check_instructions(instructions: list[df.Instruction], dockerfile: Path) -> None:
    """Reject what the sandbox cannot do before starting anything (no FROM, a second FROM,
    ``COPY --from``, unsupported instructions).

    Raises:
        DockerfileError: naming ``dockerfile`` and the line.
    """
    froms = [ins for ins in instructions if ins.keyword == "FROM"]
    if not froms:
        raise df.DockerfileError(f"{dockerfile}:1: no FROM instruction")
    if len(froms) > 1:
        raise df.DockerfileError(
            f"{dockerfile}:{froms[1].line}: a second FROM (a multi-stage build; the first stage starts at line "
            f"{froms[0].line}) is not supported by the local sandbox: it builds one layer on one Debian base, and "
            "stages with their own images cannot be emulated on it. Run this task with a container engine "
            "(harbor run -e docker), or rewrite the Dockerfile as one stage (install in it what the earlier stage "
            "built, and drop COPY --from)."
        )
    seen_from = False
    for ins in instructions:
        where = f"{dockerfile}:{ins.line}"
        if ins.keyword == "FROM":
            seen_from = True
        elif ins.keyword not in SUPPORTED_OR_IGNORED:
            raise df.DockerfileError(f"{where}: {ins.keyword} is not supported by the local sandbox")
        elif not seen_from and ins.keyword != "ARG":
            raise df.DockerfileError(f"{where}: {ins.keyword} before FROM")
        if ins.keyword in ("COPY", "ADD") and any(w.startswith("--from") for w in df.split_words(ins.args)):
            raise df.DockerfileError(
                f"{where}: {ins.keyword} --from copies out of another image or build stage, which the local sandbox "
                "does not have (it builds one layer on one Debian base). Run this task with a container engine "
                "(harbor run -e docker), or install what it copies in this stage instead."
            )


SUPPORTED_OR_IGNORED = df.SUPPORTED | df.IGNORED
_check = check_instructions  # older name, kept for callers


class _Builder:
    """Runs the instructions in one build sandbox; returns the layer's meta."""

    def __init__(self, dockerfile: Path, context: Path | None, base: BaseImage, tmp: Path, log, *,
                 as_of: str | None = None):  # fmt: skip
        self.dockerfile, self.context, self.base, self.tmp, self.log = dockerfile, context, base, tmp, log
        self.as_of = as_of  # resolve Python packages as of this date (module docstring), or None
        self.build_env: dict[str, str] = {}  # the build steps' own variables, never the image's
        self.vars: dict[str, str] = {}  # ARG + ENV values, for substitution
        self.args: dict[str, str] = {}
        self.env: dict[str, str] = {}
        self.user: str | None = None
        self.workdir: str | None = None
        self.shell = ["/bin/sh", "-c"]
        self.box: Box | None = None
        self.mapping: df.BaseMapping | None = None
        self._base_packages: set[str] | None = None

    @property
    def base_packages(self) -> set[str]:
        """The packages installed in the base (read once)."""
        if self._base_packages is None:
            self._base_packages = installed_packages(self.base.rootfs)
        return self._base_packages

    def where(self, ins: df.Instruction) -> str:
        return f"{self.dockerfile}:{ins.line}"

    def run_env(self) -> dict[str, str]:
        env = {"PATH": DEFAULT_PATH, "HOSTNAME": "sandbox", "HOME": "/root"}
        if host_ca_bundle() is not None:
            env.update({k: HOST_CA_PATH for k in CA_ENV_VARS})
        env.update(self.build_env)
        env.update(self.args)
        env.update(self.env)
        if "PYTHONPATH" in self.build_env and env["PYTHONPATH"] != self.build_env["PYTHONPATH"]:
            env["PYTHONPATH"] = self.build_env["PYTHONPATH"] + ":" + env["PYTHONPATH"]  # the Dockerfile's after ours
        return env

    async def run(self, instructions: list[df.Instruction]) -> dict:
        n = len(instructions)
        try:
            for i, ins in enumerate(instructions, 1):
                args = df.expand(ins.args, self.vars) if ins.keyword in df.EXPANDED else ins.args
                if ins.keyword in ("RUN", "COPY", "ADD", "WORKDIR"):
                    self.log(f"build {self.dockerfile.parent.parent.name}: step {i}/{n} {ins.keyword} {args[:100]}")
                await getattr(self, f"do_{ins.keyword.lower()}", self.do_ignored)(ins, args)
            if self.build_env:  # the build's pip leaves with the build
                await self._sh(instructions[0], f"rm -rf {_BUILD_PIP_DIR}", user=None, cwd=None,
                               what="removing the build's pip")  # fmt: skip
        finally:
            if self.box is not None:
                await asyncio.to_thread(self.box.close)
        return {
            "env": self.env, "user": self.user, "workdir": self.workdir, "shell": self.shell,
            "from": self.mapping.image if self.mapping else None,
            "family": self.mapping.family if self.mapping else None,
            "dockerfile": str(self.dockerfile), "base": self.base.key, "built_at": time.time(),
            "python_packages_as_of": self.as_of if self.build_env else None,
        }  # fmt: skip

    async def do_ignored(self, ins: df.Instruction, args: str) -> None:
        logger.debug("%s: %s ignored by the local sandbox", self.where(ins), ins.keyword)

    async def do_arg(self, ins: df.Instruction, args: str) -> None:
        for word in df.split_words(args):
            name, eq, default = word.partition("=")
            value = default if eq else self.vars.get(name, "")
            self.args[name] = value
            if name not in self.env:  # ENV wins over ARG of the same name
                self.vars[name] = value

    async def do_from(self, ins: df.Instruction, args: str) -> None:
        words = [w for w in df.split_words(args) if not w.startswith("--")]
        if not words:
            raise df.DockerfileError(f"{self.where(ins)}: FROM without an image")
        self.mapping = df.map_base_image(words[0], self.where(ins))
        self.box = await asyncio.to_thread(
            Box.start,
            BoxSpec(lowers=[self.base.rootfs], upper=self.tmp, network=True, memory_mb=8192, pids_max=8192),
        )
        if self.mapping.python_aliases:
            if strict_mode():
                await self._sh(ins, _PYTHON_STRICT_INSTALL, user=None, cwd=None, what="python image mapping (strict "
                               "base: installing Debian's python3, python3-pip, python3-venv, python3-dev)")  # fmt: skip
            else:
                await self._sh(ins, _PYTHON_HEADERS_INSTALL, user=None, cwd=None,
                               what="python image mapping (installing Debian's python3-dev: Python.h)")  # fmt: skip
            await self._sh(ins, _PYTHON_ALIASES, user=None, cwd=None, what="python image mapping")
            if self.as_of:
                await self._sh(ins, _BUILD_PIP_INSTALL, user=None, cwd=None,
                               what=f"python image mapping (pip 26 for the build steps, to resolve packages as of "
                                    f"{self.as_of}, the date of the task's image)")  # fmt: skip
                self.build_env = {"PYTHONPATH": _BUILD_PIP_DIR, "PIP_UPLOADED_PRIOR_TO": self.as_of,
                                  "UV_EXCLUDE_NEWER": self.as_of}  # fmt: skip

    async def do_env(self, ins: df.Instruction, args: str) -> None:
        kv = df.parse_key_values(args, self.where(ins))
        self.env.update(kv)
        self.vars.update(kv)

    async def do_user(self, ins: df.Instruction, args: str) -> None:
        self.user = args.strip() or None
        r = await self._raw(["id", "-u", self.user.split(":")[0]], user=None, cwd=None)
        if r.return_code != 0:
            raise SandboxBuildFailedError(f"{self.where(ins)}: USER {self.user}: no such user in the image")
        if self.box.mode == "rootless" and r.stdout.strip() != b"0":
            raise SandboxBuildFailedError(
                f"{self.where(ins)}: USER {self.user}: a rootless sandbox maps only one uid (root inside = you "
                "outside), so commands cannot run as another user. Run as root (sudo) for this task."
            )

    async def do_shell(self, ins: df.Instruction, args: str) -> None:
        value = ins.json_args()
        if not value:
            raise df.DockerfileError(f"{self.where(ins)}: SHELL needs the JSON form, e.g. SHELL [\"/bin/bash\", \"-c\"]")
        self.shell = value

    async def do_workdir(self, ins: df.Instruction, args: str) -> None:
        path = args.strip()
        if not path.startswith("/"):
            path = str(PurePosixPath(self.workdir or "/") / path)
        self.workdir = path
        cmd = f"mkdir -p {shlex.quote(path)}"
        if self.user and self.user not in ("root", "0"):
            cmd += f" && chown {shlex.quote(self.user)} {shlex.quote(path)}"
        await self._sh(ins, cmd, user=None, cwd=None, what="WORKDIR")

    async def do_run(self, ins: df.Instruction, args: str) -> None:
        words = args.split(None, 1) if args else []
        while words and words[0].startswith("--") and "=" in words[0]:  # --mount=..., --network=...
            args = words[1] if len(words) > 1 else ""
            words = args.split(None, 1)
        exec_form = ins.json_args() if not args.startswith("--") else None
        if ins.heredocs:
            head = df._HEREDOC_RE.sub("", args).strip()
            if not head:  # RUN <<EOF: the body is the script
                body = ins.heredocs[0][1]
                command: str | list[str] = body
                if body.startswith("#!"):
                    # a script with its own interpreter (#!/usr/bin/env python3 ...): run it as a file
                    command = (f"f=$(mktemp) && cat > \"$f\" <<'__RETERM_EOF__'\n{body}__RETERM_EOF__\n"
                               'chmod +x "$f" && "$f"; rc=$?; rm -f "$f"; exit $rc')  # fmt: skip
            else:
                command = args + "\n" + "".join(f"{body}{delim}\n" for delim, body in ins.heredocs)
        else:
            command = exec_form if exec_form is not None else args
        pkgs = apt_install_packages(command) if isinstance(command, str) else None
        if pkgs and not strict_mode():
            # the default base already holds the kit's package set: when it has every package asked for, the
            # install is a no-op and the build stays offline; the strict base (RETERM_SANDBOX_STRICT=1) runs it
            missing = [p for p in pkgs if p.split("=")[0] not in self.base_packages]
            if not missing:
                self.log(f"{self.where(ins)}: apt-get install {' '.join(pkgs)}: all in the base already, skipped")
                return
        r = await self.box.run(
            self.box.wrap_command(command, user=self.user, cwd=self.workdir, set_home=True, shell=tuple(self.shell)),
            env=self.run_env(), max_output_bytes=256 * 1024, on_output=self._stream,
        )  # fmt: skip
        if r.return_code != 0:
            self._fail(ins, f"RUN {str(command)[:300]}", r)

    async def _stream(self, text: str, name: str) -> None:
        for line in text.splitlines():
            logger.debug("build | %s", line)

    def _fail(self, ins: df.Instruction, what: str, r) -> None:
        tail = (r.stdout.decode(errors="replace") + r.stderr.decode(errors="replace")).strip()[-3000:]
        hint = ""
        if self.box is not None and self.box.mode == "rootless" and _ONE_UID_SYMPTOMS.search(tail):
            hint += ("\n(note: rootless sandboxes map only one uid: chown to other users or groups, apt's _apt "
                     "download user and packages shipping files owned by other users fail there; run as root "
                     "(sudo) for this task)")  # fmt: skip
        if mentions_unreachable(tail):
            hosts = unreachable_hosts(tail)
            hint += (f"\n(note: this step could not reach {', '.join(hosts) if hosts else 'a host it needs'}: build "
                     "steps use this machine's network, and the host is not reachable from it; the task needs more "
                     "network than this machine has)")  # fmt: skip
        elif self.mapping and self.mapping.family != "debian":
            suite = self.base.meta.get("suite", "bookworm")
            hint += (f"\n(note: the local sandbox builds FROM {self.mapping.image} on Debian {SUITES.get(suite, '?')} {suite}; "
                    "package names or versions of another distribution may not exist there)")  # fmt: skip
        raise SandboxBuildFailedError(f"{self.where(ins)}: {what} failed with exit code {r.return_code}:\n{tail}{hint}")

    async def _raw(self, argv: list[str], *, user, cwd, stdin: bytes | Path | None = None):
        return await self.box.run(
            self.box.wrap_command(argv, user=user, cwd=cwd, set_home=True), env=self.run_env(), stdin=stdin
        )

    async def _sh(self, ins, command: str, *, user, cwd, what: str, stdin: bytes | Path | None = None) -> None:
        r = await self._raw(["/bin/sh", "-c", command], user=user, cwd=cwd, stdin=stdin)
        if r.return_code != 0:
            self._fail(ins, what, r)

    # ------------------------------------------------------------------------- COPY / ADD
    async def do_copy(self, ins: df.Instruction, args: str, is_add: bool = False) -> None:
        where = self.where(ins)
        words = ins.json_args() or df.split_words(args)
        flags = {}
        while words and words[0].startswith("--"):
            k, _, v = words.pop(0)[2:].partition("=")
            flags[k] = v
        if ins.json_args():
            words = [df.expand(w, self.vars) for w in words]
        if ins.heredocs:  # COPY <<EOF /dest
            dest = words[-1]
            files = [(delim, body) for delim, body in ins.heredocs]
            await self._copy_heredocs(ins, files, dest, flags)
            return
        if len(words) < 2:
            raise df.DockerfileError(f"{where}: {ins.keyword} needs a source and a destination")
        srcs, dest = words[:-1], words[-1]
        if not dest.startswith("/"):
            dest = str(PurePosixPath(self.workdir or "/") / dest) + ("/" if dest.endswith("/") else "")
        if is_add and any(s.startswith(("http://", "https://")) for s in srcs):
            for s in srcs:
                target = dest + s.rsplit("/", 1)[-1] if dest.endswith("/") else dest
                q = shlex.quote
                await self._sh(ins, f"mkdir -p \"$(dirname {q(target)})\" && curl -fsSL -o {q(target)} {q(s)}",
                               user=None, cwd=None, what=f"ADD {s}")  # fmt: skip
                await self._chown_chmod(ins, [target], flags)
            return
        if self.context is None:
            raise df.DockerfileError(f"{where}: {ins.keyword} without a build context")
        matches = self._resolve_sources(ins, srcs)
        if is_add and len(matches) == 1 and matches[0].is_file() and str(matches[0]).endswith(ARCHIVE_SUFFIXES):
            q = shlex.quote
            await self._sh(ins, f"mkdir -p {q(dest)} && tar -xf - -C {q(dest)}", user=None, cwd=None,
                           what=f"ADD {srcs[0]}", stdin=matches[0])  # fmt: skip
            return
        into_dir = dest.endswith("/") or len(matches) > 1 or any(m.is_dir() and not m.is_symlink() for m in matches)
        if not into_dir:
            r = await self._raw(["test", "-d", dest], user=None, cwd=None)
            into_dir = r.return_code == 0
        if into_dir:
            dest_dir, entries = dest.rstrip("/") or "/", []
            for m in matches:
                if m.is_dir() and not m.is_symlink():
                    entries += [(p, p.relative_to(m).as_posix()) for p in sorted(m.rglob("*"))
                                if not self._ignored_path(p)]  # fmt: skip
                else:
                    entries.append((m, m.name))
        else:
            dest_dir, entries = str(PurePosixPath(dest).parent), [(matches[0], PurePosixPath(dest).name)]
        tops = sorted({str(PurePosixPath(dest_dir) / a.split("/")[0]) for _, a in entries})
        with tempfile.TemporaryFile() as tf:
            with tarfile.open(fileobj=tf, mode="w") as tar:
                for path, arc in entries:
                    tar.add(path, arcname=arc, recursive=False, filter=_root_owner)
            tf.flush()
            tf.seek(0)
            data = tf.read()
        q = shlex.quote
        await self._sh(ins, f"mkdir -p {q(dest_dir)} && tar -xf - -C {q(dest_dir)} --numeric-owner",
                       user=None, cwd=None, what=f"{ins.keyword} {' '.join(srcs)}", stdin=data)  # fmt: skip
        await self._chown_chmod(ins, tops, flags)

    async def do_add(self, ins: df.Instruction, args: str) -> None:
        await self.do_copy(ins, args, is_add=True)

    async def _copy_heredocs(self, ins, files, dest, flags) -> None:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for i, (delim, body) in enumerate(files):
                data = body.encode()
                info = tarfile.TarInfo(delim if dest.endswith("/") else PurePosixPath(dest).name)
                info.size, info.mode = len(data), 0o644
                tar.addfile(info, io.BytesIO(data))
        dest_dir = dest.rstrip("/") if dest.endswith("/") else str(PurePosixPath(dest).parent)
        if not dest_dir.startswith("/"):
            dest_dir = str(PurePosixPath(self.workdir or "/") / dest_dir)
        q = shlex.quote
        await self._sh(ins, f"mkdir -p {q(dest_dir)} && tar -xf - -C {q(dest_dir)}", user=None, cwd=None,
                       what=f"{ins.keyword} heredoc", stdin=buf.getvalue())  # fmt: skip
        await self._chown_chmod(ins, [dest if not dest.endswith("/") else dest_dir], flags)

    async def _chown_chmod(self, ins, paths: list[str], flags: dict) -> None:
        q = " ".join(shlex.quote(p) for p in paths)
        if flags.get("chown"):
            await self._sh(ins, f"chown -R {shlex.quote(flags['chown'])} {q}", user=None, cwd=None, what="--chown")
        if flags.get("chmod"):
            await self._sh(ins, f"chmod -R {shlex.quote(flags['chmod'])} {q}", user=None, cwd=None, what="--chmod")

    def _ignored_path(self, p: Path) -> bool:
        return _ignored(p.relative_to(self.context).as_posix(), _dockerignore(self.context))

    def _resolve_sources(self, ins, srcs: list[str]) -> list[Path]:
        """Context paths for ``srcs`` (globs allowed); none may leave the context."""
        root = self.context.resolve()
        out: list[Path] = []
        for s in srcs:
            rel = PurePosixPath("/" + s)
            parts = [p for p in rel.parts if p not in ("/", ".")]
            if ".." in parts:
                raise df.DockerfileError(f"{self.where(ins)}: {ins.keyword} source {s!r} is outside the build context")
            pattern = "/".join(parts) or "."
            found = sorted(root.glob(pattern)) if any(c in pattern for c in "*?[") else [root / pattern]
            found = [f for f in found if f.exists() or f.is_symlink()]
            found = [f for f in found if f == root or not self._ignored_path(f)]
            if not found:
                raise df.DockerfileError(f"{self.where(ins)}: {ins.keyword} source {s!r} not found in {self.context}")
            for f in found:
                real = f.resolve()
                if real != root and root not in real.parents:
                    raise df.DockerfileError(
                        f"{self.where(ins)}: {ins.keyword} source {s!r} resolves outside the build context"
                    )
                out.append(f)
        return out


def _root_owner(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info
