"""The episode loop: a policy acts in a terminal until it submits or runs out of turns or time.

:func:`run_episodes` runs N episodes in lock-step: each turn, one ``policy.generate`` call writes the
next reply of every live episode (a local model generates them as one batch), then the actions run
concurrently, each in its own environment. This is what GRPO groups and recovery fan-outs use;
:func:`run_episode` is the single-episode case. An episode can start from a given history (a failure
prefix, copied into the trajectory with ``from_history=True``) in an environment already in that
state: a recovery attempt.

:func:`run_verifier` runs the task's tests on an environment without a Harbor ``Trial``, with Harbor's
own :class:`harbor.verifier.verifier.Verifier` (upload ``tests/``, run ``test.sh``, read
``/logs/verifier/reward.{json,txt}``), and turns its faults into infrastructure outcomes.

Outcome rules (:class:`reterm.trajectory.Outcome`; infrastructure faults are never agent outcomes):

- ``policy.generate`` raised :class:`reterm.policies.base.EndpointError` -> ``ENDPOINT_ERROR``;
- the environment failed under the terminal (:class:`reterm.agent.terminal.EnvironmentFault`) before the
  agent acted, or the host ended the sandbox (its init died, or the host ran out of memory while the
  sandbox was under its own limits) -> ``SANDBOX_ERROR``;
- the sandbox stopped working after an agent command started (its memory, processes or disk
  exhausted, its shell or terminal killed for good, ``/logs`` made unusable for the verifier) ->
  ``FAILURE`` with reward 0, stop reason ``sandbox_broken``, the command recorded as a step with an
  observation that says so, ``metadata["broken_by_agent"]`` naming what broke (docs/SCORING.md);
- any other exception in the harness -> ``HARNESS_ERROR`` with the message;
- the verifier crashed or wrote no reward -> ``VERIFIER_ERROR``; it ran over its time -> ``VERIFIER_TIMEOUT``;
- otherwise the verifier's reward decides ``SUCCESS``/``FAILURE``, whatever stopped the agent
  (submit, max turns, its own time budget, parse errors, a context too long for the model).
  Infrastructure faults are never verified: they carry no reward.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reterm.agent.protocol import (
    DEFAULT_COMMAND_TIMEOUT_S,
    SYSTEM_PROMPT,
    TOOLS,
    ParseResult,
    count_parse_outcomes,
    ends_with_submit,
    parse_action,
    system_prompt,
)
from reterm.agent.terminal import EnvironmentFault, ShellState, TerminalSession
from reterm.policies.base import FINISH_CONTEXT_LENGTH, EndpointError, Generation, Policy
from reterm.rewards import RewardError, reward_source, scalar_reward
from reterm.trajectory import Outcome, Step, Trajectory, tool_call_id

logger = logging.getLogger(__name__)

DEFAULT_MAX_TURNS = 30


class HarnessError(RuntimeError):
    """A fault in this kit's own code during an episode (an infrastructure fault, not the agent's)."""


def load_task(task: Any) -> Any:
    """A Harbor :class:`harbor.models.task.task.Task` from a task folder path (a ``Task`` passes through).

    Raises ``ValueError`` naming the folder when it is not a Harbor task.
    """
    from harbor.models.task.task import Task

    if isinstance(task, Task):
        return task
    path = Path(task)
    if not (path / "task.toml").is_file():
        raise ValueError(f"{path}: not a Harbor task folder (no task.toml)")
    return Task(path)


def task_id_of(task: Any) -> str:
    """The task's id: ``[task] name`` of task.toml without its org prefix, else the folder name."""
    name = getattr(task, "name", None) or Path(str(task)).name
    return str(name).split("/")[-1]


def policy_call_format(policy: Any) -> str | None:
    """The tool-call syntax a policy's model writes (``"qwen"``/``"hermes"``), for parse-error
    observations: the policy's ``call_format`` or ``tool_call_format`` attribute, else its tokenizer's
    chat template (Qwen3.5's renders ``<function=...>``); ``None`` when unknown (the parser then
    shows the syntax the reply itself used, else Hermes JSON)."""
    for attr in ("call_format", "tool_call_format"):
        value = getattr(policy, attr, None)
        if value in ("qwen", "hermes"):
            return value
    template = getattr(getattr(policy, "tokenizer", None), "chat_template", None)
    if isinstance(template, str):
        return "qwen" if "<function=" in template else "hermes"
    return None


@dataclass
class EpisodeSpec:
    """One episode of a lock-step batch.

    Args:
        environment: a started Harbor environment (anything with Harbor's ``exec``).
        task: a Harbor ``Task`` or a task folder.
        history: steps (or a trajectory whose steps) already taken in ``environment`` (a failure
            prefix); copied into the new trajectory with ``from_history=True``.
        session: a running :class:`TerminalSession` in ``environment`` to type into; default: a new
            one, started with ``restore`` (default with a history: the shell state the sandbox's
            files hold, see :meth:`TerminalSession.saved_state`).
        restore: cwd and exported variables for a new session.
        metadata: copied into the trajectory's metadata.
        instruction: the instruction shown to the model (default the task's; Harbor passes its own,
            which may carry extra instructions).
    """

    environment: Any
    task: Any
    history: Sequence[Step] | Trajectory | None = None
    session: TerminalSession | None = None
    restore: ShellState | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    instruction: str | None = None


class _Episode:
    """The mutable state of one running episode."""

    def __init__(self, spec: EpisodeSpec, policy_name: str, time_budget_s: float | None,
                 tools: list[dict[str, Any]] | None = None) -> None:
        self.spec = spec
        self.task = load_task(spec.task)
        history = spec.history.steps if isinstance(spec.history, Trajectory) else list(spec.history or [])
        steps = [s.model_copy(update={"from_history": True, "index": i}, deep=True) for i, s in enumerate(history)]
        self.traj = Trajectory(
            task_id=task_id_of(self.task),
            instruction=spec.instruction if spec.instruction is not None else self.task.instruction,
            system_prompt=system_prompt(tools) if tools is not None else SYSTEM_PROMPT,
            policy=policy_name,
            steps=steps,
            prefix_len=len(steps),
            metadata=dict(spec.metadata),
        )
        budget = time_budget_s
        if budget is None:
            budget = getattr(self.task.config.agent, "timeout_sec", None)
        self.time_budget_s = float(budget) if budget else None
        self.session = spec.session
        self.parse_outcomes: Counter[str] = Counter()
        self.turns = 0
        self.consecutive_parse_errors = 0
        self.done = False
        self.started = 0.0
        self.t_generation = 0.0
        self.t_execution = 0.0
        self.t_session_start = 0.0
        self.t_wait = 0.0  # lock-step: time spent waiting for the other episodes' commands
        self.t_charged = 0.0  # what the time budget counts: own commands + own share of each generation call

    def remaining_s(self) -> float | None:
        """Seconds of the time budget left: the budget minus this episode's own commands and its share of each
        batched generation call (the call's time over the conversations in it); ``None`` without a budget."""
        if self.time_budget_s is None:
            return None
        return self.time_budget_s - self.t_charged

    def stop(self, reason: str, outcome: Outcome | None = None, error: str | None = None) -> None:
        self.done = True
        self.traj.stop_reason = reason  # type: ignore[assignment]
        if outcome is not None:
            self.traj.outcome = outcome
        if error is not None:
            self.traj.error = error


def _fault(exc: BaseException) -> tuple[Outcome, str]:
    """(outcome, message) of an exception raised while running an episode."""
    if isinstance(exc, EndpointError):
        return Outcome.ENDPOINT_ERROR, f"model endpoint: {exc}"
    if isinstance(exc, EnvironmentFault):
        return Outcome.SANDBOX_ERROR, f"sandbox: {exc}"
    tb = traceback.extract_tb(exc.__traceback__)
    where = f" at {Path(tb[-1].filename).name}:{tb[-1].lineno}" if tb else ""
    return Outcome.HARNESS_ERROR, f"harness: {type(exc).__name__}: {exc}{where}"


BROKEN_KEY = "broken_by_agent"  # trajectory metadata (and Harbor agent metadata): what the agent broke
# Run as root after the episode (and after a verifier fault): can the verifier still work here?
_VERIFIER_PATHS_PROBE = (
    "mkdir -p /logs/verifier 2>&1 && touch /logs/verifier/.reterm-probe 2>&1 && rm -f /logs/verifier/.reterm-probe"
    " && [ -x /bin/bash ] && [ -x /bin/sh ] && echo __reterm_ok__"
)
# Below this share of the host's memory available, a sandbox that died under its own limits is the host's fault.
HOST_MEMORY_LOW = 0.02


def _host_memory_low() -> bool:
    try:
        info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
        total = int(info["MemTotal"].split()[0])
        return int(info["MemAvailable"].split()[0]) < HOST_MEMORY_LOW * total
    except (OSError, KeyError, ValueError):
        return False


def _sandbox_health(environment: Any) -> Any:
    """``environment.sandbox_health()`` (the local sandbox's ``BoxHealth``: ``alive``, ``limits_hit``...), or
    ``None`` for an environment that cannot say."""
    health_of = getattr(environment, "sandbox_health", None)
    if callable(health_of):
        with contextlib.suppress(Exception):
            return health_of()
    return None


def blame_breakage(environment: Any, why: str) -> tuple[bool, str]:
    """Whose fault is a sandbox that stopped working after the agent acted: ``(agent, message)``.

    The agent's, unless the environment shows the host did it: its init (which nothing inside can
    kill) is gone, or the host is short of memory while the sandbox stayed within its own limits.
    Environments that cannot say (no ``sandbox_health``) follow the rule: the agent's.
    ``message`` adds the sandbox's own limits it ran into.
    """
    health = _sandbox_health(environment)
    if health is None:
        return True, why
    if not health.alive:
        return False, f"{why}; the sandbox itself ended (host or harness)"
    hit = list(health.limits_hit)
    if not hit and _host_memory_low():
        return False, f"{why}; the host is short of memory (the sandbox stayed within its limits)"
    if hit:
        why += f"; the sandbox ran out of {', '.join(hit)}"
    return True, why


async def verifier_paths_broken(environment: Any) -> str | None:
    """What keeps the verifier from running in ``environment`` (``/logs/verifier`` not a writable
    folder, no shell, exec failing), or ``None`` when it can run. Runs one short command as root."""
    try:
        r = await asyncio.wait_for(environment.exec(_VERIFIER_PATHS_PROBE, timeout_sec=30, user="root"), timeout=40)
    except Exception as exc:  # exec itself failed: pids or memory exhausted, no shell, ...
        return f"commands cannot run in the sandbox any more ({type(exc).__name__}: {str(exc)[:200]})"
    if r.return_code == 0 and "__reterm_ok__" in (r.stdout or ""):
        return None
    said = ((r.stdout or "") + (r.stderr or "")).strip()[-300:]
    said = said or f"exit {r.return_code}"
    return f"the verifier's folder /logs/verifier cannot be made writable or no shell is left ({said})"


def mark_broken(traj: Trajectory, why: str) -> None:
    """Score ``traj`` as an agent failure because the agent broke its sandbox: reward 0, ``FAILURE``,
    stop reason ``sandbox_broken``, ``metadata["broken_by_agent"] = why``."""
    traj.reward, traj.outcome, traj.error = 0.0, Outcome.FAILURE, None
    traj.stop_reason = "sandbox_broken"
    traj.metadata[BROKEN_KEY] = why


async def _start_session(ep: _Episode) -> None:
    if ep.session is not None:
        return
    t0 = time.monotonic()
    restore = ep.spec.restore
    if restore is None and ep.traj.prefix_len:
        restore = await TerminalSession.saved_state(ep.spec.environment)
    ep.session = await TerminalSession.start(ep.spec.environment, restore=restore)
    ep.t_session_start = time.monotonic() - t0


async def _act(ep: _Episode, gen: Generation, generation_s: float, call_format: str | None,
               max_consecutive_parse_errors: int | None, command_timeout_s: float | None,
               submit_tool: bool = True) -> Step:  # fmt: skip
    """Parse one reply, run its action, append the step; stop the episode when it is over. Without a
    ``submit`` tool (``submit_tool`` false: the ``bash`` tool set), a reply without a tool call ends the
    attempt and a ``submit`` call is an unknown tool."""
    parsed = parse_action(gen.text, call_format)  # type: ignore[arg-type]
    if not submit_tool and parsed.action is not None and parsed.action.tool == "submit":
        parsed = ParseResult(outcome="unknown_tool", error="unknown tool submit; the only tool is `bash`",
                             reasoning=parsed.reasoning, content=parsed.content, n_calls=parsed.n_calls,
                             call_format=parsed.call_format)  # fmt: skip
    ep.parse_outcomes[parsed.outcome] += 1
    ep.turns += 1
    index = len(ep.traj.steps)
    if parsed.action is not None:
        parsed.action = parsed.action.model_copy(update={"call_id": tool_call_id(index)})
    step = Step(
        index=index,
        model_text=gen.text,
        reasoning=parsed.message_content or None,
        action=parsed.action,
        parse_error=None if parsed.ok else parsed.outcome,
        generation_s=generation_s,
        prompt_tokens=gen.prompt_tokens,
        completion_tokens=gen.completion_tokens,
    )
    step.extra["parse_outcome"] = parsed.outcome
    if gen.finish_reason:
        step.extra["finish_reason"] = gen.finish_reason
    if gen.token_ids is not None:
        step.extra["completion_token_ids"] = list(gen.token_ids)
    if gen.logprobs is not None:
        step.extra["logprobs"] = list(gen.logprobs)
    if parsed.action is None and not submit_tool and parsed.outcome == "no_tool_call":
        step.parse_error = None  # the bash tool set's way to end an attempt, not a mistake
        ep.consecutive_parse_errors = 0
        ep.traj.steps.append(step)
        ep.stop("submitted")
        return step
    if parsed.action is None:
        ep.consecutive_parse_errors += 1
        step.observation = parsed.observation()
    elif parsed.action.tool == "submit":
        ep.consecutive_parse_errors = 0
        ep.traj.steps.append(step)
        ep.stop("submitted")
        return step
    else:
        ep.consecutive_parse_errors = 0
        timeout = parsed.action.timeout or command_timeout_s or DEFAULT_COMMAND_TIMEOUT_S
        remaining = ep.remaining_s()
        if remaining is not None:
            timeout = max(0.1, min(timeout, remaining))
        t0 = time.monotonic()
        assert ep.session is not None
        try:
            result = await ep.session.run(parsed.action.command or "", timeout)
        except EnvironmentFault as exc:
            # the sandbox stopped working once the agent's command had started
            agent, why = blame_breakage(ep.spec.environment, f"the terminal failed after this command: {exc}")
            if not agent:
                raise EnvironmentFault(why) from exc
            step.execution_s = time.monotonic() - t0
            step.observation = f"[the sandbox stopped working: {why}]"
            step.extra[BROKEN_KEY] = why
            ep.traj.steps.append(step)
            ep.done = True
            mark_broken(ep.traj, why)
            return step
        step.execution_s = time.monotonic() - t0
        step.observation = result.observation(note=parsed.note)
        step.exit_status = result.exit_status if not result.timed_out else None
        step.timed_out = result.timed_out
        if result.running:
            step.extra["running"] = result.running
        if result.restarted:
            step.extra["terminal_restarted"] = result.restarted
    ep.traj.steps.append(step)
    if max_consecutive_parse_errors and ep.consecutive_parse_errors >= max_consecutive_parse_errors:
        ep.stop("parse_errors")
    return step


async def run_episodes(
    policy: Policy,
    episodes: Sequence[EpisodeSpec],
    *,
    max_turns: int = DEFAULT_MAX_TURNS,
    time_budget_s: float | None = None,
    command_timeout_s: float | None = None,
    max_consecutive_parse_errors: int | None = None,
    verify: bool = True,
    trial_dirs: Sequence[str | Path | None] | None = None,
    on_step: Callable[[int, Trajectory, Step], None] | None = None,
    on_start: Callable[[list[Trajectory]], None] | None = None,
    tools: list[dict[str, Any]] | None = None,
) -> list[Trajectory]:
    """Run ``len(episodes)`` episodes in lock-step with one ``policy.generate`` call per turn.

    Each turn: the live episodes' conversations (``Trajectory.to_messages()``) go to the policy in
    one batch; every reply is parsed (:func:`reterm.agent.protocol.parse_action`) and its action runs
    in its episode's terminal, concurrently across environments. An episode stops when its policy
    submits, after ``max_turns`` generated turns (a history does not count), when its time budget
    is spent (stop reason ``time_budget``: an agent failure, judged by the verifier; the budget counts the
    episode's own commands and its share of each batched generation call, the call's time divided by the
    conversations in it, so neither the batch size nor the other episodes' commands spend it: measured, with 32
    attempts generated together on 2 CPU cores, 55 of 64 two-stage attempts ran out of a 120 s wall-clock budget
    by their fourth turn), after
    ``max_consecutive_parse_errors`` parse errors in a row, when the model's context is full, or at
    an infrastructure fault. Then (``verify=True``) the verifier of each episode without an
    infrastructure fault runs, concurrently.

    Args:
        policy: the :class:`reterm.policies.base.Policy` (its ``generate`` runs in a worker thread).
        episodes: what to run (:class:`EpisodeSpec`).
        max_turns: turns generated per episode.
        time_budget_s: the agent's own time per episode (its share of the model's calls + its commands),
            seconds; default the task's ``[agent] timeout_sec``; ``None`` there too means no limit. A command's
            timeout is cut to the time left.
        command_timeout_s: a command's timeout when the action gives none (default 30 s).
        max_consecutive_parse_errors: stop an episode after this many parse errors in a row (``None``:
            never; max_turns still bounds it).
        verify: run the task's verifier at the end (:func:`run_verifier`).
        trial_dirs: per episode, a host folder for the verifier's files (default: a temporary one).
        on_step: called as ``on_step(episode_index, trajectory, step)`` after every step (live display).
        on_start: called once with the (still empty) trajectories before the first turn; they are
            filled in place, so a caller cut off (e.g. cancelled by Harbor's agent timeout) keeps them.
        tools: tool schemas given to the policy (default :data:`reterm.agent.protocol.TOOLS`).

    Returns:
        One :class:`reterm.trajectory.Trajectory` per episode, in order. Timings are in
        ``metadata["timing"]`` (seconds), parse-outcome counts in ``metadata["parse_outcomes"]``.
        Never raises for faults of the policy, the environment or the verifier; they become outcomes.
    """
    tools = TOOLS if tools is None else tools
    submit_tool = ends_with_submit(tools)
    name = getattr(policy, "name", type(policy).__name__)
    call_format = policy_call_format(policy)
    eps: list[_Episode] = []
    for spec in episodes:
        try:
            eps.append(_Episode(spec, name, time_budget_s, tools))
        except Exception as exc:  # an unreadable task is the caller's error, said clearly
            raise ValueError(f"episode {len(eps)}: cannot load task {spec.task!r}: {exc}") from exc
    t_all = time.monotonic()

    async def start(ep: _Episode) -> None:
        try:
            await _start_session(ep)
        except Exception as exc:
            ep.stop("infra_fault", *_fault(exc))

    await asyncio.gather(*(start(ep) for ep in eps))
    for ep in eps:
        ep.started = time.monotonic()
    if on_start is not None:
        on_start([ep.traj for ep in eps])

    while True:
        live = [ep for ep in eps if not ep.done]
        for ep in live:
            remaining = ep.remaining_s()
            if ep.turns >= max_turns:
                ep.stop("max_turns")
            elif remaining is not None and remaining <= 0:
                ep.stop("time_budget")
        live = [ep for ep in live if not ep.done]
        if not live:
            break
        batch = [ep.traj.to_messages() for ep in live]
        t0 = time.monotonic()
        try:
            gens = await asyncio.to_thread(policy.generate, batch, tools)
            if len(gens) != len(batch):
                raise HarnessError(f"policy {name!r} returned {len(gens)} generations for {len(batch)} conversations")
        except Exception as exc:
            outcome, message = _fault(exc)
            for ep in live:
                ep.stop("infra_fault", outcome, message)
            break
        generation_s = time.monotonic() - t0
        for ep in live:
            ep.t_generation += generation_s
            ep.t_charged += generation_s / len(live)

        async def act(i: int, ep: _Episode, gen: Generation) -> None:
            if gen.finish_reason == FINISH_CONTEXT_LENGTH:
                ep.stop("context_length")
                return
            try:
                step = await _act(ep, gen, generation_s, call_format, max_consecutive_parse_errors, command_timeout_s,
                                  submit_tool)
                ep.t_execution += step.execution_s
                ep.t_charged += step.execution_s
                if on_step is not None:
                    on_step(eps.index(ep), ep.traj, step)
            except Exception as exc:
                ep.stop("infra_fault", *_fault(exc))

        n_before = {id(ep): len(ep.traj.steps) for ep in live}
        await asyncio.gather(*(act(i, ep, g) for i, (ep, g) in enumerate(zip(live, gens))))
        # lock-step: an episode whose command finished first waits for the slowest one
        own = {id(ep): sum(s.execution_s for s in ep.traj.steps[n_before[id(ep)]:]) for ep in live}
        slowest = max(own.values(), default=0.0)
        for ep in live:
            ep.t_wait += slowest - own[id(ep)]

    for ep in eps:
        loop_s = time.monotonic() - ep.started if ep.started else 0.0
        ep.traj.metadata["parse_outcomes"] = count_parse_outcomes(ep.parse_outcomes)
        ep.traj.metadata["turns"] = ep.turns
        ep.traj.metadata["timing"] = {
            "session_start_s": ep.t_session_start,
            "generation_s": ep.t_generation,
            "execution_s": ep.t_execution,
            "lockstep_wait_s": ep.t_wait,
            "budget_charged_s": ep.t_charged,
        }
        if ep.session is not None:
            ep.traj.metadata["terminal_restarts"] = ep.session.restarts
        ep.traj.metadata["_loop_s"] = loop_s

    async def probe(ep: _Episode) -> None:
        # an episode that ended normally may still have left a sandbox the verifier cannot use
        if ep.traj.outcome.is_infra_fault or BROKEN_KEY in ep.traj.metadata or not ep.started:
            return
        broken = await verifier_paths_broken(ep.spec.environment)
        if broken is None:
            return
        agent, why = blame_breakage(ep.spec.environment, broken)
        if agent:
            mark_broken(ep.traj, why)
        else:
            ep.traj.outcome, ep.traj.error = Outcome.SANDBOX_ERROR, f"sandbox: {why}"

    await asyncio.gather(*(probe(ep) for ep in eps))

    if verify:
        dirs = list(trial_dirs) if trial_dirs is not None else [None] * len(eps)

        async def check(ep: _Episode, trial_dir: str | Path | None) -> None:
            if ep.traj.outcome.is_infra_fault or BROKEN_KEY in ep.traj.metadata:
                return
            t0 = time.monotonic()
            await run_verifier(ep.spec.environment, ep.task, ep.traj, trial_dir=trial_dir)
            ep.traj.metadata["timing"]["verify_s"] = time.monotonic() - t0

        await asyncio.gather(*(check(ep, d) for ep, d in zip(eps, dirs)))

    wall = time.monotonic() - t_all
    for ep in eps:
        ep.traj.wall_s = wall
        timing = ep.traj.metadata["timing"]
        loop_s = ep.traj.metadata.pop("_loop_s")
        timing["loop_s"] = loop_s
        timing["overhead_s"] = max(0.0, loop_s - timing["generation_s"] - timing["execution_s"] - timing["lockstep_wait_s"])
    return [ep.traj for ep in eps]


async def run_episode(
    policy: Policy,
    environment: Any,
    task: Any,
    history: Sequence[Step] | Trajectory | None = None,
    *,
    max_turns: int = DEFAULT_MAX_TURNS,
    time_budget_s: float | None = None,
    session: TerminalSession | None = None,
    restore: ShellState | None = None,
    trial_dir: str | Path | None = None,
    metadata: dict[str, Any] | None = None,
    **kwargs: Any,
) -> Trajectory:
    """Run one episode of ``policy`` on ``task`` in the started ``environment``; returns its trajectory.

    ``history`` (a failure prefix) is copied in with ``from_history=True`` and the episode continues
    from it; the environment must already be in that state (a fork of the failure state). See
    :func:`run_episodes` for the stopping rules, outcomes, ``**kwargs`` and timings.
    """
    spec = EpisodeSpec(environment, task, history, session, restore, dict(metadata or {}))
    (traj,) = await run_episodes(
        policy, [spec], max_turns=max_turns, time_budget_s=time_budget_s,
        trial_dirs=[trial_dir], **kwargs,
    )  # fmt: skip
    return traj


# =============================================================================== verifier
@dataclass
class VerifierOutcome:
    """What the verifier said: ``reward`` (``None`` on a fault), all ``rewards``, the fault message
    (``error``), whether it timed out, its duration in seconds and the tail of its output.
    ``broken_by_agent`` says why a fault is the agent's (it left no usable sandbox or ``/logs``)."""

    reward: float | None
    rewards: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    timed_out: bool = False
    duration_s: float = 0.0
    output_tail: str = ""
    broken_by_agent: str | None = None


async def run_verifier(
    environment: Any,
    task: Any,
    trajectory: Trajectory | None = None,
    *,
    trial_dir: str | Path | None = None,
    timeout_s: float | None = None,
) -> VerifierOutcome:
    """Run the task's verifier against ``environment`` with Harbor's ``Verifier`` (no ``Trial`` needed).

    The reward is read by :func:`reterm.rewards.scalar_reward` (``rewards["reward"]`` or the only
    value, a number in [0, 1]). A crash, a missing, unreadable, ambiguous or out-of-range reward -> an
    error outcome naming the file and the value; exceeding ``timeout_s`` (default the task's
    ``[verifier] timeout_sec``) -> a timeout. A fault where the agent left no usable sandbox or
    ``/logs`` (:func:`verifier_paths_broken`, :func:`blame_breakage`) is the agent's failure instead:
    ``broken_by_agent`` is set and the trajectory scored 0 (:func:`mark_broken`). With ``trajectory``,
    :meth:`Trajectory.set_reward` records the result (and the verifier's output tail goes to
    ``metadata["verifier_output_tail"]``).

    Args:
        environment: the started Harbor environment the agent worked in.
        task: a Harbor ``Task`` or task folder.
        trial_dir: host folder for ``verifier/`` files (Harbor's trial layout); default a temporary one.
    """
    from harbor.models.trial.paths import TrialPaths
    from harbor.verifier.verifier import Verifier

    task = load_task(task)
    timeout = float(timeout_s or getattr(task.config.verifier, "timeout_sec", 600.0) or 600.0)
    t0 = time.monotonic()
    tmp = None
    if trial_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="reterm-verify-")
        trial_dir = tmp.name
    paths = TrialPaths(Path(trial_dir))
    paths.mkdir()
    outcome = VerifierOutcome(reward=None)
    user_scope = (
        environment.with_default_user(task.config.verifier.user)
        if hasattr(environment, "with_default_user")
        else contextlib.nullcontext()
    )
    try:
        with user_scope:
            if hasattr(environment, "empty_dirs"):  # as Harbor's trial: a clean /logs/verifier
                from harbor.models.trial.paths import EnvironmentPaths

                await environment.empty_dirs([EnvironmentPaths.for_os(environment.os).verifier_dir], chmod=True)
            verifier = Verifier(task=task, trial_paths=paths, environment=environment)
            result = await asyncio.wait_for(verifier.verify(), timeout=timeout)
        rewards = dict(result.rewards or {})
        outcome.rewards = rewards
        try:
            outcome.reward = scalar_reward(rewards, reward_source(paths.verifier_dir))
        except RewardError as exc:
            outcome.error = f"verifier: {exc}"
        else:
            if outcome.reward is None:
                outcome.error = f"verifier wrote no reward ({reward_source(paths.verifier_dir)})"
    except asyncio.TimeoutError:
        outcome.timed_out, outcome.error = True, f"verifier timed out after {timeout:g} s"
    except Exception as exc:
        outcome.error = f"verifier: {type(exc).__name__}: {exc}"
    finally:
        outcome.duration_s = time.monotonic() - t0
        try:
            if paths.test_stdout_path.is_file():
                outcome.output_tail = paths.test_stdout_path.read_text(errors="replace")[-2000:]
        except OSError:
            pass
        if tmp is not None:
            tmp.cleanup()
    broken = None
    if outcome.reward is None and not outcome.timed_out:
        # a verifier fault: the agent's doing when it left no usable /logs or no working sandbox
        broken = await verifier_paths_broken(environment)
        health = _sandbox_health(environment)
        if broken is None and health is not None and health.alive and health.limits_hit:
            # the sandbox works again now, but it ran out of its own limits (a fork bomb's pids come
            # back once its forks die): the fault followed what the agent did
            broken = "the verifier could not run after the agent's commands"
        if broken is not None:
            agent, why = blame_breakage(environment, broken)
            broken = why if agent else None
            outcome.error = f"{outcome.error}; {why}"
            outcome.broken_by_agent = broken
    if trajectory is not None and broken is not None:
        mark_broken(trajectory, broken)
    elif trajectory is not None:
        trajectory.set_reward(outcome.reward, error=outcome.error, timed_out=outcome.timed_out)
        trajectory.metadata["verifier_output_tail"] = outcome.output_tail
        if outcome.rewards:
            trajectory.metadata["verifier_rewards"] = outcome.rewards
    return outcome
