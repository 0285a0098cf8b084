"""Replay fork: the fork that works with *any* Harbor environment (docker, podman, daytona, ...).

No Harbor environment but :class:`reterm.sandbox.local.LocalEnvironment` can snapshot its state, so
to put ``n`` environments into the state an agent left one in, start ``n`` fresh ones and re-run
the agent's commands in each, then compare what can be compared (exit codes, optionally outputs) and
flag each copy whose replay diverged (a command that depends on time, randomness, the network or a
process that is gone can make a copy differ from the original). Cost grows with the prefix; the
local sandbox's :meth:`~reterm.sandbox.local.LocalEnvironment.fork` does not (see
``bench/sandbox_fork.py``).

Shell state: an agent's commands ran one after another in one terminal, so ``cd`` and ``export``
carried over. The replay therefore runs all of them in **one** ``bash`` process (one ``exec``),
each through ``eval`` (a syntax error then fails that command only, as in an interactive shell),
with stdin from /dev/null and stderr merged into stdout, framed by markers so that each command's
exit code and output can be told apart. A command that ends the shell (``exit``) ends the replay:
the commands after it are reported as ``missing``. Interactive programs (an editor, a REPL waiting
for keys) cannot be replayed this way; keep them out of the prefix.

Own code: Harbor has no fork or replay of an environment.
"""

from __future__ import annotations

import asyncio
import re
import shlex
import tempfile
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from harbor.environments.base import BaseEnvironment

# Scripts longer than this go through a file (exec arguments are limited to 128 KiB on Linux).
_MAX_INLINE_SCRIPT = 100_000


@dataclass
class RecordedCommand:
    """One command of the original session.

    ``exit_code`` / ``output`` are what the original run saw (None = unknown, not compared).
    ``output`` is stdout and stderr together, as a terminal shows them.
    """

    command: str
    exit_code: int | None = None
    output: str | None = None


@dataclass
class Divergence:
    """Where a replay differed: ``kind`` is ``exit_code``, ``output`` or ``missing`` (never ran)."""

    index: int
    command: str
    kind: Literal["exit_code", "output", "missing"]
    expected: Any = None
    actual: Any = None


@dataclass
class ReplayResult:
    """One replayed environment (started; the caller stops it) and how the replay went.

    ``exit_codes[i]`` / ``outputs[i]`` are None for commands that never ran.
    """

    environment: BaseEnvironment
    exit_codes: list[int | None] = field(default_factory=list)
    outputs: list[str | None] = field(default_factory=list)
    divergences: list[Divergence] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def diverged(self) -> bool:
        """True when any command's exit code or (if compared) output differed, or did not run."""
        return bool(self.divergences)


def commands_from_trajectory(trajectory: Any, upto: int | None = None) -> list[RecordedCommand]:
    """The bash commands of ``trajectory.steps[:upto]`` with their exit statuses.

    Outputs are not taken: a step's observation is the harness's formatted terminal view, not the
    raw output, so only exit codes are compared for trajectories.
    """
    steps = trajectory.steps[: len(trajectory.steps) if upto is None else upto]
    return [RecordedCommand(s.command, s.exit_status) for s in steps if s.command]


def build_script(commands: Sequence[RecordedCommand | str], nonce: str) -> str:
    """The bash script that replays ``commands`` in one shell, framing each command's output."""
    lines = []
    for i, c in enumerate(commands):
        cmd = c.command if isinstance(c, RecordedCommand) else c
        lines.append(f"printf '\\n__RETERM_BEGIN_{nonce} {i}\\n'")
        lines.append(f"eval {shlex.quote(cmd)} </dev/null 2>&1")
        lines.append(f"printf '\\n__RETERM_END_{nonce} {i} %d\\n' $?")
    return "\n".join(lines) + "\n"


def parse_output(stdout: str, n: int, nonce: str) -> tuple[list[int | None], list[str | None]]:
    """Split the replay's stdout into per-command exit codes and outputs (None = did not finish)."""
    codes: list[int | None] = [None] * n
    outputs: list[str | None] = [None] * n
    pattern = re.compile(rf"\n__RETERM_BEGIN_{nonce} (\d+)\n(.*?)\n__RETERM_END_{nonce} \1 (\d+)\n", re.S)
    for m in pattern.finditer(stdout if stdout.startswith("\n") else "\n" + stdout):
        i = int(m.group(1))
        if 0 <= i < n:
            codes[i], outputs[i] = int(m.group(3)), m.group(2)
    return codes, outputs


def _normalise(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.replace("\r", "").strip().splitlines())


async def replay(
    env: BaseEnvironment,
    commands: Sequence[RecordedCommand | str],
    *,
    compare_output: bool = False,
    timeout_sec: int | None = None,
    user: str | int | None = None,
    cwd: str | None = None,
) -> ReplayResult:
    """Re-run ``commands`` in a started environment, in one bash process (see module doc).

    Args:
        env: any started Harbor environment.
        commands: the recorded commands (strings count as "nothing recorded to compare").
        compare_output: also compare outputs (trailing whitespace and ``\\r`` ignored).
        timeout_sec: limit for the whole replay (the environment's exec timeout).
        user / cwd: passed to ``env.exec`` (the session's user and starting folder).

    Returns a :class:`ReplayResult`; exceptions of ``env.exec`` (e.g. a timeout) propagate.
    """
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    nonce = uuid.uuid4().hex[:10]
    script = build_script(commands, nonce)
    if len(script) > _MAX_INLINE_SCRIPT:
        target = f"/tmp/.reterm-replay-{nonce}.sh"
        with tempfile.TemporaryDirectory() as d:
            p = Path(d) / "replay.sh"
            p.write_text(script)
            await env.upload_file(p, target)
        script = f"__f={target}; . \"$__f\"; rm -f \"$__f\""
    r = await env.exec(script, cwd=cwd, timeout_sec=timeout_sec, user=user)
    codes, outputs = parse_output(r.stdout or "", len(commands), nonce)
    result = ReplayResult(env, codes, outputs, wall_s=loop.time() - t0)
    for i, c in enumerate(commands):
        rec = c if isinstance(c, RecordedCommand) else RecordedCommand(c)
        if codes[i] is None:
            result.divergences.append(Divergence(i, rec.command, "missing"))
            continue
        if rec.exit_code is not None and rec.exit_code != codes[i]:
            result.divergences.append(Divergence(i, rec.command, "exit_code", rec.exit_code, codes[i]))
        if compare_output and rec.output is not None and _normalise(rec.output) != _normalise(outputs[i] or ""):
            result.divergences.append(Divergence(i, rec.command, "output", rec.output, outputs[i]))
    return result


EnvFactory = Callable[[int], BaseEnvironment | Awaitable[BaseEnvironment]]


async def replay_fork(
    factory: EnvFactory,
    commands: Sequence[RecordedCommand | str],
    n: int,
    *,
    start: bool = True,
    **replay_kwargs: Any,
) -> list[ReplayResult]:
    """``n`` environments brought to the recorded state by replay, each flagged if it diverged.

    Args:
        factory: ``factory(i)`` returns (or returns an awaitable of) a new environment, e.g.
            ``lambda i: EnvironmentFactory.create_environment(...)`` or ``LocalEnvironment.for_task``.
        commands: the recorded prefix.
        n: how many copies.
        start: call ``await env.start(force_build=False)`` on each (False if the factory starts them).
        **replay_kwargs: passed to :func:`replay` (``compare_output``, ``timeout_sec``, ``user``, ``cwd``).

    The environments are started and replayed concurrently. If any start or replay raises, all of
    them are stopped and the first error is raised; otherwise the caller stops them.
    """
    envs: list[BaseEnvironment] = []
    for i in range(n):
        e = factory(i)
        envs.append(await e if asyncio.iscoroutine(e) or isinstance(e, asyncio.Future) else e)

    async def one(env: BaseEnvironment) -> ReplayResult:
        if start:
            await env.start(force_build=False)
        return await replay(env, commands, **replay_kwargs)

    results = await asyncio.gather(*(one(e) for e in envs), return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        await asyncio.gather(*(e.stop(delete=True) for e in envs), return_exceptions=True)
        raise errors[0]
    return list(results)  # type: ignore[arg-type]
