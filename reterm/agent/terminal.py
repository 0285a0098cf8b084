"""A persistent tmux terminal inside any Harbor environment, driven only through ``environment.exec``.

The agent's ``bash`` actions are keystrokes typed into one long-lived interactive bash running in a
tmux session *inside* the environment, as in Harbor's Terminus-2 (``harbor.agents.terminus_2.tmux_session``):
interactive programs (a python REPL, ``less``, ``vim``, ``apt``'s questions) receive the keystrokes,
and shell state (cwd, variables, an activated venv) persists between actions. Only
``environment.exec`` is used, so the session works on the local sandbox, Docker, Podman, Daytona...

Written for this kit rather than reusing Terminus-2's ``TmuxSession`` because that class waits for a
command by appending ``; tmux wait -S done`` to the keystrokes (which breaks keystrokes meant for an
interactive program), returns whole screens rather than a command's output, and has no exit status,
restart or shell-state transfer. Ideas taken from it: a tmux paste buffer for text, a private history
limit, ``capture-pane -J``. What the agent types reaches the terminal byte for byte: at the prompt
through a paste buffer (after ``C-u``, which drops replies the terminal typed into the shell's input),
into a running program as hexadecimal keys (``send-keys -H``); never as tmux command arguments, which
tmux splits at a trailing ``;``.

How a command is followed:

- **Completion and exit status**: the shell's ``PROMPT_COMMAND`` hook (exported, so nested shells and
  ``exec bash`` keep it) writes ``export -p`` to a file, then appends ``$?`` and ``$PWD`` to a status file
  before each prompt (builtins only, in that order: a reader that sees the new status line finds the
  exports complete). A new status line plus the prompt on the cursor line means the command finished;
  the line holds its exit status.
- **Output**: the session's scrollback is cleared before each command, so the rows from the command's
  prompt row to the new prompt are exactly what it printed (the typed echo and the new prompt are
  cut). Long output keeps its head and tail (:func:`reterm.agent.protocol.truncate_middle`).
- **Interactive programs**: when no prompt returns, the foreground process group (``tpgid`` of the
  shell, from ``/proc``) is checked: if every process in it sleeps in a read/poll system call and the
  screen has not changed for ``idle_s``, the program is waiting for input and the wait ends; the next
  action's keystrokes go to it. Full-screen programs (alternate screen) return the visible screen.
- **Timeouts**: at ``timeout`` the foreground program gets Ctrl-C; if it neither exits nor waits for
  input within ``interrupt_grace_s`` its process group is killed. The observation says so.
- **Robustness**: ``exit``, ``kill -9 $$``, ``exec``, ``tmux kill-server``, ``stty`` changes, huge or
  binary output do not break the harness: a dead shell is respawned (``remain-on-exit`` keeps its last
  output readable first), a dead tmux server is restarted, both with the last known cwd and exported
  variables, and the observation says so.
- **Forks**: a fork of a sandbox carries files but not processes. :meth:`TerminalSession.shell_state`
  returns the cwd and exported variables as of the last prompt; ``TerminalSession.start(env,
  restore=state)`` (or :meth:`TerminalSession.saved_state` on the fork, which reads the hook's files
  the fork inherited) brings them back.
"""

from __future__ import annotations

import asyncio
import re
import shlex
import time
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from reterm.agent.protocol import (
    DEFAULT_COMMAND_TIMEOUT_S,
    MAX_COMMAND_TIMEOUT_S,
    MAX_OBSERVATION_CHARS,
    SPECIAL_KEYS,
    format_observation,
)

STATE_ROOT = "/tmp/.reterm"
SESSION = "reterm"  # tmux session name (on a private socket, so it never meets another tmux)
PANE_WIDTH, PANE_HEIGHT = 160, 40
HISTORY_LIMIT = 50_000  # rows of scrollback per command; beyond it the head of the output is lost
CAPTURE_ROWS = 400  # rows captured from each end of a long output (the middle is cut anyway)
# Variables that belong to one shell process, not to the state carried to a new shell.
_NOT_RESTORED = {
    "PWD", "OLDPWD", "SHLVL", "_", "TMUX", "TMUX_PANE", "PROMPT_COMMAND", "PS1", "PS2", "TERM",
    "COLUMNS", "LINES", "__reterm_d",
}  # fmt: skip
# System calls a process sits in while it waits for keyboard input (read, select and poll families).
_INPUT_SYSCALLS = {
    "x86_64": {0, 7, 19, 23, 232, 270, 271, 281, 441},
    "aarch64": {20, 22, 63, 65, 72, 73, 441},
}

_RC = r"""# ReTerm terminal session (reterm.agent.terminal). Interactive non-login bash, as `docker exec -it bash`.
if [ -f /etc/bash.bashrc ]; then . /etc/bash.bashrc; fi
if [ -f "$HOME/.bashrc" ]; then . "$HOME/.bashrc"; fi
export __reterm_d=__STATE_DIR__
__reterm_hook() {
  local s=$?
  { export -p > "$__reterm_d/exports"; printf '%s\t%s\n' "$s" "$PWD" >> "$__reterm_d/status"; } 2>/dev/null
  PS1='${PWD}\$ '
  PS2='> '
  return $s
}
export -f __reterm_hook
case "$PROMPT_COMMAND" in *__reterm_hook*) ;; *) PROMPT_COMMAND="__reterm_hook${PROMPT_COMMAND:+;$PROMPT_COMMAND}" ;; esac
export PROMPT_COMMAND
if [ -f "$__reterm_d/restore.sh" ]; then . "$__reterm_d/restore.sh" 2>/dev/null; fi
"""

_TMUX_CONF = f"""set -g history-limit {HISTORY_LIMIT}
set -g remain-on-exit on
set -g status off
set -g exit-empty off
set -g default-terminal screen-256color
"""

# One exec per poll. Prints: "S<TAB>count<TAB>last status line", "T<TAB>tmux fields" (or "E<TAB>error"),
# "F<TAB>foreground pgid", "P<TAB>pid<TAB>state<TAB>syscall" per foreground process (PROC=1), then
# "C" and the captured rows: the cursor row, or (count > N0, dead pane, MODE=full) the rows since START.
_POLL = r"""D=$1; MODE=$2; N0=$3; START=$4; PROC=$5; LIM=$6
T="tmux -S $D/tmux.sock"
n=0; last=
if [ -f "$D/status" ]; then while IFS= read -r l; do n=$((n+1)); last=$l; done < "$D/status"; fi
printf 'S\t%s\t%s\n' "$n" "$last"
info=$($T display-message -p -t reterm '#{pane_dead}|#{pane_dead_status}|#{pane_pid}|#{alternate_on}|#{history_size}|#{cursor_y}|#{cursor_x}|#{pane_current_command}' 2>&1) || { printf 'E\t%s\n' "$info"; exit 0; }
printf 'T\t%s\n' "$info"
IFS='|' read -r dead dstat ppid alt hist cy cx cmd <<EOF
$info
EOF
fg=
if [ "$dead" != 1 ] && { read -r st < /proc/$ppid/stat; } 2>/dev/null; then
  rest=${st##*) }; set -- $rest; fg=$6; printf 'F\t%s\n' "$fg"
fi
if [ "$PROC" = 1 ] && [ -n "$fg" ]; then
  for p in /proc/[0-9]*; do
    { read -r st < $p/stat; } 2>/dev/null || continue
    rest=${st##*) }; set -- $rest
    [ "$3" = "$fg" ] || continue
    sc=; { read -r sc < $p/syscall; } 2>/dev/null
    printf 'P\t%s\t%s\t%s\n' "${p#/proc/}" "$1" "$sc"
  done
fi
if [ "$MODE" = screen ] || { [ "$alt" = 1 ] && [ "$MODE" != line ]; }; then
  printf 'C\tscreen\n'; $T capture-pane -p -t reterm; exit 0
fi
if [ "$MODE" = full ] || [ "$n" -gt "$N0" ] || [ "$dead" = 1 ]; then
  s=$((START - hist)); lost=0
  if [ "$s" -lt "-$hist" ]; then s=-$hist; lost=1; fi
  if [ "$hist" -ge __HISTORY_FULL__ ]; then lost=1; fi
  if [ "$s" -gt "$cy" ]; then s=$cy; fi
  rows=$((cy - s + 1))
  if [ "$rows" -gt $((2 * LIM)) ]; then
    printf 'C\tsplit\t%s\t%s\n' "$lost" "$((rows - 2 * LIM))"
    $T capture-pane -p -J -t reterm -S "$s" -E "$((s + LIM - 1))"
    printf '\036\n'
    $T capture-pane -p -J -t reterm -S "$((cy - LIM + 1))" -E "$cy"
  else
    printf 'C\tfull\t%s\n' "$lost"
    $T capture-pane -p -J -t reterm -S "$s" -E "$cy"
  fi
else
  printf 'C\tline\n'; $T capture-pane -p -J -t reterm -S "$cy" -E "$cy"
fi
exit 0
"""


_PANE_DEAD_RE = re.compile(r"\n*^Pane is dead \([^\n]*\)\s*$", re.MULTILINE)


class EnvironmentFault(RuntimeError):
    """The environment failed under the terminal (``exec`` raised or timed out, tmux cannot start).

    An infrastructure fault (:attr:`reterm.trajectory.Outcome.SANDBOX_ERROR`) when it happens before
    the agent acts or the host is to blame; raised while an agent command runs, the episode loop
    scores it as the agent's failure (:func:`reterm.agent.episode.blame_breakage`, docs/SCORING.md).
    """


#: The tty's echo of terminal replies (device attributes ``ESC [ ? 1 ; 2 c``, ``ESC [ > 84 ; 0 ; 0 c``, status
#: ``ESC [ 0 n``, cursor position ``ESC [ 1 ; 1 R``) at the end of a row, as ``^[[?1;2c``.
_ECHOED_REPLIES = re.compile(r"(?:\^\[\[[?>]?[0-9;]*[cnR])+$")


class ShellState(BaseModel):
    """What a new shell needs to continue where another left off: the working directory and the
    exported variables (bash ``export -p`` text, one ``declare -x NAME="value"`` per variable;
    per-process variables such as ``PWD``/``SHLVL``/``TMUX`` removed). JSON-serialisable, so it can
    travel with a failure state."""

    cwd: str
    exports: str = ""

    def variables(self) -> dict[str, str]:
        """The exported variables as a mapping (values unquoted; a variable without value maps to "")."""
        return dict(_parse_exports(self.exports))


def _split_exports(text: str) -> list[str]:
    return [e for e in re.split(r"(?m)^(?=declare -)", text) if e.strip()]


def _parse_exports(text: str) -> list[tuple[str, str]]:
    out = []
    for entry in _split_exports(text):
        m = re.match(r'declare -\S* ([A-Za-z_][A-Za-z0-9_]*)(?:="(.*)")?\s*$', entry, re.DOTALL)
        if m:
            value = re.sub(r'\\([\\"$`])', r"\1", m.group(2) or "")
            out.append((m.group(1), value))
    return out


def filter_exports(text: str) -> str:
    """``export -p`` text without the per-process variables (:data:`_NOT_RESTORED`) and functions."""
    keep = []
    for entry in _split_exports(text):
        m = re.match(r"declare -(\S*) ([A-Za-z_][A-Za-z0-9_]*)", entry)
        if m and "f" not in m.group(1) and m.group(2) not in _NOT_RESTORED:
            keep.append(entry.rstrip("\n"))
    return "\n".join(keep) + ("\n" if keep else "")


@dataclass
class CommandResult:
    """What one action did in the terminal. Times in seconds.

    ``exit_status`` is the shell's ``$?`` when the prompt came back (``None`` otherwise); ``running``
    names the foreground program when it is still running (``waiting_for_input`` when it waits for
    keys); ``timed_out``/``interrupt`` say the timeout hit and what was done; ``restarted`` says the
    shell or tmux had died and was started again; ``screen`` is True when ``output`` is the visible
    screen of a full-screen program rather than printed lines.
    """

    output: str
    exit_status: int | None = None
    timed_out: bool = False
    timeout_s: float | None = None
    interrupt: str | None = None
    running: str | None = None
    waiting_for_input: bool = False
    restarted: str | None = None
    lost_head: bool = False
    screen: bool = False
    duration_s: float = 0.0

    def observation(self, note: str | None = None, max_chars: int = MAX_OBSERVATION_CHARS) -> str:
        """The observation text (:func:`reterm.agent.protocol.format_observation`)."""
        return format_observation(
            self.output,
            self.exit_status,
            timed_out=self.timed_out,
            timeout_s=self.timeout_s,
            interrupt=self.interrupt,
            running=self.running,
            waiting_for_input=self.waiting_for_input,
            restarted=self.restarted,
            lost_head=self.lost_head,
            note=note,
            max_chars=max_chars,
        )


@dataclass
class _Poll:
    count: int = 0
    status: int | None = None
    pwd: str | None = None
    error: str | None = None  # tmux could not be reached
    dead: bool = False
    dead_status: int | None = None
    pane_pid: int | None = None
    alternate: bool = False
    history: int = 0
    cursor_y: int = 0
    cursor_x: int = 0
    command: str = ""
    fg: int | None = None
    procs: list[tuple[int, str, str]] | None = None
    capture_kind: str = ""
    capture: str = ""
    lost: bool = False
    gap_rows: int = 0

    def signature(self) -> tuple:
        return (self.history, self.cursor_y, self.cursor_x, self.capture if self.capture_kind == "line" else "")


def _parse_poll(text: str) -> _Poll:
    p = _Poll()
    head, sep, capture = text.partition("\nC\t")
    if not sep and text.startswith("C\t"):
        head, capture = "", text[2:]
    for line in head.split("\n"):
        tag, _, rest = line.partition("\t")
        if tag == "S":
            count, _, last = rest.partition("\t")
            p.count = int(count or 0)
            status, _, pwd = last.partition("\t")
            p.status = int(status) if status.lstrip("-").isdigit() else None
            p.pwd = pwd or None
        elif tag == "E":
            p.error = rest.strip() or "tmux did not answer"
        elif tag == "T":
            f = rest.split("|", 7)
            if len(f) == 8:
                p.dead = f[0] == "1"
                p.dead_status = int(f[1]) if f[1].lstrip("-").isdigit() else None
                p.pane_pid = int(f[2]) if f[2].isdigit() else None
                p.alternate = f[3] == "1"
                p.history, p.cursor_y, p.cursor_x = (int(x) if x.isdigit() else 0 for x in f[4:7])
                p.command = f[7].strip()
        elif tag == "F":
            p.fg = int(rest) if rest.strip().isdigit() else None
        elif tag == "P":
            pid, _, rest2 = rest.partition("\t")
            state, _, sc = rest2.partition("\t")
            if pid.isdigit():
                (p.procs if p.procs is not None else setattr(p, "procs", []) or p.procs).append((int(pid), state, sc))
    if sep or text.startswith("C\t"):
        kind_line, _, body = capture.partition("\n")
        kind = kind_line.split("\t")
        p.capture_kind = kind[0]
        if kind[0] in ("full", "split"):
            p.lost = len(kind) > 1 and kind[1] == "1"
        if kind[0] == "split" and len(kind) > 2 and kind[2].isdigit():
            p.gap_rows = int(kind[2])
        p.capture = body
    return p


class TerminalSession:
    """One interactive bash in a tmux session inside ``environment`` (any Harbor ``BaseEnvironment``).

    Create with :meth:`start`; run actions with :meth:`run`; read the state for a fork with
    :meth:`shell_state`; end with :meth:`close`. Not safe for concurrent :meth:`run` calls on one
    session (one agent types into one terminal); sessions in different environments are independent.

    Args:
        environment: anything with Harbor's ``async exec(command, cwd=, env=, timeout_sec=, user=)``.
        user: user for every exec (``None``: the environment's default user, as Harbor sets it).
        state_dir: folder inside the environment for the hook's files and the tmux socket.
        idle_s: seconds without screen change after which a program waiting for input ends the wait.
        interrupt_grace_s: seconds a program gets to stop after Ctrl-C before its process group is killed.
        exec_timeout_s: bound on each control ``exec`` (a hung environment becomes :class:`EnvironmentFault`).
    """

    def __init__(
        self,
        environment: Any,
        *,
        user: str | int | None = None,
        state_dir: str = f"{STATE_ROOT}/{SESSION}",
        width: int = PANE_WIDTH,
        height: int = PANE_HEIGHT,
        idle_s: float = 0.6,
        interrupt_grace_s: float = 2.0,
        exec_timeout_s: int = 60,
        max_poll_interval_s: float = 0.25,
    ) -> None:
        self.environment = environment
        self.user = user
        self.state_dir = state_dir.rstrip("/")
        self.width, self.height = width, height
        self.idle_s = idle_s
        self.interrupt_grace_s = interrupt_grace_s
        self.exec_timeout_s = exec_timeout_s
        self.max_poll_interval_s = max_poll_interval_s
        self.busy: str | None = None  # name of the program left in the foreground by the last action
        self.restarts = 0
        self.exec_calls = 0
        self._arch = "x86_64"
        self._sigil = "#"
        self._last_state: ShellState | None = None
        self._cwd: str | None = None
        self._server_pid: int | None = None
        self._typed_at_prompt = True  # the current action was typed at the shell prompt
        self._typed_into_screen = False  # ... or into a full-screen program (alternate screen)

    # ------------------------------------------------------------------------------ plumbing
    @property
    def _tmux(self) -> str:
        return f"tmux -S {shlex.quote(self.state_dir + '/tmux.sock')}"

    async def _exec(self, command: str, timeout: float | None = None) -> tuple[int, str, str]:
        """Run a control command in the environment: (return code, stdout, stderr).

        Raises :class:`EnvironmentFault` when ``exec`` itself fails or exceeds its bound.
        """
        self.exec_calls += 1
        bound = int(timeout or self.exec_timeout_s)
        try:
            result = await asyncio.wait_for(
                self.environment.exec(command=command, timeout_sec=bound, user=self.user), timeout=bound + 10
            )
        except asyncio.TimeoutError as exc:
            raise EnvironmentFault(f"environment exec did not return within {bound + 10} s: {command[:80]!r}") from exc
        except Exception as exc:
            raise EnvironmentFault(f"environment exec failed: {type(exc).__name__}: {exc}") from exc
        return result.return_code, result.stdout or "", result.stderr or ""

    async def _write_file(self, path: str, content: str) -> None:
        rc, _, err = await self._exec(f"printf '%s' {shlex.quote(content)} > {shlex.quote(path)}")
        if rc != 0:
            raise EnvironmentFault(f"cannot write {path} in the environment: {err.strip()}")

    async def _poll(
        self, mode: str = "auto", n0: int = 1 << 30, start: int = 0, proc: bool = False, send: str | None = None
    ) -> _Poll:
        """One look at the terminal (see ``_POLL``); with ``send``, the scrollback is then cleared and
        the keys typed in the same exec (the state read is the one just before the keys)."""
        d = shlex.quote(self.state_dir)
        cmd = f"sh {d}/poll {d} {mode} {n0} {start} {int(proc)} {CAPTURE_ROWS}"
        if send is not None:
            # only after a successful look: a missing poll script must not type the keys twice
            cmd += f" && {{ {self._tmux} clear-history -t {SESSION} && {send}; }} >/dev/null 2>&1"
        rc, out, err = await self._exec(cmd)
        if rc != 0 and not out:
            return _Poll(error=(err or f"poll exited {rc}").strip())
        return _parse_poll(out)

    # ------------------------------------------------------------------------------ lifecycle
    @classmethod
    async def start(
        cls,
        environment: Any,
        *,
        restore: ShellState | None = None,
        cwd: str | None = None,
        **kwargs: Any,
    ) -> "TerminalSession":
        """Start a tmux session with an interactive bash in ``environment`` and wait for its prompt.

        Args:
            restore: cwd and exported variables to bring back (a fork of another session's sandbox).
            cwd: starting directory (default: the environment's working directory); ignored with
                ``restore``.
            **kwargs: options of :class:`TerminalSession`.

        Raises:
            EnvironmentFault: tmux is missing and cannot be installed, or the shell does not come up.
        """
        session = cls(environment, **kwargs)
        await session._boot(restore, cwd)
        return session

    @classmethod
    async def saved_state(cls, environment: Any, state_dir: str = f"{STATE_ROOT}/{SESSION}") -> ShellState | None:
        """The shell state a session's hook last wrote in ``environment`` (e.g. inherited by a fork
        of its sandbox), or ``None`` when there is none."""
        probe = cls(environment, state_dir=state_dir)
        return await probe._read_state()

    async def _read_state(self) -> ShellState | None:
        d = shlex.quote(self.state_dir)
        rc, out, _ = await self._exec(f"tail -n 1 {d}/status 2>/dev/null; printf '\\036\\n'; cat {d}/exports 2>/dev/null")
        status, _, exports = out.partition("\x1e\n")
        _, _, pwd = status.strip("\n").partition("\t")
        if not pwd:
            return None
        return ShellState(cwd=pwd, exports=filter_exports(exports))

    async def _boot(self, restore: ShellState | None, cwd: str | None) -> None:
        rc, out, _ = await self._exec("command -v tmux >/dev/null 2>&1 && echo ok; uname -m; id -u")
        lines = out.split()
        if "ok" not in lines:
            await self._install_tmux()
        self._arch = next((x for x in lines if x in _INPUT_SYSCALLS), self._arch)
        self._sigil = "#" if lines[-1:] == ["0"] else "$"
        d = shlex.quote(self.state_dir)
        files = dict(self._files())
        if restore is not None:
            files["restore.sh"] = self._restore_script(restore)
            cwd = None
        writes = "; ".join(f"printf '%s' {shlex.quote(body)} > {d}/{name}" for name, body in files.items())
        rc, _, err = await self._exec(f"{self._tmux} kill-server 2>/dev/null; rm -rf {d} && mkdir -p {d} && {writes}")
        if rc != 0:
            raise EnvironmentFault(f"cannot create the terminal's state folder {self.state_dir}: {err.strip()}")
        await self._start_server(cwd)

    def _files(self) -> dict[str, str]:
        return {
            "rc": _RC.replace("__STATE_DIR__", shlex.quote(self.state_dir)),
            "tmux.conf": _TMUX_CONF,
            # tmux drops the oldest 10% of a full history at once: 90% full means rows were dropped
            "poll": _POLL.replace("__HISTORY_FULL__", str(HISTORY_LIMIT * 9 // 10)),
        }

    async def _install_tmux(self) -> None:
        cmd = (
            "if command -v apt-get >/dev/null; then DEBIAN_FRONTEND=noninteractive apt-get install -y tmux "
            "|| (apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y tmux); "
            "elif command -v apk >/dev/null; then apk add --no-cache tmux; "
            "elif command -v dnf >/dev/null; then dnf install -y tmux; "
            "elif command -v yum >/dev/null; then yum install -y tmux; fi >/dev/null 2>&1; command -v tmux"
        )
        rc, _, _ = await self._exec(cmd, timeout=180)
        if rc != 0:
            raise EnvironmentFault("tmux is not installed in the environment and could not be installed")

    @staticmethod
    def _restore_script(state: ShellState) -> str:
        return filter_exports(state.exports) + f"cd -- {shlex.quote(state.cwd)}\n"

    async def _write_restore(self, state: ShellState) -> None:
        await self._write_file(f"{self.state_dir}/restore.sh", self._restore_script(state))

    def _shell_command(self) -> str:
        return f"bash --noprofile --rcfile {shlex.quote(self.state_dir + '/rc')} -i"

    async def _start_server(self, cwd: str | None) -> None:
        d = shlex.quote(self.state_dir)
        where = f"-c {shlex.quote(cwd)} " if cwd else ""
        rc, out, err = await self._exec(
            f"rm -f {d}/status {d}/tmux.sock; TERM=xterm-256color SHELL=/bin/bash {self._tmux} -f {d}/tmux.conf "
            f"new-session -d -s {SESSION} -x {self.width} -y {self.height} {where}{shlex.quote(self._shell_command())}"
            f" && {self._tmux} display-message -p '#{{pid}}'"
        )
        if rc != 0:
            raise EnvironmentFault(f"tmux failed to start in the environment: {err.strip()}")
        self._server_pid = int(out.strip()) if out.strip().isdigit() else None
        await self._wait_ready()

    async def _wait_ready(self, timeout: float = 20.0) -> _Poll:
        deadline = time.monotonic() + timeout
        delay = 0.01
        while True:
            p = await self._poll("line")
            if p.count >= 1 and not p.error and self._at_prompt_line(p.capture, p.pwd):
                self._cwd = p.pwd
                self.busy = None
                return p
            if time.monotonic() > deadline:
                raise EnvironmentFault(f"the shell in the terminal did not show its prompt within {timeout:g} s "
                                   f"({p.error or p.capture.strip()[-200:]!r})")  # fmt: skip
            await asyncio.sleep(delay)
            delay = min(delay * 1.5, 0.2)

    async def close(self) -> None:
        """Kill the tmux server of this session (the environment itself is left running)."""
        try:
            await self._exec(f"{self._tmux} kill-server 2>/dev/null; true", timeout=10)
        except EnvironmentFault:
            pass

    async def shell_state(self) -> ShellState:
        """The cwd and exported variables as of the last prompt (what a fork needs to continue).

        Raises :class:`EnvironmentFault` when the hook's files cannot be read.
        """
        state = await self._read_state()
        if state is None:
            if self._last_state is not None:
                return self._last_state
            raise EnvironmentFault(f"no shell state in {self.state_dir} (the session never showed a prompt)")
        self._last_state = state
        return state

    async def screen(self) -> str:
        """The visible screen (what a person looking at the terminal would see)."""
        return (await self._poll("screen")).capture

    # ------------------------------------------------------------------------------ recovery
    async def _revive_socket(self) -> bool:
        """A deleted socket (``rm -rf /tmp/*``) leaves the tmux server running but unreachable;
        SIGUSR1 makes tmux recreate it (tmux(1)). True when the session answers again."""
        if not self._server_pid:
            return False
        pid = self._server_pid
        await self._exec(f"mkdir -p {shlex.quote(self.state_dir)}")
        for name, body in self._files().items():
            await self._write_file(f"{self.state_dir}/{name}", body)
        rc, out, _ = await self._exec(
            f"case \"$(cat /proc/{pid}/comm 2>/dev/null)\" in "
            f"tmux*) kill -USR1 {pid} && echo revived;; esac"
        )
        if "revived" not in out:
            return False
        await asyncio.sleep(0.05)
        p = await self._poll("line")
        return not p.error

    async def _restart(self, why: str) -> str:
        """Start a new shell (or a new tmux server) with the last known state. Returns the message."""
        self.restarts += 1
        try:
            state = await self._read_state() or self._last_state
        except EnvironmentFault:
            state = self._last_state
        if state is not None:
            self._last_state = state
        # the state folder may have been deleted with the files in it
        await self._exec(f"mkdir -p {shlex.quote(self.state_dir)}")
        for name, body in self._files().items():
            await self._write_file(f"{self.state_dir}/{name}", body)
        if state is not None:
            await self._write_restore(state)
        rc, _, _ = await self._exec(
            f"rm -f {shlex.quote(self.state_dir)}/status; "
            f"{self._tmux} respawn-pane -k -t {SESSION} {shlex.quote(self._shell_command())} 2>/dev/null"
        )
        if rc != 0:  # the tmux server itself is gone (or unreachable): start a new one
            if self._server_pid:
                await self._exec(
                    f"case \"$(cat /proc/{self._server_pid}/comm 2>/dev/null)\" in tmux*) "
                    f"kill -KILL {self._server_pid};; esac; true"
                )
            await self._start_server(None if state else self._cwd)
        else:
            await self._wait_ready()
        self.busy = None
        where = state.cwd if state else (self._cwd or "the start directory")
        return f"{why}; a new shell was started in {where} with the exported variables restored"

    # ------------------------------------------------------------------------------ one action
    def _at_prompt_line(self, line: str, pwd: str | None) -> bool:
        line = line.rstrip("\n").rstrip()
        if pwd is None:
            return False
        return line.endswith(f"{pwd}{self._sigil}") or line.endswith(f"{pwd}#") or line.endswith(f"{pwd}$")

    def _strip_prompt(self, line: str, pwd: str | None) -> str:
        stripped = line.rstrip()
        for sigil in (self._sigil, "#", "$"):
            tail = f"{pwd}{sigil}"
            if pwd is not None and stripped.endswith(tail):
                return stripped[: -len(tail)]
        return line

    def _waiting_for_input(self, p: _Poll, idle_for: float) -> bool:
        """Every process of the foreground group sleeps, at least one in a read/poll system call.

        Where ``/proc/PID/syscall`` cannot be read, a sleeping group idle for ``3 * idle_s`` counts.
        """
        if not p.procs:
            return False
        calls = _INPUT_SYSCALLS.get(self._arch, set())
        reading, known = False, False
        for _, state, syscall in p.procs:
            if state not in ("S", "I"):
                return False
            first = syscall.split(" ", 1)[0]
            if first.lstrip("-").isdigit():
                known = True
                reading = reading or int(first) in calls
        return reading if known else idle_for >= 3 * self.idle_s

    async def _send(self, command: str, at_prompt: bool) -> str:
        """Type ``command`` and press Enter (or press a lone key name). Returns the shell text used.

        The bytes reach the terminal unchanged: tmux's own command parser never sees the text, because
        ``send-keys`` splits its arguments at a trailing ``;`` (``find -exec ... \\;`` would arrive as
        ``... ;``) and ``-l`` reads UTF-8 only. At the shell prompt the text goes through a paste
        buffer, bracketed when the program asked for it (``-p``), so bash reads a multi-line command
        as one input and TABs are not completion; typed into a running program, each byte is sent
        as a hexadecimal key (``send-keys -H``), as if typed. Long text always uses the buffer. At the
        prompt, ``C-u`` goes first and empties readline's line: replies the terminal typed into the shell's
        input after earlier output queried it (``ESC [ c`` -> ``ESC [ ? 1 ; 2 c``) would otherwise prefix the
        command.
        """
        target = f"-t {SESSION}"
        key = command.strip()
        if command == "":
            return "true"
        if key in SPECIAL_KEYS and "\n" not in command:
            return f"{self._tmux} send-keys {target} {shlex.quote(key)}"
        text = command.rstrip("\n")
        data = text.encode("utf-8", errors="surrogateescape")
        enter = f"{self._tmux} send-keys {target} Enter"
        if not data:
            return enter
        if at_prompt or len(data) > 2000:
            # at the prompt C-u first: the terminal's replies to queries in earlier output (``ESC [ c`` gets
            # ``ESC [ ? 1 ; 2 c``) wait in the shell's input, and readline would prefix them to the line
            discard = f"send-keys {target} C-u \\; " if at_prompt else ""
            return (
                f"printf '%s' {shlex.quote(text)} | {self._tmux} load-buffer -b reterm - && "
                f"{self._tmux} {discard}paste-buffer -p -d -b reterm {target} && {enter}"
            )
        keys = " ".join(f"{b:02x}" for b in data)
        return f"{self._tmux} send-keys {target} -H {keys} \\; send-keys {target} Enter"

    async def run(self, command: str, timeout: float | None = None) -> CommandResult:
        """Type ``command`` into the terminal and wait for its result.

        The wait ends when the shell prompt returns (exit status known), when the foreground program
        waits for input and the screen has been idle for ``idle_s``, or at ``timeout`` seconds (then
        the program is interrupted, see the module docstring). A command that is only a key name of
        :data:`reterm.agent.protocol.SPECIAL_KEYS` presses that key; an empty command only waits.

        Raises:
            EnvironmentFault: the environment's ``exec`` failed (an infrastructure fault).
        """
        timeout = float(min(max(timeout or DEFAULT_COMMAND_TIMEOUT_S, 0.1), MAX_COMMAND_TIMEOUT_S))
        t0 = time.monotonic()
        restarted: str | None = None

        # one exec: read the state, clear the scrollback, type the keys
        at_prompt = self.busy is None
        send = await self._send(command, at_prompt)
        pre = await self._poll("line", send=send)
        if pre.error and await self._revive_socket():
            pre = await self._poll("line", send=send)
        if pre.error or pre.dead:
            why = "the terminal's tmux server had stopped" if pre.error else "the shell had exited"
            restarted = await self._restart(why)
            at_prompt = True
            pre = await self._poll("line", send=await self._send(command, at_prompt))
        if pre.error:
            raise EnvironmentFault(f"cannot type into the terminal: {pre.error[:300]}")
        self._typed_at_prompt, self._typed_into_screen = at_prompt, pre.alternate
        n0, start = pre.count, pre.cursor_y
        if command.strip() == "" and at_prompt:
            return CommandResult(output="(nothing is running: the shell waits at its prompt)", exit_status=None,
                                 restarted=restarted, duration_s=time.monotonic() - t0)  # fmt: skip
        # clear-history ran before the keys: rows are now counted from an empty scrollback
        start = min(start, self.height - 1)
        multi = "\n" in command.strip("\n")
        result = await self._follow(command, n0, start, timeout, t0, multi)
        if restarted:
            result.restarted = restarted if not result.restarted else f"{restarted}. {result.restarted}"
        result.duration_s = time.monotonic() - t0
        return result

    async def _follow(self, command: str, n0: int, start: int, timeout: float, t0: float, multi: bool) -> CommandResult:
        delay, last_sig, last_change = 0.005, None, time.monotonic()
        deadline = t0 + timeout
        confirm: tuple | None = None
        while True:
            await asyncio.sleep(delay)
            delay = min(delay * 1.6, self.max_poll_interval_s)
            now = time.monotonic()
            idle_for = now - last_change
            want_proc = idle_for >= self.idle_s
            p = await self._poll("auto", n0, start, proc=want_proc)
            if p.error and await self._revive_socket():
                continue
            if p.error:
                return await self._died(command, "the terminal's tmux server stopped", None, start)
            if p.dead:
                why = "the shell exited" + (f" (status {p.dead_status})" if p.dead_status is not None else "")
                return await self._died(command, why, p, start)
            if p.count < n0:  # the status file was deleted with its folder: any new line is a prompt
                n0 = 0 if p.count == 0 else p.count
            sig = p.signature()
            if sig != last_sig:
                last_sig, last_change = sig, time.monotonic()
            if p.count > n0 and p.capture_kind in ("full", "split"):
                rows = p.capture.split("\n")
                if p.capture.endswith("\n"):
                    rows = rows[:-1]
                if rows and self._at_prompt_line(rows[-1], p.pwd):
                    # several lines typed ahead produce several prompts: make sure no more come
                    if multi and confirm != (p.count, sig):
                        confirm = (p.count, sig)
                        delay = 0.05
                        continue
                    self.busy = None
                    self._cwd = p.pwd
                    return self._result(command, p, exit_status=p.status)
            if want_proc and self._waiting_for_input(p, idle_for):
                if p.count > n0 and p.fg == p.pane_pid and not p.alternate:
                    # the shell prompted again but its prompt is not readable: output bytes changed
                    # the terminal's state (charset, scroll region...) or the terminal's replies to
                    # queries sit on readline's line. Reset tmux's emulator, empty the line (C-u) and
                    # let readline redraw the prompt, so the next command starts clean.
                    self.busy = None
                    self._cwd = p.pwd
                    r = self._result(command, p, exit_status=p.status, keep_last=True)
                    r.output = self._cut_prompt_and_typeahead(r.output, p.pwd)
                    await self._exec(
                        f"{self._tmux} send-keys -R -t {SESSION} \\; send-keys -t {SESSION} C-u \\; "
                        f"send-keys -t {SESSION} C-l"
                    )
                    return r
                return await self._waiting(command, p, n0, start)
            if time.monotonic() >= deadline:
                return await self._interrupt(command, n0, start, timeout)

    async def _waiting(self, command: str, p: _Poll, n0: int, start: int) -> CommandResult:
        """The result when the foreground program (or the shell itself) waits for keyboard input."""
        full = p if p.capture_kind in ("screen", "full", "split") else await self._poll("full", n0, start)
        rows = full.capture.rstrip("\n").split("\n")
        if full.fg == full.pane_pid and not full.alternate and self._at_prompt_line(rows[-1], full.pwd or self._cwd):
            # the shell waits at a bare prompt. A poll reads the status file before the screen, so a
            # command that ended between the two shows its prompt before its status line: read again.
            again = await self._poll("full", n0, start)
            if again.count > n0 and not again.error:
                self.busy = None
                self._cwd = again.pwd
                return self._result(command, again, exit_status=again.status)
            # its hook really wrote nothing (its files were deleted, or it is no longer bash): the
            # command is done, its exit status unknown
            self.busy = None
            return self._result(command, full, exit_status=None)
        self.busy = full.command or p.command or "program"
        r = self._result(command, full, exit_status=None, keep_last=True)
        r.running, r.waiting_for_input = self.busy, True
        return r

    async def _interrupt(self, command: str, n0: int, start: int, timeout: float) -> CommandResult:
        """Ctrl-C the foreground program; kill its process group if it neither stops nor waits."""
        actions = ["sent Ctrl-C"]
        await self._exec(f"{self._tmux} send-keys -t {SESSION} C-c")
        killed = False
        grace_end = time.monotonic() + self.interrupt_grace_s
        while True:
            await asyncio.sleep(0.1)
            p = await self._poll("auto", n0, start, proc=True)
            if p.error or p.dead:
                r = await self._died(command, "the shell died when interrupted", None if p.error else p, start)
                r.timed_out, r.timeout_s, r.interrupt = True, timeout, "; ".join(actions)
                return r
            if p.count > n0 and p.capture_kind in ("full", "split"):
                rows = p.capture.rstrip("\n").split("\n")
                if rows and self._at_prompt_line(rows[-1], p.pwd):
                    self.busy = None
                    r = self._result(command, p, exit_status=p.status)
                    r.timed_out, r.timeout_s, r.interrupt = True, timeout, "; ".join(actions)
                    return r
            if p.fg is not None and p.fg != p.pane_pid and self._waiting_for_input(p, 0.0):
                r = await self._waiting(command, p, n0, start)
                r.timed_out, r.timeout_s, r.interrupt = True, timeout, "; ".join(actions)
                return r
            if time.monotonic() < grace_end:
                continue
            if killed:
                full = await self._poll("full", n0, start)
                self.busy = full.command or "program"
                r = self._result(command, full, exit_status=None, keep_last=True)
                r.running = self.busy
                r.timed_out, r.timeout_s, r.interrupt = True, timeout, "; ".join(actions)
                return r
            # Ctrl-C did not stop it: kill the foreground process group (the shell itself if a
            # builtin loop holds it; it is then respawned with its state)
            target = p.fg if p.fg and p.fg != p.pane_pid else None
            if target:
                await self._exec(f"kill -KILL -- -{target} 2>/dev/null; true")
                actions.append(f"killed `{p.command or 'the program'}`")
            else:
                await self._exec(f"kill -KILL {p.pane_pid} 2>/dev/null; true")
                actions.append("killed the shell")
            killed = True
            grace_end = time.monotonic() + self.interrupt_grace_s

    def _cut_prompt_and_typeahead(self, output: str, pwd: str | None) -> str:
        """Drop the new prompt, what readline shows after it, and the tty's echo of terminal replies just
        before it, from the last row of ``output``.

        The shell's input can hold the terminal's replies to queries the command printed (``ESC [ c``,
        ``ESC [ 6 n``): a reply that arrives while the tty still echoes shows as ``^[[?1;2c`` before the
        prompt, and readline shows the printable part of one it reads after the prompt (``/app# 1;2c``).
        """
        if pwd is None:
            return output
        head, newline, last = output.rpartition("\n")
        cut = max(last.rfind(f"{pwd}{sigil} ") for sigil in {self._sigil, "#", "$"})
        if cut < 0:
            return output
        last = _ECHOED_REPLIES.sub("", last[:cut])
        return head + newline + last if last.strip() else head

    async def _died(self, command: str, why: str, p: _Poll | None, start: int) -> CommandResult:
        output = ""
        if p is not None:
            output = self._result(command, p, exit_status=None, keep_last=True).output
        restarted = await self._restart(why)
        return CommandResult(output=output, exit_status=None, restarted=restarted)

    def _result(self, command: str, p: _Poll, exit_status: int | None, keep_last: bool = False) -> CommandResult:
        """Cut the typed echo and the new prompt out of the captured rows."""
        if p.capture_kind == "screen":
            return CommandResult(output=p.capture, exit_status=exit_status, screen=True)
        text = p.capture[:-1] if p.capture.endswith("\n") else p.capture
        text = _PANE_DEAD_RE.sub("", text)
        head, sep, tail = text.partition("\x1e\n")
        rows = head.split("\n")
        tail_rows = tail.split("\n") if sep else []
        if self._typed_into_screen and not p.alternate and exit_status is not None:
            # keys typed into a full-screen program that then exited (":wq" in vim, "q" in less): the
            # rows before the prompt are the restored old screen, not output
            return CommandResult(output="", exit_status=exit_status)

        def norm(line: str) -> str:  # TABs show as spaces on the screen
            return " ".join(line.split())

        typed = [norm(ln) for ln in command.rstrip("\n").split("\n")]
        if not command.strip() or command.strip() in SPECIAL_KEYS:
            typed = []
        k = 0
        if self._typed_at_prompt and rows:
            k = 1  # the prompt row holds the typed command (or nothing, with `stty -echo`)
        elif typed and rows and norm(rows[0]).endswith(typed[0]):
            k = 1
        while 0 < k < len(typed) and k < len(rows) and norm(rows[k]).endswith(typed[k]):
            k += 1
        if self._typed_at_prompt and 0 < k < len(typed):
            # a pasted command taller than the screen: readline redrew it, so the echo rows no longer
            # match line by line. Its last row starts (or ends) with the command's last line.
            last = next((t for t in reversed(typed) if t), "")
            window = rows[: len(typed) + 1]
            hits = [i for i, row in enumerate(window) if last and (norm(row).startswith(last) or norm(row).endswith(last))]
            if hits:
                k = hits[-1] + 1
        rows = rows[k:]
        last_rows = tail_rows if sep else rows
        if not keep_last and last_rows:
            last = self._strip_prompt(last_rows[-1], p.pwd)
            if last != last_rows[-1]:  # the prompt was cut: what the tty echoed just before it goes too
                last = _ECHOED_REPLIES.sub("", last)
            if last.strip():
                last_rows[-1] = last
            else:
                last_rows.pop()
        if sep:
            out = "\n".join(rows) + f"\n[... {p.gap_rows} lines omitted ...]\n" + "\n".join(tail_rows)
        else:
            out = "\n".join(rows)
        return CommandResult(output=out, exit_status=exit_status, lost_head=p.lost)
