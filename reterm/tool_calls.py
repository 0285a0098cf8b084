"""The tool-call wire format: how a model writes a tool call and how its text is parsed back.

The bottom of every harness and every model: policies render calls with :func:`format_tool_call`
(scripted and endpoint policies) and parse replies with :func:`parse_action` (``reterm serve``), the
agent (:mod:`reterm.agent.protocol`, which re-exports everything here) turns each model text into exactly
one action or one named parse-error outcome (:data:`PARSE_OUTCOMES`; :func:`parse_action` never raises).

Two syntaxes, the ones the chat templates render: Qwen3.5's ``<tool_call><function=bash><parameter=command>...``
blocks and Hermes-style JSON ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (ReTerm's ChatML
template ``reterm/agent/templates/chatml_tools.jinja`` for models without tool support, e.g. SmolLM2).
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any, Literal

from reterm.trajectory import Action

# the longest timeout a bash call may ask for (longer ones are clamped), seconds
MAX_COMMAND_TIMEOUT_S = 600.0

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
