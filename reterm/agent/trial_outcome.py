"""The kit's outcome of a Harbor trial: :func:`classify_trial` turns a ``result.json``
(:class:`harbor.models.trial.result.TrialResult`) into one :class:`reterm.trajectory.Outcome` and a reward.

Used wherever a Harbor trial is read back: trajectories from job folders (:mod:`reterm.agent.atif`), the
data pipeline's rollouts and the evaluation's scores (:mod:`reterm.eval.metrics`); only agent outcomes
(``SUCCESS``/``FAILURE``) are scored, infrastructure faults are counted apart. :func:`score_trial` gives one
trial's :class:`TrialScore` (``reterm tasks verify`` and the evaluation's reports read it).

Rules (and where they come from)
--------------------------------
* **Which exceptions are infrastructure faults.** Harbor's own error table
  (:mod:`harbor.models.trial.error_policy`, ``ErrorPolicy.has_valid_reward``) decides, with the job's
  ``override_error_policy`` applied. ``has_valid_reward=False`` types are faults: environment build/start
  failures and timeouts (``SandboxBuildFailedError``, ``EnvironmentStartTimeoutError``,
  ``AgentSetupTimeoutError``, ``HealthcheckError``, out-of-memory...), model-endpoint errors (``ApiError``,
  litellm's ``RateLimitError``...), verifier faults (``VerifierTimeoutError``, ``RewardFileNotFoundError``
  = the missing reward file, ``RewardFileEmptyError``, ``VerifierOutputParseError``) and cancellations.
  Exception types Harbor does not know (a crash of an agent harness, this kit's
  :class:`reterm.policies.base.EndpointError`) are faults too; Harbor would score them, but a crash of
  the harness is not the agent's failure (project rule: faults are never failures). This kit's
  ``EpisodeFault`` names its fault outcome (``sandbox_error: ...``, ``endpoint_error: ...``).
* **Agent timeouts are failures.** ``AgentTimeoutError`` (and the other exceptions Harbor marks
  ``has_valid_reward=True``: non-zero agent exit, context window exceeded, refusals) are agent outcomes:
  the verifier still runs and its reward decides; no reward counts as 0. This is Terminal-Bench's rule:
  its leaderboard query keeps ``AgentTimeoutError`` trials and scores them ``COALESCE(reward, 0)``
  (laude-institute/terminal-bench-experiments, ``sql/get_agent_scores_and_costs.sql``).
  Difference to that query: it also scores ``VerifierTimeoutError`` as 0; here (as in Harbor's table)
  a verifier timeout is a fault, reported in ``infra_faults`` so a reader can redo the other count.
* **A trial without exception but without a reward** is a verifier fault (Harbor: "a missing reward
  file is an error, not a zero").
* **Pass**: the reward (the ``reward`` key of ``verifier_result.rewards``, or its only key) is at least
  :data:`reterm.trajectory.PASS_THRESHOLD` (1.0; Terminal-Bench rewards are 0/1).
* **What the agent breaks is its failure** (docs/SCORING.md): a trial whose agent recorded
  ``broken_by_agent`` (the sandbox stopped working after one of its commands, or ``/logs`` was made
  unusable) is a ``FAILURE`` with reward 0 even though Harbor's verifier then failed; the report counts
  these apart (``broken_by_agent``).
* **A task that needs more network than the trial had is not the agent's failure.** A trial that did not
  pass, whose verifier (or, for Harbor's ``oracle`` agent, whose reference solution) ran in a phase whose
  policy asked for the public network and failed to reach a host, is a ``NETWORK_ERROR`` naming the hosts
  (:func:`network_fault`): from the look-ups the local sandbox recorded while offline
  (``<trial>/reterm-network.jsonl``, :mod:`reterm.sandbox.network`), the packages the offline verifier shim
  could not install (``verifier/reterm-shim-missing.txt``), and the error messages in the verifier's output
  and the oracle's log. A ``no-network`` phase never counts, and what the *agent* fails to reach in its own
  phase stays its failure (the kit's tasks need no network; an agent that tries ``pip install`` offline must
  recover). The local sandbox applies the same rule while the trial runs and raises
  ``NetworkUnreachableError`` after the verifier, so Harbor's own ``result.json`` records the fault
  (``exception_info``) with no reward (:mod:`reterm.sandbox.faults`); this module maps that type to
  ``NETWORK_ERROR``.
* **A reward that cannot be scored** (several keys and none named ``reward``, outside [0, 1]; the one
  reader :func:`reterm.rewards.scalar_reward`) is a verifier fault of that trial only
  (``exception_type`` ``RewardError``, the message naming the file and the value); the report goes on.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from harbor.models.trial.error_policy import ERROR_POLICIES
from harbor.models.trial.result import ExceptionInfo, TimingInfo, TrialResult

from reterm.rewards import RewardError, reward_source, scalar_reward
from reterm.sandbox.faults import phase_network_fault
from reterm.trajectory import PASS_THRESHOLD, Outcome

# Harbor exception type -> fault outcome. Types not listed here but marked has_valid_reward=False by
# Harbor's table map through _FAULT_BY_GROUP below; types unknown to Harbor are harness errors.
_FAULT_OUTCOME: dict[str, Outcome] = {
    "EnvironmentStartTimeoutError": Outcome.ENVIRONMENT_TIMEOUT,
    "AgentSetupTimeoutError": Outcome.ENVIRONMENT_TIMEOUT,
    "VerifierTimeoutError": Outcome.VERIFIER_TIMEOUT,
    "RewardFileNotFoundError": Outcome.VERIFIER_ERROR,
    "RewardFileEmptyError": Outcome.VERIFIER_ERROR,
    "VerifierOutputParseError": Outcome.VERIFIER_ERROR,
    "AddTestsDirError": Outcome.VERIFIER_ERROR,
    "DownloadVerifierDirError": Outcome.VERIFIER_ERROR,
    "CancelledError": Outcome.HARNESS_ERROR,
    "RegradeError": Outcome.HARNESS_ERROR,
    "MissingExtraError": Outcome.HARNESS_ERROR,
    "DspyImportError": Outcome.HARNESS_ERROR,
    # this kit's policy backends (reterm.policies.base.EndpointError)
    "EndpointError": Outcome.ENDPOINT_ERROR,
    # the local sandbox: a verifier or reference solution lacked a host (reterm.sandbox.faults)
    "NetworkUnreachableError": Outcome.NETWORK_ERROR,
    # the local sandbox: a verifier or reference solution pinned what its stand-in base lacks (reterm.sandbox.faults)
    "StandInBaseError": Outcome.SANDBOX_ERROR,
    # the local sandbox: the reference solution filled the in-memory writable layer (reterm.sandbox.faults)
    "WritableLayerFullError": Outcome.SANDBOX_ERROR,
}
_ENVIRONMENT_ERRORS = {
    "SandboxBuildFailedError",
    "HealthcheckError",
    "SandboxLikelyOutOfMemoryError",
    "MemoryLimitExceededError",
    "SSHAccessError",
    "GKEExecStreamClosedError",
    "GKEPodNotFoundError",
    "RuntimeRequestError",
    "ServiceOperationsUnsupportedError",
    "VercelScopeError",
}


def _fault_outcome(exception_type: str, message: str = "") -> Outcome:
    """The fault outcome of a Harbor exception type Harbor marks as not scorable (or does not know).

    ``EpisodeFault`` (raised by :class:`reterm.agent.harbor.ReTermAgent`) carries the episode's fault
    outcome as the prefix of its message (``"endpoint_error: ..."``).
    """
    if exception_type == "EpisodeFault":
        prefix = message.split(":", 1)[0].strip()
        if prefix in {o.value for o in Outcome} and Outcome(prefix).is_infra_fault:
            return Outcome(prefix)
        return Outcome.HARNESS_ERROR
    if exception_type in _FAULT_OUTCOME:
        return _FAULT_OUTCOME[exception_type]
    if exception_type in _ENVIRONMENT_ERRORS:
        return Outcome.SANDBOX_ERROR
    if exception_type in ERROR_POLICIES:  # the rest of Harbor's non-scorable table: model API errors
        return Outcome.ENDPOINT_ERROR
    return Outcome.HARNESS_ERROR


def _is_agent_outcome(exc: ExceptionInfo) -> bool:
    """True when Harbor scores a trial that raised ``exc`` (e.g. ``AgentTimeoutError``) and knows the type."""
    return exc.exception_type in ERROR_POLICIES and exc.policy.has_valid_reward


def task_name(result: TrialResult) -> str:
    """The task's name without its org prefix (``reterm/semver-sort`` -> ``semver-sort``), as the task
    folders and ``tasks/splits.json`` name it."""
    return result.task_name.split("/")[-1]


def reward_of(result: TrialResult, trial_dir: str | Path | None = None) -> float | None:
    """The checked scalar reward of a trial (:func:`reterm.rewards.scalar_reward`): ``rewards["reward"]``,
    or the only value; ``None`` when absent.

    Raises :class:`reterm.rewards.RewardError` naming the reward file (``trial_dir/verifier/...``, else
    the trial) and the value when several rewards are given and none is called ``reward``, or the
    value is not a number in [0, 1].
    """
    rewards = result.verifier_result.rewards if result.verifier_result else None
    where = f"trial {result.trial_name}: reward file"
    source = reward_source(Path(trial_dir) / "verifier" if trial_dir is not None else None, fallback=where)
    if source != where:
        source = f"trial {result.trial_name}: {source}"
    return scalar_reward(rewards, source)


def broken_by_agent(result: TrialResult) -> str | None:
    """What the agent broke in its sandbox, as this kit's agent recorded it in Harbor's agent metadata
    (``broken_by_agent``; docs/SCORING.md), or ``None``."""
    meta = result.agent_result.metadata if result.agent_result else None
    value = (meta or {}).get("broken_by_agent")
    return str(value) if value else None


def _window(timing: TimingInfo | None) -> tuple[float, float] | None:
    if timing is None or timing.started_at is None:
        return None
    end = timing.finished_at or datetime.now(tz=timing.started_at.tzinfo)
    return timing.started_at.timestamp(), end.timestamp()


def network_fault(result: TrialResult, trial_dir: str | Path | None) -> str | None:
    """Why a trial's verifier or reference solution lacked the network its task asked for, naming hosts and
    packages, or ``None`` (:func:`reterm.sandbox.faults.phase_network_fault`, the rule the local sandbox also
    applies when it raises :class:`~reterm.sandbox.faults.NetworkUnreachableError` for Harbor).

    Phases: the verifier (``verifier/test-stdout.txt``), and for Harbor's ``oracle`` agent the reference
    solution (``agent/oracle.txt``), each over its window in ``result``. Returns e.g.
    ``"verifier could not reach: astral.sh, pypi.org"``.
    """
    if trial_dir is None:
        return None
    trial_dir = Path(trial_dir)
    phases = [("verifier", _window(result.verifier), trial_dir / "verifier" / "test-stdout.txt")]
    if result.agent_info.name == "oracle":
        phases.insert(0, ("solution", _window(result.agent_execution), trial_dir / "agent" / "oracle.txt"))
    return phase_network_fault(trial_dir, phases)


def classify_trial(result: TrialResult, trial_dir: str | Path | None = None) -> tuple[Outcome, float | None]:
    """Classify a Harbor trial result into ``(outcome, reward)`` by the rules of this module's docstring.

    A trial whose agent broke its sandbox (:func:`broken_by_agent`) is a ``FAILURE`` with reward 0,
    whatever the verifier did next. A reward that cannot be scored (:class:`reterm.rewards.RewardError`)
    makes the trial a verifier fault (``VERIFIER_ERROR``, no reward); :func:`score_trial` keeps its message.
    """
    outcome, reward = _classify(result, trial_dir)
    if outcome in (Outcome.FAILURE, Outcome.VERIFIER_ERROR) and not broken_by_agent(result):
        if network_fault(result, trial_dir):
            return Outcome.NETWORK_ERROR, None
    return outcome, reward


def _classify(result: TrialResult, trial_dir: str | Path | None) -> tuple[Outcome, float | None]:
    exceptions = result.recorded_exceptions()
    if broken_by_agent(result):
        return Outcome.FAILURE, 0.0
    try:
        reward = reward_of(result, trial_dir)
    except RewardError:
        return Outcome.VERIFIER_ERROR, None
    for exc in exceptions:
        if not _is_agent_outcome(exc):
            return _fault_outcome(exc.exception_type, exc.exception_message), reward
    if exceptions:  # agent outcomes only (agent timeout, context exceeded...): no reward counts as 0
        reward = 0.0 if reward is None else reward
    elif reward is None:
        return Outcome.VERIFIER_ERROR, None
    return (Outcome.SUCCESS if reward >= PASS_THRESHOLD else Outcome.FAILURE), reward


@dataclass
class TrialScore:
    """One Harbor trial, classified.

    ``outcome`` is ``SUCCESS``/``FAILURE`` for scored trials, a fault outcome otherwise
    (``Outcome.is_infra_fault``). ``reward`` is the verifier's reward (``None`` when there was none).
    ``exception_type`` is Harbor's first recorded exception type, ``agent_timed_out`` marks
    ``AgentTimeoutError``. ``agent_s`` is the agent phase's wall time in seconds (``None`` if it did not run).
    """

    task: str
    trial: str
    trial_dir: str
    agent: str
    model: str | None
    outcome: Outcome
    reward: float | None
    exception_type: str | None = None
    exception_message: str | None = None
    agent_timed_out: bool = False
    agent_s: float | None = None
    broken_by_agent: str | None = None

    @property
    def scored(self) -> bool:
        """True for agent outcomes (counted in Pass@1), False for infrastructure faults."""
        return not self.outcome.is_infra_fault

    @property
    def passed(self) -> bool:
        return self.outcome is Outcome.SUCCESS


def score_trial(result: TrialResult, trial_dir: str | Path) -> TrialScore:
    """A :class:`TrialScore` from a trial result (see :func:`classify_trial`)."""
    outcome, reward = classify_trial(result, trial_dir)
    exceptions = result.recorded_exceptions()
    first = exceptions[0] if exceptions else None
    exception_type = first.exception_type if first else None
    exception_message = first.exception_message[:500] if first else None
    try:
        reward_of(result, trial_dir)
    except RewardError as exc:  # the trial's own fault; the rest of the report goes on
        exception_type, exception_message = "RewardError", str(exc)[:500]
    if outcome is Outcome.NETWORK_ERROR and exception_type != "NetworkUnreachableError":
        # the task needed more network than the trial had: name the hosts (the local sandbox's own
        # NetworkUnreachableError already does, in Harbor's result.json)
        exception_type, exception_message = "NetworkUnreachableError", (network_fault(result, trial_dir) or "")[:500]
    timing = result.agent_execution
    agent_s = None
    if timing and timing.started_at and timing.finished_at:
        agent_s = (timing.finished_at - timing.started_at).total_seconds()
    return TrialScore(
        task=task_name(result),
        trial=result.trial_name,
        trial_dir=str(trial_dir),
        agent=result.agent_info.name,
        model=result.agent_info.model_info.name if result.agent_info.model_info else None,
        outcome=outcome,
        reward=reward,
        exception_type=exception_type,
        exception_message=exception_message,
        agent_timed_out=any(e.exception_type == "AgentTimeoutError" for e in exceptions),
        agent_s=agent_s,
        broken_by_agent=broken_by_agent(result),
    )
