"""``ReTermAgent``: this kit's harness as a Harbor agent, for Harbor's trial and job machinery.

    harbor run -p tasks/X -a reterm.agent.harbor:ReTermAgent \\
        -e reterm.sandbox.local:LocalEnvironment --ak policy=smollm2

runs :func:`reterm.agent.episode.run_episode` (same prompt, parser, terminal and observation format
as data generation, training and the Space) inside a Harbor trial. Harbor starts the environment,
calls :meth:`ReTermAgent.run`, then runs the verifier itself; this agent does not verify. The trial's
``agent/`` folder receives ``trajectory.json`` (ATIF, rewritten after every step, so a trial cut by
Harbor's agent timeout still has it) and ``reterm_trajectory.json`` (this kit's JSON).

Agent kwargs (``--ak KEY=VALUE``): ``policy`` (a :func:`reterm.policies.load_policy` spec: ``smollm2``,
``hf:<path-or-id>``, ``openai:<model>``, ``oracle``; default: Harbor's ``-m`` model name, else
``smollm2``), ``base_url`` (for ``openai:``), ``max_turns``, ``command_timeout`` (seconds),
``time_budget`` (seconds; default the task's ``[agent] timeout_sec`` less a margin so the episode ends
before Harbor cancels it), ``max_consecutive_parse_errors`` (default
:data:`reterm.generation.MAX_CONSECUTIVE_PARSE_ERRORS`: the episode stops with stop reason ``parse_errors``
after that many replies in a row without a valid tool call; ``0`` never stops), ``progress`` (default true:
one line per turn on stderr, ``[reterm] TASK turn K/N  S s  $ COMMAND``), ``policy_kwargs`` (a JSON object
passed to the policy, e.g. sampling parameters; a generating policy gets the kit's shared defaults,
:func:`reterm.generation.policy_defaults`: ``temperature`` 0 and ``max_new_tokens``
:data:`reterm.generation.MAX_TURN_TOKENS`, the evaluation's, unless given here).

Importing this module applies the shared thread policy (``OMP_WAIT_POLICY=PASSIVE`` unless set:
:func:`reterm.generation.apply_thread_policy`), as Harbor loads the agent before the policy loads torch.

Offline, LiteLLM retries fetching its model-cost map for about 19 s per run (warnings after the
results) unless ``LITELLM_LOCAL_MODEL_COST_MAP=True``: the kit's entry points (``reterm``,
``train/run_all.sh``, ``reterm.eval.run``, the Space) set it, and so does importing this module (Harbor loads
the agent before it imports LiteLLM), unless the caller chose a value.

An episode in which the agent broke its sandbox (docs/SCORING.md) returns normally with
``broken_by_agent`` in the agent metadata, so the evaluation scores it as a failure although Harbor's
verifier then fails. Infrastructure faults of the episode (model endpoint, sandbox, harness) are
raised after the trajectory is written, so Harbor records them in ``result.json`` (``exception_info``) and
:func:`reterm.agent.trial_outcome.classify_trial` keeps them out of the scores.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from harbor.agents.base import BaseAgent
from harbor.agents.capabilities import AgentCapabilities
from harbor.environments.base import BaseEnvironment
from harbor.models.agent.context import AgentContext

from reterm.agent.atif import AGENT_NAME, _version, write_trial_files
from reterm.agent.episode import BROKEN_KEY, DEFAULT_MAX_TURNS, EpisodeSpec, run_episodes
from reterm.generation import MAX_CONSECUTIVE_PARSE_ERRORS, apply_thread_policy, policy_defaults
from reterm.policies import load_policy
from reterm.trajectory import Step, Trajectory

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # see the module docstring
apply_thread_policy()

# Replies in a row without a valid tool call after which an episode stops (stop reason "parse_errors"):
# the kit's shared default (reterm.generation).
DEFAULT_MAX_CONSECUTIVE_PARSE_ERRORS = MAX_CONSECUTIVE_PARSE_ERRORS

# Seconds kept between the episode's own time budget and the task's agent timeout (Harbor's cut).
BUDGET_MARGIN_S = 15.0

_POLICIES: dict[str, Any] = {}  # policies by spec + kwargs: a job's trials share one loaded model


class EpisodeFault(RuntimeError):
    """An infrastructure fault ended the episode (raised to Harbor after the trajectory is written).

    The message starts with the :class:`reterm.trajectory.Outcome` value (``endpoint_error: ...``).
    """


_POLICIES_LOCK = threading.Lock()


def _load_policy(spec: str, kwargs: dict[str, Any]) -> Any:
    """The process-wide policy for ``(spec, kwargs)``, loaded once.

    Trials of one Harbor job call ``setup`` concurrently (in threads); transformers' loading is not
    thread-safe ("Cannot copy out of meta tensor"), so the cache miss is serialised by a lock.
    """

    key = json.dumps([spec, kwargs], sort_keys=True, default=str)
    with _POLICIES_LOCK:
        if key not in _POLICIES:
            _POLICIES[key] = load_policy(spec, **kwargs)
        return _POLICIES[key]


def progress_line(task: str, step: Step, max_turns: int, elapsed_s: float) -> str:
    """One turn as a progress line: ``[reterm] TASK turn K/N  S s (T s in all)  WHAT`` where S is the
    turn's generation plus execution seconds and WHAT is ``$ COMMAND`` (first line, at most 100
    characters), ``submit``, or ``parse error: OUTCOME``."""
    if step.action is None:
        what = f"parse error: {step.parse_error or 'unknown'}"
    elif step.action.tool == "submit":
        what = "submit"
    else:
        lines = (step.action.command or "").splitlines() or [""]
        what = "$ " + lines[0][:100] + (" ..." if len(lines) > 1 or len(lines[0]) > 100 else "")
    seconds = step.generation_s + step.execution_s
    return f"[reterm] {task} turn {step.index + 1}/{max_turns}  {seconds:.1f} s ({elapsed_s:.0f} s in all)  {what}"


class ReTermAgent(BaseAgent):
    """This kit's one harness as a Harbor ``BaseAgent`` (see the module docstring for the kwargs)."""

    capabilities = AgentCapabilities(atif=True, base_url=True)

    def __init__(
        self,
        logs_dir: Path,
        model_name: str | None = None,
        *,
        policy: str | None = None,
        base_url: str | None = None,
        max_turns: int | str = DEFAULT_MAX_TURNS,
        command_timeout: float | str | None = None,
        time_budget: float | str | None = None,
        max_consecutive_parse_errors: int | str | None = DEFAULT_MAX_CONSECUTIVE_PARSE_ERRORS,
        progress: bool | str = True,
        policy_kwargs: dict[str, Any] | str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(logs_dir=logs_dir, model_name=model_name, **kwargs)
        self.policy_spec = policy or model_name or "smollm2"
        if isinstance(policy_kwargs, str):
            try:
                policy_kwargs = json.loads(policy_kwargs)
            except ValueError as exc:
                raise ValueError(f"ReTermAgent: policy_kwargs is not a JSON object: {policy_kwargs!r}") from exc
        if policy_kwargs is not None and not isinstance(policy_kwargs, dict):
            raise ValueError(f"ReTermAgent: policy_kwargs must be a JSON object, got {policy_kwargs!r}")
        self.policy_kwargs: dict[str, Any] = policy_defaults(self.policy_spec, **(policy_kwargs or {}))
        if base_url:
            self.policy_kwargs["base_url"] = base_url
        self.max_turns = int(max_turns)
        self.command_timeout = float(command_timeout) if command_timeout not in (None, "") else None
        self.time_budget = float(time_budget) if time_budget not in (None, "") else None
        limit = max_consecutive_parse_errors
        limit = DEFAULT_MAX_CONSECUTIVE_PARSE_ERRORS if limit in (None, "") else int(limit)
        if limit < 0:
            raise ValueError(f"ReTermAgent: max_consecutive_parse_errors must be >= 0 (0: never stop), got {limit}")
        self.max_consecutive_parse_errors = limit or None
        if isinstance(progress, str):
            if progress.strip().lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(f"ReTermAgent: progress must be true or false, got {progress!r}")
            progress = progress.strip().lower() in ("true", "1", "yes")
        self.progress = bool(progress)
        self.trajectory: Trajectory | None = None
        self.policy: Any = None

    @staticmethod
    def name() -> str:
        return AGENT_NAME

    @classmethod
    def resolve_model_connection_config(cls, model_name: str | None, resolve_env: Any, **kwargs: Any) -> Any:
        """Harbor's connection hook: this agent's connection is the policy's own (``base_url`` goes to an
        ``openai:`` policy), so Harbor resolves nothing (the hook Harbor documents for adapters with
        their own connection configuration)."""
        from harbor.agents.agent_auth_resolution import ResolvedModelConnection

        base_url = kwargs.get("base_url") or kwargs.get("base_url_from_kwargs")
        return ResolvedModelConnection(can_configure_base_url=True, user_supplied_base_url=base_url)

    def version(self) -> str:
        return _version()

    async def set_web_tools_disabled(self, disabled: bool, environment: BaseEnvironment) -> None:
        """Nothing to disable: this harness has no web tools (only ``bash`` and ``submit``), and the
        environment's network policy applies to its commands. Harbor's default logs an ERROR line
        ("exposes no native web search or fetch tools") in every trial, which read as a failure."""

    async def setup(self, environment: BaseEnvironment) -> None:
        """Load the policy (in Harbor's setup phase, so model loading does not eat the agent's time).
        The terminal session checks for tmux when it starts."""
        import asyncio

        task = self._task(environment)
        kwargs = dict(self.policy_kwargs)
        if self.policy_spec == "oracle":
            kwargs.setdefault("tasks", task.paths.task_dir)
        self.policy = await asyncio.to_thread(_load_policy, self.policy_spec, kwargs)

    def _task(self, environment: BaseEnvironment) -> Any:
        from harbor.models.task.task import Task

        env_dir = Path(getattr(environment, "environment_dir", "") or "")
        for candidate in (env_dir.parent, env_dir):
            if (candidate / "task.toml").is_file():
                return Task(candidate)
        raise ValueError(f"ReTermAgent: cannot find the task folder from the environment folder {env_dir}")

    async def run(self, instruction: str, environment: BaseEnvironment, context: AgentContext) -> None:
        """Run one episode in ``environment`` and write its trajectory into the trial's ``agent/`` folder.

        The trajectory files are rewritten after every step and once more when the run ends, also
        when Harbor cancels it at the agent timeout (stop reason ``time_budget``).
        Raises :class:`EpisodeFault` (after writing) when an infrastructure fault ended the episode.
        """
        task = self._task(environment)
        if self.policy is None:
            await self.setup(environment)
        budget = self.time_budget
        if budget is None and task.config.agent.timeout_sec:
            timeout = float(task.config.agent.timeout_sec)
            budget = max(timeout * 0.5, timeout - BUDGET_MARGIN_S)
        self.logs_dir.mkdir(parents=True, exist_ok=True)

        def on_start(trajs: list[Trajectory]) -> None:
            self.trajectory = trajs[0]
            write_trial_files(self.trajectory, self.logs_dir)

        started = time.monotonic()

        def on_step(_: int, traj: Trajectory, step: Step) -> None:
            write_trial_files(traj, self.logs_dir)
            if self.progress:
                print(progress_line(task.name, step, self.max_turns, time.monotonic() - started),
                      file=sys.stderr, flush=True)  # fmt: skip

        spec = EpisodeSpec(environment, task, instruction=instruction,
                           metadata={"session_id": self.session_id, "harbor_agent": True})  # fmt: skip
        try:
            (traj,) = await run_episodes(
                self.policy, [spec], max_turns=self.max_turns, time_budget_s=budget,
                command_timeout_s=self.command_timeout,
                max_consecutive_parse_errors=self.max_consecutive_parse_errors,
                verify=False, on_step=on_step, on_start=on_start,
            )  # fmt: skip
        except BaseException:  # cancelled at Harbor's agent timeout (or worse): keep what was done
            if self.trajectory is not None:
                if self.trajectory.stop_reason is None:
                    self.trajectory.stop_reason = "time_budget"
                write_trial_files(self.trajectory, self.logs_dir)
            raise
        self.trajectory = traj
        write_trial_files(traj, self.logs_dir)
        prompt = [s.prompt_tokens for s in traj.steps if s.prompt_tokens is not None]
        completion = [s.completion_tokens for s in traj.steps if s.completion_tokens is not None]
        context.n_input_tokens = sum(prompt) if prompt else None
        context.n_output_tokens = sum(completion) if completion else None
        context.metadata = {
            "policy": traj.policy,
            "stop_reason": traj.stop_reason,
            "outcome": traj.outcome.value,
            "turns": traj.metadata.get("turns"),
            "parse_outcomes": traj.metadata.get("parse_outcomes"),
        }
        if traj.metadata.get(BROKEN_KEY):
            # the agent broke its sandbox: Harbor's verifier will fail next, and the evaluation
            # (reterm.agent.trial_outcome.classify_trial) scores the trial as this agent failure, reward 0
            context.metadata[BROKEN_KEY] = traj.metadata[BROKEN_KEY]
        if traj.outcome.is_infra_fault:
            raise EpisodeFault(f"{traj.outcome.value}: {traj.error}")
