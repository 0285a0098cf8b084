"""The ``datasets`` schema of a ReTerm-10K record (:data:`FEATURES`): the parquet shards' column types.

Apart from :mod:`reterm.records` (the columns' meanings and the light helpers that write them) because importing
``datasets`` is slow: only the modules that build or read a Hub dataset import this one.
"""

from __future__ import annotations

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
        "id": Value("string"),  # <task_id>:<first 16 hex of trajectory_sha256> (dedup, resume)
        "task_id": Value("string"),
        "messages": List(MESSAGE),
        "train_from_message_index": Value("int32"),  # index in messages of the first trained assistant message
        "target_attempt_index": Value("int32"),  # 2: attempt-level failure state; 1: step-level
        "trajectory_sha256": Value("string"),  # sha256 of the canonical JSON of messages
        "task_license": Value("string"),
        "instruction": Value("string"),
        "tools": Value("string"),  # JSON of the tool schemas the conversation used (protocol.TOOLS)
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
        "prompt_version": Value("string"),  # reterm.agent.protocol.PROMPT_VERSION of the conversation
        "family": Value("string"),  # the recovery drill's family ("" for other tasks)
    }
)
