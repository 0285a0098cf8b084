"""The ReTerm-10K record: one verified recovery from one failure state.

The first six columns are the authors' release (``twothsnd/ReTerm-10K``), with the release's meanings:

- ``id``: ``<task_id>:<first 16 hex digits of trajectory_sha256>`` (:func:`record_id`);
- ``task_id``: the task the record comes from;
- ``messages``: the whole conversation in the training format (OpenAI-style chat messages with tool calls,
  :mod:`reterm.agent.protocol`): the failed attempt kept as context, then the recovery the task's verifier
  accepted;
- ``train_from_message_index``: index in ``messages`` of the first assistant message trained on (the first
  message of the recovery, after the mistake and its observation: :func:`trains_on_mistake` is false for every
  record the kit writes). SFT trains on the assistant turns of ``messages[train_from_message_index:]`` with
  ``messages[:train_from_message_index]`` as the prompt;
- ``target_attempt_index``: the attempt trained on, counted from 1. ``2`` for attempt-level failure states
  (the release's protocol: a whole failed first attempt, the feedback message, then the second attempt made in
  the state the first left behind); ``1`` for step-level failure states (the recovery continues the same
  attempt right after its first consequential failing step);
- ``trajectory_sha256``: :func:`trajectory_sha256`, the SHA-256 of the canonical JSON of ``messages``.

The kit's own metadata columns follow (failure category and source, replay commands, verifier reward...).
Produced by ``pipeline/``, read by ``train/sft.py``, ``train/grpo.py`` (failure-state pool), the dataset
card and the Space. :data:`RELEASE_COLUMNS` is what a dataset must have at least for SFT. This module is light (the
standard library only); the ``datasets`` schema of the published parquet shards, ``FEATURES``, is in
:mod:`reterm.record_features`, imported only where a Hub dataset is built or read.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

RELEASE_COLUMNS = ("id", "task_id", "messages", "train_from_message_index", "target_attempt_index",
                   "trajectory_sha256")

KIT_COLUMNS = ("task_license", "instruction", "tools", "failure_step", "failure_category", "failure_source",
               "injection", "failure_command", "failure_output", "replay_commands", "verifier_reward", "attempts",
               "successful_attempts", "recovery_turns", "source_policy", "teacher", "trajectory_id",
               "prompt_version", "family")
"""The kit's metadata columns, in order after the release's (types: :data:`reterm.record_features.FEATURES`).
``trajectory_id`` is the id of the failure state the record starts from
(:func:`reterm.recovery.state.state_id`): every record of one state shares it."""

COLUMNS = RELEASE_COLUMNS + KIT_COLUMNS
"""Every column of a record, in order (:meth:`reterm.recovery.state.State.to_record` writes them)."""


def __getattr__(name: str) -> object:
    # the ``datasets`` schema lives in reterm.record_features (importing it loads ``datasets``); these names
    # stay importable from here for code written before the split
    if name in ("FEATURES", "MESSAGE", "TOOL_CALL"):
        from reterm import record_features  # defers datasets

        return getattr(record_features, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")



def trajectory_sha256(messages: list[dict[str, Any]]) -> str:
    """SHA-256 (64 hex digits) of ``messages`` as canonical JSON.

    Each message is first put in the uniform layout (:func:`normalise_message`: tool-call ``arguments`` as
    JSON strings, missing fields as ``""``/``[]``), then the list is serialised with sorted keys, no
    whitespace and UTF-8 (``json.dumps(..., sort_keys=True, separators=(",", ":"), ensure_ascii=False)``).
    Identical conversations hash identically whatever their source.
    """
    canon = [normalise_message(m) for m in messages]
    text = json.dumps(canon, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def record_id(task_id: str, sha256: str) -> str:
    """The release's record id: ``<task_id>:<first 16 hex digits of the trajectory's sha256>``."""
    return f"{task_id}:{sha256[:16]}"


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
                "function": {"name": fn["name"],
                         "arguments": args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)},
            }
        )
    return {
        "role": message["role"],
        "content": message.get("content") or "",
        "tool_calls": calls,
        "tool_call_id": message.get("tool_call_id") or "",
        "name": message.get("name") or "",
    }


def _arguments(value: Any) -> dict[str, Any]:
    """Tool-call arguments as a mapping: a JSON string (the kit's and the release's parquet) or a mapping
    (JSON lines written by other tools); empty or missing is ``{}``."""
    if value is None or value == "":
        return {}
    return dict(value) if isinstance(value, dict) else json.loads(value)


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
                        "arguments": _arguments(c["function"].get("arguments")),
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


def release_columns(task_id: str, messages: list[dict[str, Any]], train_from_message_index: int,
                    target_attempt_index: int) -> dict[str, Any]:
    """The six release columns of one record, in order (the one conversion every producer uses).

    Args:
        task_id: the task's id.
        messages: chat messages (any layout :func:`normalise_message` accepts).
        train_from_message_index: index of the first assistant message trained on.
        target_attempt_index: 2 for an attempt-level failure state, 1 for a step-level one.

    Raises:
        ValueError: naming the task when ``train_from_message_index`` does not point at an assistant
            message of ``messages``.
    """
    msgs = [normalise_message(m) for m in messages]
    k = int(train_from_message_index)
    if not 0 < k < len(msgs) or msgs[k]["role"] != "assistant":
        raise ValueError(f"record of task {task_id}: train_from_message_index={k} does not point at an "
                         f"assistant message (of {len(msgs)} messages)")
    if target_attempt_index not in (1, 2):
        raise ValueError(f"record of task {task_id}: target_attempt_index={target_attempt_index!r} (1 or 2)")
    sha = trajectory_sha256(msgs)
    return {"id": record_id(task_id, sha), "task_id": task_id, "messages": msgs,
            "train_from_message_index": k, "target_attempt_index": int(target_attempt_index),
            "trajectory_sha256": sha}


NO_FAILURE_STEP = -1
"""``failure_step`` of a record without a mistake: a verified reference solution from the task's start (the drills
data's whole multi-stage solutions, :mod:`reterm.data.drills`), ``failure_category`` ``"none"``."""


def mistake_message_indices(record: dict[str, Any]) -> list[int]:
    """Indices in ``record["messages"]`` of the assistant turns the record itself marks as the mistake.

    Step ``i`` of a trajectory is its ``i``-th assistant message (:meth:`reterm.trajectory.Trajectory.to_messages`
    writes one assistant message a step, a parse error included). ``failure_step`` is the failing step:

    - ``target_attempt_index`` 1 (step-level): the assistant turn of step ``failure_step``;
    - ``target_attempt_index`` 2 (attempt-level): every assistant turn of the failed first attempt, steps
      ``0..failure_step`` (the attempt as a whole failed the verifier);
    - ``failure_step`` :data:`NO_FAILURE_STEP` (a reference solution from the task's start): none.

    Raises:
        ValueError: naming the record id when ``failure_step`` is missing or beyond the assistant turns.
    """
    rid = record.get("id") or "?"
    step = record.get("failure_step")
    if step == NO_FAILURE_STEP:
        return []
    if not isinstance(step, int) or step < 0:
        raise ValueError(f"record {rid}: failure_step={step!r} (a step index >= 0, or {NO_FAILURE_STEP}: no mistake)")
    turns = [i for i, m in enumerate(record["messages"]) if m["role"] == "assistant"]
    if step >= len(turns):
        raise ValueError(f"record {rid}: failure_step={step} but the conversation has {len(turns)} assistant turns")
    return turns[: step + 1] if record.get("target_attempt_index") == 2 else [turns[step]]


def trains_on_mistake(record: dict[str, Any]) -> bool:
    """Whether SFT on ``messages[train_from_message_index:]`` (:mod:`reterm.training.sft_data`) would train on a
    turn the record marks as its mistake (:func:`mistake_message_indices`)."""
    return max(mistake_message_indices(record), default=-1) >= int(record["train_from_message_index"])
