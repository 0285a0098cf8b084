"""The failure-state pool of ReTerm-GRPO: where each group of recovery attempts starts.

A pool entry (:class:`PoolState`) is a failure state (:class:`reterm.recovery.state.State`: a point where the
agent failed, its history up to and including the failing step being the group's prompt, in the training
message format of :mod:`reterm.agent.protocol`; the task; the error category) plus the pool's own fields
(task folder, origin, parent, step created). The pool holds two kinds:

- **seed states**, from the SFT dataset (ReTerm-10K records, :mod:`reterm.records`): the prefix
  ``messages[:train_from_message_index]``; they are also the rows of the dataset TRL's sampler draws from;
- **online states**, localised (:func:`reterm.recovery.localise`, first consequential failure) in the
  *current policy's own* failed recovery attempts during training, and added every
  ``pool_refresh_steps`` steps (paper: the policy learns from its own failure states, online).

Each group is a seed row drawn by TRL's ``RepeatSampler`` or, with probability
``online_state_fraction``, an online state. Every choice uses a ``random.Random`` seeded by
``(seed, step, global group index)``, and new online states are gathered from every process and sorted
before they are added, so the pool and the choices are identical on every rank (a group may span ranks;
TRL 1.16).

In standard mode (the baseline) the pool holds one *task-start* state per task: the prompt is the
task's first two messages and the environment is fresh.

The environment of a state is rebuilt from its history (its bash commands, replayed through the
harness's terminal; :mod:`reterm.training.grpo_rollout`); on the local sandbox the result is kept as a
snapshot (:class:`SnapshotCache`) and forked for every later group that starts there.

Written for this kit: TRL samples prompts from a fixed dataset and has no notion of environment state.
"""

from __future__ import annotations

import random
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from reterm.agent.atif import from_messages
from reterm.agent.protocol import feedback_message, initial_messages, is_feedback
from reterm.policies.transformers_policy import template_messages
from reterm.recovery import localise
from reterm.recovery.attempts import with_feedback
from reterm.recovery.state import Level, Source, State, state_id
from reterm.trajectory import Step, Trajectory

REPO = Path(__file__).resolve().parents[2]

SOURCES = ("seed", "online", "task_start")


def resolve_task_dir(task_id: str, task_dirs: Sequence[str | Path]) -> Path | None:
    """``<dir>/<task_id>`` for the first ``dir`` of ``task_dirs`` holding a Harbor task of that name.

    Relative folders are tried against the working directory, then the repository root. Returns ``None``
    when no folder has the task.
    """
    if not task_id or "/" in task_id or task_id in (".", ".."):
        return None
    for d in task_dirs:
        d = Path(d).expanduser()
        for root in ([d] if d.is_absolute() else [Path.cwd() / d, REPO / d]):
            if (root / task_id / "task.toml").is_file():
                return (root / task_id).resolve()
    return None


def excluded_task_ids() -> set[str]:
    """Task ids that must never be trained on: the test split of this project's suite (tasks/splits.json)."""
    try:
        from reterm.tasks import load_splits

        return set(load_splits().get("test", []))
    except (FileNotFoundError, ValueError):
        return set()


@dataclass
class PoolState:
    """One pool entry: a failure state (or task start) plus what the pool keeps beside it.

    Build one from a prompt with :meth:`from_prompt` (the state is derived from it), or from a
    :class:`reterm.recovery.state.State` directly.

    Attributes:
        state: the failure state (:class:`reterm.recovery.state.State`: id, history, category,
            :class:`reterm.recovery.state.Source`, level). Its id is the one the dataset record and the eval
            give the state (:func:`reterm.recovery.state.state_id` of the task and ``prompt``);
            ``start:<task_id>`` for a task start.
        task_dir: the task's folder on this machine.
        source: the pool's own notion of where the entry came from: ``seed`` (the dataset) | ``online`` |
            ``task_start``; :attr:`state_source` is the state's :class:`reterm.recovery.state.Source`.
        parent_id: for an online state, the state its attempt started from (its snapshot, when cached,
            is the cheapest start for rebuilding this one).
        created_step: optimiser step at which an online state was found (``-1`` for others).

    Read-only views of :attr:`state`: ``state_id``, ``task_id``, ``prompt`` (the history's chat messages,
    ``[system, user(instruction), assistant, tool, ...]``, tool-call arguments as mappings, ending with the
    failing step's observation or the feedback message), ``category`` (``""`` for a task start).
    """

    state: State
    task_dir: str
    source: str = "seed"
    parent_id: str = ""
    created_step: int = -1

    @classmethod
    def from_prompt(cls, state_id: str, task_id: str, task_dir: str, prompt: list[dict[str, Any]],
                    category: str = "", source: str = "seed", parent_id: str = "", created_step: int = -1,
                    failure_source: str = "own") -> "PoolState":  # fmt: skip
        """The entry whose state's history is ``prompt`` (attempt-level when it ends with the feedback message).

        Args:
            state_id: the state's id (kept as given: the caller computed it, e.g. ``state_id(task_id, prompt)``).
            task_id, task_dir, prompt: see the class attributes.
            category: a :class:`reterm.recovery.Category` id; empty: ``other`` (``""`` kept for a task start).
            source, parent_id, created_step: the pool fields.
            failure_source: for a seed, its record's ``failure_source`` (``own`` | ``injected``); the state's
                source is ``online`` / ``task_start`` for those pool origins.

        Raises:
            ValueError: ``source`` or ``failure_source`` is not a known value.
        """
        if source not in SOURCES:
            raise ValueError(f"pool state {state_id}: source {source!r} is not one of {SOURCES}")
        state_source = {"online": Source.ONLINE, "task_start": Source.TASK_START}.get(source, failure_source)
        last = prompt[-1] if len(prompt) > 2 else {}
        level = Level.ATTEMPT if is_feedback(str(last.get("content") or "")) else Level.IN_ATTEMPT
        try:
            history = _parse(prompt, task_id).steps
        except ValueError:  # not a layout the harness shows: _check_prompt names it
            history = []
        bash = [s for s in history if s.command is not None]
        state = State(id=state_id, task_id=task_id, messages=prompt,
                      category=category or ("" if source == "task_start" else "other"), source=state_source,
                      level=level, history=history, replay_commands=[s.command or "" for s in bash],
                      replay_timeouts=[s.action.timeout if s.action else None for s in bash])  # fmt: skip
        return cls(state=state, task_dir=str(task_dir), source=source, parent_id=parent_id, created_step=created_step)

    # ------------------------------------------------------------------ views of the state
    @property
    def state_id(self) -> str:
        """The state's id (:attr:`reterm.recovery.state.State.id`)."""
        return self.state.id

    @property
    def task_id(self) -> str:
        """The task's name."""
        return self.state.task_id

    @property
    def prompt(self) -> list[dict[str, Any]]:
        """The history's chat messages (the group's prompt)."""
        return self.state.messages

    @property
    def category(self) -> str:
        """The state's failure category (``""`` for a task start)."""
        return self.state.category

    @property
    def state_source(self) -> Source:
        """The entry's :class:`reterm.recovery.state.Source` (``online``, ``task_start``, else the seed record's)."""
        return self.state.source

    @cached_property
    def trajectory(self) -> Trajectory:
        """The history as a trajectory (steps with ``from_history``; exit statuses read from observations).

        Raises:
            ValueError: the prompt is not a layout the harness shows.
        """
        return _parse(self.prompt, self.task_id)

    @property
    def history(self) -> list[Step]:
        """The history's steps (what :class:`reterm.agent.episode.EpisodeSpec` takes)."""
        return self.trajectory.steps

    @property
    def instruction(self) -> str:
        """The task instruction as the history shows it."""
        return self.trajectory.instruction

    @property
    def replay_commands(self) -> list[str]:
        """The bash commands of the history, in order (what rebuilds the state)."""
        return [s.command for s in self.history if s.command is not None]

    def row(self) -> dict[str, Any]:
        """The TRL dataset row of this state (``prompt`` is what TRL logs; the rest routes the group):
        ``state_source`` is the state's :class:`reterm.recovery.state.Source` value (own, injected, online,
        task_start; the spelling of the dataset and the eval), ``pool_origin`` the pool's own (seed, online,
        task_start)."""
        return {
            "prompt": self.prompt,
            "task_id": self.task_id,
            "state_id": self.state_id,
            "failure_category": self.category,
            "state_source": self.state_source.value,
            "pool_origin": self.source,
        }

    # ------------------------------------------------------------------ checkpoints, pickling
    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict (checkpoints): ``{"state": State.to_json(), "task_dir", "source", "parent_id",
        "created_step"}``; :meth:`from_json` reverses it."""
        return {"state": self.state.to_json(), "task_dir": self.task_dir, "source": self.source,
                "parent_id": self.parent_id, "created_step": self.created_step}  # fmt: skip

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> "PoolState":
        """The entry :meth:`to_json` wrote, or one in the older flat layout (checkpoints written before entries
        held a ``State``: ``state_id, task_id, task_dir, prompt, category, source, parent_id, created_step,
        failure_source``), whose state is rebuilt from its prompt with the id it had.

        Raises:
            ValueError: neither layout (the missing or unknown fields are named).
        """
        if "state" in obj:
            pool = {k: v for k, v in obj.items() if k != "state"}
            try:
                return cls(state=State.from_json(obj["state"]), **pool)
            except TypeError as exc:
                raise ValueError(f"pool state {obj['state'].get('id', '?')}: not a pool entry's JSON ({exc})") from exc
        try:
            return cls.from_prompt(**obj)
        except TypeError as exc:
            raise ValueError(f"pool state {obj.get('state_id', '?')}: neither the pool-entry JSON "
                             f"(a 'state' field) nor the older flat one ({exc})") from exc

    def __getstate__(self) -> dict[str, Any]:  # pickled by accelerate's gather_object
        return self.to_json()

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(type(self).from_json(state).__dict__)


def _parse(prompt: list[dict[str, Any]], task_id: str) -> Trajectory:
    """``prompt`` read back as a trajectory, its steps marked ``from_history``.

    Raises:
        ValueError: not a layout :func:`reterm.agent.atif.from_messages` reads.
    """
    traj = from_messages(prompt, task_id=task_id)
    for s in traj.steps:
        s.from_history = True
    return traj


def _without_call_ids(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages without tool-call ids: the chat templates do not render them, and records written
    before ids were unique per trajectory (every call ``call_0``) must still match their rebuild."""
    out = []
    for m in messages:
        m = {k: v for k, v in m.items() if k != "tool_call_id"}
        if m.get("tool_calls"):
            m["tool_calls"] = [{k: v for k, v in c.items() if k != "id"} for c in m["tool_calls"]]
        out.append(m)
    return out


def _check_prompt(state: PoolState) -> str | None:
    """Why ``state.prompt`` cannot be a group's prompt (None when it can): the harness must rebuild it
    exactly (``Trajectory.to_messages`` of the parsed history), and it must end with an observation."""

    try:
        rebuilt = state.trajectory.to_messages()
    except ValueError as exc:
        return f"layout: {exc}"
    if _without_call_ids(template_messages(rebuilt)) != _without_call_ids(template_messages(state.prompt)):
        return "not_reproducible"
    if state.source != "task_start" and (not state.history or state.prompt[-1]["role"] not in ("tool", "user")):
        return "no_failing_step"
    return None


def _attempt_level(state: "PoolState") -> bool:
    """True when ``state`` is an attempt-level failure state: its prompt ends with the feedback message that
    follows a failed attempt (:func:`reterm.agent.protocol.is_feedback`)."""

    return bool(state.prompt) and is_feedback(state.prompt[-1].get("content"))


def seed_states_from_records(
    records: Iterable[dict[str, Any]],
    task_dirs: Sequence[str | Path],
    *,
    exclude: set[str] | None = None,
) -> tuple[list[PoolState], Counter]:
    """Seed failure states from ReTerm-10K records (:data:`reterm.record_features.FEATURES` rows).

    The state is the one record reader's (:meth:`reterm.recovery.state.State.from_record`): its prompt is
    ``messages[:train_from_message_index]`` (the failure prefix), its id the record's ``trajectory_id``. Records are skipped, and
    counted by reason, when their task folder is not found (``unknown_task``), their task is excluded
    (``excluded_task``: the test split), or their prefix is not what the harness would show
    (``not_reproducible``, ``layout: ...``, ``no_failing_step``).

    Returns:
        ``(states, skipped)``; duplicate prefixes (same task and prompt) are kept once (``duplicate``).
    """

    exclude = excluded_task_ids() if exclude is None else exclude
    states: list[PoolState] = []
    seen: set[str] = set()
    skipped: Counter = Counter()
    for record in records:
        task_id = record.get("task_id") or ""
        if task_id in exclude:
            skipped["excluded_task"] += 1
            continue
        task_dir = resolve_task_dir(task_id, task_dirs)
        if task_dir is None:
            skipped["unknown_task"] += 1
            continue
        try:  # the one record reader: history = messages[:train_from_message_index]
            read = State.from_record(record)
        except ValueError as exc:
            skipped[f"layout: {exc.__cause__ or exc}"] += 1
            continue
        sid = read.id
        if sid in seen:
            skipped["duplicate"] += 1
            continue
        state = PoolState(state=read, task_dir=str(task_dir), source="seed")
        why = _check_prompt(state)
        if why is not None:
            skipped[why] += 1
            continue
        seen.add(sid)
        states.append(state)
    return states, skipped


def task_start_states(task_ids: Iterable[str], task_dirs: Sequence[str | Path]) -> list[PoolState]:
    """One task-start state per task (standard GRPO): prompt ``[system, user(instruction)]``, fresh environment.

    Raises:
        ValueError: a task folder is not found, or a task is in the excluded test split (named).
    """
    from harbor.models.task.task import Task

    exclude = excluded_task_ids()
    out = []
    for task_id in sorted(set(task_ids)):
        if task_id in exclude:
            raise ValueError(f"task {task_id!r} is in the test split (tasks/splits.json); it is never trained on")
        task_dir = resolve_task_dir(task_id, task_dirs)
        if task_dir is None:
            raise ValueError(f"task {task_id!r}: no task folder in task_dirs {list(map(str, task_dirs))}")
        prompt = initial_messages(Task(task_dir).instruction)
        out.append(PoolState.from_prompt(f"start:{task_id}", task_id, str(task_dir), prompt, source="task_start"))
    return out


def online_states_from_attempt(
    trajectory: Trajectory, parent: PoolState, step: int, *, max_states: int = 1
) -> list[PoolState]:
    """New failure states from one failed recovery attempt of the current policy.

    From an attempt-level parent (its prompt ends with the feedback message: the release's protocol) the new
    state is the whole failed attempt followed by the feedback again (one more sequential attempt, as in
    Recovery@k), labelled with the category of its first consequential failure. From a step-level parent the
    attempt's generated steps are localised (:func:`reterm.recovery.localise`, rules only; the copied
    history is context); its first consequential failure (``LocalisationResult.primary``) becomes a state
    whose prompt is the whole conversation up to and including the failing step. Infrastructure faults,
    passed attempts and attempts that broke their sandbox (docs/SCORING.md) yield nothing.

    Args:
        trajectory: a finished, verified attempt (``trajectory.prefix_len`` = the parent's history length).
        parent: the state the attempt started from.
        step: the current optimiser step (recorded on the new state).
        max_states: at most this many states (the primary first, then later consequential ones).
    """

    if trajectory.outcome.is_infra_fault or trajectory.passed or trajectory.reward is None or max_states < 1:
        return []
    if trajectory.metadata.get("broken_by_agent"):  # scored 0, but no sandbox left to recover in
        return []
    result = localise(trajectory)
    if _attempt_level(parent):
        # the release's protocol: the whole failed attempt, then the feedback, is the next state (Recovery@k)

        if not trajectory.steps:
            return []
        feedback = feedback_message(trajectory.metadata.get("verifier_output_tail"), trajectory.instruction)
        whole = trajectory.model_copy(update={"steps": with_feedback(trajectory.steps, feedback)})
        prompt = template_messages(whole.to_messages())
        category = result.primary.category if result.primary is not None else parent.category
        state = PoolState.from_prompt(state_id(parent.task_id, prompt), parent.task_id, parent.task_dir, prompt,
                                      category=category, source="online", parent_id=parent.state_id,
                                      created_step=step)  # fmt: skip
        return [state] if _check_prompt(state) is None else []
    chosen = result.select("first") + [s for s in result.states if s.localisation.consequential and not s.localisation.primary]
    out = []
    for fs in chosen[:max_states]:
        prompt = trajectory.to_messages(upto=len(fs.history))

        prompt = template_messages(prompt)
        state = PoolState.from_prompt(state_id(parent.task_id, prompt), parent.task_id, parent.task_dir, prompt,
                                      category=fs.category, source="online", parent_id=parent.state_id,
                                      created_step=step)  # fmt: skip
        if _check_prompt(state) is None:
            out.append(state)
    return out


def merge_group_parts(groups: Iterable[tuple[str, int, list[float]]],
                      gather: Callable[[list], list] | None = None) -> dict[tuple[str, int], list[float]]:  # fmt: skip
    """Each group's rewards, joined from the parts of it that every process scored.

    Args:
        groups: ``(state_id, global group index, scored rewards)`` of this process's group parts (a group of G
            attempts may span processes).
        gather: e.g. accelerate's ``gather_object`` (every rank calls it at the same steps); None on one process.

    Returns:
        ``(state_id, group index) -> rewards`` (infrastructure faults, which have no reward, left out by the caller).
    """
    parts = list(groups)
    merged: dict[tuple[str, int], list[float]] = {}
    for sid, g, rewards in gather(parts) if gather is not None else parts:
        merged.setdefault((sid, g), []).extend(rewards)
    return merged


class FailurePool:
    """Seed and online failure states, the per-group choice between them, and the online refresh.

    Args:
        seeds: the seed states (also the rows of :meth:`dataset`); must not be empty.
        online_fraction: probability that a group starts from an online state (when there are any).
        max_online: online states kept; the oldest are evicted first.
        seed: the random seed of every choice.
        prompt_tokens: optional ``state -> prompt length in tokens``; with ``max_prompt_tokens``, longer
            states are refused (counted in :attr:`counts`).
        max_prompt_tokens: see ``prompt_tokens``.
        skip_equal_after: skip a state before rollout once its last this-many groups all had equal rewards
            (0: never; :meth:`record_groups` keeps the streaks); it is still chosen with probability
            ``skip_equal_explore``.
        skip_equal_explore: see ``skip_equal_after``.

    Raises:
        ValueError: no seed states, or two states share an id.
    """

    def __init__(
        self,
        seeds: Sequence[PoolState],
        *,
        online_fraction: float = 0.5,
        max_online: int = 512,
        seed: int = 0,
        prompt_tokens: Callable[[PoolState], int] | None = None,
        max_prompt_tokens: int | None = None,
        skip_equal_after: int = 0,
        skip_equal_explore: float = 0.2,
    ) -> None:
        self.online_fraction, self.max_online, self.seed = online_fraction, max_online, seed
        self.skip_equal_after, self.skip_equal_explore = skip_equal_after, skip_equal_explore
        self.equal_streak: dict[str, int] = {}  # state id -> groups in a row with equal rewards
        self.prompt_tokens, self.max_prompt_tokens = prompt_tokens, max_prompt_tokens
        self.counts: Counter = Counter()
        self.seeds: list[PoolState] = [s for s in seeds if self._fits(s)]
        if not self.seeds:
            raise ValueError("the failure-state pool has no usable seed states (see the skipped counts)")
        self.online: list[PoolState] = []
        self.pending: list[PoolState] = []
        self.by_id: dict[str, PoolState] = {}
        for s in self.seeds:
            if s.state_id in self.by_id:
                raise ValueError(f"two seed states share the id {s.state_id}")
            self.by_id[s.state_id] = s
        self.retired: set[str] = set()  # states whose environment could not be rebuilt (same on every rank)
        self._retired_pending: list[str] = []
        self._local_bad: set[str] = set()  # retired here, not yet gathered from every rank

    def _fits(self, state: PoolState) -> bool:
        if self.max_prompt_tokens is None or self.prompt_tokens is None:
            return True
        if self.prompt_tokens(state) <= self.max_prompt_tokens:
            return True
        self.counts["too_long"] += 1
        return False

    # ------------------------------------------------------------------------------ sampling
    def dataset(self):
        """The seed rows as a ``datasets.Dataset`` for TRL (``prompt`` messages stored as JSON)."""
        from datasets import Dataset, Features, Json, List, Value

        features = Features({"prompt": List(Json()), "task_id": Value("string"), "state_id": Value("string"),
                             "failure_category": Value("string"), "state_source": Value("string"),
                             "pool_origin": Value("string")})  # fmt: skip
        return Dataset.from_list([s.row() for s in self.seeds], features=features)

    def get(self, state_id: str) -> PoolState:
        """The state with this id (seed or online). Raises ``KeyError`` naming the id."""
        try:
            return self.by_id[state_id]
        except KeyError:
            raise KeyError(f"no failure state {state_id!r} in the pool") from None

    def _rng(self, *key: Any) -> random.Random:
        return random.Random(f"{self.seed}:" + ":".join(map(str, key)))

    def choose(self, state_ids: Sequence[str], step: int, process_index: int, group_size: int) -> list[PoolState]:
        """The state of each position of a generation batch: the sampled seed row or, per group, an online state.

        Args:
            state_ids: the ``state_id`` of the rows TRL's sampler gave this process (G consecutive copies
                per group; a group may start on the previous process).
            step: the optimiser step (same on every rank).
            process_index: this process's rank; every rank holds ``len(state_ids)`` positions.
            group_size: G.

        Returns:
            One state per position; all positions of a group get the same state on every rank.
        """
        out = []
        chosen: dict[int, PoolState] = {}  # once per group: its positions share the choice (and the counts)
        for i, sid in enumerate(state_ids):
            group = (process_index * len(state_ids) + i) // group_size
            if group not in chosen:
                chosen[group] = self._choose_group(sid, step, group)
            out.append(chosen[group])
        return out

    def _choose_group(self, sampled_id: str, step: int, group: int) -> PoolState:
        live = [s for s in self.online if s.state_id not in self.retired]
        rng = self._rng("choose", step, group)
        if live and rng.random() < self.online_fraction:
            state = live[rng.randrange(len(live))]
        else:
            state = self.get(sampled_id)
            if state.state_id in self.retired:  # its environment could not be rebuilt: draw another seed
                state = self.draw(step, ("retired", group))
        for attempt in range(8):  # skip states that keep giving equal rewards (at most 8 redraws)
            if not self._skip(state, step, group, attempt):
                break
            self.counts["skipped_equal"] += 1
            state = self.draw(step, ("skip", group, attempt), exclude=self.stale())
        return state

    def stale(self) -> set[str]:
        """Ids whose last :attr:`skip_equal_after` groups all gave equal rewards (empty when skipping is off)."""
        if self.skip_equal_after < 1:
            return set()
        return {sid for sid, n in self.equal_streak.items() if n >= self.skip_equal_after}

    def _skip(self, state: PoolState, step: int, group: int, attempt: int) -> bool:
        if self.skip_equal_after < 1 or self.equal_streak.get(state.state_id, 0) < self.skip_equal_after:
            return False
        return self._rng("explore", step, group, attempt).random() >= self.skip_equal_explore

    def record_groups(self, groups: Iterable[tuple[str, int, list[float]]],
                      gather: Callable[[list], list] | None = None) -> None:  # fmt: skip
        """Update each state's streak of equal-reward groups from the groups just scored.

        Args:
            groups: ``(state_id, global group index, scored rewards)`` of this process's group parts.
            gather: e.g. accelerate's ``gather_object``; every rank calls this at the same steps, so a group
                split across ranks is judged on all its rewards and the streaks stay identical everywhere.
        """
        for (sid, _), rewards in sorted(merge_group_parts(groups, gather).items()):
            if len(rewards) < 2:
                continue
            self.equal_streak[sid] = self.equal_streak.get(sid, 0) + 1 if len(set(rewards)) == 1 else 0

    def draw(self, step: int, key: Any, exclude: set[str] | None = None) -> PoolState:
        """A state drawn afresh (dynamic sampling's replacement groups): online with probability
        ``online_fraction`` when there are online states, else a seed; seeded by ``(step, key)``."""
        exclude = set(exclude or ()) | self.retired | self._local_bad
        rng = self._rng("draw", step, key)
        online = [s for s in self.online if s.state_id not in exclude]
        seeds = [s for s in self.seeds if s.state_id not in exclude] or [
            s for s in self.seeds if s.state_id not in self.retired | self._local_bad]
        if online and rng.random() < self.online_fraction:
            return online[rng.randrange(len(online))]
        if not seeds:
            raise RuntimeError("every seed state of the pool was retired (their environments could not be rebuilt)")
        return seeds[rng.randrange(len(seeds))]

    def mark_retired(self, state_id: str) -> None:
        """Stop choosing a state whose environment could not be rebuilt (its replay diverged): at once for
        this process's replacement draws, on every rank from the next :meth:`refresh`."""
        if state_id not in self.retired and state_id not in self._local_bad:
            self._local_bad.add(state_id)
            self._retired_pending.append(state_id)

    # ------------------------------------------------------------------------------- refresh
    def add_candidates(self, states: Iterable[PoolState]) -> None:
        """Queue new online states found on this process (added at the next :meth:`refresh`)."""
        self.pending.extend(states)

    def refresh(self, gather: Callable[[list[PoolState]], list[PoolState]] | None = None) -> list[str]:
        """Add the queued online states of every process (``gather``: e.g. accelerate's ``gather_object``;
        every rank must call this at the same steps), and retire the states marked on any rank.

        New states are de-duplicated by id, sorted by ``(created_step, state_id)`` (same order on every
        rank), filtered by prompt length, and appended; beyond ``max_online`` the oldest are evicted.

        Returns:
            The ids of evicted states (their cached snapshots can be released).
        """
        pending, self.pending = self.pending, []
        everything = gather(pending) if gather is not None else pending
        bad, self._retired_pending = self._retired_pending, []
        for sid in sorted(set(gather(bad) if gather is not None else bad)):
            if sid not in self.retired:
                self.retired.add(sid)
                self.counts["retired"] += 1
        self._local_bad -= self.retired
        new: dict[str, PoolState] = {}
        for s in everything:
            if s.state_id not in self.by_id and s.state_id not in new:
                new[s.state_id] = s
        added = 0
        for s in sorted(new.values(), key=lambda s: (s.created_step, s.state_id)):
            if not self._fits(s):
                continue
            self.online.append(s)
            self.by_id[s.state_id] = s
            added += 1
        self.counts["online_added"] += added
        evicted = []
        while len(self.online) > self.max_online:
            old = self.online.pop(0)
            del self.by_id[old.state_id]
            evicted.append(old.state_id)
        self.counts["online_evicted"] += len(evicted)
        return evicted

    # --------------------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        """The online part of the pool and counters (JSON-able), for checkpoints."""
        return {"online": [s.to_json() for s in self.online], "pending": [s.to_json() for s in self.pending],
                "retired": sorted(self.retired), "counts": dict(self.counts),
                "equal_streak": dict(sorted(self.equal_streak.items()))}  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` saved (resume)."""
        for s in self.online:
            self.by_id.pop(s.state_id, None)
        self.online = [PoolState.from_json(o) for o in state.get("online", [])]
        self.pending = [PoolState.from_json(o) for o in state.get("pending", [])]
        for s in self.online:
            self.by_id[s.state_id] = s
        self.retired = set(state.get("retired", []))
        self.counts = Counter(state.get("counts", {}))
        self.equal_streak = dict(state.get("equal_streak", {}))

    def __len__(self) -> int:
        return len(self.seeds) + len(self.online)


@dataclass
class SnapshotCache:
    """Snapshots of materialised states, least recently used released first (local sandbox).

    A released snapshot's files stay until the last fork started from it stops
    (:meth:`reterm.sandbox.snapshot.Snapshot.release`), so evicting one in use is safe.
    """

    max_size: int = 16
    _items: OrderedDict = field(default_factory=OrderedDict)
    pinned: set = field(default_factory=set)  # ids in use by the running batch: never evicted
    building: dict = field(default_factory=dict)  # state id -> future of a snapshot being made (materialize)
    hits: int = 0
    misses: int = 0

    def get(self, state_id: str):
        snap = self._items.get(state_id)
        if snap is None or snap.released or not snap.path.exists():
            self._items.pop(state_id, None)
            self.misses += 1
            return None
        self._items.move_to_end(state_id)
        self.hits += 1
        return snap

    def put(self, state_id: str, snap) -> None:
        old = self._items.pop(state_id, None)
        if old is not None and old is not snap:
            old.release()
        self._items[state_id] = snap
        self._evict()

    def _evict(self) -> None:
        for sid in list(self._items):
            if len(self._items) <= self.max_size:
                break
            if sid not in self.pinned:
                self._items.pop(sid).release()

    def pin(self, state_ids: Iterable[str]) -> None:
        """Keep these states' snapshots while a batch forks from them (eviction waits for :meth:`unpin`)."""
        self.pinned |= set(state_ids)

    def unpin(self) -> None:
        self.pinned.clear()
        self._evict()

    def discard(self, state_ids: Iterable[str]) -> None:
        for sid in state_ids:
            snap = self._items.pop(sid, None)
            if snap is not None:
                snap.release()

    def close(self) -> None:
        """Release every snapshot (end of training)."""
        while self._items:
            _, snap = self._items.popitem()
            snap.release()

    def __len__(self) -> int:
        return len(self._items)
