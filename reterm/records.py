"""The ReTerm-10K record: one verified recovery from one failure state.

A record is a whole conversation in the training format (OpenAI-style chat messages with tool calls,
see :mod:`reterm.agent.protocol`): the failure prefix the agent produced itself (or an injected
failure), then the recovery that the task's verifier accepted. ``recovery_start`` is the index in
``messages`` of the first assistant message of the recovery: SFT trains on ``messages[recovery_start:]``
(assistant turns only) with ``messages[:recovery_start]`` as the prompt; GRPO rebuilds the failure
state from the prefix.

Produced by ``pipeline/``, read by ``train/sft.py``, ``train/grpo.py`` (failure-state pool), the dataset
card and the Space. :data:`FEATURES` is the ``datasets`` schema of the published parquet shards.
"""

from __future__ import annotations

import json
from typing import Any

from datasets import Features, List, Value

TOOL_CALL = {
    "id": Value("string"),
    "type": Value("string"),
    "function": {"name": Value("string"), "arguments": Value("string")},  # arguments: a JSON string
}

MESSAGE = {
    "role": Value("string"),  # system | user | assistant | tool
    "content": Value("string"),
    "tool_calls": List(TOOL_CALL),  # [] except on assistant messages that call a tool
    "tool_call_id": Value("string"),  # "" except on tool messages
    "name": Value("string"),  # tool name on tool messages, else ""
}

FEATURES = Features(
    {
        "id": Value("string"),  # stable content hash: identical records share it (dedup, resume)
        "task_id": Value("string"),
        "task_license": Value("string"),
        "instruction": Value("string"),
        "messages": List(MESSAGE),
        "tools": Value("string"),  # JSON of the tool schemas the conversation used (protocol.TOOLS)
        "recovery_start": Value("int32"),  # index in messages of the first recovery assistant message
        "failure_step": Value("int32"),  # step index (0-based) of the failing step in the trajectory
        "failure_category": Value("string"),  # reterm.recovery taxonomy name
        "failure_source": Value("string"),  # "own" (the policy's own failure) | "injected"
        "injection": Value("string"),  # what was perturbed for injected failures, else ""
        "failure_command": Value("string"),
        "failure_output": Value("string"),  # the failing step's observation (truncated as the model saw it)
        "replay_commands": List(Value("string")),  # bash commands of the prefix, to rebuild the state by replay
        "verifier_reward": Value("float32"),
        "attempts": Value("int32"),  # recovery attempts forked from this failure state
        "successful_attempts": Value("int32"),
        "recovery_turns": Value("int32"),
        "source_policy": Value("string"),  # the policy whose rollout failed
        "teacher": Value("string"),  # the recovery policy that wrote the kept attempt
        "trajectory_id": Value("string"),
    }
)


def normalise_message(message: dict[str, Any]) -> dict[str, Any]:
    """A chat message in the uniform column layout of :data:`MESSAGE` (missing fields become ""/[]).

    Tool-call ``arguments`` given as a mapping are serialised to a JSON string.
    """
    calls = []
    for call in message.get("tool_calls") or []:
        fn = call.get("function", call)
        args = fn.get("arguments", "{}")
        calls.append(
            {
                "id": call.get("id", ""),
                "type": call.get("type", "function"),
                "function": {"name": fn["name"], "arguments": args if isinstance(args, str) else json.dumps(args)},
            }
        )
    return {
        "role": message["role"],
        "content": message.get("content") or "",
        "tool_calls": calls,
        "tool_call_id": message.get("tool_call_id") or "",
        "name": message.get("name") or "",
    }


def chat_messages(record_messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Inverse of :func:`normalise_message` for chat templates: drops empty fields and parses
    ``arguments`` back into mappings (Qwen3.5's template iterates them)."""
    out = []
    for m in record_messages:
        msg: dict[str, Any] = {"role": m["role"], "content": m.get("content") or ""}
        if m.get("tool_calls"):
            msg["tool_calls"] = [
                {
                    "id": c.get("id", ""),
                    "type": "function",
                    "function": {
                        "name": c["function"]["name"],
                        "arguments": json.loads(c["function"]["arguments"] or "{}"),
                    },
                }
                for c in m["tool_calls"]
            ]
        if m.get("tool_call_id"):
            msg["tool_call_id"] = m["tool_call_id"]
        if m.get("name"):
            msg["name"] = m["name"]
        out.append(msg)
    return out
