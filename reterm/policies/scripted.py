"""Scripted policies: fixed command lists, functions of the conversation, and the solution oracle.

They write the same tool-call text a model would (Hermes JSON by default, Qwen3.5's form on request,
both via :func:`reterm.agent.protocol.format_tool_call`), so their replies go through the harness's
parser like any model's. Used by tests, by the task checks, and as the oracle teacher.

Statelessness (the episode loop batches different episodes, e.g. a GRPO group or a recovery fan-out,
into one ``generate`` call): every reply is a function of its own conversation only. The rules:

- :class:`ScriptedPolicy` with a command list: the next command is ``commands[k]`` where ``k`` is the
  number of assistant messages already in the conversation (a given history counts); when the list is
  used up it submits (or, with ``submit=False``, keeps answering with a plain-text reply, which the
  parser reports as ``no_tool_call``).
- :class:`OraclePolicy`: the task is identified by the conversation's first user message (the task
  instruction); the position in the solution is the length of the longest run of assistant bash
  commands at the end of the conversation that equals the solution's first steps. Without a history
  that is the number of turns so far; after a failure prefix that does not end in solution steps it
  is 0, so a recovery attempt replays the solution from its first step.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Literal

from reterm.policies.base import Generation
from reterm.tool_calls import format_tool_call

CallFormat = Literal["hermes", "qwen"]


def bash_call(command: str, timeout: float | None = None, call_format: CallFormat = "hermes") -> str:
    """The tool-call text of a ``bash`` action (``timeout`` in seconds, optional)."""

    args: dict[str, Any] = {"command": command}
    if timeout is not None:
        args["timeout"] = timeout
    return format_tool_call("bash", args, call_format)


def submit_call(call_format: CallFormat = "hermes") -> str:
    """The tool-call text of the ``submit`` action."""

    return format_tool_call("submit", {}, call_format)


def assistant_turns(messages: list[dict[str, Any]]) -> int:
    """Number of assistant messages in a conversation."""
    return sum(1 for m in messages if m.get("role") == "assistant")


def assistant_commands(messages: list[dict[str, Any]]) -> list[str | None]:
    """The bash command of every assistant message, in order (``None`` for a message without a
    ``bash`` tool call: a parse error or a submit)."""
    out: list[str | None] = []
    for m in messages:
        if m.get("role") != "assistant":
            continue
        command = None
        for call in m.get("tool_calls") or []:
            fn = call.get("function", call)
            if fn.get("name") == "bash":
                args = fn.get("arguments")
                try:
                    args = json.loads(args) if isinstance(args, str) else args
                except ValueError:
                    args = None
                if isinstance(args, dict) and isinstance(args.get("command"), str):
                    command = args["command"]
            break
        out.append(command)
    return out


def _first_user_text(messages: list[dict[str, Any]]) -> str:
    for m in messages:
        if m.get("role") == "user":
            content = m.get("content") or ""
            return content if isinstance(content, str) else "".join(p.get("text", "") for p in content)
    return ""


class ScriptedPolicy:
    """Replies from a command list or a function of the conversation.

    Args:
        script: a list of bash commands (turn ``k`` runs ``script[k]``, see the module docstring), or
            a function ``messages -> text`` returning the whole raw reply (e.g. built with
            :func:`bash_call`/:func:`submit_call`, or deliberately malformed text for tests).
        submit: with a command list, submit after the last command (default) instead of replying
            with plain text.
        timeout: the ``timeout`` argument written into every bash call (seconds; ``None``: omitted).
        call_format: ``"hermes"`` (JSON, default) or ``"qwen"`` (Qwen3.5's form).
        name: the policy's name in trajectories.
    """

    def __init__(
        self,
        script: Iterable[str] | Callable[[list[dict[str, Any]]], str],
        *,
        submit: bool = True,
        timeout: float | None = None,
        call_format: CallFormat = "hermes",
        name: str = "scripted",
    ) -> None:
        if callable(script):
            self._fn, self.commands = script, None
        else:
            self.commands = list(script)
            if not all(isinstance(c, str) for c in self.commands):
                raise TypeError("ScriptedPolicy: the script must be a list of command strings or a callable")
            self._fn = None
        self.submit, self.timeout, self.call_format, self.name = submit, timeout, call_format, name

    def reply(self, messages: list[dict[str, Any]]) -> str:
        """The raw reply text for one conversation."""
        if self._fn is not None:
            return str(self._fn(messages))
        assert self.commands is not None
        k = assistant_turns(messages)
        if k < len(self.commands):
            return bash_call(self.commands[k], self.timeout, self.call_format)
        return submit_call(self.call_format) if self.submit else "I have nothing more to run."

    def generate(self, batch: list[list[dict[str, Any]]], tools: list[dict[str, Any]]) -> list[Generation]:
        """One :class:`Generation` per conversation (``finish_reason="stop"``, no token counts)."""
        return [Generation(text=self.reply(messages), finish_reason="stop") for messages in batch]


def _task_instruction_and_steps(task: Any) -> tuple[str, list[str]]:
    """(instruction, solution steps) of a task folder (path), a ``reterm.tasks.LoadedTask`` or a Harbor
    ``Task``: the instruction as Harbor reads it (canary lines stripped), the steps from
    ``reterm.tasks.solution_steps`` (the task suite's splitter of ``solution/solve.sh``)."""
    from reterm.tasks import load_task, solution_steps

    if isinstance(task, (str, os.PathLike)):
        task = load_task(Path(task))
    instruction = getattr(task, "instruction", None)
    if not isinstance(instruction, str):
        raise TypeError(f"OraclePolicy: cannot read the instruction of {task!r} (give a task folder)")
    return instruction, list(solution_steps(task))


def _is_pair(obj: Any) -> bool:
    """An ``(instruction, [steps...])`` pair (not a tuple of task folders)."""
    return isinstance(obj, tuple) and len(obj) == 2 and isinstance(obj[0], str) and isinstance(obj[1], (list, tuple))


class OraclePolicy:
    """Replays each task's ``solution/solve.sh`` one top-level command per turn, then submits.

    Args:
        tasks: one task or several: task folders (paths), ``reterm.tasks.LoadedTask`` or Harbor
            ``Task`` objects, or ``(instruction, steps)`` pairs.
        timeout: the ``timeout`` written into every bash call (seconds); default: the harness default.
        call_format: ``"hermes"`` or ``"qwen"``.
        name: the policy's name in trajectories.

    Raises:
        ValueError: (at :meth:`generate`) a conversation's instruction matches none of the tasks
            (with exactly one task the instruction is not checked). A conversation matches a task
            when its first user message equals the task's instruction, else when it contains it
            (Harbor may append extra instructions; the longest contained instruction wins).
    """

    def __init__(
        self,
        tasks: Any,
        *,
        timeout: float | None = None,
        call_format: CallFormat = "hermes",
        name: str = "oracle",
    ) -> None:
        if isinstance(tasks, (str, os.PathLike)) or _is_pair(tasks) or not isinstance(tasks, (list, tuple)):
            tasks = [tasks]
        self.solutions: dict[str, list[str]] = {}
        for task in tasks:
            if _is_pair(task):
                instruction, steps = task[0], list(task[1])
            else:
                instruction, steps = _task_instruction_and_steps(task)
            self.solutions[instruction.strip()] = steps
        if not self.solutions:
            raise ValueError("OraclePolicy: no tasks given")
        self.timeout, self.call_format, self.name = timeout, call_format, name

    def steps_for(self, messages: list[dict[str, Any]]) -> list[str]:
        """The solution steps of the conversation's task (see the class docstring)."""
        if len(self.solutions) == 1:
            return next(iter(self.solutions.values()))
        instruction = _first_user_text(messages).strip()
        if instruction in self.solutions:
            return self.solutions[instruction]
        # Harbor may append extra instructions: the longest task instruction contained in the message
        contained = [k for k in self.solutions if k and k in instruction]
        if not contained:
            raise ValueError(f"OraclePolicy: no task has the instruction {instruction[:80]!r}")
        return self.solutions[max(contained, key=len)]

    @staticmethod
    def position(commands: list[str | None], steps: list[str]) -> int:
        """Largest ``j`` with ``commands[-j:] == steps[:j]`` (0 when none): the next step's index."""
        for j in range(min(len(commands), len(steps)), 0, -1):
            if commands[len(commands) - j :] == steps[:j]:
                return j
        return 0

    def reply(self, messages: list[dict[str, Any]]) -> str:
        """The raw reply text for one conversation."""
        steps = self.steps_for(messages)
        j = self.position(assistant_commands(messages), steps)
        if j < len(steps):
            return bash_call(steps[j], self.timeout, self.call_format)
        return submit_call(self.call_format)

    def generate(self, batch: list[list[dict[str, Any]]], tools: list[dict[str, Any]]) -> list[Generation]:
        """One :class:`Generation` per conversation (``finish_reason="stop"``, no token counts)."""
        return [Generation(text=self.reply(messages), finish_reason="stop") for messages in batch]


END_OF_TURN = "<|im_end|>"
"""The end-of-turn text of the ChatML templates (SmolLM2 with the kit's template, Qwen3.5)."""


def turn_tokens(text: str, tokenizer: Any, eos: str = END_OF_TURN) -> int:
    """Tokens a model spends writing ``text`` and ending its turn (``eos`` included)."""
    return len(tokenizer(text + eos, add_special_tokens=False)["input_ids"])


class TokenCapped:
    """A policy whose every reply is cut to ``max_new_tokens`` tokens, the way a model's generation is cut.

    A model's turn counts its end-of-turn token (``eos``) against the cap: a reply of ``n`` text tokens needs
    ``n + 1``. A reply that does not fit is truncated to its first ``max_new_tokens`` tokens (decoded), so
    a cut tool call arrives broken, exactly as a capped model's would (``finish_reason="length"``). Used to
    check that the reference solution passes under the evaluation's and training's caps (issue 24: caps
    that make items unwinnable are a confound).

    Args:
        policy: the wrapped policy (usually :class:`OraclePolicy` or a teacher).
        tokenizer: a Hugging Face tokenizer (the evaluated model's).
        max_new_tokens: tokens per turn, end-of-turn token included.
        eos: the end-of-turn text appended before counting (SmolLM2's ChatML: ``<|im_end|>``).
    """

    def __init__(self, policy: Any, tokenizer: Any, max_new_tokens: int, *, eos: str = END_OF_TURN) -> None:
        if max_new_tokens < 1:
            raise ValueError(f"TokenCapped: max_new_tokens must be >= 1, got {max_new_tokens}")
        self.policy, self.tokenizer, self.max_new_tokens, self.eos = policy, tokenizer, max_new_tokens, eos
        self.name = f"{policy.name}@{max_new_tokens}tok"
        self.cut = 0  # replies truncated so far

    def tokens(self, text: str) -> int:
        """Tokens a model spends writing ``text`` and ending its turn."""
        return turn_tokens(text, self.tokenizer, self.eos)

    def generate(self, batch: list[list[dict[str, Any]]], tools: list[dict[str, Any]]) -> list[Generation]:
        out = []
        for g in self.policy.generate(batch, tools):
            if self.tokens(g.text) <= self.max_new_tokens:
                out.append(g)
                continue
            self.cut += 1
            ids = self.tokenizer(g.text, add_special_tokens=False)["input_ids"][: self.max_new_tokens]
            out.append(Generation(text=self.tokenizer.decode(ids), finish_reason="length"))
        return out
