"""Read a task's ``environment/Dockerfile`` for the local sandbox (no container engine involved).

Own code: Harbor hands Dockerfiles to docker/podman; there is no maintained pure-Python Dockerfile
parser in our requirements. This one follows the Dockerfile reference (line continuations with the
escape character, comments and parser directives, shell and JSON forms, BuildKit heredocs,
``$VAR`` / ``${VAR:-default}`` / ``${VAR:+alt}`` substitution in the instructions that take it).

Which instructions the local sandbox supports: ``FROM`` of a Debian, Ubuntu or python base
(mapped onto the cached Debian bookworm base, see :func:`map_base_image`), ``RUN``, ``WORKDIR``,
``ENV``, ``ARG``, ``COPY``/``ADD`` (no ``--from``), ``USER``, ``SHELL``; harmless metadata
(``LABEL``, ``EXPOSE``, ``CMD``, ``ENTRYPOINT``, ``VOLUME``, ``STOPSIGNAL``, ``HEALTHCHECK``,
``MAINTAINER``) is ignored. Anything else, a second ``FROM`` (multi-stage) or another base image
raises :class:`DockerfileError` naming the file and line.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

SUPPORTED = {"FROM", "RUN", "WORKDIR", "ENV", "ARG", "COPY", "ADD", "USER", "SHELL"}
IGNORED = {"LABEL", "EXPOSE", "CMD", "ENTRYPOINT", "VOLUME", "STOPSIGNAL", "HEALTHCHECK", "MAINTAINER"}
# Instructions whose arguments Docker expands with build variables.
EXPANDED = {"ADD", "COPY", "ENV", "FROM", "USER", "WORKDIR", "ARG", "SHELL"}


class DockerfileError(ValueError):
    """A Dockerfile the local sandbox cannot build; the message starts with ``file:line:``."""


@dataclass
class Instruction:
    """One instruction. ``args`` is the text after the keyword (continuations joined);
    ``heredocs`` the ``(delimiter, body)`` pairs that followed it; ``line`` is 1-based."""

    keyword: str
    args: str
    line: int
    heredocs: list[tuple[str, str]] = field(default_factory=list)

    def json_args(self) -> list[str] | None:
        """The JSON (exec) form as a list of strings, or None for the shell form."""
        text = self.args.strip()
        if not text.startswith("["):
            return None
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            return None
        return value if isinstance(value, list) and all(isinstance(v, str) for v in value) else None


_HEREDOC_RE = re.compile(r"<<(-?)(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\2")


def parse(path: Path) -> list[Instruction]:
    """Parse a Dockerfile into instructions (comments, directives and blank lines dropped).

    Raises:
        DockerfileError: unknown syntax (an unterminated heredoc, a line that is no instruction).
    """
    text = path.read_text()
    lines = text.splitlines()
    escape = "\\"
    i = 0
    # parser directives: leading "# key=value" comment lines
    while i < len(lines):
        m = re.match(r"^#\s*([a-zA-Z]+)\s*=\s*(\S+)\s*$", lines[i])
        if not m:
            break
        if m.group(1).lower() == "escape":
            escape = m.group(2)
        i += 1
    out: list[Instruction] = []
    while i < len(lines):
        raw = lines[i]
        start_line = i + 1
        i += 1
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue
        logical = raw
        while logical.rstrip().endswith(escape) and i <= len(lines):
            logical = logical.rstrip()[: -len(escape)]
            # comment and blank lines inside a continuation are dropped
            while i < len(lines) and (lines[i].lstrip().startswith("#") or not lines[i].strip()):
                i += 1
            if i >= len(lines):
                break
            logical += lines[i]
            i += 1
        m = re.match(r"^\s*([A-Za-z]+)(\s+(.*))?$", logical, re.S)
        if not m:
            raise DockerfileError(f"{path}:{start_line}: cannot parse {raw.strip()!r}")
        keyword, args = m.group(1).upper(), (m.group(3) or "").strip()
        heredocs: list[tuple[str, str]] = []
        if keyword in ("RUN", "COPY", "ADD"):
            for hm in _HEREDOC_RE.finditer(args):
                strip_tabs, delim = hm.group(1) == "-", hm.group(3)
                body: list[str] = []
                while True:
                    if i >= len(lines):
                        raise DockerfileError(f"{path}:{start_line}: heredoc <<{delim} is not terminated")
                    line = lines[i]
                    i += 1
                    if (line.lstrip("\t") if strip_tabs else line) == delim:
                        break
                    body.append(line.lstrip("\t") if strip_tabs else line)
                heredocs.append((delim, "\n".join(body) + "\n"))
        out.append(Instruction(keyword, args, start_line, heredocs))
    return out


_VAR_RE = re.compile(r"\\\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::([-+])([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)")


def expand(text: str, variables: dict[str, str]) -> str:
    """Docker's variable substitution: ``$V``, ``${V}``, ``${V:-default}``, ``${V:+alt}``, ``\\$`` literal."""

    def repl(m: re.Match) -> str:
        if m.group(0) == "\\$":
            return "$"
        name = m.group(1) or m.group(4)
        value = variables.get(name)
        if m.group(2) == "-":
            return value if value else expand(m.group(3), variables)
        if m.group(2) == "+":
            return expand(m.group(3), variables) if value else ""
        return value or ""

    return _VAR_RE.sub(repl, text)


def split_words(text: str) -> list[str]:
    """Split shell-form arguments on whitespace, honouring double/single quotes and backslashes."""
    words, cur, quote, has = [], [], None, False
    i = 0
    while i < len(text):
        c = text[i]
        if quote:
            if c == quote:
                quote = None
            elif c == "\\" and quote == '"' and i + 1 < len(text):
                i += 1
                cur.append(text[i])
            else:
                cur.append(c)
        elif c in "\"'":
            quote, has = c, True
        elif c == "\\" and i + 1 < len(text):
            i += 1
            cur.append(text[i])
            has = True
        elif c.isspace():
            if cur or has:
                words.append("".join(cur))
            cur, has = [], False
        else:
            cur.append(c)
            has = True
        i += 1
    if cur or has:
        words.append("".join(cur))
    return words


def parse_key_values(args: str, where: str) -> dict[str, str]:
    """``ENV``/``LABEL`` arguments: ``K=V K2="v 2"`` or the legacy ``K value with spaces``."""
    words = split_words(args)
    if not words:
        raise DockerfileError(f"{where}: missing arguments")
    if "=" not in words[0]:
        key, _, value = args.strip().partition(" ")
        return {key: " ".join(split_words(value.strip())) if value.strip() else ""}
    out = {}
    for w in words:
        if "=" not in w:
            raise DockerfileError(f"{where}: expected KEY=VALUE, got {w!r}")
        k, _, v = w.partition("=")
        out[k] = v
    return out


@dataclass(frozen=True)
class BaseMapping:
    """How a ``FROM`` image maps onto the local base.

    ``family`` is ``debian``, ``ubuntu`` or ``python``; ``python_aliases`` asks the build to add
    ``python``/``pip`` commands and allow system-wide ``pip install`` like the python images do.
    """

    image: str
    family: str
    python_aliases: bool


def debian_suite(image: str) -> str:
    """The Debian suite of the base a ``FROM`` image is built on: ``trixie`` for Debian 13 images
    (``debian:13``, ``debian:13-slim``, ``debian:trixie*``, ``buildpack-deps:trixie*``), else ``bookworm`` (every
    other debian, ubuntu and python image; :data:`reterm.sandbox.base_image.SUITES`)."""
    ref = image.split("@", 1)[0]
    name, _, tag = ref.rsplit("/", 1)[-1].partition(":")
    name, tag = name.lower(), tag.lower()
    if name.startswith(("debian", "buildpack-deps")) and (tag == "13" or tag.startswith(("13-", "13.", "trixie"))):
        return "trixie"
    return "bookworm"


def first_from(text: str) -> str | None:
    """The image of a Dockerfile's first ``FROM`` line (``--platform=`` skipped), or ``None``."""
    for line in text.splitlines():
        words = line.strip().split()
        if words and words[0].upper() == "FROM":
            images = [w for w in words[1:] if not w.startswith("--")]
            return images[0] if images else None
    return None


def map_base_image(image: str, where: str) -> BaseMapping:
    """Map a ``FROM`` image onto the Debian base (bookworm; trixie for Debian 13, :func:`debian_suite`), or raise
    :class:`DockerfileError`.

    Accepted: ``debian:*``, ``buildpack-deps:*``, ``ubuntu:*``, ``python:*`` (any registry or org
    prefix, so Terminal-Bench's ``ghcr.io/laude-institute/t-bench/ubuntu-24-04`` and
    ``.../python-3-13`` count). The userland is Debian 12 with Python 3.11 (Debian 13 with Python 3.13 for
    ``FROM debian:13``): a Dockerfile that installs another distribution's package names fails at its ``RUN``
    line with apt's message.
    """
    ref = image.split("@", 1)[0]
    name = ref.rsplit("/", 1)[-1]
    name = name.split(":", 1)[0].lower()
    if name.startswith("python") or name.startswith("pypy"):
        return BaseMapping(image, "python", True)
    if name.startswith(("debian", "buildpack-deps")):
        return BaseMapping(image, "debian", False)
    if name.startswith("ubuntu"):
        return BaseMapping(image, "ubuntu", False)
    raise DockerfileError(
        f"{where}: FROM {image}: the local sandbox's userland is a Debian 12 (bookworm) base made by "
        "debootstrap; it can stand in for debian, ubuntu and python images only. Use one of those as the "
        "base, or run this task with a container engine (harbor -e docker / podman)."
    )
