"""Rule-based classification of one agent step into the error taxonomy.

A :class:`StepRecord` is one step as the harness saw it (command, terminal output, exit status, timeout
flag) plus a little context (earlier commands, files the agent wrote, the verifier's result for a submit).
:func:`classify_step` labels it with a :class:`~reterm.recovery.taxonomy.Category` (a failure category,
``none`` or ``infra``), a confidence in [0, 1], the rule that fired and the evidence it matched.

The rules (in the order they are tried; the first that fires wins; see docs/ERROR_TAXONOMY.md):

1. submit steps: ``premature_completion`` when the verifier failed, else ``none``; parse-error steps are
   ``none`` (not failure states; the harness already answered them).
2. infrastructure faults (container runtime, bubblewrap, tmux server, harness tracebacks) -> ``infra``.
3. a command that is only a key press (``C-c``...) or empty -> ``none``; the harness timed the step out,
   ``timeout`` exited 124, Ctrl-C interrupted it, or the terminal waits for input nobody asked for (a
   ``[Y/n]``/password/host-key prompt, a pager), or a foreground program still holds the terminal when
   the harness came back (a server started without ``&``) -> ``timeout_hang``. A REPL or editor the
   agent opened is not a failure, and keystrokes typed into a program the previous step left running
   are input for it. The harness's own status lines (``[exit status: N]``...) are not read as output.
4. pattern families over the output, most specific cause first: services not reachable, missing
   dependencies, wrong usage/syntax, wrong state, git errors, test failures, Python tracebacks (by the
   final exception), compile errors, crashes, paths/permissions, other known failures.
5. fall-backs: a probe's "no" (``grep`` exit 1, ``which``, ``test``, ``diff``, ``pgrep``...) -> ``none``;
   ``curl`` exit codes; cue words in the error lines (confidence 0.5); a test runner, the agent's own
   script, or an error naming a file the agent wrote -> ``faulty_implementation``; any other non-zero
   exit -> ``other`` with low confidence (the LLM judge, if any, looks at those).

Error words in the output of read-only commands that succeeded (``cat log``, ``grep -i error``) are file
content, not errors. "Weak" patterns (a missing path, "already exists") are ignored for probes and for
lines that mask failure with ``|| true``: there the agent anticipated them.

Written for this kit (no library classifies terminal errors); the public-run shares in the field notes
(missing dependency about 44% of failing steps, benign non-zero exits about 7%) set the priorities.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from reterm.agent.protocol import SPECIAL_KEYS
from reterm.recovery import shell
from reterm.recovery.taxonomy import Category

C = Category


@dataclass
class StepRecord:
    """One agent step with the context the classifier uses.

    Args:
        command: the bash command typed (``None`` for submit and parse-error steps).
        output: the terminal output as the model saw it (observation).
        exit_status: the shell's ``$?``; ``None`` when the shell did not return (timeout, interactive
            program) or is unknown (trajectories of agents that do not record it).
        timed_out: the harness interrupted the command after its timeout.
        tool: ``"bash"``, ``"submit"`` or ``"parse_error"``.
        previous_commands: earlier bash commands of the episode, oldest first.
        agent_files: paths the agent wrote or edited in earlier steps (see
            :func:`reterm.recovery.shell.written_files`).
        verifier_passed: for submit steps, whether the verifier passed the trial (``None``: unknown).
        infra_flag: the harness marked the step as an infrastructure fault (``Step.extra["infra_fault"]``).
        running: the program still in the foreground when the step returned (``Step.extra["running"]``;
            also read from the observation's ``[still running: ...]`` line).
        typed_into: the program that was in the foreground when the command was typed (the previous
            step's ``running``): the command is input for it (Python typed into a REPL), not a shell command.
        id: an identifier for reports (labelled records).
    """

    command: str | None = None
    output: str = ""
    exit_status: int | None = None
    timed_out: bool = False
    tool: str = "bash"
    previous_commands: list[str] = field(default_factory=list)
    agent_files: list[str] = field(default_factory=list)
    verifier_passed: bool | None = None
    infra_flag: bool = False
    running: str | None = None
    typed_into: str | None = None
    id: str = ""

    @classmethod
    def from_dict(cls, row: dict[str, Any], where: str = "record") -> "StepRecord":
        """Build from a mapping (a labelled-set row). Unknown keys are ignored except ``label``,
        ``split``, ``note`` which belong to the labelled set. Raises ``ValueError`` naming ``where``
        and the field for a value of the wrong type."""
        kwargs: dict[str, Any] = {}
        types = {
            "command": (str, type(None)),
            "output": (str, type(None)),
            "exit_status": (int, type(None)),
            "timed_out": (bool,),
            "tool": (str,),
            "previous_commands": (list,),
            "agent_files": (list,),
            "verifier_passed": (bool, type(None)),
            "infra_flag": (bool,),
            "running": (str, type(None)),
            "typed_into": (str, type(None)),
            "id": (str,),
        }
        for key, allowed in types.items():
            if key in row:
                value = row[key]
                if not isinstance(value, allowed) or (key == "exit_status" and isinstance(value, bool)):
                    raise ValueError(f"{where}: field {key!r} has {type(value).__name__} value {value!r}")
                kwargs[key] = value
        kwargs["output"] = kwargs.get("output") or ""
        if kwargs.get("tool", "bash") not in ("bash", "submit", "parse_error"):
            raise ValueError(f"{where}: field 'tool' must be bash, submit or parse_error, not {kwargs['tool']!r}")
        return cls(**kwargs)


@dataclass
class Classification:
    """The label of one step.

    ``label`` is a :class:`Category`; ``confidence`` in [0, 1] (below about 0.6 the rules are unsure and
    the LLM judge, when configured, is asked); ``rule`` names the rule that fired; ``evidence`` is the
    matched text (a line of the output, the exit status...); ``source`` is ``"rules"`` or ``"judge"``;
    ``rules_label`` keeps the rules' label when the judge changed it.
    """

    label: Category
    confidence: float
    rule: str
    evidence: str = ""
    source: str = "rules"
    rules_label: Category | None = None

    @property
    def is_failure(self) -> bool:
        """True when the label is one of the eight failure categories."""
        return self.label.is_failure


# --------------------------------------------------------------------------------- helpers
@dataclass
class _Ctx:
    record: StepRecord
    segs: list[shell.Segment]
    text: str  # output the rules read (command echo removed; diagnostics only for viewers that succeeded)
    failed: bool | None  # exit status says failure (None: unknown)
    weak_ok: bool  # weak patterns count
    programs: set[str]


_MAX_SCAN = 64_000


def _clip_output(output: str) -> str:
    """Very long outputs are scanned as their first 16 000 and last 48 000 characters (errors sit at the
    end; the harness truncates observations anyway). Keeps classification fast on megabytes of output."""
    if len(output) <= _MAX_SCAN:
        return output
    return output[:16_000] + "\n[...]\n" + output[-48_000:]


def _line_of(text: str, start: int) -> str:
    a = text.rfind("\n", 0, start) + 1
    b = text.find("\n", start)
    return text[a : b if b >= 0 else len(text)].strip()[:300]


def _strip_echo(output: str, command: str | None) -> str:
    """Drop a leading echo of the command (terminals that show the typed line, ``$ cmd``)."""
    if not command or not output:
        return output
    first, _, rest = output.partition("\n")
    cmd_first = command.strip().split("\n", 1)[0].strip()
    line = first.rstrip()
    if cmd_first and (line == cmd_first or (line.endswith(("$ " + cmd_first, "# " + cmd_first))
                                            and len(line) - len(cmd_first) < 80)):
        return rest
    return output


# Programs whose absence is a missing dependency, used to tell a typo (``pyhton3``) from a missing tool.
KNOWN_PROGRAMS = frozenset(
    """python python2 python3 pip pip3 pipx uv poetry pipenv conda mamba virtualenv pytest ruff black flake8
    mypy tox nox ipython jupyter node nodejs npm npx yarn pnpm deno bun tsc ts-node eslint prettier gcc g++ cc
    clang clang++ make cmake ninja meson bazel autoconf automake libtool pkg-config cargo rustc rustup go
    gofmt java javac mvn gradle kotlin scala sbt ruby gem bundle rake perl cpan cpanm php composer lua luajit
    ghc cabal stack ocaml opam dotnet mono swift julia R Rscript zig nim erl elixir mix dart jq yq curl wget
    git svn hg tar unzip zip gzip gunzip bzip2 xz 7z zstd sqlite3 psql pg_ctl initdb createdb pg_dump mysql
    mysqld mariadb redis-cli redis-server mongod mongosh nginx apache2 httpd docker podman kubectl helm
    ssh scp rsync sftp vim vi nano emacs less more tree file strace ltrace gdb valgrind lsof netstat ss ip
    ifconfig ping nc netcat ncat socat telnet dig nslookup host htop top ps pgrep pkill kill killall
    systemctl service sudo su awk gawk mawk sed grep rg ag find fd xargs sort uniq wc cut tr head tail cat
    tee diff patch cmp md5sum sha256sum base64 openssl gpg bc dc expr seq shuf timeout watch screen tmux
    crontab flask gunicorn uvicorn django-admin celery supervisord convert magick ffmpeg ffprobe pandoc
    pdflatex latex gs nasm as ld objdump readelf nm strings hexdump xxd od protoc terraform ansible aws
    gcloud az parallel inotifywait iptables useradd adduser groupadd chown chmod mount lsblk dd losetup
    apt apt-get apt-cache dpkg yum dnf apk pacman brew snap pip-compile pre-commit sphinx-build mkdocs
    hyperfine ab wrk htpasswd qemu-system-x86_64 qemu-img unrar lz4 cpio rpm alien mkfs fdisk parted""".split()
)
# Words that are code or shell syntax, not programs: typing them into bash means the wrong program
# was in the foreground (a here-doc that ended early, Python typed after the REPL exited).
_NOT_PROGRAMS = frozenset(
    "EOF import from def class return print fi done then else elif esac end endif function let const var "
    "if for while SELECT INSERT UPDATE DELETE CREATE DROP BEGIN COMMIT".split()
)


_INSTALLERS = {("pip", "install"), ("pip3", "install"), ("pipx", "install"), ("npm", "install"), ("cargo", "install"),
               ("go", "install"), ("gem", "install"), ("uv", "pip"), ("conda", "install")}


def _installed_earlier(name: str, previous: list[str]) -> bool:
    """True when an earlier command installed a package named ``name`` with pip/npm/cargo/... ."""
    for command in previous:
        for seg in shell.segments(command):
            if (seg.program, seg.args[0] if seg.args else "") in _INSTALLERS or (
                re.search(r"(^|/)pip3?$", seg.text.split()[0] if seg.text.split() else "") and "install" in seg.args
            ):
                pkgs = {re.split(r"[<>=\[@]", a, maxsplit=1)[0].lower() for a in seg.args if not a.startswith("-")}
                if name.lower() in pkgs:
                    return True
    return False


def _command_not_found(ctx: _Ctx) -> Classification | None:
    m = re.search(
        r"(?m)(?:^|\s)(?:[\w./-]+: )?(?:line \d+: )?([^\s:]+): command not found"
        r"|^[^\n:]*: \d+: ([^\s:]+): not found\s*$"
        r"|command not found: (\S+)",
        ctx.text,
    )
    if not m:
        return None
    name = next(g for g in m.groups() if g)
    evidence = _line_of(ctx.text, m.start() + (1 if ctx.text[m.start() : m.start() + 1].isspace() else 0))
    if _installed_earlier(name, ctx.record.previous_commands):
        # installed by an earlier step but not on PATH (venv not activated, --user install, other prefix)
        return Classification(C.WRONG_STATE, 0.7, "installed_but_not_on_path", evidence)
    if name in KNOWN_PROGRAMS:
        return Classification(C.MISSING_DEPENDENCY, 0.9, "command_not_found", evidence)
    if name in _NOT_PROGRAMS or re.search(r"[()=\"'{}\[\]<>]", name):
        return Classification(C.WRONG_COMMAND, 0.8, "code_typed_into_shell", evidence)
    close = difflib.get_close_matches(name, KNOWN_PROGRAMS, n=1, cutoff=0.8) if len(name) >= 4 else []
    if close:
        return Classification(C.WRONG_COMMAND, 0.8, "command_typo", f"{evidence} (typo of {close[0]}?)")
    return Classification(C.MISSING_DEPENDENCY, 0.75, "command_not_found", evidence)


def _module_not_found(ctx: _Ctx) -> Classification | None:
    m = re.search(r"No module named ['\"]?([\w.]+)['\"]?", ctx.text)
    if not m:
        return None
    module = m.group(1).split(".")[0]
    evidence = _line_of(ctx.text, m.start())
    stems = {re.sub(r"\.py$", "", f.rstrip("/").rsplit("/", 1)[-1]) for f in ctx.record.agent_files}
    if module in stems:  # the agent's own module: a path / PYTHONPATH problem, not a missing package
        return Classification(C.PATH_PERMISSION, 0.6, "own_module_not_found", evidence)
    return Classification(C.MISSING_DEPENDENCY, 0.95, "module_not_found", evidence)


def _cannot_import_name(ctx: _Ctx) -> Classification | None:
    m = re.search(r"ImportError: cannot import name '?(\w+)'? from '?([\w.]+)'?(?: \(([^)]*)\))?", ctx.text)
    if not m:
        return None
    evidence = _line_of(ctx.text, m.start())
    where = m.group(3) or ""
    if where and (shell.path_matches(where, ctx.record.agent_files) or "site-packages" not in where
                  and not where.startswith("/usr/lib/python")):
        return Classification(C.FAULTY_IMPLEMENTATION, 0.7, "import_name_own_code", evidence)
    return Classification(C.MISSING_DEPENDENCY, 0.6, "import_name_version", evidence)


def _no_rule_to_make(ctx: _Ctx) -> Classification | None:
    m = re.search(r"No rule to make target '([^']+)'(, needed by '([^']+)')?", ctx.text)
    if not m:
        return None
    evidence = _line_of(ctx.text, m.start())
    if m.group(2):  # a prerequisite file is missing
        return Classification(C.PATH_PERMISSION, 0.75, "make_missing_prerequisite", evidence)
    return Classification(C.WRONG_COMMAND, 0.85, "make_unknown_target", evidence)


def _git_error(ctx: _Ctx) -> Classification | None:
    if "git" not in ctx.programs:
        return None
    m = re.search(r"(?m)^(?:fatal|error): .+$|^CONFLICT \(|^ ! \[(?:rejected|remote rejected)\]", ctx.text)
    if not m:
        return None
    return Classification(C.PATH_PERMISSION, 0.85, "git_error", _line_of(ctx.text, m.start()))


_INSTALL_PROGRAMS = {"pip", "pip3", "pipx", "uv", "poetry", "pipenv", "conda", "mamba", "apt", "apt-get", "npm", "yarn",
                     "pnpm", "cargo", "go", "gem", "bundle", "composer", "mvn", "gradle", "cpanm", "dotnet"}
_NETWORK = re.compile(
    r"Could not resolve host|Temporary failure in name resolution|resolve host|Network is unreachable|Failed to fetch"
    r"|Name or service not known|getaddrinfo|ENOTFOUND|EAI_AGAIN|Connection timed out|ReadTimeoutError|NewConnectionError"
)


def _network_during_install(ctx: _Ctx) -> Classification | None:
    """A package manager could not reach its registry: the dependency stays missing."""
    if not ctx.programs & _INSTALL_PROGRAMS:
        return None
    m = _NETWORK.search(ctx.text)
    if not m:
        return None
    return Classification(C.MISSING_DEPENDENCY, 0.7, "network_during_install", _line_of(ctx.text, m.start()))


_TRACEBACK = re.compile(r"Traceback \(most recent call last\):")
_FRAME = re.compile(r'^\s*File "([^"]+)", line \d+', re.M)
_EXC_LINE = re.compile(r"^(?:E\s+)?([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit|Expired|Timeout|Warning))(?::\s?(.*))?$")

_EXC_CATEGORY: dict[str, Category] = {
    "ModuleNotFoundError": C.MISSING_DEPENDENCY,
    "FileNotFoundError": C.PATH_PERMISSION,
    "PermissionError": C.PATH_PERMISSION,
    "IsADirectoryError": C.PATH_PERMISSION,
    "NotADirectoryError": C.PATH_PERMISSION,
    "FileExistsError": C.WRONG_STATE,
    "ConnectionRefusedError": C.WRONG_STATE,
    "ConnectionResetError": C.WRONG_STATE,
    "ConnectionError": C.WRONG_STATE,
    "BrokenPipeError": C.WRONG_STATE,
    "KeyboardInterrupt": C.TIMEOUT_HANG,
    "TimeoutError": C.TIMEOUT_HANG,
    "TimeoutExpired": C.TIMEOUT_HANG,
    "MemoryError": C.OTHER,
}


def _python_traceback(ctx: _Ctx) -> Classification | None:
    text = ctx.text
    starts = [m.start() for m in _TRACEBACK.finditer(text)]
    if starts:
        start = starts[-1]
    else:  # SyntaxError/IndentationError are printed without the Traceback header
        m = re.search(r'(?m)^\s*File "[^"]+", line \d+\n(?:.*\n){0,4}?(?:Syntax|Indentation|Tab)Error\b', text)
        if not m:
            return None
        start = m.start()
    block = text[start:]
    exc = None
    for line in block.split("\n")[1:]:
        if line[:1].isspace() or not line.strip():
            continue
        m = _EXC_LINE.match(line.strip())
        if m:
            exc = m
            break
    if exc is None:
        return None
    full, message = exc.group(1), exc.group(2) or ""
    name = full.rsplit(".", 1)[-1]
    evidence = exc.group(0)[:300]
    frames = _FRAME.findall(block)
    own = [f for f in frames if shell.path_matches(f, ctx.record.agent_files)]
    project = [f for f in frames if not f.startswith("<") and "site-packages" not in f
               and "/usr/lib/python" not in f and "/lib/python3" not in f]
    if name in ("SyntaxError", "IndentationError", "TabError"):
        if frames and frames[-1] in ("<string>", "<stdin>"):
            return Classification(C.WRONG_COMMAND, 0.85, "python_inline_syntax", evidence)
        return Classification(C.FAULTY_IMPLEMENTATION, 0.9 if own else 0.8, "python_syntax_in_file", evidence)
    if name == "ImportError" and "No module named" not in message:
        if "cannot open shared object" in message:
            return Classification(C.MISSING_DEPENDENCY, 0.85, "python_shared_library", evidence)
        return Classification(C.FAULTY_IMPLEMENTATION if own else C.MISSING_DEPENDENCY, 0.6, "python_import_error", evidence)
    if name == "OSError" and re.search(r"Errno (2|13|20|21|30)\b", message):
        return Classification(C.PATH_PERMISSION, 0.8, "python_os_path_error", evidence)
    if re.search(r"Connection refused|Errno 111|Failed to establish a new connection", message):
        return Classification(C.WRONG_STATE, 0.85, "python_connection_refused", evidence)
    if "OutOfMemory" in name or name == "MemoryError":
        return Classification(C.OTHER, 0.8, "python_out_of_memory", evidence)
    if re.search(r"SSL|Certificate|ConnectTimeout|HTTPError|TooManyRedirects|gaierror|NameResolution", full + message):
        return Classification(C.OTHER, 0.75, "python_network_error", evidence)
    category = _EXC_CATEGORY.get(name)
    if category is not None:
        return Classification(category, 0.85, f"python_{name}", evidence)
    if frames and all(f in ("<string>", "<stdin>") or f.startswith("<frozen") or f not in project for f in frames) \
            and any(f in ("<string>", "<stdin>") for f in frames):
        return Classification(C.WRONG_COMMAND, 0.55, "python_inline_exception", evidence)
    confidence = 0.9 if own else (0.75 if project else 0.55)
    return Classification(C.FAULTY_IMPLEMENTATION, confidence, "python_exception", evidence)


def _pattern(category: Category, confidence: float, regex: str, name: str, *, weak: bool = False,
             require_failed: bool = False, flags: int = re.M) -> Callable[[_Ctx], Classification | None]:
    """A rule that fires when ``regex`` matches the output. ``weak`` rules are skipped for probes and
    lines ending in ``|| true``; ``require_failed`` rules need a non-zero exit status."""
    compiled = re.compile(regex, flags)

    def rule(ctx: _Ctx) -> Classification | None:
        if (weak and not ctx.weak_ok) or (require_failed and not ctx.failed):
            return None
        m = compiled.search(ctx.text)
        if not m:
            return None
        return Classification(category, confidence, name, _line_of(ctx.text, m.start()))

    rule.__name__ = name
    return rule


# ------------------------------------------------------------------------------------ rules
INFRA_PATTERNS = re.compile(
    r"OCI runtime (?:\w+ )?(?:failed|error)|Error response from daemon:|Cannot connect to the Docker daemon"
    r"|unable to upgrade connection|container (?:[0-9a-f]{6,} )?(?:is not running|not found|does not exist)"
    r"|^bwrap: |no server running on /tmp/tmux|error connecting to /tmp/tmux|^lost server$|server exited unexpectedly"
    r"|File \"[^\"]*/(?:site-packages/harbor|reterm)/[^\"]+\", line \d+|\[(?:sandbox|harness|infra)[ _]error\]"
    r"|sandbox (?:\S+ )?(?:died|was killed|is gone|not found|has been stopped|was stopped)|websocket: close \d+"
    r"|^Error: failed to execute command:",
    re.M,
)

_SERVICE_DOWN = _pattern(
    C.WRONG_STATE, 0.85,
    r"Is the server running|Can't connect to (?:local )?(?:MySQL )?server|Connection refused|Couldn't connect to server"
    r"|Failed to connect to \S+ port|Could not connect to (?:Redis|server|the server|database)|ECONNREFUSED"
    r"|could not connect to server|connection to server .* failed",
    "service_not_reachable",
)

RULES: list[Callable[[_Ctx], Classification | None]] = [
    _SERVICE_DOWN,
    # ---- missing dependency (the largest family in public runs)
    _command_not_found,
    _module_not_found,
    _pattern(C.MISSING_DEPENDENCY, 0.95,
             r"^E: Unable to locate package|^E: Package '[^']+' has no installation candidate"
             r"|Could not find a version that satisfies the requirement|No matching distribution found for"
             r"|^npm ERR! (?:code E404|404)|^npm error (?:code E404|404)|externally-managed-environment"
             r"|fatal error: [\w/.+-]+\.h(?:pp)?: No such file or directory|/ld: cannot find -l|cannot find -l\w+"
             r"|error while loading shared libraries|cannot open shared object file"
             r"|Package [\w.+-]+ was not found in the pkg-config search path|No package '[^']+' found"
             r"|Could NOT find \w+|Can't locate [\w/]+\.pm in @INC|Cannot find module '|cannot load such file -- "
             r"|bad interpreter: No such file or directory|env: '?[\w.+-]+'?: No such file or directory"
             r"|unable to execute '?[\w.+-]+'?: No such file or directory|Unable to find image '"
             r"|^(?:make|xargs|env|nohup|exec|timeout|sudo|npm|npx)(?:\[\d+\])?: '?[\w.+-]+'?: (?:No such file or directory|command not found)"
             r"|no required module provides package|cannot find package \"|there is no package called"
             r"|DistributionNotFound|Could not resolve dependencies|could not find artifact|unresolved import"
             r"|can't find crate|ClassNotFoundException|NoClassDefFoundError",
             "missing_package_or_tool"),
    _pattern(C.MISSING_DEPENDENCY, 0.6,
             r"metadata-generation-failed|Failed building wheel|subprocess-exited-with-error|executable not found",
             "package_build_failed"),
    _cannot_import_name,
    # ---- wrong command: usage and syntax
    _no_rule_to_make,
    _pattern(C.WRONG_COMMAND, 0.85,
             r"syntax error near unexpected token|unexpected EOF while looking for matching|syntax error: unexpected end of file"
             r"|: syntax error: operand expected|: bad substitution|unrecognized option|invalid option|unknown option"
             r"|illegal option|unrecognized arguments?:|the following arguments are required|invalid choice:"
             r"|missing operand|option requires an argument|requires an argument|no such option|unknown flag"
             r"|flag provided but not defined|error: unexpected argument|Unknown argument|is not a git command"
             r"|^ERROR: unknown command|^E: Invalid operation|^E: Command line option|: too many arguments"
             r"|integer expression expected|sed: -e expression|^awk: .*(?:syntax error|unexpected newline)"
             r"|^jq: error: .*(?:syntax error|compile error)|jq: \d+ compile errors?|Parse error: near \""
             r"|in prepare, near \"|near \"[^\"]*\": syntax error|ERROR 1064 \(42000\)|ERROR:  syntax error at or near"
             r"|System has not been booted with systemd|not in gzip format|not a bzip2 file|This does not look like a tar archive"
             r"|^Try '[\w.-]+ --help'|missing (?:\w+ )?argument|invalid mode|invalid argument\b(?! [(]os error)|Cowardly refusing"
             r"|column \"[^\"]+\" does not exist|no such column|Unknown column '|-r not specified; omitting directory",
             "usage_or_syntax"),
    _pattern(C.WRONG_COMMAND, 0.7, r"^(?:ERROR: )?[Uu]sage: \S+", "usage_printed", require_failed=True),
    # ---- wrong state of the environment
    _pattern(C.WRONG_STATE, 0.85,
             r"Address already in use|EADDRINUSE|port is already allocated|database is locked|Could not get lock"
             r"|Unable to acquire the dpkg frontend lock|dpkg was interrupted|no such table|relation \"[^\"]+\" does not exist"
             r"|Unknown database '|nothing to commit|Text file busy|Device or resource busy|already running"
             r"|pid file .* exists|Stale file handle|already listening|another (?:process|instance|program) is"
             r"|is already running",
             "environment_state"),
    _git_error,
    _pattern(C.WRONG_STATE, 0.75, r"File exists|already exists", "already_exists", weak=True),
    # ---- faulty implementation: tests, tracebacks, compile errors, crashes
    _pattern(C.FAULTY_IMPLEMENTATION, 0.9,
             r"^=+ .*\b\d+ (?:failed|errors?)\b.* =+$|^FAILED [\w/.-]+::|^\d+ failed(?:, \d+ (?:passed|errors?))?"
             r"|^FAILED \((?:failures|errors)=\d+|^--- FAIL: |^FAIL\t|^Tests:\s+\d+ failed|^not ok \d+ "
             r"|^test result: FAILED|^\s*\d+ failing$|^E\s+assert |^AssertionError",
             "tests_failed"),
    _python_traceback,
    _pattern(C.FAULTY_IMPLEMENTATION, 0.85,
             r"^[\w./-]+\.(?:c|cc|cpp|cxx|h|hpp|go|java|ts|tsx|js|rs|swift|kt|cs|zig):\d+(?::\d+)?:\s*(?:fatal )?error\b"
             r"|^error\[E\d+\]: |^error: could not compile|undefined reference to|^\S+\.java:\d+: error:"
             r"|^\s+at .+ \(.+:\d+:\d+\)$|^(?:Type|Reference|Range|Syntax)Error: .+",
             "compile_or_runtime_error"),
    _pattern(C.FAULTY_IMPLEMENTATION, 0.8,
             r"Segmentation fault|core dumped|^Aborted|double free|stack smashing detected|panicked at"
             r"|Exception in thread \"|^Floating point exception|^Bus error",
             "crash"),
    # ---- paths and permissions
    _pattern(C.PATH_PERMISSION, 0.85,
             r"(?i:permission denied)|EACCES|EPERM|Operation not permitted|Read-only file system|are you root\?"
             r"|must be (?:run as )?root|unable to open database file|can't open file|Unable to access (?:jarfile|file)"
             r"|[Cc]annot open (?:file|directory|input file)|[Cc]ould not open (?:file|input file)",
             "permission_or_unopenable"),
    _pattern(C.PATH_PERMISSION, 0.8,
             r"No such file or directory|cannot access '|cannot stat '|Not a directory|Is a directory"
             r"|file or directory not found|[Dd]irectory nonexistent|can't cd to"
             r"|(?:[Ff]ile|[Dd]irectory|[Pp]ath|[Ff]older)\b[^\n]{0,60}does not exist|'[^'\n]*/[^'\n]*' does not exist",
             "missing_path", weak=True),
    # ---- other known failures (network failures while installing are missing dependencies)
    _network_during_install,
    _pattern(C.OTHER, 0.75,
             r"Could not resolve host|Temporary failure in name resolution|unable to resolve host|Network is unreachable"
             r"|No space left on device|Disk quota exceeded|^Killed$|Out of memory|returned error: \d{3}"
             r"|HTTP(?:/[\d.]+)? [45]\d\d|ERROR \d{3}: |Unexpected EOF in archive|unexpected end of file",
             "known_other"),
]


def _non_probe_diagnostic(output: str, segs: list[shell.Segment]) -> bool:
    """True when a command of the line that is not a probe printed a diagnostic (``bash: cd: x: ...``,
    ``cp: cannot stat ...``): then the non-zero exit came from it, not from a probe saying no."""
    for seg in segs:
        if not seg.program or seg.program in shell.PROBE_EXITS:
            continue
        if re.search(rf"(?m)(?:^|: ){re.escape(seg.program)}: ", output):
            return True
    return False


# Cue words for error messages no specific rule knows. Only lines that look like errors are read; each
# category's cues are counted (the last error line twice) and the best-scoring category wins with a low
# confidence, so the LLM judge, when configured, re-examines it.
_ERROR_LINE = re.compile(
    r"(?i)\b(?:error|fatal|fail(?:ed|ure|ing)?|cannot|can't|could ?n[o']t|unable|not found|no such|invalid|unknown"
    r"|unrecognized|denied|missing|refused|not running|already|mismatch|expected|exception|halted|abort(?:ed|ing)?"
    r"|not up to date|not available|not installed|no package|unsupported|does not exist|doesn't exist)\b"
)
_CUES: list[tuple[Category, re.Pattern]] = [
    (C.MISSING_DEPENDENCY, re.compile(
        r"(?i)not installed|no package|(?:package|module|library|executable|program|plugin|gem|crate) [^\n]{0,40}not found"
        r"|\blib[\w+.-]+[^\n]{0,30}not found|not found[^\n]{0,30}(?:package|module|library)|cannot load|could not load (?:module|library)"
        r"|please install|need to install|you may need to install|install the \S+|install missing"
        r"|missing (?:dependenc|module|package|librar|header|plugin|gem)|could not find [\w.-]+ in locally installed"
        r"|is not available|not available on this system|executable not found|failed to (?:get|fetch|download)[^\n]{0,40}(?:dependenc|package)"
        r"|vendor/autoload|node_modules")),
    (C.WRONG_STATE, re.compile(
        r"(?i)already (?:in use|running|listening|started|initiali[sz]ed|exists)|not running|\bis locked|locked by"
        r"|not up to date|out of date|no such (?:job|process)|not initiali[sz]ed|not configured|(?:load|find) (?:the )?cache"
        r"|\bstale\b|\bbusy\b|connection (?:refused|reset)|not ready|is not started|\bno (?:server|daemon)\b"
        r"|(?:group|user|database|table|relation|role|schema|index|queue|bucket|topic|namespace|volume|service)\b[^\n]{0,40}does not exist")),
    (C.PATH_PERMISSION, re.compile(
        r"(?i)no such file|not a directory|is a directory|permission|denied|cannot (?:open|access|stat|create|remove|move)"
        r"|can't (?:open|access)|unable to (?:open|access|create)|not writable|read-only")),
    (C.WRONG_COMMAND, re.compile(
        r"(?i)\bunknown\b|\binvalid\b|unrecognized|unsupported|\billegal\b|malformed|missing script|did you mean"
        r"|\busage\b|bad (?:option|argument|flag|value)|no such (?:option|command|subcommand|script)|not a valid"
        r"|expected [^\n]{0,30}argument|too (?:many|few) arguments")),
    (C.FAULTY_IMPLEMENTATION, re.compile(
        r"mismatch|(?i:expected [^\n]{0,60}(?:\bgot\b|\bbut\b|received|found))|(?i:wrong (?:answer|output|result))"
        r"|\bincorrect\b|\bFAIL(?:ED)?\b|(?i:tests? failed|\d+ failed|assert)|\bdiffer\b")),
    (C.OTHER, re.compile(
        r"(?i)network|resolve host|unreachable|out of memory|no space|quota|certificate|\bssl\b|\btls\b"
        r"|\b(?:401|403|404|429|500|502|503)\b|rate limit")),
]


def _error_cues(text: str) -> Classification | None:
    lines = [ln.strip() for ln in text.strip().split("\n")[-20:] if _ERROR_LINE.search(ln)]
    if not lines:
        return None
    scores: dict[Category, float] = {}
    for k, line in enumerate(lines):
        weight = 2.0 if k == len(lines) - 1 else 1.0
        for category, cue in _CUES:
            if cue.search(line):
                scores[category] = scores.get(category, 0.0) + weight
    if not scores:
        return None
    order = [c for c, _ in _CUES]
    best = max(scores, key=lambda c: (scores[c], -order.index(c)))
    evidence = next(ln for ln in reversed(lines) if dict(_CUES)[best].search(ln))
    return Classification(best, 0.5, "error_cues", evidence[:300])


# curl(1) EXIT CODES, for `curl -s` lines that print nothing.
_CURL_EXITS: dict[int, tuple[Category, str]] = {
    6: (C.OTHER, "could not resolve host"),
    7: (C.WRONG_STATE, "failed to connect (nothing listening)"),
    22: (C.OTHER, "HTTP error status"),
    28: (C.TIMEOUT_HANG, "operation timed out"),
    35: (C.OTHER, "TLS handshake failed"),
    52: (C.WRONG_STATE, "empty reply from server"),
    56: (C.WRONG_STATE, "failure receiving network data"),
    60: (C.OTHER, "certificate problem"),
}


def _fallback(ctx: _Ctx, r: StepRecord) -> Classification:
    status = r.exit_status
    if shell.probe_exit_is_benign(ctx.segs, status) and not _non_probe_diagnostic(ctx.text, ctx.segs):
        return Classification(C.NONE, 0.9, "probe_answered_no", f"exit status {status}")
    if status is None or status == 0:
        return Classification(C.NONE, 0.85, "no_error", "" if status is None else "exit status 0")
    if shell.tolerates_failure(ctx.segs):
        return Classification(C.NONE, 0.7, "tolerated_failure", f"exit status {status}")
    if "curl" in ctx.programs and status in _CURL_EXITS:
        category, meaning = _CURL_EXITS[status]
        return Classification(category, 0.75, "curl_exit_status", f"curl exit status {status}: {meaning}")
    cues = _error_cues(ctx.text)
    if cues is not None:
        return cues
    m = re.search(r"(?m)^make(?:\[\d+\])?: \*\*\* \[.*\] Error \d+", ctx.text)
    if m:
        return Classification(C.FAULTY_IMPLEMENTATION, 0.55, "make_recipe_failed", _line_of(ctx.text, m.start()))
    if shell.runs_tests(ctx.segs):
        return Classification(C.FAULTY_IMPLEMENTATION, 0.6, "tests_exit_nonzero", f"exit status {status}")
    for seg in ctx.segs:
        targets = [seg.program] + seg.args[:1]
        if any(t and shell.path_matches(t, r.agent_files) for t in targets):
            return Classification(C.FAULTY_IMPLEMENTATION, 0.6, "own_program_exit_nonzero", f"{seg.text[:120]}: exit status {status}")
    if r.agent_files and any(f and f in ctx.text for f in r.agent_files):
        return Classification(C.FAULTY_IMPLEMENTATION, 0.55, "error_names_own_file", f"exit status {status}")
    if status == 137:
        return Classification(C.OTHER, 0.5, "killed", "exit status 137 (SIGKILL, often out of memory)")
    return Classification(C.OTHER, 0.3, "nonzero_exit", f"exit status {status}")


# The terminal is left waiting for input the agent did not ask for: a confirmation, credentials or
# host-key question, or a pager. (A REPL or an editor the agent opened on purpose is not a failure:
# the harness hands the next keystrokes to it.)
_UNEXPECTED_PROMPT = re.compile(
    r"(?:^|\n)(?::|\(END\)|--More--.*|lines \d+-\d+.*)\s*$"
    r"|\[[Yy]/[Nn]\]\s*$|\[y/N\]\s*$|\(yes/no(?:/\[fingerprint\])?\)\?\s*$|[Pp]assword(?: for [^:]+)?:\s*$"
    r"|[Pp]assphrase[^:\n]*:\s*$|Username for '[^']+':\s*$"
)
_PAGERS = frozenset({"less", "more", "most", "man", "pager", "pg"})

# Status lines of the harness's observation format (reterm.agent.protocol.format_observation): they are
# the harness speaking, not the command's output.
_HARNESS_LINE = re.compile(
    r"^\[(?:exit status(?: after the interrupt)?: -?\d+|exit status unknown|timed out after [^\]]*"
    r"|still running: [^\n]*|\.\.\. earlier output scrolled out of the terminal history \.\.\.)\]$"
    r"|^\(no output\)$|^\(nothing is running: the shell waits at its prompt\)$"
)
_STILL_RUNNING = re.compile(r"^\[still running: `([^`]+)` is in the foreground \((waiting for input|no new output)\)", re.M)


_REPLS = frozenset({"python", "python2", "python3", "ipython", "node", "nodejs", "irb", "ghci", "lua", "R", "julia",
                    "bash", "sh", "zsh", "dash", "gdb", "pdb", "bc", "ftp", "sftp", "ssh", "telnet", "nc", "su"})
_DB_SHELLS = frozenset({"sqlite3", "psql", "mysql", "mariadb", "redis-cli", "mongosh", "mongo"})
_EDITORS = frozenset({"vim", "vi", "nvim", "nano", "emacs", "ed", "less", "more", "man", "most"})


def _deliberate_interactive(segs: list[shell.Segment]) -> bool:
    """True when the command line opens an interactive program on purpose: a REPL or a shell without a
    script (``python3``, ``python3 -i x.py``), a database shell without an inline query (``sqlite3
    app.db``), an editor or pager on a file (``vim x``, ``less log``)."""
    if not segs:
        return False
    seg = segs[-1]
    positional = [a for a in seg.args if not a.startswith("-")]
    if seg.program in _EDITORS:
        return True
    if seg.program in _REPLS:
        return "-i" in seg.args or not positional or seg.program in ("ssh", "telnet", "nc", "sftp", "ftp", "su", "gdb")
    if seg.program in _DB_SHELLS:
        inline = {"-c", "-e", "--command", "--execute", "--eval"} & set(seg.args)
        return not inline and len(positional) <= (1 if seg.program == "sqlite3" else 2)
    return False


def running_program(observation: str) -> str | None:
    """The program the harness reports still in the foreground (``[still running: `PROG` ...]``), or None."""
    m = _STILL_RUNNING.search(observation)
    return m.group(1) if m else None


def _harness_status(output: str) -> tuple[str, str | None, bool]:
    """(output without the harness's status lines, the program still in the foreground, waiting for input)."""
    m = _STILL_RUNNING.search(output)
    running, waiting = (m.group(1), m.group(2) == "waiting for input") if m else (None, False)
    lines = [line for line in output.split("\n") if not _HARNESS_LINE.match(line.strip())]
    return "\n".join(lines), running, waiting




def classify_step(record: StepRecord) -> Classification:
    """Label one step with the rules (no model involved).

    Returns a :class:`Classification` whose ``label`` is a failure category, ``none`` or ``infra``.
    Deterministic and pure; never raises on odd input (empty output, unknown exit status).
    """
    r = record
    if r.tool == "parse_error":
        return Classification(C.NONE, 0.9, "parse_error", "no valid action (parse error)")
    if r.tool == "submit":
        if r.verifier_passed is False:
            return Classification(C.PREMATURE_COMPLETION, 0.9, "submitted_but_failed", "submit; verifier failed")
        return Classification(C.NONE, 0.8, "submit", "submit")

    output, running, _waiting = _harness_status(r.output or "")
    running = r.running or running
    output = _clip_output(_strip_echo(output, r.command))
    if r.infra_flag:
        return Classification(C.INFRA, 1.0, "harness_flag", "step marked as infrastructure fault")
    m = INFRA_PATTERNS.search(output)
    if m:
        return Classification(C.INFRA, 0.95, "infra_pattern", _line_of(output, m.start()))

    if (r.command or "").strip() in SPECIAL_KEYS or not (r.command or "").strip():
        # a key press (C-c to stop a program, Escape, Enter) or an empty command that only waits
        return Classification(C.NONE, 0.85, "key_press", (r.command or "").strip() or "(wait)")
    segs = shell.segments(r.command)
    if r.timed_out:
        return Classification(C.TIMEOUT_HANG, 0.95, "harness_timeout", "the harness timed the command out")
    if r.exit_status == 124 and any(s.timeout_wrapped for s in segs):
        return Classification(C.TIMEOUT_HANG, 0.9, "timeout_killed", "exit status 124 under timeout")
    tail = output.rstrip()[-200:]
    if r.exit_status == 130 or re.search(r"\^C\s*$", tail) or re.search(r"(?m)^KeyboardInterrupt\s*$", tail):
        return Classification(C.TIMEOUT_HANG, 0.8, "interrupted", "interrupted with Ctrl-C")

    if r.exit_status is None:
        tail = output.rstrip(" \n")[-300:]
        last = tail.rsplit("\n", 1)[-1].strip() or (running or "")
        run_base = (running or "").rsplit("/", 1)[-1]
        if _UNEXPECTED_PROMPT.search(tail) or (run_base in _PAGERS and not {s.program for s in segs} & _PAGERS):
            return Classification(C.TIMEOUT_HANG, 0.8, "waiting_for_unexpected_input", last[:300])
        if running and not r.typed_into and not _deliberate_interactive(segs):
            # the harness came back while the command still holds the terminal (a server or a program
            # reading stdin in the foreground): the next command would be typed into it
            return Classification(C.TIMEOUT_HANG, 0.7, "foreground_program", f"still running: {running}")

    failed = None if r.exit_status is None else r.exit_status != 0
    text = output
    if not failed and shell.is_read_only(segs):
        # a viewer that succeeded: only its own diagnostics ("cat: x: ...") are errors of this step
        names = {s.program for s in segs} | {"bash", "sh"}
        text = "\n".join(line for line in output.split("\n") if line.split(":", 1)[0].strip() in names)
    probe_no = shell.probe_exit_is_benign(segs, r.exit_status) and not _non_probe_diagnostic(output, segs)
    weak_ok = not probe_no and not shell.tolerates_failure(segs)
    programs = {s.program for s in segs}
    ctx = _Ctx(record=r, segs=segs, text=text, failed=failed, weak_ok=weak_ok, programs=programs)
    if text.strip():
        for rule in RULES:
            result = rule(ctx)
            if result is None:
                continue
            if not failed:  # errors printed while the exit status says success (masked by a pipe, || true)
                result.confidence = round(result.confidence - 0.1, 2)
            return result
    return _fallback(ctx, r)
