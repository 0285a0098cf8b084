"""Just enough shell parsing to reason about an agent's command line.

The classifier and the localiser need to know which programs a command line runs (is it a probe such as
``grep`` or ``which``, a read-only viewer such as ``cat``, a test runner, the agent's own script?),
whether it tolerates failure (``|| true``), and which files it writes (so that later errors in those files
count as the agent's own code). No library does this (``shlex`` only splits words; ``bashlex`` is
unmaintained and fails on partial input), so this module does it with a small quote-aware splitter and
``shlex`` for words. It never raises: input it cannot parse degrades to a plain whitespace split.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

# Wrappers that run another program: their own options are skipped to find the real program.
_WRAPPERS = {"sudo", "env", "time", "nohup", "nice", "ionice", "exec", "stdbuf", "setsid", "xargs", "chronic"}
_TIMEOUT_WRAPPERS = {"timeout", "gtimeout"}

_HEREDOC = re.compile(r"<<-?\s*(['\"]?)([A-Za-z_][\w.-]*)\1")
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


@dataclass
class Segment:
    """One simple command of a command line.

    ``op`` is the operator that precedes it (``""`` for the first, else ``;``, ``&&``, ``||``, ``|``,
    ``&`` or ``"\\n"``). ``program`` is the base name of the program it runs after wrappers
    (``sudo``, ``env``, ``timeout 60``...) and variable assignments are skipped; ``python -m X`` gives
    ``X``. ``args`` are the words after the program. ``timeout_wrapped`` is True under ``timeout``.
    """

    text: str
    op: str = ""
    program: str = ""
    args: list[str] = field(default_factory=list)
    timeout_wrapped: bool = False


def strip_heredocs(command: str) -> str:
    """The command line without here-document bodies (their text is data, not commands)."""
    lines = command.split("\n")
    out: list[str] = []
    pending: list[str] = []
    for line in lines:
        if pending:
            if line.strip() == pending[0]:
                pending.pop(0)
            continue
        out.append(line)
        pending.extend(m.group(2) for m in _HEREDOC.finditer(line))
    return "\n".join(out)


def _split_top_level(command: str) -> list[tuple[str, str]]:
    """Split at top-level ``;``, ``&&``, ``||``, ``|``, ``&`` and newlines, respecting quotes,
    backslashes, ``$( )``, backticks, ``( )`` and ``{ }`` groups. Returns ``(op, text)`` pairs."""
    parts: list[tuple[str, str]] = []
    buf: list[str] = []
    op = ""
    quote = ""
    depth = 0
    i, n = 0, len(command)
    while i < n:
        c = command[i]
        if quote:
            buf.append(c)
            if c == "\\" and quote == '"' and i + 1 < n:
                buf.append(command[i + 1])
                i += 2
                continue
            if c == quote:
                quote = ""
            i += 1
            continue
        if c == "\\" and i + 1 < n:
            buf.append(command[i : i + 2])
            i += 2
            continue
        if c in "'\"`":
            quote = c
            buf.append(c)
            i += 1
            continue
        if c == "(" or (c == "{" and (i + 1 < n and command[i + 1] in " \n")):
            depth += 1
        elif c == ")" or (c == "}" and depth > 0 and command[i - 1 : i] in (" ", ";", "\n")):
            depth = max(0, depth - 1)
        if depth == 0:
            two = command[i : i + 2]
            if two in ("&&", "||"):
                parts.append((op, "".join(buf)))
                buf, op = [], two
                i += 2
                continue
            if c == "&" and command[i - 1 : i] not in (">", "<") and command[i + 1 : i + 2] != ">":
                parts.append((op, "".join(buf)))
                buf, op = [], "&"
                i += 1
                continue
            if c in ";|\n" and not (c == "|" and command[i - 1 : i] == ">"):
                parts.append((op, "".join(buf)))
                buf, op = [], c
                i += 1
                continue
        buf.append(c)
        i += 1
    parts.append((op, "".join(buf)))
    return [(o, t.strip()) for o, t in parts if t.strip()]


def _words(text: str) -> list[str]:
    try:
        return shlex.split(text, comments=False, posix=True)
    except ValueError:  # unbalanced quotes
        return text.split()


def _program(words: list[str]) -> tuple[str, list[str], bool]:
    """Skip assignments and wrappers; return (program base name, args, under timeout)."""
    i = 0
    timeout_wrapped = False
    while i < len(words):
        w = words[i]
        if _ASSIGNMENT.match(w) or w in ("!", "(", "{", "then", "do", "else", "if", "while", "until"):
            i += 1
            continue
        base = w.rsplit("/", 1)[-1]
        if base in _WRAPPERS:
            i += 1
            while i < len(words) and (words[i].startswith("-") or _ASSIGNMENT.match(words[i])):
                # options with a value (sudo -u USER, nice -n 5)
                if words[i] in ("-u", "-g", "-n", "-c", "-s", "-C", "-I", "-L", "-P") and base != "env":
                    i += 1
                i += 1
            continue
        if base in _TIMEOUT_WRAPPERS:
            timeout_wrapped = True
            i += 1
            while i < len(words) and words[i].startswith("-"):
                if words[i] in ("-s", "-k", "--signal", "--kill-after"):
                    i += 1
                i += 1
            i += 1  # the duration
            continue
        if base == "command" and i + 1 < len(words) and words[i + 1] in ("-v", "-V"):
            return "command -v", words[i + 2 :], timeout_wrapped
        args = words[i + 1 :]
        if re.fullmatch(r"python[\d.]*", base) and len(args) >= 2 and args[0] == "-m":
            return args[1], args[2:], timeout_wrapped
        return base, args, timeout_wrapped
    return "", [], timeout_wrapped


def segments(command: str | None) -> list[Segment]:
    """The simple commands of a command line, in order (here-document bodies removed).

    ``segments("cd /app && timeout 5 python -m pytest -q || true")`` gives programs
    ``cd``, ``pytest``, ``true`` with ops ``""``, ``&&``, ``||``.
    """
    if not command:
        return []
    out = []
    for op, text in _split_top_level(strip_heredocs(command)):
        words = _words(text)
        program, args, wrapped = _program(words)
        out.append(Segment(text=text, op=op, program=program, args=args, timeout_wrapped=wrapped))
    return out


# ------------------------------------------------------------------------------------ intents
# Probes: programs whose non-zero exit answers "no" rather than reporting an error. Value: the benign
# exit statuses. Source: the programs' manuals (grep(1): 1 = no line selected, 2 = error; diff(1): 1 =
# different, 2 = trouble; test(1); which(1); pgrep(1); systemctl is-active: 3 = inactive...).
PROBE_EXITS: dict[str, frozenset[int]] = {
    **{p: frozenset({1}) for p in ("grep", "egrep", "fgrep", "zgrep", "rg", "ag", "ack", "which", "type",
                                   "command -v", "test", "[", "[[", "diff", "cmp", "pgrep", "pidof", "pkill",
                                   "killall", "false", "id", "stat", "dpkg-query", "nc", "ncat",
                                   "ps", "kill-0", "hash", "whereis", "git-diff", "pip-show", "dpkg-s")},
    "ls": frozenset({1, 2}),
    "find": frozenset({1}),  # some start points unreadable or missing: the search itself answered
    "getent": frozenset({2}),
    "systemctl": frozenset({1, 3, 4}),
    "service": frozenset({3}),
}

# Programs that only show things: error words in their output are content, not errors of this step
# (unless the line is the program's own diagnostic, "cat: x: No such file or directory").
VIEWERS = frozenset(
    "cat less more head tail grep egrep fgrep zgrep rg ag ack nl tac zcat bat view echo printf ls find tree "
    "wc sort uniq cut column strings hexdump xxd od file stat du df dmesg journalctl env printenv ps "
    "history jq yq readlink realpath basename dirname date whoami id pwd true which type test [ [[ sleep".split()
) | {"command -v"}
_GIT_VIEW = {"log", "show", "diff", "status", "blame", "branch", "remote", "config", "rev-parse", "ls-files", "grep"}
_PKG_VIEW = {("pip", "list"), ("pip", "show"), ("pip", "freeze"), ("pip3", "list"), ("pip3", "show"),
             ("pip3", "freeze"), ("apt", "list"), ("apt", "show"), ("apt-cache", "policy"),
             ("apt-cache", "show"), ("apt-cache", "search"), ("dpkg", "-l"), ("dpkg", "-s"), ("dpkg", "-L")}

TEST_RUNNERS = frozenset("pytest py.test unittest nose2 tox nox jest mocha vitest ctest bats".split())
_TEST_SUBCOMMANDS = {("go", "test"), ("cargo", "test"), ("npm", "test"), ("yarn", "test"), ("pnpm", "test"),
                     ("make", "test"), ("make", "check"), ("mvn", "test"), ("gradle", "test"), ("dotnet", "test")}

_FALLBACKS = frozenset({"true", ":", "echo", "printf", "exit", "return"})


def _view_key(seg: Segment) -> str:
    if seg.program == "git" and seg.args:
        sub = next((a for a in seg.args if not a.startswith("-")), "")
        if sub in _GIT_VIEW and not (sub in ("branch", "remote", "config") and len(seg.args) > 1):
            if sub == "diff" and ("--quiet" in seg.args or "--exit-code" in seg.args):
                return "git-diff"
            return "view"
    if (seg.program, seg.args[0] if seg.args else "") in _PKG_VIEW:
        return "view"
    if seg.program == "sed" and not any(a.startswith("-i") or a.startswith("--in-place") for a in seg.args):
        return "view" if any(a in ("-n", "--quiet") for a in seg.args) else ""
    return "view" if seg.program in VIEWERS else ""


def is_read_only(segs: list[Segment]) -> bool:
    """True when every simple command only shows things (viewers, ``cd``, git log/diff/status...),
    so error words in the output are file content rather than errors of this step."""
    if not segs:
        return False
    for seg in segs:
        if seg.program in ("cd", "pushd", "popd", "set", "export", "source", "."):
            continue
        if _view_key(seg) != "view":
            return False
        if re.search(r"(?<![0-9&])>(?!&)", seg.text):  # writes a file
            return False
    return True


def probe_exit_is_benign(segs: list[Segment], exit_status: int | None) -> bool:
    """True when ``exit_status`` is the "no" answer of a probe in the command line (``grep`` exit 1,
    ``which`` exit 1, ``test`` exit 1, ``diff`` exit 1, ``pgrep`` exit 1, ``dpkg -s``/``pip show``
    exit 1...). Only probes that can decide the final status count: the last simple command, or one
    chained with ``&&`` (which stops the line when it answers no)."""
    if not exit_status:
        return False
    for k, seg in enumerate(segs):
        key = seg.program
        if seg.program == "git" and _view_key(seg) == "git-diff":
            key = "git-diff"
        elif seg.program == "git" and seg.args[:1] == ["grep"]:
            key = "grep"
        elif seg.program in ("pip", "pip3") and seg.args[:1] == ["show"]:
            key = "pip-show"
        elif seg.program == "dpkg" and seg.args[:1] in (["-s"], ["--status"], ["-l"]):
            key = "dpkg-s"
        elif seg.program == "kill" and seg.args[:1] == ["-0"]:
            key = "kill-0"
        elif seg.program == "systemctl" and not (seg.args[:1] and seg.args[0].startswith("is-")):
            continue
        benign = PROBE_EXITS.get(key)
        if not benign or exit_status not in benign:
            continue
        last = k == len(segs) - 1
        next_op = segs[k + 1].op if not last else ""
        if last or next_op in ("&&", "|") and all(s.op in ("&&", "|") for s in segs[k + 1 :]):
            return True
    return False


def tolerates_failure(segs: list[Segment]) -> bool:
    """True when the line ends in a fallback that masks failure: ``|| true``, ``|| :``,
    ``|| echo ...``, ``|| exit 0``."""
    return bool(segs) and segs[-1].op == "||" and segs[-1].program in _FALLBACKS


def runs_tests(segs: list[Segment]) -> bool:
    """True when the line runs a test runner (pytest, unittest, go/cargo/npm test, make test...)."""
    for seg in segs:
        sub = seg.args[0] if seg.args else ""
        if seg.program in TEST_RUNNERS or (seg.program, sub) in _TEST_SUBCOMMANDS:
            return True
        if seg.program in ("npm", "yarn", "pnpm") and sub == "run" and len(seg.args) > 1 and seg.args[1].startswith("test"):
            return True
        if re.search(r"(^|/)(run_?tests?|test)(\.sh)?$", seg.program) or (
            seg.program in ("bash", "sh") and sub and re.search(r"(^|/)(run_?)?tests?[\w-]*\.sh$", sub)
        ):
            return True
    return False


_REDIRECT = re.compile(r"(?<![0-9&<])(?:[12]?>>?|&>>?)\s*([^\s;&|<>()]+)")


def written_files(command: str | None) -> list[str]:
    """Paths a command line writes (redirections, ``tee``, ``sed -i``, ``cp``/``mv``/``touch``
    targets, editors). Best effort; ``/dev/*`` and fd duplications are left out."""
    if not command:
        return []
    out: list[str] = []
    first_lines = strip_heredocs(command)
    for m in _REDIRECT.finditer(first_lines):
        out.append(m.group(1).strip("'\""))
    for seg in segments(command):
        files = [a for a in seg.args if not a.startswith("-") and not re.match(r"^[0-9&]*[<>]", a)]
        if seg.program == "tee":
            out.extend(files)
        elif seg.program == "sed" and any(a.startswith("-i") or a.startswith("--in-place") for a in seg.args):
            out.extend(files[1:] if len(files) > 1 else [])
        elif seg.program in ("cp", "mv", "install", "ln") and len(files) >= 2:
            out.append(files[-1])
        elif seg.program in ("touch", "vim", "vi", "nano", "emacs", "ed"):
            out.extend(files)
    return [p for p in dict.fromkeys(out) if p and not p.startswith("/dev/") and not p.startswith("&")]


def path_matches(path: str, candidates: list[str]) -> bool:
    """True when ``path`` names one of ``candidates`` (equal, or one is a path suffix of the other:
    ``/app/solve.py`` matches ``solve.py``)."""
    p = path.strip().rstrip("/")
    for c in candidates:
        c = c.strip().rstrip("/")
        if not c or not p:
            continue
        if p == c or p.endswith("/" + c.lstrip("./")) or c.endswith("/" + p.lstrip("./")):
            return True
    return False
