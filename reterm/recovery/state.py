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

**Level** (:class:`Level`), one field with one meaning: ``attempt`` (the release's protocol: the whole failed
attempt, then the feedback message; the recovery is a second attempt, ``target_attempt_index = 2``) or
``in_attempt`` (the recovery continues the same attempt after its failing step, ``target_attempt_index = 1``).

**Source** (:class:`Source`): ``own`` (the policy's own failed attempt), ``injected`` (a scripted first mistake)
or ``online`` (found in the current policy's recovery attempts during GRPO).

**Localisation** (:class:`Localisation`): what the localiser (:func:`reterm.recovery.localise.localise`) knows
about a state beyond its history and failing step (labelling confidence, source, rule and signals; resolution,
repeats, which state is the trajectory's primary one; the trial's verdict; the rollout and snapshot ids). The
localiser and :func:`reterm.recovery.attempts.attempt_end_state` fill :attr:`State.localisation`; a state read
from a record or a pool prompt has none.

**Records**: :meth:`State.to_record` is the one writer of a dataset record (``State`` -> columns; the data
stage, the drills data, the evaluation's state set) and :meth:`State.from_record` the one reader (columns ->
``State``; the history is ``messages[:train_from_message_index]`` whatever the level, so a record read back
gives the state it was written from, with the same id). The column ``trajectory_id`` is the state's id.

Written for this kit.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from typing import Any

from reterm.agent.atif import from_messages
from reterm.agent.protocol import PROMPT_VERSION, TOOLS
from reterm.records import COLUMNS, RELEASE_COLUMNS, chat_messages, normalise_message, record_id, release_columns
from reterm.records import trajectory_sha256 as _sha256
from reterm.trajectory import Step, Trajectory


class Level(StrEnum):
    """Where the recovery starts: after a whole failed attempt, or inside it (a string: compares and prints as its value)."""

    ATTEMPT = "attempt"
    IN_ATTEMPT = "in_attempt"

    @property
    def target_attempt_index(self) -> int:
        """The record column: 2 for an attempt-level state (the recovery is a second attempt), else 1."""
        return 2 if self is Level.ATTEMPT else 1

    @classmethod
    def parse(cls, value: Any) -> "Level":
        """A :class:`Level` from its value, or from the older words for it (``attempt_end``,
        ``first_failing_step``: how journals and checkpoints written before the one spelling name it).

        Raises:
            ValueError: any other value (the known ones are named).
        """
        if isinstance(value, cls):
            return value
        value = _LOCALISE_LEVEL.get(value, value)
        try:
            return cls(value)
        except ValueError:
            raise ValueError(f"level {value!r} is not one of {LEVELS}") from None


class Source(StrEnum):
    """Where a failure state comes from (a string: compares and prints as its value)."""

    OWN = "own"
    INJECTED = "injected"
    ONLINE = "online"
    TASK_START = "task_start"  # no failure: the task's start (a reference solution record, a standard-GRPO group)


LEVELS: tuple[str, ...] = tuple(m.value for m in Level)
SOURCES: tuple[str, ...] = tuple(m.value for m in Source)

#: the older words for a level -> Level value
_LOCALISE_LEVEL = {"attempt_end": "attempt", "first_failing_step": "in_attempt"}

#: columns :meth:`State.to_record` derives from the state (a caller cannot set them)
STATE_COLUMNS = ("task_id", "messages", "train_from_message_index", "target_attempt_index", "failure_category",
                 "failure_source", "replay_commands", "trajectory_id")


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
class Localisation:
    """What the localiser found about a failure state, beyond :class:`State`'s fields (see the module docstring).

    Attributes:
        confidence: the label's confidence, 0 to 1.
        source: who labelled the failing step: ``rules`` | ``judge`` | ``localiser`` (a localiser rule: undone
            step, premature completion, or the attempt-level state's category from its first failing step) |
            ``task`` (no failing step found: the task's declared category). Not the state's :class:`Source`.
        rule: the rule that matched.
        signals: every reason the step counts (``exit_status=1``, ``pattern:<rule>``, ``timed_out``,
            ``undone_by:7``, ``repeated_at:5``, ``resolved_by:4``, ``verifier_failed``...).
        resolved_by: index of a later step where the same command succeeded, else ``None``.
        repeats: later steps with the same failure, merged into this state.
        consequential: not resolved later in the trajectory.
        primary: the failure state of its trajectory (first consequential, else first).
        trial_passed: the verifier's verdict on the trajectory (``None`` when unscored).
        origin_id: the trajectory's ``metadata["rollout_id"]`` or ``metadata["id"]`` ("" when neither).
        snapshot_id: id of a local-sandbox snapshot of the state (attempt-level states with a kept snapshot).
    """

    confidence: float = 0.0
    source: str = "rules"
    rule: str = ""
    signals: list[str] = field(default_factory=list)
    resolved_by: int | None = None
    repeats: list[int] = field(default_factory=list)
    consequential: bool = True
    primary: bool = False
    trial_passed: bool | None = None
    origin_id: str = ""
    snapshot_id: str | None = None


@dataclass
class State:
    """One failure state (see the module docstring).

    Attributes:
        id: :func:`state_id` of ``task_id`` and ``messages``.
        task_id: the task's name.
        messages: the history as chat messages (training format), ending where the recovery starts.
        category: a :class:`reterm.recovery.taxonomy.Category` id.
        source: a :class:`Source` (a string value is converted).
        level: a :class:`Level` (a string value is converted).
        replay_commands: the history's bash commands in order (rebuild by replay); ``replay_timeouts``
            their ``timeout`` arguments (``None``: the harness default).
        history: the history's steps (``from_history``), what :class:`reterm.agent.episode.EpisodeSpec` takes.
        snapshot: optional handle of a local-sandbox snapshot of the state (a
            :class:`reterm.sandbox.snapshot.Snapshot`); never serialised.
        step, command, output, exit_status, evidence: the failing step the state is labelled by (index in
            the failed attempt's steps, its command, observation, ``$?`` and the matched text; ``-1`` and
            empty when unknown, e.g. read from a record): what a teacher's diagnosis and the record's
            ``failure_*`` columns name. For an in-attempt state made by the localiser the failing step is
            ``history[-1]`` (except premature completion, whose submit step is left out of the history).
        localisation: what the localiser found (:class:`Localisation`); ``None`` for a state it did not make.
    """

    id: str
    task_id: str
    messages: list[dict[str, Any]]
    category: str
    source: Source
    level: Level
    history: list[Step] = field(default_factory=list)
    replay_commands: list[str] = field(default_factory=list)
    replay_timeouts: list[float | None] = field(default_factory=list)
    snapshot: Any = None
    step: int = -1
    command: str = ""
    output: str = ""
    exit_status: int | None = None
    evidence: str = ""
    localisation: Localisation | None = None

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise ValueError(f"failure state {self.id}: source {self.source!r} is not one of {SOURCES}")
        self.source = Source(self.source)
        if self.level not in LEVELS:
            raise ValueError(f"failure state {self.id}: level {self.level!r} is not one of {LEVELS}")
        self.level = Level(self.level)

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_history(cls, trajectory: Trajectory, history: Sequence[Step], *, category: str, source: str,
                     level: str, snapshot: Any = None) -> "State":  # fmt: skip
        """The state whose history is ``history`` shown after ``trajectory``'s system prompt and instruction
        (its replay commands and their timeouts: the history's bash calls)."""
        messages = history_messages(trajectory, history)
        steps = [s.model_copy(deep=True) for s in history]
        bash = [s for s in steps if s.action is not None and s.action.tool == "bash"]
        return cls(id=state_id(trajectory.task_id, messages), task_id=trajectory.task_id, messages=messages,
                   category=category, source=source, level=Level.parse(level), history=steps,
                   replay_commands=[s.action.command or "" for s in bash], replay_timeouts=[s.action.timeout for s in bash],
                   snapshot=snapshot)  # fmt: skip

    def with_source(self, source: str, snapshot: Any = None) -> "State":
        """A copy of this state with another :class:`Source` (and ``snapshot``, when given): the localiser
        labels its states ``own``; a scripted mistake's state is ``injected``.

        Raises:
            ValueError: ``source`` is not a :class:`Source` value.
        """
        return replace(self, source=source, snapshot=self.snapshot if snapshot is None else snapshot,
                       messages=list(self.messages), history=[s.model_copy(deep=True) for s in self.history],
                       localisation=Localisation(**asdict(self.localisation)) if self.localisation else None)  # fmt: skip

    # ------------------------------------------------------------------ JSON (journals, checkpoints)
    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict of everything but the snapshot handle; :meth:`from_json` reverses it."""
        return {"id": self.id, "task_id": self.task_id, "messages": self.messages, "category": self.category,
                "source": self.source.value, "level": self.level.value,
                "history": [s.model_dump(mode="json") for s in self.history],
                "replay_commands": list(self.replay_commands), "replay_timeouts": list(self.replay_timeouts),
                "step": self.step, "command": self.command, "output": self.output,
                "exit_status": self.exit_status, "evidence": self.evidence,
                "localisation": asdict(self.localisation) if self.localisation is not None else None}  # fmt: skip

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "State":
        """The state :meth:`to_json` wrote (``localisation`` may be absent: JSON written before it existed).

        Raises:
            ValueError: a missing or wrong field (named, with the state's id); the older layout of the
                localiser's own state type (no ``messages``, a ``history_len``: journals written before the
                localiser made :class:`State` objects; read those with :func:`from_localiser_json`).
        """
        if "messages" not in data and "history_len" in data:
            raise ValueError(f"failure state {data.get('id', '?')}: written in the localiser's older layout (no "
                             "'messages'); it needs the trajectory's system prompt and instruction "
                             "(reterm.recovery.state.from_localiser_json)")
        try:
            loc = data.get("localisation")
            return cls(**{**data, "history": [Step.model_validate(s) for s in data.get("history", [])],
                          "localisation": Localisation(**loc) if loc is not None else None})  # fmt: skip
        except (TypeError, ValueError) as exc:
            raise ValueError(f"failure state {data.get('id', '?')}: not a state's JSON ({exc})") from exc

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> "State":
        """The one reader of a dataset record (:data:`reterm.records.COLUMNS`): the failure state a recovery
        record starts from, or a state-only record (the evaluation's state set) describes.

        The history is ``messages[:train_from_message_index]`` whatever the level (the failed attempt and the
        feedback for ``target_attempt_index = 2``; the attempt's steps up to where the recovery starts for 1);
        ``level`` comes from ``target_attempt_index`` (2 when absent), ``source`` from ``failure_source``
        (``own`` when absent), ``category`` from ``failure_category``, ``replay_commands`` from the history's
        bash commands. So ``State.from_record(state.to_record(...))`` has ``state``'s id.

        Raises:
            ValueError: naming the record id for a field that is missing or wrong.
        """
        rid = record.get("id", "?")
        try:
            k = int(record["train_from_message_index"])
            level = Level.ATTEMPT if int(record.get("target_attempt_index", 2)) >= 2 else Level.IN_ATTEMPT
            messages = chat_messages(record["messages"])
            if not 0 < k <= len(messages):
                raise ValueError(f"train_from_message_index={k} outside the {len(messages)} messages")
            messages = messages[:k]
            steps = [s.model_copy(update={"from_history": True})
                     for s in from_messages(messages, task_id=record["task_id"]).steps]  # fmt: skip
            replay = [s.command for s in steps if s.command]
            return cls(id=state_id(record["task_id"], messages), task_id=record["task_id"], messages=messages,
                       category=record.get("failure_category") or "other",
                       source=record.get("failure_source") or "own", level=level,
                       history=steps, replay_commands=replay, replay_timeouts=[None] * len(replay))  # fmt: skip
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"record {rid}: not a usable failure state ({exc})") from exc

    # ------------------------------------------------------------------ the record writer
    def to_record(self, conversation: Trajectory | None = None, **columns: Any) -> dict[str, Any]:
        """The one writer of a dataset record: the row (:data:`reterm.records.COLUMNS`, the release's six first)
        of a recovery from this state, or of the state alone.

        Args:
            conversation: the recovery attempt, its history being this state's (its messages begin with
                :attr:`messages`); ``None`` for a state-only record (the evaluation's state set:
                ``train_from_message_index`` = the number of messages, nothing to train on).
            **columns: the kit's other columns (``task_license``, ``failure_step``, ``injection``,
                ``failure_command``, ``failure_output``, ``verifier_reward``, ``attempts``,
                ``successful_attempts``, ``recovery_turns``, ``source_policy``, ``teacher``, ``family``,
                ``instruction``, ``tools``, ``prompt_version``). Defaults: from ``conversation`` (reward,
                recovery turns, policy as teacher, instruction), the kit's tools and prompt version, else empty.

        The state gives ``task_id``, ``train_from_message_index`` (the length of its history),
        ``target_attempt_index`` (:attr:`Level.target_attempt_index`), ``failure_category``, ``failure_source``,
        ``replay_commands`` and ``trajectory_id`` (its id: every record of one state shares it).

        Raises:
            ValueError: the conversation does not begin with the state's history, a column the state gives
                or an unknown one is passed, or the release columns are invalid (named).
        """
        fixed = sorted(set(columns) & set(STATE_COLUMNS + RELEASE_COLUMNS))
        unknown = sorted(set(columns) - set(COLUMNS))
        if fixed or unknown:
            raise ValueError(f"failure state {self.id}: columns {fixed + unknown} cannot be set by the caller "
                             f"({'given by the state' if fixed else 'not dataset columns'})")
        k = len(self.messages)
        target = self.level.target_attempt_index
        if conversation is not None:
            messages = conversation.to_messages()
            if canonical_messages(messages[:k]) != canonical_messages(self.messages):
                raise ValueError(f"failure state {self.id}: the conversation of task {conversation.task_id} "
                                 "does not begin with the state's history")
            row = release_columns(self.task_id, messages, k, target)
        else:
            msgs = [normalise_message(m) for m in self.messages]
            sha = _sha256(msgs)
            row = {"id": record_id(self.task_id, sha), "task_id": self.task_id, "messages": msgs,
                   "train_from_message_index": k, "target_attempt_index": target, "trajectory_sha256": sha}
        user = next((m.get("content") or "" for m in self.messages if m.get("role") == "user"), "")
        defaults: dict[str, Any] = {
            "task_license": "", "instruction": conversation.instruction if conversation is not None else user,
            "tools": json.dumps(TOOLS, ensure_ascii=False), "failure_step": -1, "injection": "",
            "failure_command": "", "failure_output": "",
            "verifier_reward": float(conversation.reward or 0.0) if conversation is not None else 0.0,
            "attempts": 0, "successful_attempts": 0,
            "recovery_turns": len(conversation.steps) - conversation.prefix_len if conversation is not None else 0,
            "source_policy": "", "teacher": conversation.policy if conversation is not None else "",
            "prompt_version": PROMPT_VERSION, "family": "",
        }  # fmt: skip
        given = {"failure_category": self.category, "failure_source": self.source.value,
                 "replay_commands": list(self.replay_commands), "trajectory_id": self.id}
        merged = {**defaults, **columns, **given}
        return {c: row[c] if c in row else merged[c] for c in COLUMNS}

    # ------------------------------------------------------------------ conversions
    def record_columns(self) -> dict[str, Any]:
        """The kit's metadata columns of a dataset record recovered from this state (docs/PROTOCOL.md):
        ``trajectory_id`` (= the state id), ``failure_category``, ``failure_source``, ``replay_commands``."""
        return {"trajectory_id": self.id, "failure_category": self.category, "failure_source": self.source.value,
                "replay_commands": list(self.replay_commands)}

    def pool_row(self) -> dict[str, Any]:
        """The routing columns of a GRPO pool row (:meth:`reterm.training.failure_pool.PoolState.row`) except
        ``prompt``: ``task_id``, ``state_id``, ``failure_category``, ``state_source``."""
        return {"task_id": self.task_id, "state_id": self.id, "failure_category": self.category,
                "state_source": self.source.value}

    def eval_item(self, attempt: Trajectory) -> dict[str, Any]:
        """The eval's per-item result of one recovery attempt from this state: ``state_id``, ``task_id``,
        ``category``, ``source``, ``level``, ``outcome``, ``passed`` (``None`` for an infrastructure fault)."""
        scored = not attempt.outcome.is_infra_fault and attempt.reward is not None
        return {"state_id": self.id, "task_id": self.task_id, "category": self.category, "source": self.source.value,
                "level": self.level.value, "outcome": attempt.outcome.value,
                "passed": bool(attempt.passed) if scored else None}


#: the localiser's fields of the older layout (before it made State objects) kept in :class:`Localisation`
_LOCALISATION_FIELDS = ("confidence", "source", "rule", "signals", "resolved_by", "repeats", "consequential",
                        "primary", "trial_passed", "origin_id", "snapshot_id")


def from_localiser_json(data: dict[str, Any], trajectory: Trajectory, source: str) -> State:
    """A state from the JSON of the localiser's older state type (journals written before the localiser made
    :class:`State` objects: ``id, task_id, origin_id, step, category, confidence, source`` (the labelling
    source), ``rule, evidence, signals, command, output, exit_status, history, history_len, replay_commands,
    replay_timeouts, snapshot_id, resolved_by, repeats, consequential, primary, trial_passed, level``).

    Args:
        data: that JSON.
        trajectory: gives the system prompt and instruction the history is shown after (only those are read).
        source: the state's :class:`Source` (the older layout did not hold it).

    Returns:
        The :class:`State`; its id is recomputed from ``trajectory`` and the history (the same id when the
        trajectory is the one that was localised).

    Raises:
        ValueError: a missing or wrong field (named, with the state's id).
    """
    try:
        history = [Step.model_validate(s) for s in data.get("history", [])]
        messages = history_messages(trajectory, history)
        loc = Localisation(**{k: data[k] for k in _LOCALISATION_FIELDS if k in data})
        return State(id=state_id(data["task_id"], messages), task_id=data["task_id"], messages=messages,
                     category=data["category"], source=source, level=Level.parse(data.get("level", "in_attempt")),
                     history=history, replay_commands=list(data.get("replay_commands", [])),
                     replay_timeouts=list(data.get("replay_timeouts", [])), step=int(data.get("step", -1)),
                     command=data.get("command") or "", output=data.get("output") or "",
                     exit_status=data.get("exit_status"), evidence=data.get("evidence") or "",
                     localisation=loc)  # fmt: skip
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"failure state {data.get('id', '?')}: not the localiser's older JSON ({exc})") from exc
