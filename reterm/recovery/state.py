"""The failure state: one id, one type, and its conversions (dataset record, GRPO pool row, eval item).

A *failure state* is a point an agent can be resumed from: the task, the history the recovery attempt
sees (the chat messages of the failed attempt up to where the recovery starts, the feedback message
included for attempt-level states), the error category, where it came from and, when the local sandbox
snapshotted it, a handle to that snapshot.

**The id** (:func:`state_id`) is derived from content only: the task id and the history's messages in
a canonical form (:func:`canonical_messages`: role, text and tool calls with their arguments as
mappings; no tool-call ids, no timings, no reasoning). So the same history gets the same id whether
it is read from a trajectory (the localiser, the attempt-level protocol, the eval), from a dataset
record's ``messages[:train_from_message_index]`` or from a GRPO pool row's ``prompt``, and results of
the dataset, the GRPO rollouts and the eval can be joined on it. Task-start states (standard GRPO) use
``start:<task_id>``.

**Level**, one field with one meaning: ``attempt`` (the release's protocol: the whole failed attempt,
then the feedback message; the recovery is a second attempt, ``target_attempt_index = 2``) or
``in_attempt`` (the recovery continues the same attempt after its failing step).

**Source**: ``own`` (the policy's own failed attempt), ``injected`` (a scripted first mistake) or
``online`` (found in the current policy's recovery attempts during GRPO).

Written for this kit.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from reterm.agent.atif import from_messages
from reterm.records import chat_messages
from reterm.trajectory import Step, Trajectory

Level = Literal["attempt", "in_attempt"]
Source = Literal["own", "injected", "online"]
LEVELS: tuple[str, ...] = ("attempt", "in_attempt")
SOURCES: tuple[str, ...] = ("own", "injected", "online")

#: FailureState.level (reterm.recovery.localise) -> Level
_LOCALISE_LEVEL = {"attempt_end": "attempt", "first_failing_step": "in_attempt"}


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, list):
        return "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
    return str(content)


def _arguments(args: Any, where: str) -> Any:
    if isinstance(args, str):
        try:
            return json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as exc:
            raise ValueError(f"{where}: tool-call arguments are not JSON ({exc}): {args[:80]!r}") from exc
    return args if args is not None else {}


def canonical_messages(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The part of chat messages that identifies a state: ``role``, ``content`` as text, and tool calls as
    ``{"name", "arguments"}`` with ``arguments`` a mapping (JSON strings parsed).

    Left out: tool-call ids and ``tool_call_id`` (renumbered by :meth:`Trajectory.unique_call_ids`),
    ``name``, ``reasoning_content`` and any other key. Accepts the training format
    (:meth:`Trajectory.to_messages`), the dataset's (:func:`reterm.records.normalise_message`) and the
    chat-template one (:func:`reterm.records.chat_messages`).

    Raises:
        ValueError: a message without ``role``, or a tool call whose ``arguments`` string is not JSON
            (the message index is named).
    """
    out = []
    for i, m in enumerate(messages):
        if "role" not in m:
            raise ValueError(f"message {i}: no 'role'")
        c: dict[str, Any] = {"role": m["role"], "content": _text(m.get("content"))}
        calls = m.get("tool_calls") or []
        if calls:
            c["tool_calls"] = []
            for call in calls:
                fn = call.get("function", call)
                c["tool_calls"].append({"name": fn.get("name", ""),
                                        "arguments": _arguments(fn.get("arguments"), f"message {i}")})
        out.append(c)
    return out


def state_id(task_id: str, messages: Sequence[dict[str, Any]]) -> str:
    """The id of the failure state of task ``task_id`` whose history renders as ``messages``: the first 16 hex
    digits of the SHA-256 of ``[task_id, canonical_messages(messages)]`` as sorted-key JSON.

    This is the one definition; the localiser, the attempt-level protocol, the drills dataset, the GRPO pool
    and the eval use it (through :func:`history_messages` when they hold steps).
    """
    blob = json.dumps([task_id, canonical_messages(messages)], ensure_ascii=False, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def history_messages(trajectory: Trajectory, history: Sequence[Step] | None = None) -> list[dict[str, Any]]:
    """The messages a recovery attempt sees before its first generated step: ``trajectory``'s system prompt
    and instruction, then ``history`` (default: the trajectory's ``steps[:prefix_len]``), feedback included."""
    steps = list(trajectory.steps[: trajectory.prefix_len]) if history is None else list(history)
    return trajectory.model_copy(update={"steps": steps}, deep=True).to_messages()


def state_id_of(trajectory: Trajectory, history: Sequence[Step] | None = None) -> str:
    """:func:`state_id` of ``history`` shown after ``trajectory``'s system prompt and instruction."""
    return state_id(trajectory.task_id, history_messages(trajectory, history))


@dataclass
class State:
    """One failure state (see the module docstring).

    Attributes:
        id: :func:`state_id` of ``task_id`` and ``messages``.
        task_id: the task's name.
        messages: the history as chat messages (training format), ending where the recovery starts.
        category: a :class:`reterm.recovery.taxonomy.Category` id.
        source: ``own`` | ``injected`` | ``online``.
        level: ``attempt`` | ``in_attempt``.
        replay_commands: the history's bash commands in order (rebuild by replay); ``replay_timeouts``
            their ``timeout`` arguments (``None``: the harness default).
        history: the history's steps (``from_history``), what :class:`reterm.agent.episode.EpisodeSpec` takes.
        snapshot: optional handle of a local-sandbox snapshot of the state (a
            :class:`reterm.sandbox.snapshot.Snapshot`); never serialised.
    """

    id: str
    task_id: str
    messages: list[dict[str, Any]]
    category: str
    source: str
    level: str
    history: list[Step] = field(default_factory=list)
    replay_commands: list[str] = field(default_factory=list)
    replay_timeouts: list[float | None] = field(default_factory=list)
    snapshot: Any = None

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise ValueError(f"failure state {self.id}: source {self.source!r} is not one of {SOURCES}")
        if self.level not in LEVELS:
            raise ValueError(f"failure state {self.id}: level {self.level!r} is not one of {LEVELS}")

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_failure_state(cls, fs: Any, trajectory: Trajectory, source: str, snapshot: Any = None) -> "State":
        """From a localised :class:`reterm.recovery.localise.FailureState` of ``trajectory``."""
        messages = history_messages(trajectory, fs.history)
        return cls(id=state_id(trajectory.task_id, messages), task_id=trajectory.task_id, messages=messages,
                   category=fs.category, source=source, level=_LOCALISE_LEVEL[fs.level],
                   history=[s.model_copy(deep=True) for s in fs.history],
                   replay_commands=list(fs.replay_commands), replay_timeouts=list(fs.replay_timeouts),
                   snapshot=snapshot)  # fmt: skip

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> "State":
        """From a dataset record (:data:`reterm.record_features.FEATURES`).

        ``level`` is ``attempt`` for ``target_attempt_index = 2`` (history: ``messages[:train_from_message_index]``,
        the failed attempt and the feedback) and ``in_attempt`` for 1 (history: the steps up to and including
        ``failure_step``); ``source`` is ``failure_source`` (``own`` when absent). Raises ``ValueError`` naming the record id for a field that is missing or wrong.
        """

        rid = record.get("id", "?")
        try:
            k = int(record["train_from_message_index"])
            level = "attempt" if int(record.get("target_attempt_index", 2)) >= 2 else "in_attempt"
            messages = chat_messages(record["messages"])
            if level == "attempt":  # the failed attempt and the feedback: everything before the trained part
                messages = messages[:k]
                steps = from_messages(messages, task_id=record["task_id"]).steps
            else:  # in-attempt: the attempt's steps up to and including the failing one
                whole = from_messages(messages, task_id=record["task_id"])
                steps = whole.steps[: int(record["failure_step"]) + 1]
                messages = whole.model_copy(update={"steps": steps}).to_messages()
            steps = [s.model_copy(update={"from_history": True}) for s in steps]
            replay = [s.command for s in steps if s.command]
            return cls(id=state_id(record["task_id"], messages), task_id=record["task_id"], messages=messages,
                       category=record.get("failure_category") or "other",
                       source=record.get("failure_source") or "own", level=level,
                       history=steps, replay_commands=replay, replay_timeouts=[None] * len(replay))  # fmt: skip
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"record {rid}: not a usable failure state ({exc})") from exc

    # ------------------------------------------------------------------ conversions
    def record_columns(self) -> dict[str, Any]:
        """The kit's metadata columns of a dataset record recovered from this state (docs/PROTOCOL.md):
        ``trajectory_id`` (= the state id), ``failure_category``, ``failure_source``, ``replay_commands``."""
        return {"trajectory_id": self.id, "failure_category": self.category, "failure_source": self.source,
                "replay_commands": list(self.replay_commands)}

    def pool_row(self) -> dict[str, Any]:
        """The routing columns of a GRPO pool row (:meth:`reterm.training.failure_pool.PoolState.row`) except
        ``prompt``: ``task_id``, ``state_id``, ``failure_category``, ``state_source``."""
        return {"task_id": self.task_id, "state_id": self.id, "failure_category": self.category,
                "state_source": self.source}

    def eval_item(self, attempt: Trajectory) -> dict[str, Any]:
        """The eval's per-item result of one recovery attempt from this state: ``state_id``, ``task_id``,
        ``category``, ``source``, ``level``, ``outcome``, ``passed`` (``None`` for an infrastructure fault)."""
        scored = not attempt.outcome.is_infra_fault and attempt.reward is not None
        return {"state_id": self.id, "task_id": self.task_id, "category": self.category, "source": self.source,
                "level": self.level, "outcome": attempt.outcome.value,
                "passed": bool(attempt.passed) if scored else None}
