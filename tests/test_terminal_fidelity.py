"""What the agent types is what bash runs: commands that tmux's command parser would change (a
trailing ``;``, ``\\;``, ``;;``), quotes, TABs, non-ASCII text and a leading ``-`` reach bash byte for
byte, at the prompt (compared with bash's own history) and typed into a running program (compared
with the bytes it read). On the real local sandbox."""

from __future__ import annotations

import asyncio
from pathlib import Path

from reterm.agent.terminal import TerminalSession
from reterm.sandbox.local import LocalEnvironment

TASK = Path(__file__).parent / "fixtures" / "tasks" / "hello-file"

# (command, what its output must be or None, its exit status)
AT_PROMPT = [
    ("find /app -maxdepth 0 -exec echo {} \\;", "/app", 0),
    ("echo semi\\;", "semi;", 0),
    ("echo end;", "end", 0),
    ("echo hi;;", None, 2),  # a syntax error bash must see
    ("echo 'single \"double\" $HOME' \"$((6*7))\"", 'single "double" $HOME 42', 0),
    ("printf '%s|' 'a\tb' | tr '\t' T", "aTb|", 0),
    ("echo héllo ✓ 日本語", "héllo ✓ 日本語", 0),
    ("-n", None, 127),  # a leading '-' is a command name to bash, not an option to tmux
    ("echo a; echo b ;", "a\nb", 0),
    # several lines: one history entry per command; a compound command keeps its lines (lithist)
    ("echo one\necho 'two;'\nfind /app -maxdepth 0 -exec echo {} \\;", "one\ntwo;\n/app", 0),
    ("for w in 'x;' y\\;; do\n\tprintf '%s\\n' \"$w\"\ndone", "x;\ny;", 0),
]


def run(coro):
    return asyncio.run(coro)


def test_commands_reach_bash_byte_for_byte():
    async def body(env, s):
        r = await s.run("unset HISTCONTROL HISTIGNORE; shopt -s lithist cmdhist; HISTFILE=")
        assert r.exit_status == 0
        for command, output, status in AT_PROMPT:
            r = await s.run(command)
            assert r.exit_status == status, (command, r.output)
            if output is not None:
                assert r.output == output, (command, r.output)
            entries = command.split("\n") if command.startswith("echo one") else [command]
            await s.run(f"fc -ln -{len(entries)} > /tmp/typed.hist")
            got = await env.exec("cat /tmp/typed.hist")
            assert got.stdout == "".join(f"\t {e}\n" for e in entries), (command, got.stdout)

    async def main():
        env = LocalEnvironment.for_task(TASK)
        async with env:
            s = await TerminalSession.start(env)
            await body(env, s)

    run(main())


def test_keys_typed_into_a_program_arrive_unchanged():
    lines = ["a;", "b\\;", "c;;", "\tTAB", "-x", "ünï ✓", "'\"$HOME"]

    async def main():
        env = LocalEnvironment.for_task(TASK)
        async with env:
            s = await TerminalSession.start(env)
            r = await s.run("cat > /tmp/typed.txt")
            assert r.waiting_for_input and r.running == "cat"
            for line in lines:
                r = await s.run(line)
                assert r.running == "cat"
            r = await s.run("C-d")
            got = await env.exec("cat /tmp/typed.txt")
            assert got.stdout == "".join(f"{line}\n" for line in lines)

    run(main())
