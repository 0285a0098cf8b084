"""The agent protocol: system prompt, tool schemas (the action format) and the message layout.

This module is the single definition of what the model sees and what it may answer. Data generation,
SFT/GRPO training, evaluation (the Harbor adapter) and the Space all go through it, so a model is
trained for exactly the harness that judges it.

Actions are tool calls in the model's native chat-template format: for Qwen3.5 the template's
``<tool_call><function=bash><parameter=command>...`` blocks, for templates without tool support
(SmolLM2) ReTerm's ChatML template ``templates/chatml_tools.jinja`` with Hermes-style JSON
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``. The parser accepts both.

Also here: :func:`parse_action` (model text -> action or a named parse-error outcome, never raises;
outcomes in :data:`PARSE_OUTCOMES`), :func:`format_tool_call`/:func:`render_action` (its inverse),
and :func:`format_observation` (the one wording of terminal results: output with head+tail
truncation, then ``[exit status: N]`` / ``[timed out ...]`` / ``[still running ...]`` lines).
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

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
MAX_COMMAND_TIMEOUT_S = 600.0


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


# ============================================================================ action parsing
#
# Written for this kit: TRL's `parse_response` and transformers' response schemas parse well-formed
# tool calls but raise (or silently drop) on the malformed text small models write, and the harness
# must turn every model text into exactly one defined outcome. The accepted formats are the ones the
# two chat templates render (Qwen3.5's XML-style calls, as in TRL's `qwen3_5_*.jinja`; Hermes JSON, as in
# `templates/chatml_tools.jinja`), so parsing inverts rendering.

CallFormat = Literal["hermes", "qwen"]

# Model text longer than this is not parsed (a degenerate blob); a bash command longer than this is
# refused. A heredoc writing a 30 KB file still fits.
MAX_TEXT_CHARS = 131_072
MAX_COMMAND_CHARS = 32_768

# Whole-command key names sent as a single key press instead of typed text (tmux key names), so the
# model can interrupt a program (C-c), end input (C-d), suspend (C-z) or leave an editor mode (Escape).
SPECIAL_KEYS: frozenset[str] = frozenset(
    {"C-c", "C-d", "C-z", "C-\\", "C-l", "C-u", "C-a", "C-e", "C-r", "C-o", "C-x", "C-w",
     "Escape", "Enter", "Tab", "BSpace", "Up", "Down", "Left", "Right", "PageUp", "PageDown",
     "Home", "End"}
)  # fmt: skip

PARSE_OUTCOMES: dict[str, str] = {
    # name -> what it means (an action runs only for "ok" and "multiple_calls")
    "ok": "exactly one valid tool call",
    "multiple_calls": "several tool calls; the first (valid) one was run and the rest ignored",
    "empty": "the reply was empty",
    "no_tool_call": "prose without any tool call",
    "unterminated_think": "a <think> block that never closed and no tool call (ran out of tokens?)",
    "unterminated_tool_call": "<tool_call> without a closing </tool_call>",
    "malformed_json": "the JSON inside <tool_call> could not be parsed",
    "malformed_call": "the <tool_call> body is neither a JSON object with a name nor a <function=...> block",
    "unknown_tool": "a tool name other than bash or submit",
    "missing_argument": "a required argument (bash's command) is missing",
    "bad_argument": "an argument of the wrong type or value, or an unexpected argument",
    "too_long": "the reply or the command is too long",
    "binary": "the reply holds NUL, control bytes or undecodable characters",
}
OK_OUTCOMES = frozenset({"ok", "multiple_calls"})

_TOOL_CALL_OPEN = "<tool_call>"
_TOOL_CALL_CLOSE = "</tool_call>"
_FUNCTION_RE = re.compile(r"<function=([^>\n]*)>")
_PARAM_RE = re.compile(r"<parameter=([^>\n]*)>(.*?)</parameter>", re.DOTALL)
# C0 controls except TAB, LF, CR and ESC; DEL; the replacement character of failed decoding.
_BINARY_RE = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1a\x1c-\x1f\x7f\ufffd]")


@dataclass
class ParseResult:
    """What one model text was parsed into.

    ``outcome`` is a key of :data:`PARSE_OUTCOMES`. ``action`` is set exactly when ``outcome`` is in
    :data:`OK_OUTCOMES`. ``reasoning`` is the text inside ``<think>...</think>`` (``None`` without a
    think block), ``content`` the text outside the think block and the tool calls. ``error`` says
    what was wrong (for the model), ``note`` is a remark to prepend to the observation of a run
    action (several calls). ``call_format`` is the call syntax the model used or should use.
    """

    outcome: str
    action: Action | None = None
    reasoning: str | None = None
    content: str = ""
    error: str | None = None
    note: str | None = None
    n_calls: int = 0
    call_format: CallFormat = "hermes"

    @property
    def ok(self) -> bool:
        """True when an action was parsed (``outcome`` in :data:`OK_OUTCOMES`)."""
        return self.outcome in OK_OUTCOMES

    @property
    def message_content(self) -> str:
        """The assistant text outside the tool call, as stored in :attr:`Step.reasoning`.

        A think block is kept in ``<think>`` tags, the way Qwen3.5's template renders it, so a chat
        template that splits ``reasoning_content`` out of ``content`` splits it again.
        """
        if self.reasoning is None:
            return self.content
        return f"<think>\n{self.reasoning}\n</think>\n\n{self.content}".rstrip()

    def observation(self) -> str:
        """The parse-error observation shown to the model (``""`` for a parsed action)."""
        if self.ok:
            return ""
        return format_parse_error(self.outcome, self.error or PARSE_OUTCOMES[self.outcome], self.call_format)


def format_tool_call(name: str, arguments: dict[str, Any], call_format: CallFormat = "hermes") -> str:
    """A tool call as the chat templates render it.

    ``"hermes"``: ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` (ChatML tool
    template); ``"qwen"``: ``<tool_call>\\n<function=NAME>\\n<parameter=K>\\nV\\n</parameter>\\n
    </function>\\n</tool_call>`` (Qwen3.5 template). :func:`parse_action` inverts both.
    """
    if call_format == "qwen":
        params = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in arguments.items())
        return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"
    body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"<tool_call>\n{body}\n</tool_call>"


def render_action(action: Action, content: str = "", call_format: CallFormat = "hermes") -> str:
    """A canonical model text for ``action`` (``content`` first, then the call), parseable back."""
    args: dict[str, Any] = {}
    if action.tool == "bash":
        args["command"] = action.command or ""
        if action.timeout is not None:
            args["timeout"] = action.timeout
    call = format_tool_call(action.tool, args, call_format)
    return f"{content}\n\n{call}" if content else call


def format_parse_error(outcome: str, error: str, call_format: CallFormat = "hermes") -> str:
    """The observation for a reply that held no runnable action: what was wrong, then the format.

    Shape: ``[parse error: OUTCOME] ERROR No command was run.`` + an example of a bash call and of
    submit in ``call_format``.
    """
    example = format_tool_call("bash", {"command": "ls -la"}, call_format)
    submit = format_tool_call("submit", {}, call_format)
    return (
        f"[parse error: {outcome}] {error.rstrip('.')}. No command was run.\n"
        "Reply with exactly one tool call, for example:\n"
        f"{example}\n"
        "or, when the task is done and checked:\n"
        f"{submit}"
    )


def _snippet(text: str, n: int = 120) -> str:
    text = text.strip()
    return repr(text if len(text) <= n else text[:n] + "...")


def _split_think(text: str) -> tuple[str | None, str, bool]:
    """(reasoning, rest, unterminated). Handles a missing ``<think>`` (Qwen3.5's generation prompt
    opens the block, so the model's text starts inside it) and a think block that never closes."""
    close = text.find("</think>")
    if close >= 0:
        head, rest = text[:close], text[close + len("</think>") :]
        open_ = head.find("<think>")
        before = head[:open_] if open_ >= 0 else ""
        reasoning = head[open_ + len("<think>") :] if open_ >= 0 else head
        return reasoning.strip(), (before + rest).strip(), False
    open_ = text.find("<think>")
    if open_ >= 0:
        inside = text[open_ + len("<think>") :]
        call = inside.find(_TOOL_CALL_OPEN)
        if call >= 0:  # a call inside an unclosed think block: the think ends where the call starts
            return inside[:call].strip(), (text[:open_] + inside[call:]).strip(), False
        return inside.strip(), text[:open_].strip(), True
    return None, text.strip(), False


def _coerce_timeout(value: Any) -> tuple[float | None, str | None]:
    """(timeout seconds, error). Accepts numbers and numeric strings; clamps to the maximum."""
    if isinstance(value, bool) or value is None:
        return None, f"`timeout` must be a number of seconds, got {value!r}"
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            return None, f"`timeout` must be a number of seconds, got {_snippet(value, 40)}"
    if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        return None, f"`timeout` must be a positive number of seconds, got {value!r}"
    return min(float(value), MAX_COMMAND_TIMEOUT_S), None


def _build_action(name: Any, arguments: Any, call_id: str) -> tuple[Action | None, str, str | None]:
    """(action, outcome, error) for one call's name and arguments."""
    if not isinstance(name, str) or not name.strip():
        return None, "malformed_call", f"the tool call has no tool name (got {name!r})"
    name = name.strip()
    if name not in ("bash", "submit"):
        return None, "unknown_tool", f"unknown tool {_snippet(name, 40)}; the tools are `bash` and `submit`"
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return None, "bad_argument", f"`arguments` must be an object, got {type(arguments).__name__}"
    allowed = {"command", "timeout"} if name == "bash" else set()
    extra = sorted(set(arguments) - allowed)
    if extra:
        return None, "bad_argument", f"unexpected argument(s) {', '.join(map(repr, extra))} for `{name}`"
    if name == "submit":
        return Action(tool="submit", call_id=call_id), "ok", None
    if "command" not in arguments:
        return None, "missing_argument", "the `bash` call has no `command` argument"
    command = arguments["command"]
    if not isinstance(command, str):
        return None, "bad_argument", f"`command` must be a string, got {type(command).__name__}"
    if len(command) > MAX_COMMAND_CHARS:
        return None, "too_long", f"the command has {len(command)} characters; the limit is {MAX_COMMAND_CHARS}"
    # a NUL or a lone surrogate (JSON "\\u0000", "\\ud800") cannot be typed into a terminal or passed
    # to exec: the model's mistake, not a sandbox fault (which it was, ending the episode)
    if "\x00" in command:
        return None, "bad_argument", "the command contains a NUL character (\\x00), which a terminal cannot type"
    try:
        command.encode("utf-8")
    except UnicodeEncodeError as exc:
        return None, "bad_argument", f"the command is not valid text: {exc.reason} at character {exc.start}"
    timeout = None
    if "timeout" in arguments:
        timeout, err = _coerce_timeout(arguments["timeout"])
        if err:
            return None, "bad_argument", err
    return Action(tool="bash", command=command, timeout=timeout, call_id=call_id), "ok", None


def _parse_call_body(body: str, call_id: str) -> tuple[Action | None, str, str | None, CallFormat]:
    """Parse the text between ``<tool_call>`` and ``</tool_call>``: (action, outcome, error, format)."""
    stripped = body.strip()
    if stripped.startswith("<function="):
        m = _FUNCTION_RE.match(stripped)
        if m is None:
            return None, "malformed_call", "`<function=NAME>` is not closed with `>`", "qwen"
        end = stripped.rfind("</function>")
        if end < 0:
            return None, "malformed_call", "the `<function=...>` block has no closing `</function>`", "qwen"
        inner = stripped[m.end() : end]
        args: dict[str, Any] = {}
        for key, value in _PARAM_RE.findall(inner):
            # the template writes "<parameter=K>\nVALUE\n</parameter>": drop exactly those newlines
            value = value[1:] if value.startswith("\n") else value
            value = value[:-1] if value.endswith("\n") else value
            args[key.strip()] = value
        leftover = _PARAM_RE.sub("", inner).strip()
        if leftover.startswith("<parameter") or "</parameter>" in leftover:
            return None, "malformed_call", "a `<parameter=...>` block is not closed with `</parameter>`", "qwen"
        action, outcome, err = _build_action(m.group(1), args, call_id)
        return action, outcome, err, "qwen"
    if stripped.startswith("{"):
        try:
            obj = json.loads(stripped)
        except ValueError as exc:
            return None, "malformed_json", f"the tool call is not valid JSON ({exc})", "hermes"
        if not isinstance(obj, dict):
            return None, "malformed_call", "the tool call JSON must be an object", "hermes"
        unknown = sorted(set(obj) - {"name", "arguments", "id", "type"})
        if unknown:
            return None, "malformed_call", f"unexpected key(s) {', '.join(map(repr, unknown))} in the tool call", "hermes"
        arguments = obj.get("arguments", {})
        if isinstance(arguments, str):  # some models double-encode the arguments
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except ValueError as exc:
                return None, "malformed_json", f"`arguments` is a string that is not valid JSON ({exc})", "hermes"
        action, outcome, err = _build_action(obj.get("name"), arguments, call_id)
        return action, outcome, err, "hermes"
    if not stripped:
        return None, "malformed_call", "the <tool_call> block is empty", "hermes"
    return None, "malformed_call", (
        f"the <tool_call> body must be a JSON object or a <function=...> block, got {_snippet(stripped, 60)}"
    ), "hermes"


def parse_action(text: Any, call_format: CallFormat | None = None) -> ParseResult:
    """Parse one model reply into an action or a defined parse-error outcome. Never raises.

    Accepts Qwen3.5's native calls (``<tool_call>\\n<function=bash>\\n<parameter=command>\\n...``)
    and Hermes JSON calls (``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``); a
    ``<think>...</think>`` block (or a bare ``...</think>`` when the generation prompt opened it)
    becomes :attr:`ParseResult.reasoning`.

    Rules (each outcome is a key of :data:`PARSE_OUTCOMES`):
    - several calls: the first call decides. If it is valid it runs (``multiple_calls``, with a note
      telling the model only one call per turn runs); if it is not, its error is the outcome.
    - a reply over :data:`MAX_TEXT_CHARS`, or a command over :data:`MAX_COMMAND_CHARS`: ``too_long``.
    - NUL/control bytes (other than TAB, LF, CR, ESC) or U+FFFD anywhere: ``binary``.
    - ``timeout`` above :data:`MAX_COMMAND_TIMEOUT_S` is clamped; non-positive or non-numeric is
      ``bad_argument``. Unknown argument names are ``bad_argument``.
    - a command that holds a NUL or a lone surrogate once JSON escapes are decoded (``\\u0000``,
      ``\\ud800``): ``bad_argument`` (neither can be typed into a terminal).

    Args:
        text: the raw model text (anything else, e.g. ``None`` or bytes, is handled too).
        call_format: the syntax to show in parse-error observations; default: the syntax the reply
            used, else Hermes JSON.

    Returns:
        A :class:`ParseResult`.
    """
    try:
        return _parse_action(text, call_format)
    except Exception as exc:  # a parser bug must not kill an episode; it is still a defined outcome
        return ParseResult("malformed_call", error=f"the reply could not be read ({type(exc).__name__})",
                           call_format=call_format or "hermes")  # fmt: skip


def _parse_action(text: Any, call_format: CallFormat | None) -> ParseResult:
    fmt: CallFormat = call_format or "hermes"
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode("utf-8", errors="replace")
    if text is None:
        text = ""
    if not isinstance(text, str):
        return ParseResult("binary", error=f"the reply is not text ({type(text).__name__})", call_format=fmt)
    if not text.strip():
        return ParseResult("empty", error="the reply was empty", call_format=fmt)
    if len(text) > MAX_TEXT_CHARS:
        return ParseResult("too_long", error=f"the reply has {len(text)} characters; the limit is {MAX_TEXT_CHARS}",
                           call_format=fmt)  # fmt: skip
    bad = _BINARY_RE.search(text)
    if bad is not None:
        return ParseResult("binary", error=f"the reply holds a control or undecodable character "
                           f"{bad.group()!r} at position {bad.start()}", call_format=fmt)  # fmt: skip

    reasoning, rest, think_open = _split_think(text)
    if call_format is None and "<function=" in rest:
        fmt = "qwen"

    # Find the calls: each <tool_call> opens one; it ends at the first </tool_call> after it, or for
    # JSON bodies at the end of the JSON value (so "</tool_call>" inside a command does not cut it).
    spans: list[tuple[int, int, str, bool]] = []  # (start, end, body, terminated)
    pos = 0
    while True:
        start = rest.find(_TOOL_CALL_OPEN, pos)
        if start < 0:
            break
        body_start = start + len(_TOOL_CALL_OPEN)
        end_body = None
        lead = len(rest[body_start:]) - len(rest[body_start:].lstrip())
        if rest[body_start + lead : body_start + lead + 1] == "{":
            try:
                _, used = json.JSONDecoder().raw_decode(rest, body_start + lead)
                after = rest[used:]
                if after.lstrip().startswith(_TOOL_CALL_CLOSE):
                    end_body = used
            except ValueError:
                pass
        if end_body is None:
            close = rest.find(_TOOL_CALL_CLOSE, body_start)
            nxt = rest.find(_TOOL_CALL_OPEN, body_start)
            if close < 0 or (0 <= nxt < close):
                end = nxt if nxt >= 0 else len(rest)
                spans.append((start, end, rest[body_start:end], False))
                pos = end
                continue
            end_body = close
        close = rest.find(_TOOL_CALL_CLOSE, end_body)
        end = close + len(_TOOL_CALL_CLOSE)
        spans.append((start, end, rest[body_start:end_body], True))
        pos = end

    content_parts, last = [], 0
    for start, end, _, _ in spans:
        content_parts.append(rest[last:start])
        last = end
    content_parts.append(rest[last:])
    content = "".join(content_parts).strip()

    def result(outcome: str, **kw: Any) -> ParseResult:
        return ParseResult(outcome, reasoning=reasoning, content=content, n_calls=len(spans),
                           call_format=kw.pop("call_format", fmt), **kw)  # fmt: skip

    if not spans:
        if "</tool_call>" in rest or "<function=" in rest:
            return result("malformed_call", error="found a call without an opening <tool_call> tag")
        if think_open:
            return result("unterminated_think", error="the <think> block was never closed and no tool call followed")
        hint = " (a ``` code block is not run: put the command in a bash tool call)" if "```" in rest else ""
        return result("no_tool_call", error=f"the reply has no tool call{hint}; it began {_snippet(rest or text, 80)}")

    start, end, body, terminated = spans[0]
    if not terminated:
        return result("unterminated_tool_call", error="the <tool_call> tag is never closed with </tool_call>")
    action, outcome, err, used_fmt = _parse_call_body(body, "call_0")
    if call_format is None:
        fmt = used_fmt
    if action is None:
        return result(outcome, error=err, call_format=fmt)
    if len(spans) > 1:
        note = (f"[note: your reply held {len(spans)} tool calls; only the first was run. "
                "Send one tool call per turn.]")  # fmt: skip
        return result("multiple_calls", action=action, note=note, call_format=fmt)
    return result("ok", action=action, call_format=fmt)


def count_parse_outcomes(outcomes: list[str] | Counter) -> dict[str, int]:
    """Counts of parse outcomes as a plain dict with every known outcome name (zeros included)."""
    counts = Counter(outcomes)
    return {name: int(counts.get(name, 0)) for name in PARSE_OUTCOMES}


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
