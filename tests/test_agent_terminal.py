"""The tmux terminal session on the real local sandbox: output and exit status,
interactive programs, timeouts, hostile commands, shell state across a fork."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from reterm.agent.protocol import MAX_OBSERVATION_CHARS
from reterm.agent.terminal import ShellState, TerminalSession, filter_exports
from reterm.sandbox.local import LocalEnvironment

TASK = Path(__file__).parent / "fixtures" / "tasks" / "hello-file"


def run(coro):
    return asyncio.run(coro)


async def _with_session(body, **kwargs):
    env = LocalEnvironment.for_task(TASK)
    async with env:
        session = await TerminalSession.start(env, **kwargs)
        return await body(env, session)


def test_output_exit_status_and_persistent_state():
    async def body(env, s):
        r = await s.run("pwd; ls /nonexistent-dir")
        assert r.output.splitlines()[0] == "/app"
        assert "No such file or directory" in r.output and r.exit_status == 2
        assert "ls /nonexistent" not in r.output  # the typed echo is cut
        assert r.observation().endswith("[exit status: 2]")
        r = await s.run("cd /tmp && export GREETING='hi there' && false")
        assert r.exit_status == 1 and r.output == ""
        r = await s.run("echo $GREETING; pwd; printf no-newline")
        assert r.output == "hi there\n/tmp\nno-newline" and r.exit_status == 0
        # multi-line input runs as one command (bracketed paste): heredoc with TABs kept
        r = await s.run("cat > /tmp/Makefile <<'EOF'\nall:\n\techo built\nEOF\nmake -f /tmp/Makefile")
        assert r.exit_status == 0 and r.output.strip().endswith("built"), r.output
        r = await s.run("for i in 1 2 3; do\n  echo n$i\ndone")
        assert r.output == "n1\nn2\nn3" and r.exit_status == 0

    run(_with_session(body))


def test_interactive_programs_keep_the_keystrokes():
    async def body(env, s):
        r = await s.run("python3")
        assert r.running == "python3" and r.waiting_for_input and r.output.rstrip().endswith(">>>")
        r = await s.run("print(6 * 7)")
        assert r.output.splitlines()[0] == "42" and r.running == "python3"
        r = await s.run("exit()")
        assert r.running is None and r.exit_status == 0 and s.busy is None
        r = await s.run("read -p 'name? ' NAME")
        assert r.waiting_for_input and "name?" in r.output
        r = await s.run("ada")
        assert r.exit_status == 0
        assert (await s.run("echo $NAME")).output == "ada"
        # a full-screen program: the visible screen comes back, keys go to it
        r = await s.run("vi -u NONE /tmp/note.txt" if (await s.run("command -v vim")).exit_status == 0
                        else "less /etc/os-release")  # fmt: skip
        assert r.waiting_for_input and r.screen and r.running in ("vim", "vi", "less")
        keys = [":q!"] if r.running in ("vim", "vi") else ["q"]
        for k in keys:
            r = await s.run(k)
        assert r.exit_status == 0 and r.output == "" and s.busy is None

    run(_with_session(body))


def test_timeout_interrupts_and_says_so():
    async def body(env, s):
        r = await s.run("sleep 30", timeout=1)
        assert r.timed_out and r.exit_status == 130 and "sent Ctrl-C" in r.observation()
        assert "[timed out after 1 s" in r.observation()
        # a program that ignores Ctrl-C is killed
        r = await s.run("trap '' INT; sleep 30 & wait; echo after", timeout=1)
        assert r.timed_out and "killed" in (r.interrupt or "") or r.restarted, r.observation()
        assert (await s.run("echo alive")).output == "alive"
        # C-c as a key interrupts a program left running
        r = await s.run("python3 -c 'import time; print(\"start\", flush=True); time.sleep(30)'", timeout=1)
        assert r.timed_out and "KeyboardInterrupt" in r.output

    run(_with_session(body, interrupt_grace_s=1.0))


def test_hostile_commands_do_not_break_the_harness():
    async def body(env, s):
        await s.run("cd /tmp && export KEEP=1")
        r = await s.run("exit")
        assert r.restarted and "exported variables restored" in r.restarted
        assert (await s.run("echo $KEEP $(pwd)")).output == "1 /tmp"
        r = await s.run("kill -9 $$")
        assert r.restarted
        r = await s.run("exec bash")
        assert r.exit_status == 0
        assert (await s.run("false")).exit_status == 1  # the hook survived exec
        r = await s.run("tmux kill-server")
        assert r.restarted
        assert (await s.run("echo $KEEP")).output == "1"
        await s.run("stty -echo raw; stty -isig")
        r = await s.run("stty sane; echo ok")
        assert r.output.endswith("ok")
        r = await s.run("rm -rf /tmp/.reterm")
        assert (await s.run("echo still")).output == "still"
        assert s.restarts >= 3

    run(_with_session(body))


def test_huge_and_binary_output_is_bounded():
    async def body(env, s):
        r = await s.run("seq 1 200000")
        obs = r.observation()
        assert len(obs) <= MAX_OBSERVATION_CHARS + 300 and r.exit_status == 0
        assert obs.rstrip().endswith("200000\n[exit status: 0]") and "omitted" in obs
        r = await s.run("head -c 20000 /dev/urandom")
        obs = r.observation()
        assert r.exit_status == 0 and len(obs) <= MAX_OBSERVATION_CHARS + 300
        assert not any(ord(c) < 32 and c not in "\n\t" for c in obs)
        r = await s.run("yes", timeout=1)
        assert r.timed_out and len(r.observation()) <= MAX_OBSERVATION_CHARS + 300
        assert (await s.run("echo fine")).output == "fine"

    run(_with_session(body))


def test_replies_to_terminal_queries_do_not_reach_the_next_command():
    """Output that queries the terminal (device attributes, cursor position, status) makes tmux type a
    reply into the shell's input; random bytes hit ``ESC [ c`` now and then. A reply that arrives while the
    command still runs is echoed by the tty (``^[[?1;2c``) and read by readline at the prompt. Neither
    shows in the observation, and the next command runs clean."""

    async def body(env, s):
        queries = [r"\033[c", r"\033[>c", r"\033[6n", r"\033[5n", r"x\033[c\n", r"\033[c\033[6n"]
        commands = [f"printf '{q}'" for q in queries] + [r"printf '\033[c'; sleep 0.5", r"printf 'x\033[6n'; sleep 0.5"]
        for command in commands:
            r = await s.run(command)
            assert r.exit_status == 0 and r.output.strip() in ("", "x"), (command, r.output)
            r = await s.run("echo fine")
            assert (r.output, r.exit_status) == ("fine", 0), (command, r.output)

    run(_with_session(body))


def test_shell_state_moves_to_a_fork():
    async def body(env, s):
        await s.run("mkdir -p /app/work && cd /app/work && export TOKEN='a b \"c\"' PATH=/opt/x:$PATH")
        state = await s.shell_state()
        assert state.cwd == "/app/work"
        assert state.variables()["TOKEN"] == 'a b "c"'
        assert "TMUX" not in state.variables() and "PWD" not in state.variables()
        assert ShellState.model_validate_json(state.model_dump_json()) == state
        (fork,) = await env.fork(1)
        try:
            # the fork carries the hook's files but no processes: restore from them
            saved = await TerminalSession.saved_state(fork)
            assert saved == state
            s2 = await TerminalSession.start(fork, restore=saved)
            r = await s2.run('echo "$TOKEN"; pwd; echo $PATH')
            assert r.output.splitlines() == ['a b "c"', "/app/work", r.output.splitlines()[2]]
            assert r.output.splitlines()[2].startswith("/opt/x:")
            # the original session is untouched
            assert (await s.run("pwd")).output == "/app/work"
        finally:
            await fork.stop(delete=True)

    run(_with_session(body))


def test_filter_exports_drops_per_process_variables():
    text = 'declare -x A="1"\ndeclare -x PWD="/x"\ndeclare -x B="multi\nline"\ndeclare -x SHLVL="2"\ndeclare -x C\n'
    out = filter_exports(text)
    assert "PWD" not in out and "SHLVL" not in out
    assert ShellState(cwd="/", exports=out).variables() == {"A": "1", "B": "multi\nline", "C": ""}


@pytest.mark.parametrize("command", ["", "C-c", "Enter"])
def test_empty_command_and_keys_at_the_prompt(command):
    async def body(env, s):
        r = await s.run(command)
        assert not r.timed_out and r.running is None
        assert (await s.run("echo ok")).output == "ok"

    run(_with_session(body))
