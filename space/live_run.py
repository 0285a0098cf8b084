"""Live mode of the Space: run the agent on a task in the local sandbox, and when it fails, fork the
sandbox and run G recovery attempts side by side.

One run (:class:`LiveRun`):

1. Start the task's sandbox (:class:`reterm.sandbox.local.LocalEnvironment`) and a terminal session.
   Optionally type a user-given first command (a mistake to recover from, e.g. ``pip install pandas``
   offline) through the harness as a scripted turn; it is marked ``extra["injected"]``.
2. The policy acts one turn at a time, each turn one call of the kit's one harness
   (:func:`reterm.agent.episode.run_episodes` with the steps so far as history and the same terminal
   session), so prompts, parsing and observations are exactly those of training and evaluation.
   After every step :func:`reterm.recovery.localise` (rules) looks at the new step; the first failure
   state stops the episode there.
3. At the failure state the sandbox is snapshotted and forked by the kit's one rebuild
   (:func:`reterm.recovery.materialize.materialize`, method ``snapshot``: files only; the terminal's
   cwd and exports come back from its saved state) into G sandboxes, and G recovery attempts continue
   from the failure prefix in lock-step (one ``run_episodes`` call; a local model generates the G turns
   as one batch). Each attempt's verifier runs at the end. If the episode ends without a step failing
   (e.g. a premature submit) the end state is snapshotted before the verifier runs; when the verifier
   fails and localisation finds a failure state, the attempts start from that snapshot.
4. Every sandbox is stopped at the end, on errors and on cancellation (the Stop button, or
   :meth:`LiveRun.cancel` when the browser session ends): no further model turn starts, sandbox starts
   and forks are allowed to finish before being torn down, so a cancel never orphans one.

The run's state (:class:`LiveState`) is rendered after every event; its timeline has one line per turn
(``turn k/N · S s · $ COMMAND``). The run is saved after every step (and at its end, cancelled or not)
as trajectory files (``main.json``, ``attempts/attempt-K.json``) that replay mode opens as a fan-out.

Inputs are checked by :func:`validate_request` (unknown task, empty instruction, too many forks, an
unreachable endpoint...). :func:`sandbox_availability` decides whether live mode is offered at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from reterm.recovery.materialize import materialize
from reterm.recovery.state import Level, Source, State
from reterm.trajectory import Outcome, Step, Trajectory

MAX_FORKS = 8
"""Most recovery attempts per failure state (each is a sandbox and a sequence in the generation batch)."""
MAX_TURNS = 30
"""Most turns per episode or attempt the app accepts."""

MODEL_CHOICES = {
    "smollm2": "SmolLM2-135M-Instruct (embedded default, CPU)",
    "oracle": "scripted oracle (replays the task's solution/solve.sh)",
    "checkpoint": "a local checkpoint or Hub model (transformers)",
    "endpoint": "an OpenAI-compatible endpoint (vLLM, reterm serve, ...)",
}


# ============================================================================ availability
def sandbox_availability() -> tuple[bool, str]:
    """Whether this host can run the local sandbox, and a sentence saying why not (or what to expect).

    Uses the sandbox's own checks (:meth:`LocalEnvironment.preflight`: host tools, root;
    :func:`reterm.sandbox.preflight.missing_capabilities`). ``RETERM_SPACE_LIVE=0`` turns live mode off.
    """
    if os.environ.get("RETERM_SPACE_LIVE", "").strip().lower() in ("0", "false", "off", "no"):
        return False, "Live mode is turned off on this host (RETERM_SPACE_LIVE=0). Replay mode works."
    try:
        from reterm.sandbox.local import LocalEnvironment
        from reterm.sandbox.preflight import missing_capabilities

        LocalEnvironment.preflight()
        if os.geteuid() == 0 and (caps := missing_capabilities()):
            return False, (f"Live mode needs the local sandbox, which needs {', '.join(caps)}; this host (an "
                           "unprivileged container, e.g. a Hugging Face Space) does not give them. Replay mode works; "
                           "run the app on your own machine (`python space/app.py`) for live runs.")  # fmt: skip
    except SystemExit as exc:
        return False, (f"Live mode is off: this host cannot run the local sandbox ({exc}). Replay mode works; "
                       "run the app on a machine with root and bubblewrap (`python space/app.py`) for live runs.")  # fmt: skip
    except Exception as exc:  # an unexpected probe failure: say it, do not crash the app
        return False, f"Live mode is off: the sandbox check failed ({type(exc).__name__}: {exc})."
    from reterm.sandbox.base_image import find_base

    if find_base() is None:
        return True, ("The sandbox's base image is not built yet: the first live run builds it "
                      "(debootstrap, about a minute, needs the Debian mirror).")  # fmt: skip
    return True, ""


# ================================================================================== tasks
def list_tasks(roots: list[Path]) -> dict[str, tuple[Path, str]]:
    """Task folders under ``roots``: ``{task name: (folder, split)}`` (split from ``splits.json``, else "").

    The first root wins when two roots hold a task of the same name.
    """
    tasks: dict[str, tuple[Path, str]] = {}
    for root in roots:
        if not root.is_dir():
            continue
        split_of: dict[str, str] = {}
        splits = root / "splits.json"
        if splits.is_file():
            try:
                data = json.loads(splits.read_text())
                for split in ("train", "test"):
                    for name in data.get(split, []):
                        split_of[name] = split
            except (OSError, ValueError):
                pass
        for d in sorted(root.iterdir()):
            if (d / "task.toml").is_file() and d.name not in tasks:
                tasks[d.name] = (d, split_of.get(d.name, ""))
    return tasks


def read_instruction(task_dir: Path) -> str:
    """The task's instruction as Harbor reads it (``instruction.md``), or "" when unreadable."""
    try:
        from harbor.models.task.task import Task

        return Task(task_dir, disable_verification=True).instruction
    except Exception:
        try:
            return (task_dir / "instruction.md").read_text()
        except OSError:
            return ""


# ============================================================================= validation
@dataclass
class LiveRequest:
    """A validated live run.

    Attributes:
        task_dir, task_id: the Harbor task folder and its name.
        instruction: what the model is told.
        model: ``smollm2`` | ``oracle`` | ``checkpoint`` | ``endpoint``; ``policy_spec`` is the
            :func:`reterm.policies.load_policy` spec, ``policy_kwargs`` its keywords.
        forks: recovery attempts at the failure state (0: run the agent only).
        max_turns / recovery_turns: turns of the episode / of each attempt.
        temperature, max_new_tokens: sampling of generating models.
        first_command: typed before the model's first turn ("" for none).
        command_timeout_s: a command's timeout when the model gives none.
    """

    task_dir: Path
    task_id: str
    instruction: str
    model: str
    policy_spec: str
    policy_kwargs: dict[str, Any] = field(default_factory=dict)
    forks: int = 3
    max_turns: int = 8
    recovery_turns: int = 8
    temperature: float = 0.7
    max_new_tokens: int = 256
    first_command: str = ""
    command_timeout_s: float | None = None


def check_endpoint(base_url: str, model: str, timeout_s: float = 5.0) -> None:
    """Check that an OpenAI-compatible server answers ``GET {base_url}/models`` and serves ``model``.

    Raises ``ValueError`` naming the URL: not reachable, an HTTP error, or ``model`` not in its list.
    """
    import httpx

    url = base_url.rstrip("/") + "/models"
    key = os.environ.get("OPENAI_API_KEY") or "EMPTY"
    try:
        r = httpx.get(url, timeout=timeout_s, headers={"Authorization": f"Bearer {key}"})
    except httpx.HTTPError as exc:
        raise ValueError(f"cannot reach the endpoint {base_url} ({type(exc).__name__}: {exc}); "
                         "is the server running (e.g. `reterm serve smollm2` or vLLM)?") from exc  # fmt: skip
    if r.status_code != 200:
        raise ValueError(f"the endpoint {base_url} answered GET /models with HTTP {r.status_code}: {r.text[:200]}")
    try:
        served = [m.get("id") for m in r.json().get("data", [])]
    except (ValueError, AttributeError):
        raise ValueError(f"the endpoint {base_url} is not OpenAI-compatible (GET /models is not a model list)") from None
    if served and model not in served and not os.environ.get("RETERM_SPACE_ANY_MODEL"):
        raise ValueError(f"the endpoint {base_url} does not serve {model!r}; it serves: {', '.join(map(str, served))}")


def validate_request(
    *,
    task: str,
    task_folder: str = "",
    instruction: str = "",
    model: str = "smollm2",
    checkpoint: str = "",
    base_url: str = "",
    endpoint_model: str = "",
    forks: int = 3,
    max_turns: int = 8,
    recovery_turns: int = 8,
    temperature: float = 0.7,
    max_new_tokens: int = 256,
    first_command: str = "",
    task_roots: list[Path],
    allow_local_paths: bool = True,
    max_forks: int = MAX_FORKS,
    extra_models: list[str] | None = None,
    check_endpoints: bool = True,
) -> LiveRequest:
    """Check the live-mode inputs and turn them into a :class:`LiveRequest`.

    ``task`` is a suite task name (from ``task_roots``), or ``""`` with ``task_folder`` a local task
    folder (only with ``allow_local_paths``), in which case ``instruction`` must not be empty.
    ``model`` is a key of :data:`MODEL_CHOICES` or one of ``extra_models`` (``hf:<Hub id>`` entries the
    host offers, e.g. the 9B model on a ZeroGPU Space).

    Raises:
        ValueError: with a message for the UI: unknown task, not a task folder, local folders not
            allowed, empty instruction, forks outside ``0..max_forks``, turns outside ``1..MAX_TURNS``,
            an unknown model choice, a missing checkpoint, an unreachable endpoint.
    """
    task = (task or "").strip()
    folder = (task_folder or "").strip()
    if folder and not task:
        if not allow_local_paths:
            raise ValueError("local task folders cannot be used on this host; pick a task from the suite")
        task_dir = Path(folder).expanduser()
        if not (task_dir / "task.toml").is_file():
            raise ValueError(f"{folder}: not a Harbor task folder (no task.toml)")
        if not (instruction or "").strip():
            raise ValueError("the instruction is empty: paste what the agent should do (or keep the task's own)")
        task_id = task_dir.resolve().name
    else:
        if not task:
            raise ValueError("no task chosen: pick a task from the suite (or give a local task folder)")
        known = list_tasks(task_roots)
        if task not in known:
            names = ", ".join(sorted(known)[:12]) + (" ..." if len(known) > 12 else "")
            raise ValueError(f"unknown task {task!r}; the suite has: {names or 'no tasks'}")
        task_dir, task_id = known[task][0], task
        if instruction is not None and instruction != "" and not instruction.strip():
            raise ValueError("the instruction is empty: paste what the agent should do (or clear it to use the task's own)")
    instruction_text = (instruction or "").strip() or read_instruction(task_dir)
    if not instruction_text.strip():
        raise ValueError(f"{task_dir}: the task has no instruction (instruction.md is empty)")

    def as_int(name: str, value: Any, lo: int, hi: int, why: str) -> int:
        try:
            v = int(value)
        except (TypeError, ValueError):
            raise ValueError(f"{name} must be a whole number, got {value!r}") from None
        if not lo <= v <= hi:
            raise ValueError(f"{name} must be between {lo} and {hi}{why}, got {v}")
        return v

    n_forks = as_int("recovery attempts", forks, 0, max_forks,
                     f" (each attempt is a sandbox and a sequence in the batch; this host allows at most {max_forks})")
    turns = as_int("max turns", max_turns, 1, MAX_TURNS, "")
    rturns = as_int("turns per recovery attempt", recovery_turns, 1, MAX_TURNS, "")
    new_tokens = as_int("max new tokens", max_new_tokens, 16, 4096, "")
    try:
        temp = float(temperature)
    except (TypeError, ValueError):
        raise ValueError(f"temperature must be a number, got {temperature!r}") from None
    if not 0 <= temp <= 2:
        raise ValueError(f"temperature must be between 0 and 2, got {temp}")

    kwargs: dict[str, Any] = {}
    if model in (extra_models or []):
        spec = model
    elif model == "smollm2":
        spec = "smollm2"
    elif model == "oracle":
        spec, kwargs = "oracle", {"tasks": str(task_dir)}
    elif model == "checkpoint":
        ref = (checkpoint or "").strip()
        if not ref:
            raise ValueError("no checkpoint given: enter a local model folder or a Hub model id")
        from reterm.policies import is_local_path

        if is_local_path(ref):  # as everywhere in the kit: a path starts with /, . or ~; the rest is a Hub id
            if not allow_local_paths:
                raise ValueError("local checkpoints cannot be used on this host; give a Hub model id")
            p = Path(ref).expanduser()
            if not p.is_dir():
                raise ValueError(f"{ref}: no such checkpoint folder")
            if not ((p / "config.json").is_file() or (p / "adapter_config.json").is_file()):
                raise ValueError(f"{ref}: not a transformers checkpoint (no config.json or adapter_config.json)")
        elif ref.count("/") != 1:
            raise ValueError(f"{ref}: read as a Hub model id, which is ORG/NAME; a local folder is written as a "
                             f"path (./{ref}, /abs/path or ~/path)")  # fmt: skip
        spec = f"hf:{ref}"
    elif model == "endpoint":
        url = (base_url or "").strip()
        name = (endpoint_model or "").strip()
        if not url.startswith(("http://", "https://")):
            raise ValueError("endpoint URL must start with http:// or https:// (e.g. http://127.0.0.1:8000/v1), "
                             f"got {url!r}")
        if not name:
            raise ValueError("no served model name given for the endpoint")
        if check_endpoints:
            check_endpoint(url, name)
        spec, kwargs = f"openai:{name}", {"base_url": url}
    else:
        raise ValueError(f"unknown model choice {model!r}; choose one of: {', '.join(MODEL_CHOICES)}")
    return LiveRequest(task_dir=task_dir, task_id=task_id, instruction=instruction_text, model=model,
                       policy_spec=spec, policy_kwargs=kwargs, forks=n_forks, max_turns=turns, recovery_turns=rturns,
                       temperature=temp, max_new_tokens=new_tokens, first_command=(first_command or "").strip())  # fmt: skip


# ================================================================================ policies
try:  # ZeroGPU Spaces: the `spaces` package is preinstalled there; elsewhere its decorator is not needed
    import spaces  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - depends on the host
    spaces = None


def _generate(policy: Any, batch: list, tools: list) -> list:
    return policy.generate(batch, tools)


# On a ZeroGPU Space a GPU is attached only while a `@spaces.GPU` function runs; off ZeroGPU the
# decorator does nothing. Defined at import time, as ZeroGPU requires.
_gpu_generate = spaces.GPU(duration=120)(_generate) if spaces is not None else _generate


class GPUPolicy:
    """A local model whose ``generate`` runs inside ``@spaces.GPU`` (ZeroGPU); a plain call elsewhere."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = inner.name
        self.call_format = getattr(inner, "call_format", None)

    def generate(self, batch: list, tools: list) -> list:
        return _gpu_generate(self.inner, batch, tools)


class PolicyCache:
    """Loaded policies, kept across runs (a local model loads once). Oracles and endpoints are cheap
    and built per run; sampling settings are applied per run."""

    def __init__(self) -> None:
        self._models: dict[str, Any] = {}

    def get(self, req: LiveRequest) -> Any:
        """The policy for ``req`` (raises ``ValueError`` naming the model when it cannot be loaded)."""
        from dataclasses import replace

        from reterm.policies import load_policy

        if req.model in ("oracle", "endpoint"):
            kwargs = dict(req.policy_kwargs)
            if req.model == "endpoint":
                kwargs.update(temperature=req.temperature, max_new_tokens=req.max_new_tokens, max_retries=2)
            try:
                return load_policy(req.policy_spec, **kwargs)
            except Exception as exc:
                raise ValueError(f"cannot build the policy {req.policy_spec}: {exc}") from exc
        policy = self._models.get(req.policy_spec)
        if policy is None:
            try:
                policy = load_policy(req.policy_spec, **req.policy_kwargs)
            except Exception as exc:
                raise ValueError(f"cannot load the model {req.policy_spec[3:] or req.policy_spec}: "
                                 f"{type(exc).__name__}: {str(exc)[:300]}") from exc  # fmt: skip
            self._models[req.policy_spec] = policy
        policy.sampling = replace(policy.sampling, temperature=req.temperature, max_new_tokens=req.max_new_tokens)
        return GPUPolicy(policy)


class RunStopped(RuntimeError):
    """The run was stopped (Stop, or the browser session ended) before the next model turn."""


class _Observed:
    """Forwards ``generate`` and reports when a batch starts (live status: "model writing turn N").
    Once ``stopped`` is set, no new turn is generated (:class:`RunStopped`), so a stopped run does not
    keep a model busy for further turns."""

    def __init__(self, inner: Any, on_generate: Callable[[int], None]) -> None:
        self.inner, self.on_generate = inner, on_generate
        self.name = inner.name
        self.call_format = getattr(inner, "call_format", None)
        self.stopped = threading.Event()

    def generate(self, batch: list, tools: list) -> list:
        if self.stopped.is_set():
            raise RunStopped("the run was stopped")
        self.on_generate(len(batch))
        return self.inner.generate(batch, tools)


def turn_line(label: str, step: Step) -> str:
    """One turn for the live timeline: ``LABEL · S s · WHAT`` (S = generation + execution seconds; WHAT =
    ``$ COMMAND`` (first line, at most 80 characters), ``submit`` or ``parse error: OUTCOME``)."""
    if step.action is None:
        what = f"parse error: {step.parse_error or 'unknown'}"
    elif step.action.tool == "submit":
        what = "submit"
    else:
        first = (step.action.command or "").splitlines()[0] if step.action.command else ""
        what = "$ " + (first[:80] + " …" if len(first) > 80 or "\n" in (step.action.command or "") else first)
    return f"{label} · {step.generation_s + step.execution_s:.1f} s · {what}"


# =================================================================================== runs
@dataclass
class LiveState:
    """What a live run has done so far (rendered after every event).

    ``main`` is the episode (its steps so far); ``failure`` is the failure state the attempts were forked
    from (a :class:`reterm.recovery.state.State`, named by its ``state_id`` like in the dataset, the GRPO pool
    and the eval); ``failure_step``/``failure_category``/``failure_evidence`` mark the first failure as soon as
    it is seen (before any fork); ``attempts`` are filled in place while they run. ``timeline`` holds
    ``(seconds since start, text)`` lines.
    """

    request: LiveRequest
    phase: str = "starting"
    main: Trajectory | None = None
    failure_step: int | None = None
    failure_category: str | None = None
    failure_evidence: str = ""
    failure: State | None = None
    forked_at_end: bool = False
    attempts: list[Trajectory] = field(default_factory=list)
    timeline: list[tuple[float, str]] = field(default_factory=list)
    done: bool = False
    cancelled: bool = False
    error: str | None = None
    run_dir: Path | None = None
    run_id: str = field(default_factory=lambda: f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}")
    t0: float = field(default_factory=time.monotonic)
    fork_s: float | None = None

    @property
    def failure_id(self) -> str | None:
        """The ``state_id`` of the failure state the attempts continue (``None`` before the fork)."""
        return self.failure.id if self.failure is not None else None

    def log(self, text: str) -> None:
        self.timeline.append((time.monotonic() - self.t0, text))

    def summary(self) -> dict[str, Any]:
        """A JSON-able digest (the API output of a live run): status, phase, the episode's and each
        attempt's outcome, reward, stop reason and commands, the failure state, fork time, timeline."""

        def info(t: Trajectory, steps: list[Step]) -> dict[str, Any]:
            return {"outcome": t.outcome.value, "reward": t.reward, "stop_reason": t.stop_reason, "steps": len(steps),
                    "commands": [s.command for s in steps if s.command is not None],
                    "injected": [s.index for s in steps if s.extra.get("injected")]}  # fmt: skip

        status = "cancelled" if self.cancelled else "error" if self.error else "done" if self.done else "running"
        return {
            "run_id": self.run_id,
            "task_id": self.request.task_id,
            "policy": self.request.policy_spec,
            "status": status,
            "phase": self.phase,
            "error": self.error,
            "main": None if self.main is None else info(self.main, self.main.steps),
            "failure": None if self.failure_category is None else {
                "id": self.failure_id, "step": self.failure_step, "category": self.failure_category,
                "evidence": self.failure_evidence, "forked_at_end": self.forked_at_end},
            "attempts": [info(t, t.steps[t.prefix_len:]) for t in self.attempts],
            "fork_s": self.fork_s,
            "run_dir": str(self.run_dir) if self.run_dir else None,
            "timeline": [[round(t, 2), text] for t, text in self.timeline],
        }  # fmt: skip


class LiveRun:
    """One live run (see the module docstring). ``await run()``; ``notify`` is called after every event.

    Args:
        request: the validated inputs.
        policy: the policy (from :class:`PolicyCache`).
        runs_dir: where runs are saved, after every step (``None``: not saved); at most ``keep_runs`` are kept.
        notify: called (in the event loop) whenever the state changed.
    """

    def __init__(self, request: LiveRequest, policy: Any, *, runs_dir: Path | None = None, keep_runs: int = 50,
                 notify: Callable[[], None] | None = None) -> None:  # fmt: skip
        self.req = request
        self.state = LiveState(request)
        self.runs_dir, self.keep_runs = runs_dir, keep_runs
        self._notify = notify or (lambda: None)
        self._loop: asyncio.AbstractEventLoop | None = None
        self.envs: list[Any] = []  # every environment started; all stopped at the end
        self.policy = _Observed(policy, self._on_generate)
        self.task: asyncio.Task | None = None  # the task running :meth:`run` (set by the caller)
        self.stop_reason = "cancelled by the user"

    def cancel(self, reason: str = "cancelled by the user") -> None:
        """Stop the run from any thread: no further model turn starts, the task running :meth:`run`
        is cancelled (its teardown stops every sandbox; what was done so far stays saved)."""
        self.stop_reason = reason
        self.policy.stopped.set()
        if self.task is not None and not self.task.done():
            self.task.get_loop().call_soon_threadsafe(self.task.cancel)

    # ------------------------------------------------------------------------- events
    def _changed(self) -> None:
        self._notify()

    def _stepped(self) -> None:
        """After every step: save the run so far (a run cut by a crash or a closed tab keeps its steps)."""
        with contextlib.suppress(Exception):
            self._save()
        self._changed()

    def _on_generate(self, n: int) -> None:  # called from the generation thread
        what = f"model writing the next turn of {n} attempts" if n > 1 else "model writing the next turn"
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._set_phase, what)

    def _set_phase(self, text: str) -> None:
        self.state.phase = text
        self._changed()

    # -------------------------------------------------------------- cancellation-safe
    async def _settle(self, coro: Any) -> Any:
        """Await ``coro`` to its end even if this task is cancelled meanwhile (a sandbox start or fork
        cut short would leave a sandbox nobody stops); started environments are registered for
        teardown; then the cancellation is re-raised."""
        task = asyncio.ensure_future(coro)
        cancelled = False
        while True:
            try:
                result = await asyncio.shield(task)
                break
            except asyncio.CancelledError:
                if task.done():
                    raise
                cancelled = True
        if isinstance(result, list):
            self.envs.extend(result)
        elif isinstance(getattr(result, "environments", None), list):  # materialize's forks
            self.envs.extend(result.environments)
        if cancelled:
            raise asyncio.CancelledError
        return result

    async def teardown(self) -> None:
        """Stop every environment this run started (idempotent; finishes even when cancelled)."""
        envs, self.envs = self.envs, []
        if not envs:
            return
        await self._settle(asyncio.gather(*(e.stop(delete=True) for e in envs), return_exceptions=True))

    # ------------------------------------------------------------------------------ run
    async def run(self) -> LiveState:
        """Run to the end (see the module docstring); never raises except ``CancelledError``."""
        self._loop = asyncio.get_running_loop()
        st = self.state
        try:
            await self._run()
        except (asyncio.CancelledError, RunStopped) as exc:
            st.cancelled, st.phase = True, "cancelled: sandboxes stopped"
            st.log(self.stop_reason)
            if isinstance(exc, asyncio.CancelledError):
                raise
        except Exception as exc:
            if self.policy.stopped.is_set():  # the stop reached the episode loop as a generation fault
                st.cancelled, st.phase = True, "cancelled: sandboxes stopped"
                st.log(self.stop_reason)
                return st
            st.error = f"{type(exc).__name__}: {exc}"
            st.phase = "stopped by an error"
            st.log(f"error: {st.error}")
        finally:
            await self.teardown()
            st.done = True
            with contextlib.suppress(Exception):
                self._save()
            self._changed()
        return st

    async def _run(self) -> None:
        from reterm.agent.episode import EpisodeSpec, load_task, run_episodes, run_verifier
        from reterm.agent.terminal import TerminalSession
        from reterm.policies.scripted import ScriptedPolicy
        from reterm.sandbox.local import LocalEnvironment

        req, st = self.req, self.state
        task = load_task(req.task_dir)
        budget = float(getattr(task.config.agent, "timeout_sec", 0) or 0) or None

        st.phase = "starting the sandbox"
        self._changed()
        t = time.monotonic()
        env = LocalEnvironment.for_task(req.task_dir)
        self.envs.append(env)
        await self._settle(env.start(force_build=False))
        session = await TerminalSession.start(env)
        st.log(f"sandbox and terminal ready in {time.monotonic() - t:.2f} s")
        self._changed()

        steps: list[Step] = []
        turns = 0
        started = time.monotonic()
        meta = {"space_run": st.run_id, "role": "main"}

        def on_step(_: int, traj: Trajectory, step: Step) -> None:
            st.main = traj
            if not step.extra.get("injected") and traj.policy != "user":
                st.log(turn_line(f"turn {turns + 1}/{req.max_turns}", step))
            self._stepped()

        async def turn(policy: Any) -> Trajectory:
            remaining = None if budget is None else budget - (time.monotonic() - started)
            spec = EpisodeSpec(env, task, history=steps, session=session, instruction=req.instruction, metadata=dict(meta))
            (traj,) = await run_episodes(policy, [spec], max_turns=1, time_budget_s=remaining, verify=False,
                                         command_timeout_s=req.command_timeout_s, on_step=on_step)  # fmt: skip
            traj.policy = self.policy.name
            return traj

        state = None
        traj: Trajectory | None = None
        if req.first_command:
            st.phase = "typing the user's first command"
            self._changed()
            traj = await turn(ScriptedPolicy([req.first_command], submit=False, name="user"))
            if traj.steps:
                traj.steps[-1].extra["injected"] = True
            steps = list(traj.steps)
            st.main = traj
            state = self._watch(traj)
        turns = 0
        while state is None and turns < req.max_turns:
            if traj is not None and traj.stop_reason in ("submitted", "context_length", "time_budget", "infra_fault",
                                                         "sandbox_broken"):
                break
            if budget is not None and time.monotonic() - started >= budget:
                break
            st.phase = f"turn {turns + 1}/{req.max_turns}"
            self._changed()
            traj = await turn(self.policy)
            turns += 1
            steps = list(traj.steps)
            st.main = traj
            if traj.outcome.is_infra_fault:
                raise RuntimeError(f"the episode hit an infrastructure fault ({traj.outcome.value}): {traj.error}")
            state = self._watch(traj)
        if traj is None:
            raise RuntimeError("the episode produced no step")
        main = self._as_main(traj)
        st.main = main

        snapshot = None
        if state is None:
            # The episode ended without a failing step: keep its end state, then ask the verifier.
            if req.forks:
                snapshot = await self._settle(env.snapshot())
            st.phase = "running the verifier"
            self._changed()
            await run_verifier(env, task, main)
            st.log(f"episode ended ({main.stop_reason}); verifier: {main.outcome.value}"
                   + (f", reward {main.reward:g}" if main.reward is not None else ""))  # fmt: skip
            if main.outcome is Outcome.FAILURE and req.forks:
                from reterm.recovery.localise import localise

                primary = localise(main).primary
                if primary is not None:
                    st.failure_step = primary.step if primary.step < len(main.steps) else None
                    st.failure_category, st.failure_evidence = primary.category, primary.evidence
                    st.forked_at_end = True
            if not st.forked_at_end:
                if snapshot is not None:
                    snapshot.release()
                st.phase = ("the verifier passed" + (": nothing to recover from" if st.failure_category is None else
                                                     " (the agent recovered by itself)") if main.passed else
                            "the verifier failed" + ("" if req.forks else " (no recovery attempts requested)")
                            + ("; no failure state to fork from" if req.forks else "")
                            if main.outcome is Outcome.FAILURE else f"episode ended: {main.outcome.value}")  # fmt: skip
                return
        else:
            st.failure_step, st.failure_category, st.failure_evidence = state.step, state.category, state.evidence

        # ---- fork G recovery attempts from the failure state
        st.phase = f"forking {req.forks} sandboxes at the failure state"
        self._changed()
        t = time.monotonic()
        if snapshot is not None:
            last = main.steps[-1] if main.steps else None
            ends_in_submit = last is not None and last.action is not None and last.action.tool == "submit"
            history = main.steps[:-1] if ends_in_submit else main.steps  # attempts continue instead of submitting
        else:
            snapshot = await self._settle(env.snapshot())
            history = main.steps
        # the failure state, named by the id the dataset, GRPO and the eval give the same history; the attempts
        # continue the episode (no feedback message, even when forked at its end): in-attempt
        st.failure = State.from_history(main, history, category=st.failure_category or "other", source=Source.OWN,
                                        level=Level.IN_ATTEMPT, snapshot=snapshot)  # fmt: skip
        try:  # the one rebuild: forks of the state's snapshot
            made = await self._settle(materialize(st.failure, req.forks, None, method="snapshot",
                                                  fork_kwargs={"persistent_env": dict(env._persistent_env)}))  # fmt: skip
        finally:
            snapshot.release()
            st.failure.snapshot = None
        forks = made.environments
        st.fork_s = time.monotonic() - t
        st.log(f"forked {req.forks} sandboxes in {st.fork_s:.2f} s")
        with contextlib.suppress(Exception):
            await session.close()
        self.envs.remove(env)
        await self._settle(env.stop(delete=True))

        st.log(f"failure state {st.failure_id}")
        specs = [EpisodeSpec(f, task, history=history, instruction=req.instruction,
                             metadata={"space_run": st.run_id, "failure_state": st.failure_id, "state_id": st.failure_id,
                                       "attempt": k, "failure_step": st.failure_step, "failure_category": st.failure_category,
                                       "failure_evidence": st.failure_evidence, "source_policy": self.policy.name})
                 for k, f in enumerate(forks)]  # fmt: skip

        def on_start(trajs: list[Trajectory]) -> None:
            st.attempts = trajs
            self._changed()

        def on_attempt_step(k: int, traj: Trajectory, step: Step) -> None:
            turn = len(traj.steps) - traj.prefix_len
            st.phase = f"recovery turn {turn}/{req.recovery_turns} ({req.forks} attempts in lock-step)"
            st.log(turn_line(f"attempt {k + 1} turn {turn}/{req.recovery_turns}", step))
            self._stepped()

        st.phase = f"{req.forks} recovery attempts running in lock-step"
        self._changed()
        attempts = await run_episodes(self.policy, specs, max_turns=req.recovery_turns, verify=True,
                                      command_timeout_s=req.command_timeout_s, on_start=on_start,
                                      on_step=on_attempt_step)  # fmt: skip
        st.attempts = attempts
        n_pass = sum(a.outcome is Outcome.SUCCESS for a in attempts)
        st.log(f"verifier: {n_pass} of {len(attempts)} attempts recovered")
        st.phase = f"done: {n_pass} of {len(attempts)} recovery attempts passed the verifier"

    # ---------------------------------------------------------------------------- helpers
    def _watch(self, traj: Trajectory) -> Any:
        """The failure state to fork from at the newest step (``None`` to go on). With no recovery
        attempts requested the episode goes on; its first failure is only marked."""
        state = self._detect(traj)
        if state is None:
            return None
        st = self.state
        if st.failure_category is None:
            st.log(f"failure at step {state.step + 1}: {state.category} ({state.evidence[:80]})")
            if not self.req.forks:
                st.failure_step, st.failure_category, st.failure_evidence = state.step, state.category, state.evidence
        return state if self.req.forks else None

    def _detect(self, traj: Trajectory) -> Any:
        """The failure state at the episode's newest step, if the rules classifier sees one."""
        from reterm.recovery.localise import localise

        if not traj.steps or traj.outcome.is_infra_fault:
            return None
        last = len(traj.steps) - 1
        return next((s for s in localise(traj).states if s.step == last), None)

    def _as_main(self, traj: Trajectory) -> Trajectory:
        """The turn-by-turn trajectory as one episode (no history flags, the run's metadata)."""
        main = traj.model_copy(deep=True)
        for s in main.steps:
            s.from_history = False
        main.prefix_len = 0
        main.policy = self.policy.name
        main.metadata.update({"space_run": self.state.run_id, "role": "main"})
        return main

    def _save(self) -> None:
        """Write the run's trajectories under ``runs_dir/<run id>/`` and prune old runs."""
        st = self.state
        if self.runs_dir is None or st.main is None:
            return
        run_dir = self.runs_dir / f"{st.run_id}-{self.req.task_id}"
        main = st.main if st.main.metadata.get("role") == "main" and not st.main.prefix_len else self._as_main(st.main)
        main.save(run_dir / "main.json")
        for k, a in enumerate(st.attempts):
            a.save(run_dir / "attempts" / f"attempt-{k}.json")
        st.run_dir = run_dir
        runs = sorted((p for p in self.runs_dir.iterdir() if p.is_dir()), key=lambda p: p.name)
        for old in runs[: max(0, len(runs) - self.keep_runs)]:
            shutil.rmtree(old, ignore_errors=True)
