"""Every ``reterm`` command answers ``--help``, and every read-only verb runs, as a user would type them.

The commands are discovered, not listed here: the dispatcher's table (:data:`reterm.cli.COMMANDS`), then each
command's own argparse parser (captured when its ``main`` parses ``--help``) and its sub-parsers. Each command
line then runs as a subprocess (``python -m reterm.cli ...``) and must exit 0.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from reterm.cli import COMMANDS

REPO = Path(__file__).resolve().parents[1]
READ_ONLY_VERBS = {"list", "show", "status", "info"}
"""Verb names that only read (a verb of these names with no required argument is run, not just asked for help)."""


class _Captured(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.parser = parser


def _parser_of(command: str) -> argparse.ArgumentParser:
    """The argparse parser that ``reterm COMMAND`` builds (its ``main`` is run until it parses)."""
    import importlib

    module = importlib.import_module(COMMANDS[command][0])

    def capture(self, *args, **kwargs):
        raise _Captured(self)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(argparse.ArgumentParser, "parse_args", capture)
        mp.setattr(argparse.ArgumentParser, "parse_known_args", capture)
        try:
            module.main(["--help"])
        except _Captured as got:
            return got.parser
    raise AssertionError(f"reterm {command}: its main() did not parse its arguments with argparse")


def _verbs(parser: argparse.ArgumentParser, path: tuple[str, ...]) -> list[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """``(words, parser)`` for ``parser`` and every sub-parser below it (depth first)."""
    out = [(path, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                out += _verbs(child, path + (name,))
    return out


def _required(parser: argparse.ArgumentParser) -> bool:
    """Whether the parser has a required argument or sub-command."""
    return any(a.required for a in parser._actions if not isinstance(a, argparse._HelpAction))


def _command_lines() -> list[list[str]]:
    lines = []
    for command in COMMANDS:
        for words, parser in _verbs(_parser_of(command), (command,)):
            lines.append([*words, "--help"])
            if len(words) > 1 and words[-1] in READ_ONLY_VERBS and not _required(parser):
                lines.append(list(words))
    return lines


def _run(words: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "reterm.cli", *words], capture_output=True, text=True,
                          timeout=300, cwd=REPO, env=env)  # fmt: skip


def test_every_command_help_and_read_only_verb_exits_0(tmp_path):
    lines = _command_lines()
    # the discovery found the tree: every command, sub-commands of the ones that have them, a read-only verb
    assert {ws[0] for ws in lines} == set(COMMANDS)
    assert ["sandbox", "list"] in lines and ["sandbox", "prepare", "--help"] in lines
    env = {**os.environ, "PYTHONPATH": str(REPO), "RETERM_CACHE": str(tmp_path / "cache")}
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda ws: _run(ws, env), [["--help"], *lines]))
    failed = [f"reterm {' '.join(r.args[3:])}: exit {r.returncode}\n{r.stderr[-1500:]}"
              for r in results if r.returncode != 0]  # fmt: skip
    assert not failed, "\n\n".join(failed)
    by_line = {" ".join(r.args[3:]): r for r in results}
    for command in COMMANDS:  # each command's help is its own, not the dispatcher's
        assert f"reterm {command}" in by_line[f"{command} --help"].stdout
    listed = by_line["sandbox list"].stdout
    assert f"cache: {tmp_path / 'cache' / 'sandbox'}" in listed and "mode: " in listed
