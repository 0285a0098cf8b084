"""Conversions of :class:`reterm.trajectory.Trajectory`: Harbor's ATIF, chat messages, Harbor job folders.

- :func:`to_atif` / :func:`from_atif`: Harbor's Agent Trajectory Interchange Format
  (:mod:`harbor.models.trajectories`, written by Harbor agents as ``agent/trajectory.json``). ATIF steps:
  1 = ``system`` (the system prompt), 2 = ``user`` (the task instruction), then one ``agent`` step per
  turn: ``message`` = the raw model text, ``reasoning_content`` = its ``<think>`` text, ``tool_calls`` =
  the parsed action, ``observation`` = the terminal's answer, ``metrics`` = token counts (and ids,
  logprobs), ``is_copied_context`` = the step came from a given history. Everything else
  (exit status, timings, parse outcome, reward, outcome...) is kept under ``extra["reterm"]``.
  **Round trip**: ``from_atif(to_atif(t)) == t`` exactly (every field of the trajectory and its steps).
- :func:`from_atif` also reads other agents' ATIF (e.g. Terminus-2): agent steps become steps whose
  command is the concatenated keystrokes of their ``bash_command`` calls; ``mark_task_complete``
  becomes a ``submit`` step; exit statuses are unknown (``None``).
- :func:`from_messages`: the inverse of :meth:`Trajectory.to_messages` (the training format).
  **Round trip**: ``to_messages(from_messages(m)) == m`` exactly when ``m``'s tool-call ids are unique
  (a repeated id is renamed ``call_<step index>``), and ``from_messages(t.to_messages())``
  equals ``t`` on :func:`conversation_view` (system prompt, instruction, and per step the action,
  the text around it, the parse outcome, the observation and the exit status / time-out read back
  from it). Not carried by chat messages, hence not restored: timings, token counts, ``extra``,
  ``from_history``, reward/outcome, and the raw ``model_text`` of steps with an action (rebuilt as
  the canonical Hermes rendering, :func:`reterm.agent.protocol.render_action`).
- :func:`trajectory_from_trial` / :func:`trajectories_from_job`: trajectories from Harbor trial and
  job folders: this kit's agent (``agent/reterm_trajectory.json``, lossless), else any agent's
  ``agent/trajectory.json`` (ATIF) with reward and outcome from ``result.json`` classified by
  :func:`reterm.agent.trial_outcome.classify_trial` (Harbor's error table; agent timeouts are agent failures).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from reterm.agent.protocol import (
    SYSTEM_PROMPT,
    TOOLS,
    observation_status,
    parse_action,
    render_action,
)
from reterm.trajectory import Action, Outcome, Step, Trajectory, tool_call_id, write_json_atomic

AGENT_NAME = "reterm"
ATIF_FILE = "trajectory.json"  # Harbor's name for an agent's ATIF file in the trial's agent/ folder
RETERM_FILE = "reterm_trajectory.json"  # this kit's lossless JSON next to it
_KEY = "reterm"  # key of this kit's data in ATIF ``extra`` fields

# Step fields that ATIF carries natively (everything else goes to extra["reterm"]).
_NATIVE_STEP_FIELDS = {"model_text", "action", "observation", "prompt_tokens", "completion_tokens", "from_history"}


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("reterm")
    except Exception:
        return "0.1.0"


# ====================================================================================== ATIF
def to_atif(traj: Trajectory, session_id: str | None = None) -> Any:
    """The trajectory as a Harbor ATIF :class:`harbor.models.trajectories.Trajectory` (validated).

    ``session_id`` defaults to ``metadata["session_id"]`` when present. See the module docstring for
    the layout; :func:`from_atif` restores the trajectory exactly.
    """
    from harbor.models.trajectories import (
        Agent,
        FinalMetrics,
        Metrics,
        Observation,
        ObservationResult,
        ToolCall,
    )
    from harbor.models.trajectories import Step as AtifStep
    from harbor.models.trajectories import Trajectory as AtifTrajectory

    traj.unique_call_ids()
    steps = [
        AtifStep(step_id=1, source="system", message=traj.system_prompt),
        AtifStep(step_id=2, source="user", message=traj.instruction),
    ]
    for step in traj.steps:
        data = step.model_dump(mode="json")
        extra = {k: v for k, v in data.items() if k not in _NATIVE_STEP_FIELDS}
        extra["action"] = data["action"]  # exact (ATIF's tool call drops None timeouts)
        extra["observation_empty"] = step.observation == ""
        tool_calls = None
        result_id = None
        if step.action is not None:
            args: dict[str, Any] = {}
            if step.action.tool == "bash":
                args["command"] = step.action.command or ""
                if step.action.timeout is not None:
                    args["timeout"] = step.action.timeout
            tool_calls = [ToolCall(tool_call_id=step.action.call_id, function_name=step.action.tool, arguments=args)]
            result_id = step.action.call_id
        observation = None
        if step.observation or step.action is None or step.action.tool == "bash":
            observation = Observation(results=[ObservationResult(source_call_id=result_id, content=step.observation)])
        token_ids = step.extra.get("completion_token_ids")
        logprobs = step.extra.get("logprobs")
        metrics = None
        if step.prompt_tokens is not None or step.completion_tokens is not None or token_ids or logprobs:
            metrics = Metrics(
                prompt_tokens=step.prompt_tokens,
                completion_tokens=step.completion_tokens,
                completion_token_ids=token_ids,
                logprobs=logprobs,
            )
        thinking = parse_action(step.model_text).reasoning
        steps.append(
            AtifStep(
                step_id=len(steps) + 1,
                source="agent",
                model_name=traj.policy or None,
                message=step.model_text,
                reasoning_content=thinking,
                tool_calls=tool_calls,
                observation=observation,
                metrics=metrics,
                is_copied_context=True if step.from_history else None,
                extra={_KEY: extra},
            )
        )
    top = traj.model_dump(mode="json", exclude={"steps", "system_prompt", "instruction"})
    # A continued trajectory (a recovery attempt) copies the failed attempt's turns as its prefix
    # (``is_copied_context``): its totals count its own turns only, as Harbor's own converters do
    # (harbor.agents.installed.kimi_code_trajectory: "final_metrics excludes steps marked is_copied_context").
    own = [s for i, s in enumerate(traj.steps) if i >= traj.prefix_len and not s.from_history]
    copied = len(traj.steps) - len(own)
    prompt = [s.prompt_tokens for s in own if s.prompt_tokens is not None]
    completion = [s.completion_tokens for s in own if s.completion_tokens is not None]
    return AtifTrajectory(
        session_id=session_id or traj.metadata.get("session_id"),
        agent=Agent(
            name=AGENT_NAME,
            version=_version(),
            model_name=traj.policy or None,
            tool_definitions=TOOLS,
        ),
        steps=steps,
        notes=(
            "ReTerm harness (reterm.agent). Step 1 is the system prompt, step 2 the task instruction; each "
            "agent step is one model turn with at most one tool call. extra.reterm holds the exact "
            "ReTerm trajectory fields (reterm.agent.atif.from_atif restores them)."
            + (
                f" final_metrics counts this trajectory's own {len(own)} agent steps: the {copied} steps marked "
                "is_copied_context (a failed attempt's turns it continues from) stay serialized as context but are "
                "left out of the token totals and of total_steps."
                if copied
                else ""
            )
        ),
        final_metrics=FinalMetrics(
            total_prompt_tokens=sum(prompt) if prompt else None,
            total_completion_tokens=sum(completion) if completion else None,
            total_steps=len(steps) - copied,
        ),
        extra={_KEY: top},
    )


def _load_atif(atif: Any) -> Any:
    from harbor.models.trajectories import Trajectory as AtifTrajectory

    if isinstance(atif, AtifTrajectory):
        return atif
    if isinstance(atif, (str, Path)):
        path = Path(atif)
        try:
            atif = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"{path}: cannot read ATIF trajectory JSON ({exc})") from exc
        try:
            return AtifTrajectory.model_validate(atif)
        except Exception as exc:
            raise ValueError(f"{path}: not an ATIF trajectory ({exc})") from exc
    return AtifTrajectory.model_validate(atif)


def _text(message: Any) -> str:
    if isinstance(message, str):
        return message
    return "".join(part.text or "" for part in message or [] if getattr(part, "type", None) == "text")


def from_atif(atif: Any, *, task_id: str | None = None, instruction: str | None = None) -> Trajectory:
    """A trajectory from ATIF (a Harbor ``Trajectory`` model, a dict, or a JSON file path).

    ATIF written by :func:`to_atif` is restored exactly. Other agents' ATIF is mapped as described in
    the module docstring; ``task_id``/``instruction`` fill what such files lack (default: ``""`` and
    the first user step's message).

    Raises ``ValueError`` (naming the file for a path) when the input is not ATIF.
    """
    atif = _load_atif(atif)
    top = (atif.extra or {}).get(_KEY)
    if top is not None:
        system = next((_text(s.message) for s in atif.steps if s.source == "system"), SYSTEM_PROMPT)
        user = next((_text(s.message) for s in atif.steps if s.source == "user"), "")
        steps = []
        for s in atif.steps:
            if s.source != "agent":
                continue
            ex = dict((s.extra or {}).get(_KEY, {}))
            observation = ""
            if s.observation and s.observation.results:
                observation = _text(s.observation.results[0].content or "")
            ex.pop("observation_empty", None)
            action = ex.pop("action", None)
            steps.append(
                Step(
                    **ex,
                    model_text=_text(s.message),
                    action=Action.model_validate(action) if action else None,
                    observation=observation,
                    prompt_tokens=s.metrics.prompt_tokens if s.metrics else None,
                    completion_tokens=s.metrics.completion_tokens if s.metrics else None,
                    from_history=bool(s.is_copied_context),
                )
            )
        return Trajectory(**top, system_prompt=system, instruction=user, steps=steps)
    return _from_foreign_atif(atif, task_id=task_id, instruction=instruction)


def _from_foreign_atif(atif: Any, *, task_id: str | None, instruction: str | None) -> Trajectory:
    """Another agent's ATIF (Terminus-2 and the like) as a trajectory (see the module docstring)."""
    system = next((_text(s.message) for s in atif.steps if s.source == "system"), "")
    first_user = next((_text(s.message) for s in atif.steps if s.source == "user"), "")
    steps: list[Step] = []
    skipped = 0
    for s in atif.steps:
        if s.source != "agent":
            skipped += 1
            continue
        observation = "\n".join(_text(r.content or "") for r in (s.observation.results if s.observation else []))
        calls = list(s.tool_calls or [])
        bash = [c for c in calls if c.function_name not in ("mark_task_complete", "task_complete", "submit")]
        done = [c for c in calls if c.function_name in ("mark_task_complete", "task_complete", "submit")]
        metrics = s.metrics
        base = dict(
            model_text=_text(s.message),
            reasoning=s.reasoning_content,
            prompt_tokens=metrics.prompt_tokens if metrics else None,
            completion_tokens=metrics.completion_tokens if metrics else None,
            from_history=bool(s.is_copied_context),
        )
        extra: dict[str, Any] = {"atif_step_id": s.step_id}
        if calls:
            extra["atif_tool_calls"] = [c.model_dump(mode="json") for c in calls]
        if metrics and metrics.completion_token_ids:
            extra["completion_token_ids"] = metrics.completion_token_ids
        if metrics and metrics.logprobs:
            extra["logprobs"] = metrics.logprobs
        if bash:
            keys = []
            for c in bash:
                args = c.arguments or {}
                k = args.get("keystrokes", args.get("command", args.get("cmd", "")))
                keys.append(k if isinstance(k, str) else json.dumps(k))
            command = "".join(keys)
            command = command[:-1] if command.endswith("\n") else command
            action = Action(tool="bash", command=command, call_id=bash[0].tool_call_id)
            steps.append(Step(index=len(steps), action=action, observation=observation, extra=extra, **base))
        elif not done:
            steps.append(Step(index=len(steps), observation=observation, parse_error="no_tool_call", extra=extra, **base))
        if done:
            action = Action(tool="submit", call_id=done[0].tool_call_id)
            if bash:  # one ATIF step with commands and completion: the submit becomes its own step
                steps.append(Step(index=len(steps), model_text="", action=action, extra={"atif_step_id": s.step_id}))
            else:
                steps.append(Step(index=len(steps), action=action, observation=observation, extra=extra, **base))
    agent = atif.agent
    return Trajectory(
        task_id=task_id or "",
        instruction=instruction if instruction is not None else first_user,
        system_prompt=system,
        policy=f"{agent.name}:{agent.model_name}" if agent.model_name else agent.name,
        steps=steps,
        stop_reason="submitted" if steps and steps[-1].action and steps[-1].action.tool == "submit" else None,
        metadata={
            "source": "atif",
            "atif_agent": {"name": agent.name, "version": agent.version, "model_name": agent.model_name},
            "atif_session_id": atif.session_id,
            "atif_non_agent_steps": skipped,
        },
    )


# ================================================================================== messages
def from_messages(
    messages: list[dict[str, Any]],
    *,
    task_id: str = "",
    policy: str = "",
    call_format: str = "hermes",
) -> Trajectory:
    """The inverse of :meth:`Trajectory.to_messages`: a trajectory from training-format chat messages.

    Layout read: ``[system, user(instruction), (assistant, tool | assistant, user | assistant(submit))...]``;
    a failed attempt's feedback (a ``tool`` message after a submit, or a ``user`` message after a step's own
    messages) goes back into that step's ``extra["feedback"]``.
    (a leading system message is optional). ``arguments`` may be JSON strings or mappings. See the
    module docstring for what is restored.

    Raises ``ValueError`` naming the message index when the layout does not match.
    """
    msgs = list(messages)
    i = 0
    system = SYSTEM_PROMPT
    if msgs and msgs[0].get("role") == "system":
        system = msgs[0].get("content") or ""
        i = 1
    if i >= len(msgs) or msgs[i].get("role") != "user":
        raise ValueError(f"messages[{i}]: expected the user message with the task instruction")
    instruction = msgs[i].get("content") or ""
    i += 1
    steps: list[Step] = []
    while i < len(msgs):
        m = msgs[i]
        if m.get("role") != "assistant":
            raise ValueError(f"messages[{i}]: expected an assistant message, got role {m.get('role')!r}")
        content = m.get("content") or ""
        calls = m.get("tool_calls") or []
        if not calls:
            if i + 1 >= len(msgs) or msgs[i + 1].get("role") != "user":
                raise ValueError(f"messages[{i + 1}]: a reply without a tool call must be followed by the "
                                 "user message with its parse-error observation")  # fmt: skip
            observation = msgs[i + 1].get("content") or ""
            parsed = parse_action(content)
            steps.append(Step(index=len(steps), model_text=content, reasoning=parsed.message_content or None,
                              parse_error=parsed.outcome, observation=observation))  # fmt: skip
            i += 2
            if i < len(msgs) and msgs[i].get("role") == "user":  # the feedback that ends a failed attempt
                steps[-1].extra["feedback"] = msgs[i].get("content") or ""
                i += 1
            continue
        if len(calls) != 1:
            raise ValueError(f"messages[{i}]: {len(calls)} tool calls in one message; a step has one")
        fn = calls[0].get("function", calls[0])
        args = fn.get("arguments") or {}
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError as exc:
                raise ValueError(f"messages[{i}]: tool call arguments are not JSON ({exc})") from exc
        name = fn.get("name")
        if name not in ("bash", "submit"):
            raise ValueError(f"messages[{i}]: unknown tool {name!r}")
        call_id = calls[0].get("id") or tool_call_id(len(steps))
        feedback = None
        if name == "submit":
            action = Action(tool="submit", call_id=call_id)
            observation, nxt = "", i + 1
            if nxt < len(msgs) and msgs[nxt].get("role") == "tool":  # a failed attempt's feedback (attempt-level)
                feedback, nxt = msgs[nxt].get("content") or "", nxt + 1
        else:
            timeout = args.get("timeout")
            action = Action(tool="bash", command=args.get("command", ""), timeout=None if timeout is None else float(timeout),
                            call_id=call_id)  # fmt: skip
            if i + 1 >= len(msgs) or msgs[i + 1].get("role") != "tool":
                raise ValueError(f"messages[{i + 1}]: a bash call must be followed by its tool message")
            observation, nxt = msgs[i + 1].get("content") or "", i + 2
            if nxt < len(msgs) and msgs[nxt].get("role") == "user":  # feedback after the attempt's last bash step
                feedback, nxt = msgs[nxt].get("content") or "", nxt + 1
        exit_status, timed_out = observation_status(observation) if name == "bash" else (None, False)
        steps.append(
            Step(
                index=len(steps),
                model_text=render_action(action, content, call_format),  # type: ignore[arg-type]
                reasoning=content or None,
                action=action,
                observation=observation,
                exit_status=exit_status,
                timed_out=timed_out,
                extra={"feedback": feedback} if feedback is not None else {},
            )
        )
        i = nxt
    return Trajectory(task_id=task_id, instruction=instruction, system_prompt=system, policy=policy, steps=steps)


def conversation_view(traj: Trajectory) -> dict[str, Any]:
    """The part of a trajectory that chat messages carry (what the messages round trip preserves)."""
    return {
        "system_prompt": traj.system_prompt,
        "instruction": traj.instruction,
        "steps": [
            {
                "index": s.index,
                "action": s.action.model_dump() if s.action else None,
                "reasoning": (s.reasoning or None) if s.action else None,  # parse errors: in model_text
                "parse_error": s.parse_error,
                "observation": s.observation,
                "exit_status": s.exit_status,
                "timed_out": s.timed_out,
                "model_text": s.model_text if s.action is None else None,
            }
            for s in traj.steps
        ],
    }


# ============================================================================== job folders
def write_trial_files(traj: Trajectory, agent_dir: str | Path) -> tuple[Path, Path]:
    """Write ``agent_dir/trajectory.json`` (ATIF, Harbor's format) and ``agent_dir/reterm_trajectory.json``
    (this kit's JSON), atomically. Returns both paths."""
    agent_dir = Path(agent_dir)
    atif_path = write_json_atomic(agent_dir / ATIF_FILE, to_atif(traj).to_json_dict())
    own = traj.save(agent_dir / RETERM_FILE)
    return atif_path, own


def trajectory_from_trial(trial_dir: str | Path) -> Trajectory:
    """The trajectory of one Harbor trial folder (this kit's agent or any agent writing ATIF).

    Reward and outcome: this kit's own file keeps its own (its infrastructure faults are exact);
    otherwise ``result.json`` decides via :func:`reterm.agent.trial_outcome.classify_trial`. Metadata gets
    ``trial_dir``, ``trial_name`` and Harbor's exception type, if any.

    Raises ``FileNotFoundError`` when the folder has no trajectory and ``ValueError`` naming the file
    when one cannot be read.
    """
    trial_dir = Path(trial_dir)
    own = trial_dir / "agent" / RETERM_FILE
    atif = trial_dir / "agent" / ATIF_FILE
    result_path = trial_dir / "result.json"
    result = None
    if result_path.is_file():
        from harbor.models.trial.result import TrialResult

        try:
            result = TrialResult.model_validate_json(result_path.read_text())
        except Exception as exc:
            raise ValueError(f"{result_path}: not a Harbor trial result ({exc})") from exc
    if own.is_file():
        traj = Trajectory.load(own)
        keep_own = True
    elif atif.is_file():
        instruction, task_id = _trial_task(result)
        traj = from_atif(atif, task_id=task_id, instruction=instruction)
        keep_own = False
    else:
        raise FileNotFoundError(f"{trial_dir}: no agent/{RETERM_FILE} or agent/{ATIF_FILE}")
    traj.metadata["trial_dir"] = str(trial_dir)
    if result is not None:
        from reterm.agent.trial_outcome import classify_trial  # imports Harbor's trial models

        traj.metadata["trial_name"] = result.trial_name
        exceptions = result.recorded_exceptions()
        if exceptions:
            traj.metadata["harbor_exception"] = exceptions[0].exception_type
        if not traj.task_id:
            traj.task_id = result.task_name.split("/")[-1]
        outcome, reward = classify_trial(result, trial_dir)
        if not (keep_own and traj.outcome.is_infra_fault) and not (keep_own and outcome is Outcome.PENDING):
            if outcome.is_infra_fault:
                traj.reward, traj.outcome = None, outcome
                traj.error = traj.error or (f"{exceptions[0].exception_type}: {exceptions[0].exception_message[:300]}"
                                            if exceptions else "no reward")  # fmt: skip
            else:
                traj.reward, traj.outcome = reward, outcome
    return traj


def _trial_task(result: Any) -> tuple[str | None, str | None]:
    """(instruction, task id) of a trial from its task folder, when the folder is still there."""
    if result is None:
        return None, None
    task_id = result.task_name.split("/")[-1]
    path = getattr(result.task_id, "path", None)
    if path is not None and (Path(path) / "instruction.md").is_file():
        try:
            from harbor.models.task.task import Task

            return Task(Path(path)).instruction, task_id
        except Exception:
            return (Path(path) / "instruction.md").read_text(), task_id
    return None, task_id


def trajectories_from_job(job_dir: str | Path, *, skip_missing: bool = True) -> Iterator[Trajectory]:
    """The trajectories of every trial folder in a Harbor job folder (sorted by trial name).

    Trial folders without a trajectory file are skipped (``skip_missing``) or raise
    ``FileNotFoundError``. Raises ``FileNotFoundError`` for a missing job folder.
    """
    job_dir = Path(job_dir)
    if not job_dir.is_dir():
        raise FileNotFoundError(f"{job_dir}: no such Harbor job folder")
    for trial in sorted(p for p in job_dir.iterdir() if p.is_dir() and not p.name.startswith(".")):
        try:
            yield trajectory_from_trial(trial)
        except FileNotFoundError:
            if not skip_missing:
                raise
