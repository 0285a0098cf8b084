"""The agent protocol: system prompt, tool schemas (the action format) and the message layout.

This module is the single definition of what the model sees and what it may answer. Data generation,
SFT/GRPO training, evaluation (the Harbor adapter) and the Space all go through it, so a model is
trained for exactly the harness that judges it.

Actions are tool calls in the model's native chat-template format: for Qwen3.5 the template's
``<tool_call><function=bash><parameter=command>...`` blocks, for templates without tool support
(SmolLM2) ReTerm's ChatML template ``templates/chatml_tools.jinja`` with Hermes-style JSON
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``. The parser accepts both.
"""

from __future__ import annotations

import json
from typing import Any

from reterm.trajectory import Step

SYSTEM_PROMPT = """\
You are an expert Linux engineer working in a terminal. You are given a task and a bash shell \
inside the task's machine; the working directory is the task's folder.

Work in small steps: run one command with the `bash` tool, read its output and exit status, then \
decide the next command. If a command fails, read the error, find its cause and fix it before \
moving on; do not repeat a failing command unchanged. When the task is complete and you have \
checked the result, call the `submit` tool. Tests run after you submit; you cannot undo it."""

BASH_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": (
            "Type a command into the persistent bash terminal and press Enter. Returns the terminal "
            "output and the exit status. A program still running after `timeout` seconds is "
            "interrupted with Ctrl-C. Keystrokes typed while an interactive program (python, less, "
            "vim) is in the foreground go to that program."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "command": {"type": "string", "description": "The command line (or keystrokes) to type."},
                "timeout": {
                    "type": "number",
                    "description": "Seconds to wait for the command to finish (default 30, at most 600).",
                },
            },
            "required": ["command"],
        },
    },
}

SUBMIT_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "submit",
        "description": "Declare the task complete. The task's tests run next; no further commands.",
        "parameters": {"type": "object", "properties": {}, "required": []},
    },
}

TOOLS: list[dict[str, Any]] = [BASH_TOOL, SUBMIT_TOOL]

DEFAULT_COMMAND_TIMEOUT_S = 30.0
MAX_COMMAND_TIMEOUT_S = 600.0


def initial_messages(instruction: str) -> list[dict[str, Any]]:
    """The first two messages of every episode: ``[system(SYSTEM_PROMPT), user(instruction)]``."""
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": instruction}]


def step_messages(step: Step) -> list[dict[str, Any]]:
    """The chat messages one step contributes (the training format, OpenAI style).

    - a tool call: ``assistant`` (content = the model's text outside the call, ``tool_calls`` with a
      JSON-string ``arguments``) then, for ``bash``, a ``tool`` message with the observation;
      ``submit`` ends the episode, so it gets no tool message.
    - a parse error: ``assistant`` with the raw model text, then a ``user`` message holding the
      parse-error observation (there is no call to answer).
    """
    if step.action is None:
        return [
            {"role": "assistant", "content": step.model_text},
            {"role": "user", "content": step.observation},
        ]
    args: dict[str, Any] = {}
    if step.action.tool == "bash":
        args["command"] = step.action.command or ""
        if step.action.timeout is not None:
            args["timeout"] = step.action.timeout
    call = {
        "id": step.action.call_id,
        "type": "function",
        "function": {"name": step.action.tool, "arguments": json.dumps(args, ensure_ascii=False)},
    }
    messages: list[dict[str, Any]] = [{"role": "assistant", "content": step.reasoning or "", "tool_calls": [call]}]
    if step.action.tool == "bash":
        messages.append(
            {"role": "tool", "tool_call_id": step.action.call_id, "name": "bash", "content": step.observation}
        )
    return messages
