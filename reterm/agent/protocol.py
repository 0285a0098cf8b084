"""The agent protocol: system prompt, tool schemas (the action format) and the message layout.

This module is the single definition of what the model sees and what it may answer. Data generation,
SFT/GRPO training, evaluation (the Harbor adapter) and the Space all go through it, so a model is
trained for exactly the harness that judges it.

Actions are tool calls in the model's native chat-template format: for Qwen3.5 the template's
``<tool_call><function=bash><parameter=command>...`` blocks, for templates without tool support
(SmolLM2) ReTerm's ChatML template ``templates/chatml_tools.jinja`` with Hermes-style JSON
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``. The parser accepts both.

Re-exported from :mod:`reterm.tool_calls` (the wire format, below the policies and the agent):
:func:`parse_action` (model text -> action or a named parse-error outcome, never raises; outcomes in
:data:`PARSE_OUTCOMES`), :func:`format_tool_call`/:func:`render_action` (its inverse). Here:
:func:`format_observation` (the one wording of terminal results: output with head+tail
truncation, then ``[exit status: N]`` / ``[timed out ...]`` / ``[still running ...]`` lines).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

# the wire format (tool-call syntax, parser, parse outcomes) sits below the policies and the agent, in
# reterm.tool_calls; re-exported here so that the agent protocol stays one import
from reterm.tool_calls import (  # noqa: F401
    MAX_COMMAND_CHARS,
    MAX_COMMAND_TIMEOUT_S,
    MAX_TEXT_CHARS,
    OK_OUTCOMES,
    PARSE_OUTCOMES,
    SPECIAL_KEYS,
    CallFormat,
    ParseResult,
    count_parse_outcomes,
    format_parse_error,
    format_tool_call,
    parse_action,
    render_action,
)

# step_messages (the message layout) lives with the trajectory schema and is re-exported here
from reterm.trajectory import Action, Step, step_messages  # noqa: F401

PROMPT_VERSION = "v2"
"""Version of the system prompt and tool schema below (stored in every record's and trajectory's metadata).

v2 follows the authors' release (``twothsnd/ReTerm-10K``: a few-line system prompt beginning "You are a
helpful assistant that can interact with a Linux terminal", one ``bash`` tool that runs one
non-interactive command, persistent directory and environment changes), plus the kit's ``submit`` tool
that ends an attempt. The text lives in ``prompts/system_v2.md`` so that every stage and every model reads
the same file."""

_PROMPTS = Path(__file__).resolve().parent / "prompts"

SYSTEM_PROMPT = (_PROMPTS / f"system_{PROMPT_VERSION}.md").read_text().strip()

FEEDBACK_VERSION = "v1"
FEEDBACK_MESSAGE = (_PROMPTS / f"feedback_{FEEDBACK_VERSION}.md").read_text().strip()
"""The message that starts a recovery attempt after a failed attempt (attempt-level failure states).

It says that the attempt did not pass and that the environment keeps its changes, and it does not reveal the
tests (the release's protocol; see docs/PROTOCOL.md). Versioned like the system prompt."""

STAGES_DONE_LINE = "STAGES DONE: "
"""A verifier that reports its progress (the kit's chain drills, :mod:`reterm.drills.multistage`) prints
``STAGES DONE: <j> of <k>`` (``j`` of its ``k`` parts pass every check)..."""
STAGES_LEFT_LINE = "STAGES LEFT: "
"""...and, unless every part is done, ``STAGES LEFT: part 2 (<family>), part 3 (<family>)``."""
_PART_RE = re.compile(r"\bpart (\d+)\b")  # a part named in the STAGES LEFT line
_PART_LINE_RE = re.compile(r"^Part (\d+): .*$", re.MULTILINE)  # a part's line in a chain's instruction


def verifier_progress(verifier_output: str | None) -> tuple[int, int, tuple[int, ...]] | None:
    """``(parts done, parts, numbers of the parts left)`` from a verifier's output that reports its progress (the
    last ``STAGES DONE: j of k`` line, and the ``STAGES LEFT:`` line after it); ``None`` when the output has no
    such line (a task whose verifier does not report progress, no output, or output cut before the line).

    Raises:
        ValueError: a ``STAGES DONE:`` line that is not ``j of k`` with ``0 <= j <= k`` (quoted).
    """
    found = None
    for line in (verifier_output or "").splitlines():
        line = line.strip()
        if line.startswith(STAGES_DONE_LINE):
            parts = line.removeprefix(STAGES_DONE_LINE).split()
            if len(parts) != 3 or parts[1] != "of" or not (parts[0].isdigit() and parts[2].isdigit()) \
                    or int(parts[0]) > int(parts[2]):  # fmt: skip
                raise ValueError(f"verifier output: malformed progress line {line!r} (expected 'STAGES DONE: j of k')")
            found = (int(parts[0]), int(parts[2]), ())
        elif line.startswith(STAGES_LEFT_LINE) and found is not None:
            found = (found[0], found[1], tuple(int(n) for n in _PART_RE.findall(line.removeprefix(STAGES_LEFT_LINE))))
    return found


def feedback_message(verifier_output: str | None = None, instruction: str | None = None) -> str:
    """The feedback that starts a recovery attempt after the failed attempt whose verifier printed
    ``verifier_output``: :data:`FEEDBACK_MESSAGE`, and, when that verifier reports its progress
    (:func:`verifier_progress`; the kit's chain drills), which parts are done and which are left, each left part
    with its own line of ``instruction`` (``Part 4: ...``, as the chain's instruction words it)::

        Your attempt did not pass the task's tests. [...] complete the task. Parts done: 3 of 4. Still to do:
        Part 4: Write the line `yarrow 5500` into the file `/root/ember/backups/2028/manifest.conf`.

    Only the task's own words: no check, file content the tests expect, or verifier output (the release's protocol
    shows no test). A part whose line the instruction lacks is named by its number. Tasks without the report
    (Terminal-Bench, the release's records) get :data:`FEEDBACK_MESSAGE` unchanged. Why the parts are restated:
    on four-stage chains the SFT start (SmolLM2-135M), told only the parts' numbers, mostly re-ran commands of its
    own history and submitted (docs/EXPERIMENTS.md, "Four-stage chains"); the chains ask for the feedback to name
    what is left (issue 41).

    Raises:
        ValueError: a malformed progress line (:func:`verifier_progress`).
    """
    progress = verifier_progress(verifier_output)
    if progress is None:
        return FEEDBACK_MESSAGE
    done, total, left = progress
    if not left:
        return f"{FEEDBACK_MESSAGE} Parts done: {done} of {total}."
    lines = {int(m.group(1)): m.group(0).strip() for m in _PART_LINE_RE.finditer(instruction or "")}
    todo = "\n".join(lines.get(n, f"Part {n}") for n in left)
    return f"{FEEDBACK_MESSAGE} Parts done: {done} of {total}. Still to do:\n{todo}"


def is_feedback(text: str | None) -> bool:
    """Whether a message is the feedback after a failed attempt (:func:`feedback_message`, with or without the
    progress sentence): how an attempt-level failure state's prompt is told from an in-attempt one."""
    return (text or "").strip().startswith(FEEDBACK_MESSAGE)

BASH_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run one non-interactive shell command and return its output and exit status.",
        "parameters": {
            "type": "object",
            "properties": {
                "command": {"type": "string", "description": "The shell command."},
                "timeout": {"type": "number", "description": "Seconds to wait (default 30)."},
            },
            "required": ["command"],
        },
    },
}

SUBMIT_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "submit",
        "description": "Call when the task is complete; the tests run next.",
        "parameters": {"type": "object", "properties": {}, "required": []},
    },
}

TOOLS: list[dict[str, Any]] = [BASH_TOOL, SUBMIT_TOOL]

TOOL_SETS: dict[str, list[dict[str, Any]]] = {"bash+submit": TOOLS, "bash": [BASH_TOOL]}
"""The harness's tool sets, one prompt for both: ``bash+submit`` (the kit's default: ``submit`` ends an
attempt) and ``bash`` (the release's one tool: a reply without a tool call ends the attempt). The system
prompt's last rule follows the set (:func:`system_prompt`); the episode loop reads the set from the tools it
is given (:func:`ends_with_submit`)."""
DEFAULT_TOOL_SET = "bash+submit"

DEFAULT_COMMAND_TIMEOUT_S = 30.0


_SUBMIT_RULE = "- When the task is complete, call the submit tool."
_NO_CALL_RULE = "- When the task is complete, reply without calling a tool."
assert _SUBMIT_RULE in SYSTEM_PROMPT, "prompts/system_v2.md lost its submit rule (system_prompt() replaces it)"


def tool_set(name: str) -> list[dict[str, Any]]:
    """The tool schemas of a named set (:data:`TOOL_SETS`). Raises ``ValueError`` naming the known sets."""
    if name not in TOOL_SETS:
        raise ValueError(f"tool set {name!r}: not one of {sorted(TOOL_SETS)}")
    return TOOL_SETS[name]


def ends_with_submit(tools: list[dict[str, Any]] | None) -> bool:
    """Whether an attempt with these tools ends by a ``submit`` call (else: by a reply without a tool call)."""
    tools = TOOLS if tools is None else tools
    return any(t.get("function", {}).get("name") == "submit" for t in tools)


def system_prompt(tools: list[dict[str, Any]] | None = None) -> str:
    """:data:`SYSTEM_PROMPT` for a tool set: with ``submit``, as written; without it, the last rule says
    that a reply without a tool call ends the attempt."""
    return SYSTEM_PROMPT if ends_with_submit(tools) else SYSTEM_PROMPT.replace(_SUBMIT_RULE, _NO_CALL_RULE)


def initial_messages(instruction: str, tools: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """The first two messages of every episode: ``[system(system_prompt(tools)), user(instruction)]``."""
    return [{"role": "system", "content": system_prompt(tools)}, {"role": "user", "content": instruction}]


# ======================================================================= observation format
#
# The one formatter of terminal output for the model: the terminal session
# (:mod:`reterm.agent.terminal`) measures, this module words it, so every consumer sees the same text.

MAX_OBSERVATION_CHARS = 10_000  # head + tail kept of longer output
HEAD_FRACTION = 0.3  # share of the kept characters taken from the head (errors often come last)

_EXIT_RE = re.compile(r"^\[exit status: (-?\d+)\]$", re.MULTILINE)
_TIMEOUT_RE = re.compile(r"^\[timed out after ", re.MULTILINE)
_CONTROL_RE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def sanitize_output(text: str) -> str:
    """Terminal text made safe for a prompt: control characters (except TAB and LF) become ``?``,
    CRLF becomes LF, trailing spaces of each line and trailing blank lines are dropped."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = _CONTROL_RE.sub("?", text)
    return "\n".join(line.rstrip() for line in text.split("\n")).rstrip("\n")


def truncate_middle(text: str, max_chars: int = MAX_OBSERVATION_CHARS, head_fraction: float = HEAD_FRACTION) -> str:
    """Keep the head and the tail of ``text`` (``max_chars`` in all), cut at line ends where possible,
    with a marker ``[... N characters in M lines omitted ...]`` in between. Shorter text is returned
    unchanged."""
    if len(text) <= max_chars:
        return text
    head_n = int(max_chars * head_fraction)
    tail_n = max_chars - head_n
    head, tail = text[:head_n], text[len(text) - tail_n :]
    cut = head.rfind("\n")
    if cut > head_n // 2:
        head = head[:cut]
    cut = tail.find("\n")
    if 0 <= cut < tail_n // 2:
        tail = tail[cut + 1 :]
    omitted = text[len(head) : len(text) - len(tail)]
    marker = f"[... {len(omitted)} characters in {omitted.count(chr(10)) + 1} lines omitted ...]"
    return f"{head}\n{marker}\n{tail}"


def format_observation(
    output: str,
    exit_status: int | None = None,
    *,
    timed_out: bool = False,
    timeout_s: float | None = None,
    interrupt: str | None = None,
    running: str | None = None,
    waiting_for_input: bool = False,
    restarted: str | None = None,
    lost_head: bool = False,
    note: str | None = None,
    max_chars: int = MAX_OBSERVATION_CHARS,
) -> str:
    """The observation text of one bash action.

    Layout: optional ``note`` and ``restarted`` lines, the output (sanitised, head+tail truncated to
    ``max_chars``, ``(no output)`` when empty), then status lines:
    ``[timed out after T s: INTERRUPT]`` when the timeout hit; ``[exit status: N]`` when the shell
    prompt returned with a known status (after a timeout: ``[exit status after the interrupt: N]``);
    ``[still running: `PROG` ...]`` when a program is still in the foreground; otherwise
    ``[exit status unknown]``.

    Args:
        output: what the command printed (not the whole screen history).
        exit_status: the shell's ``$?``, ``None`` when unknown or still running.
        timed_out: the wait hit ``timeout_s``; ``interrupt`` says what was done (``"sent Ctrl-C"``).
        running: the foreground program's name when it is still running after the wait.
        waiting_for_input: the foreground program waits for keyboard input.
        restarted: a sentence saying the terminal session was restarted and why.
        lost_head: the start of the output scrolled out of the terminal's history.
    """
    lines: list[str] = []
    if note:
        lines.append(note)
    if restarted:
        lines.append(f"[{restarted}]")
    text = sanitize_output(output)
    if lost_head:
        text = "[... earlier output scrolled out of the terminal history ...]\n" + text
    lines.append(truncate_middle(text, max_chars) if text.strip() else "(no output)")
    if timed_out:
        lines.append(f"[timed out after {timeout_s:g} s: {interrupt or 'sent Ctrl-C'}]")
    if running:
        what = "waiting for input" if waiting_for_input else "no new output"
        lines.append(
            f"[still running: `{running}` is in the foreground ({what}); your next command is typed into it. "
            "Send C-c to interrupt it or an empty command to keep waiting]"
        )
    elif exit_status is not None:
        lines.append(f"[exit status after the interrupt: {exit_status}]" if timed_out else f"[exit status: {exit_status}]")
    else:
        lines.append("[exit status unknown]")
    return "\n".join(lines)


def observation_status(observation: str) -> tuple[int | None, bool]:
    """(exit_status, timed_out) read back from the status lines :func:`format_observation` ends an
    observation with (used to rebuild steps from chat messages)."""
    lines = observation.rstrip("\n").rsplit("\n", 2)[-2:]
    timed_out = any(line.startswith("[timed out after ") for line in lines)
    m = _EXIT_RE.match(lines[-1]) if lines else None
    return (int(m.group(1)) if m and not timed_out else None), timed_out
