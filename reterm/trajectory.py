"""The trajectory schema shared by every stage of the kit.

One episode of the agent on one task is a :class:`Trajectory`: a list of :class:`Step` (one model
turn each: raw text, parsed action, observation, exit status, timings, token counts), the verifier's
reward, and an :class:`Outcome` that separates agent outcomes from infrastructure faults.

The data pipeline, the GRPO rollouts, the evaluation and the Space all read and write this schema,
and the training format (chat messages with tool calls) is derived from it by :meth:`Trajectory.to_messages`
with the prompt of :mod:`reterm.agent.protocol`, so data, training and evaluation see the same
conversation. Conversions to and from Harbor's ATIF trajectory JSON and from Harbor job folders live in
:mod:`reterm.agent.atif`.

Source of the outcome rule: the brief ("infrastructure faults are never counted as agent failures or
successes") and Harbor's verifier (a missing reward file is an error, not a zero).
"""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from reterm.io import write_json_atomic

SCHEMA_VERSION = "reterm-trajectory/1"

# A reward at or above this counts as a pass (Terminal-Bench rewards are 0/1).
PASS_THRESHOLD = 1.0


class Outcome(str, Enum):
    """How an episode ended, as far as scoring is concerned.

    Agent outcomes (``SUCCESS``, ``FAILURE``) are scored. Everything else is an infrastructure fault:
    it carries no reward signal, is reported apart, and never becomes a failure state.
    ``FAILURE`` covers every way the *agent* fails: wrong result, out of turns, out of its own time
    budget (the agent timeout is the agent's fault, as in Terminal-Bench), and a sandbox that stopped
    working after one of its commands (its memory, processes or disk exhausted, its shell or terminal
    killed for good, ``/logs`` destroyed: reward 0, ``metadata["broken_by_agent"]`` says how).
    The rule is written out in docs/SCORING.md.
    """

    SUCCESS = "success"
    FAILURE = "failure"
    PENDING = "pending"  # episode ran, verifier not run yet
    SANDBOX_ERROR = "sandbox_error"  # the environment died, failed to start or to build
    VERIFIER_ERROR = "verifier_error"  # verifier crashed or wrote no reward file
    VERIFIER_TIMEOUT = "verifier_timeout"
    ENVIRONMENT_TIMEOUT = "environment_timeout"  # build/start of the environment timed out
    HARNESS_ERROR = "harness_error"  # an exception in this kit's (or Harbor's) own code
    ENDPOINT_ERROR = "endpoint_error"  # the model server failed after retries
    # the verifier or the reference solution failed for want of a host the sandbox could not reach (or a package
    # the offline verifier shim could not install): the task needs more network than the trial had
    NETWORK_ERROR = "network_error"

    @property
    def is_infra_fault(self) -> bool:
        """True for outcomes that must not be scored as agent success or failure."""
        return self not in (Outcome.SUCCESS, Outcome.FAILURE, Outcome.PENDING)


StopReason = Literal[
    "submitted", "max_turns", "time_budget", "parse_errors", "infra_fault", "cancelled", "context_length",
    "sandbox_broken",
]  # context_length: the conversation outgrew the model's context (an agent failure, not infra);
# sandbox_broken: the sandbox stopped working after an agent command (an agent failure, reward 0)


def tool_call_id(index: int) -> str:
    """The tool-call id of the step at ``index`` of a trajectory: ``call_<index>``.

    Unique within a trajectory and stable (the same step always gets the same id), so chat messages,
    ATIF trajectories and endpoint histories never hold two calls with one id (ATIF requires unique
    ids; strict OpenAI-compatible servers reject a history that repeats one), and records stay
    deduplicable.
    """
    return f"call_{index}"


class Action(BaseModel):
    """A parsed model action.

    ``tool`` is ``"bash"`` (run ``command`` in the terminal, waiting at most ``timeout`` seconds) or
    ``"submit"`` (declare the task done). ``call_id`` is the tool-call id used in chat messages; in a
    trajectory it is unique (:meth:`Trajectory.unique_call_ids`), by default :func:`tool_call_id`.
    """

    tool: Literal["bash", "submit"]
    command: str | None = None
    timeout: float | None = None
    call_id: str = "call_0"


class Step(BaseModel):
    """One turn: the model's text, what it was parsed into, and what the terminal answered.

    Times are in seconds. ``exit_status`` is the shell's ``$?`` when the command returned to the
    prompt, ``None`` when it did not (interactive program, timeout) or for parse errors and submit.
    ``parse_error`` is the outcome name of :func:`reterm.agent.protocol.parse_action` when the text
    held no valid action (then ``action`` is ``None`` and ``observation`` tells the model what was wrong).
    """

    index: int
    model_text: str
    reasoning: str | None = None
    action: Action | None = None
    parse_error: str | None = None
    observation: str = ""
    exit_status: int | None = None
    timed_out: bool = False
    generation_s: float = 0.0
    execution_s: float = 0.0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    # Set on steps copied from a given history (a failure prefix) rather than generated in this episode.
    from_history: bool = False
    extra: dict[str, Any] = Field(default_factory=dict)

    @property
    def command(self) -> str | None:
        """The bash command of this step, if it ran one."""
        return self.action.command if self.action and self.action.tool == "bash" else None


class Trajectory(BaseModel):
    """One episode of the agent on one task.

    ``steps[:prefix_len]`` came from a given history (a recovery attempt starts from a failure state);
    the rest were generated in this episode. ``reward`` is the verifier's reward (``None`` when the
    verifier did not run or faulted). ``outcome`` says whether the episode counts as an agent
    success/failure or an infrastructure fault (see :class:`Outcome`).
    """

    schema_version: str = SCHEMA_VERSION
    task_id: str
    instruction: str
    system_prompt: str
    policy: str = ""
    steps: list[Step] = Field(default_factory=list)
    prefix_len: int = Field(0, ge=0)
    reward: float | None = None
    outcome: Outcome = Outcome.PENDING
    stop_reason: StopReason | None = None
    error: str | None = None  # message of the infrastructure fault, if any
    wall_s: float = 0.0
    metadata: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _prefix_within_steps(self) -> "Trajectory":
        if self.prefix_len > len(self.steps):
            raise ValueError(f"prefix_len {self.prefix_len} is larger than the number of steps ({len(self.steps)})")
        self.unique_call_ids()
        return self

    def unique_call_ids(self) -> "Trajectory":
        """Make the steps' tool-call ids unique, in place; returns ``self``.

        A step whose id is empty or already used by an earlier step gets :func:`tool_call_id` of its
        index (``_<n>`` appended if even that is taken); distinct ids are kept as they are, so the
        ids of an imported trajectory survive.
        """
        seen: set[str] = set()
        for step in self.steps:
            if step.action is None:
                continue
            cid = step.action.call_id
            if not cid or cid in seen:
                cid, n = tool_call_id(step.index), 1
                while cid in seen:
                    cid, n = f"{tool_call_id(step.index)}_{n}", n + 1
                step.action.call_id = cid
            seen.add(cid)
        return self

    # ----------------------------------------------------------------------------------- scoring
    @property
    def passed(self) -> bool:
        """True when the verifier's reward reached :data:`PASS_THRESHOLD`."""
        return self.outcome is Outcome.SUCCESS

    def set_reward(self, reward: float | None, error: str | None = None, timed_out: bool = False) -> None:
        """Record the verifier result and derive :attr:`outcome`.

        ``reward=None`` with ``error`` (or ``timed_out``) marks a verifier fault, never a failure.
        """
        if timed_out:
            self.reward, self.outcome, self.error = None, Outcome.VERIFIER_TIMEOUT, error or "verifier timed out"
        elif reward is None:
            self.reward, self.outcome = None, Outcome.VERIFIER_ERROR
            self.error = error or "verifier produced no reward"
        else:
            self.reward = float(reward)
            self.outcome = Outcome.SUCCESS if self.reward >= PASS_THRESHOLD else Outcome.FAILURE

    # ------------------------------------------------------------------------------ conversions
    def to_messages(self, upto: int | None = None) -> list[dict[str, Any]]:
        """The conversation as OpenAI-style chat messages with tool calls (the training format).

        ``[system, user(instruction), assistant(tool_calls)|assistant(text), tool, ...]`` for
        ``steps[:upto]``. Tool-call ``arguments`` are JSON strings (as ``datasets`` stores them).
        A parse-error step becomes an assistant message with the raw text and a ``user`` message
        holding the parse-error observation (there was no tool call to answer). Tool-call ids are
        unique (:meth:`unique_call_ids` runs first).
        """
        self.unique_call_ids()

        messages: list[dict[str, Any]] = [
            {"role": "system", "content": self.system_prompt},
            {"role": "user", "content": self.instruction},
        ]
        for step in self.steps[: len(self.steps) if upto is None else upto]:
            messages.extend(step_messages(step))
        return messages

    def prefix(self, n: int) -> list[Step]:
        """Copies of the first ``n`` steps marked ``from_history`` (a failure prefix)."""
        return [s.model_copy(update={"from_history": True}, deep=True) for s in self.steps[:n]]

    def save(self, path: str | Path) -> Path:
        """Write the trajectory as JSON atomically (temp file + rename). Returns the path."""
        return write_json_atomic(path, self.model_dump(mode="json"))

    @classmethod
    def load(cls, path: str | Path) -> "Trajectory":
        """Read a trajectory written by :meth:`save`.

        Raises ``ValueError`` naming the file when it is not valid JSON or not this schema.
        """
        path = Path(path)
        try:
            return cls.model_validate_json(path.read_text())
        except Exception as exc:  # pydantic.ValidationError or JSON errors
            raise ValueError(f"{path}: not a ReTerm trajectory ({exc})") from exc


def step_messages(step: Step) -> list[dict[str, Any]]:
    """The chat messages one step contributes (the training format, OpenAI style; the layout the agent
    protocol, :mod:`reterm.agent.protocol`, shows the model).

    - a tool call: ``assistant`` (content = the model's text outside the call, ``tool_calls`` with a
      JSON-string ``arguments``) then, for ``bash``, a ``tool`` message with the observation;
      ``submit`` ends the episode, so it gets no tool message.
    - a parse error: ``assistant`` with the raw model text, then a ``user`` message holding the
      parse-error observation (there is no call to answer).
    - the last step of a failed attempt that a recovery attempt continues carries
      ``step.extra["feedback"]`` (:func:`reterm.agent.protocol.feedback_message`): after a ``submit`` it is the submit's ``tool``
      response, after any other step a ``user`` message. The next assistant message starts attempt 2.
    """
    if step.action is None:
        out = [
            {"role": "assistant", "content": step.model_text},
            {"role": "user", "content": step.observation},
        ]
        if step.extra.get("feedback"):
            out.append({"role": "user", "content": step.extra["feedback"]})
        return out
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
    feedback = step.extra.get("feedback")
    if step.action.tool == "bash":
        messages.append(
            {"role": "tool", "tool_call_id": step.action.call_id, "name": "bash", "content": step.observation}
        )
    elif feedback:
        # the submit that ended a failed attempt: the feedback is its tool response
        return messages + [{"role": "tool", "tool_call_id": step.action.call_id, "name": "submit", "content": feedback}]
    if feedback:
        messages.append({"role": "user", "content": feedback})
    return messages
