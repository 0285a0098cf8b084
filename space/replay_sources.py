"""What the Space's replay mode can open, turned into views (:mod:`trajectory_view`).

A source is named by one string (:func:`open_source` tells the kinds apart):

- **ReTerm-10K records** (:data:`reterm.record_features.FEATURES`): a dataset folder as ``reterm data build`` or
  ``push_to_hub`` writes it (``data/{split}-*.parquet``), a ``.parquet``/``.jsonl`` file, or a Hub dataset
  id (``ORG/NAME``: fetched with ``huggingface_hub.snapshot_download``, or taken from the Hub cache when
  the Hub cannot be reached, which is found out within :data:`HUB_TIMEOUT_S`; then
  ``datasets.load_dataset``). Each record is a failure prefix then the
  verified recovery; the failing step is ``failure_step``, the recovery starts at ``train_from_message_index``.
- **Harbor job folders** (trial folders with ``config.json``/``result.json``/``agent/``; a job folder; or
  the folder ``harbor run -o DIR`` writes, holding one job folder per run), read with
  :func:`reterm.agent.atif.trajectories_from_job`; the failure step is the primary failure state of
  :func:`reterm.recovery.localise` (rules), and steps after it are the recovery when the trial passed.
- **Folders of trajectory files** (this kit's ``Trajectory.save`` JSON, ``schema_version``
  ``reterm-trajectory/1``), searched three levels deep: attempts that share a failure prefix
  (``prefix_len > 0``) are grouped into a recovery fan-out by ``metadata["failure_state"]`` (eval's
  recovery-from-states and the Space's live runs), ``metadata["state_id"]`` (GRPO rollouts), else by
  the prefix itself; trajectories without a prefix are shown as single episodes.
- **ReTerm-GRPO rollouts** (``output_dir/rollouts/round-*-step-*-rank*.jsonl``, or the run's
  ``output_dir``): each group of a step is a fan-out of its G attempts.

Local paths can be confined to allowed roots (a public Space must not read arbitrary files):
:class:`SourceError` names the path and what is allowed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from reterm.recovery.state import State, state_id_of
from reterm.training.grpo_outputs import ROLLOUT_FILES, read_rollout_file
from reterm.trajectory import Outcome, Trajectory

from trajectory_view import EpisodeView, FanOutView

MAX_ITEMS = 1000  # entries offered in the item dropdown (filter by category to see others)
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_SCHEMA = "reterm-trajectory/"


class SourceError(ValueError):
    """A replay source that cannot be opened (the message names the source and why)."""


@dataclass
class Item:
    """One entry of a source: ``key`` (stable within the source), ``label`` (dropdown text), ``category``."""

    key: str
    label: str
    category: str = ""


@dataclass
class Source:
    """An opened replay source.

    Attributes:
        name: the string it was opened from.
        kind: ``records``, ``job`` or ``trajectories``.
        description: one line shown above the item list (counts).
        items: every entry, in display order.
    """

    name: str
    kind: str
    description: str
    items: list[Item] = field(default_factory=list)
    _data: dict[str, Any] = field(default_factory=dict, repr=False)

    def categories(self) -> list[str]:
        """The failure categories present, sorted."""
        return sorted({i.category for i in self.items if i.category})

    def filtered(self, category: str | None = None) -> list[Item]:
        """Items of one category (all for ``None``/"" /"all"), at most :data:`MAX_ITEMS`."""
        items = self.items if category in (None, "", "all") else [i for i in self.items if i.category == category]
        return items[:MAX_ITEMS]

    def view(self, key: str) -> EpisodeView | FanOutView:
        """The view of one item.

        Raises:
            SourceError: an unknown key, or an item whose fields cannot be shown (a wrongly typed
                ``failure_step``, ...): the message names the item, so the Space shows it instead of a bare error.
        """
        if key not in self._data:
            raise SourceError(f"{self.name}: no item {key!r}")
        builder = {"records": _record_view, "job": _job_view, "trajectories": _traj_view}[self.kind]
        try:
            return builder(self._data[key])
        except (TypeError, ValueError, KeyError, IndexError) as exc:
            raise SourceError(f"{self.name}: item {key!r} cannot be shown: {type(exc).__name__}: {exc}") from exc


# --------------------------------------------------------------------------------- opening
def check_allowed(path: Path, allowed_roots: list[Path] | None) -> Path:
    """``path`` resolved, if it lies under one of ``allowed_roots`` (``None``: anything goes).

    Raises :class:`SourceError` naming the path and the allowed roots.
    """
    resolved = path.expanduser().resolve()
    if allowed_roots is None:
        return resolved
    for root in allowed_roots:
        root = root.expanduser().resolve()
        if resolved == root or root in resolved.parents:
            return resolved
    names = ", ".join(r.name or str(r) for r in allowed_roots) or "none"
    raise SourceError(f"{path}: local paths outside the app's data folders ({names}) cannot be opened here; "
                      "use one of the listed sources or a Hub dataset id")  # fmt: skip


def open_source(spec: str, *, allowed_roots: list[Path] | None = None) -> Source:
    """Open a replay source (see the module docstring for the kinds).

    Args:
        spec: a local path (folder or file) or a Hub dataset id ``ORG/NAME``.
        allowed_roots: local paths must lie under one of these (``None``: no restriction).

    Raises:
        SourceError: empty spec, a path that is not a known kind, unreadable data, nothing to show.
    """
    spec = (spec or "").strip()
    if not spec:
        raise SourceError("no source given: enter a dataset folder, a Harbor job folder, a folder of attempt "
                          "trajectories, or a Hub dataset id (ORG/NAME)")  # fmt: skip
    path = Path(spec).expanduser()
    if path.exists():
        path = check_allowed(path, allowed_roots)
        if path.is_file():
            if path.suffix in (".parquet", ".jsonl"):
                return _records_source(spec, _load_records_file(path))
            if path.suffix == ".json":
                return _trajectories_source(spec, [path])
            raise SourceError(f"{spec}: not a .parquet/.jsonl records file or a .json trajectory")
        for folder in (path, path / "rollouts"):  # a GRPO run's rollouts/, or its output_dir
            if folder.is_dir() and any(folder.glob(ROLLOUT_FILES)):
                return _rollouts_source(spec, folder)
        if _is_dataset_folder(path):
            return _records_source(spec, _load_dataset(str(path), spec))
        if _is_trial_folder(path) or _trial_folders(path) or _job_folders(path):
            return _job_source(spec, path)
        files = _trajectory_files(path)
        if files:
            return _trajectories_source(spec, files)
        raise SourceError(f"{spec}: found no ReTerm-10K shards (data/*.parquet), Harbor trial folders or "
                          "trajectory JSON files in this folder")  # fmt: skip
    if _HUB_ID.match(spec) and not spec.startswith((".", "/", "~")):
        return _records_source(spec, _load_dataset(str(_hub_dataset_folder(spec)), spec))
    raise SourceError(f"{spec}: no such file or folder, and not a Hub dataset id (ORG/NAME)")


def _is_dataset_folder(path: Path) -> bool:
    return any(path.glob("data/*.parquet")) or any(path.glob("*.parquet")) or any(path.glob("data/*.jsonl"))


def _is_trial_folder(path: Path) -> bool:
    return (path / "config.json").is_file() and (path / "agent").is_dir()


def _trial_folders(path: Path) -> list[Path]:
    """Trial folders directly under ``path`` (a job folder): ``config.json`` and ``agent/`` or
    ``result.json``, and no trial folders of their own (a job folder has the same two files)."""
    return sorted(p for p in path.iterdir() if p.is_dir() and (p / "config.json").is_file()
                  and ((p / "agent").is_dir() or (p / "result.json").is_file())
                  and not any((c / "config.json").is_file() and (c / "agent").is_dir()
                              for c in p.iterdir() if c.is_dir()))  # fmt: skip


def _job_folders(path: Path) -> list[Path]:
    """Job folders directly under ``path`` (the ``-o`` folder of ``harbor run``): each holds a
    ``config.json`` and trial folders."""
    return sorted(p for p in path.iterdir() if p.is_dir() and (p / "config.json").is_file() and _trial_folders(p))


HUB_TIMEOUT_S = 3.0  # seconds to find out whether the Hub answers before falling back to the cache


def _within(seconds: float, call: Callable[[], Any]) -> Any:
    """``call()``'s result if it returns within ``seconds`` of wall time.

    huggingface_hub retries a timed-out request, so its own ``timeout`` does not bound the wait; the
    call runs in a daemon thread that is left behind on expiry.

    Raises:
        TimeoutError: ``call`` did not return in time.
        Exception: whatever ``call`` raised.
    """
    import threading

    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = call()
        except BaseException as exc:  # handed to the caller's thread
            box["error"] = exc

    worker = threading.Thread(target=run, daemon=True, name="hub-probe")
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        raise TimeoutError(f"timed out after {seconds:g} s")
    if "error" in box:
        raise box["error"]
    return box.get("value")


def _hub_dataset_folder(spec: str) -> Path:
    """A local snapshot of Hub dataset ``spec``: downloaded when the Hub answers within
    :data:`HUB_TIMEOUT_S`, else the Hub cache's copy. ``datasets.load_dataset(ID)`` would retry for
    about 25 s offline before failing.

    Raises:
        SourceError: the Hub cannot be reached (or has no such dataset) and the cache has no copy.
    """
    from huggingface_hub import HfApi, constants, snapshot_download

    patterns = ["data/*", "*.parquet", "*.jsonl", "*.json", "README.md"]
    try:
        _within(HUB_TIMEOUT_S, lambda: HfApi().dataset_info(spec, timeout=HUB_TIMEOUT_S))
    except Exception as exc:  # unreachable, unknown repo, no access: the cache is the only chance
        reason = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ''}"
        try:
            return Path(snapshot_download(spec, repo_type="dataset", allow_patterns=patterns, local_files_only=True))
        except Exception:
            raise SourceError(f"{spec}: the Hub dataset cannot be opened: {constants.ENDPOINT} did not answer within "
                              f"{HUB_TIMEOUT_S:g} s or refused ({reason}), and the Hub cache has no copy") from None  # fmt: skip
    try:
        return Path(snapshot_download(spec, repo_type="dataset", allow_patterns=patterns))
    except Exception as exc:
        raise SourceError(f"{spec}: downloading the Hub dataset failed ({type(exc).__name__}: {str(exc)[:200]})") from None


def _load_dataset(name: str, spec: str) -> list[tuple[str, Any]]:
    """(split, dataset) pairs of a dataset folder or Hub id."""
    try:
        from datasets import load_dataset

        dd = load_dataset(name)
    except Exception as exc:
        raise SourceError(f"{spec}: cannot load the dataset ({type(exc).__name__}: {str(exc)[:300]})") from exc
    return [(split, dd[split]) for split in dd]


def _load_records_file(path: Path) -> list[tuple[str, Any]]:
    try:
        from datasets import load_dataset

        kind = "parquet" if path.suffix == ".parquet" else "json"
        return [("train", load_dataset(kind, data_files=str(path), split="train"))]
    except Exception as exc:
        raise SourceError(f"{path}: cannot read records ({type(exc).__name__}: {str(exc)[:300]})") from exc


# --------------------------------------------------------------------------------- records
_RECORD_COLUMNS = ("messages", "train_from_message_index", "failure_step", "failure_category", "task_id")


def _records_source(spec: str, splits: list[tuple[str, Any]]) -> Source:
    src = Source(spec, "records", "")
    n = 0
    for split, ds in splits:
        missing = [c for c in _RECORD_COLUMNS if c not in ds.column_names]
        if missing:
            raise SourceError(f"{spec}: split {split!r} is not ReTerm-10K records (missing columns: {', '.join(missing)})")
        cats = ds["failure_category"]
        tasks = ds["task_id"]
        ids = ds["id"] if "id" in ds.column_names else [str(i) for i in range(len(ds))]
        for i in range(len(ds)):
            key = f"{split}:{i}"
            src.items.append(Item(key, f"{tasks[i]} · {cats[i]} · {split} #{i} ({str(ids[i])[:8]})", cats[i]))
            src._data[key] = (ds, i, split)
            n += 1
    if not n:
        raise SourceError(f"{spec}: the dataset has no records")
    src.description = (f"ReTerm-10K records: {n} in {len(splits)} split(s) "
                       f"({', '.join(f'{s}: {len(d)}' for s, d in splits)}), {len(src.categories())} error categories")  # fmt: skip
    return src


def record_trajectory(row: dict[str, Any]) -> tuple[Trajectory, int]:
    """The trajectory of one record and the index of its first recovery step.

    Raises :class:`SourceError` naming the record when its messages do not have the training layout.
    """
    from reterm.agent.atif import from_messages
    from reterm.records import chat_messages

    try:
        traj = from_messages(chat_messages(row["messages"]), task_id=row.get("task_id") or "",
                             policy=row.get("teacher") or "")  # fmt: skip
    except (KeyError, ValueError, TypeError) as exc:
        raise SourceError(f"record {row.get('id', '?')}: messages are not a ReTerm conversation ({exc})") from exc
    start = int(row.get("train_from_message_index") or 0)
    recovery_from = sum(1 for m in row["messages"][:start] if m["role"] == "assistant")
    reward = row.get("verifier_reward")
    traj.set_reward(None if reward is None else float(reward))
    return traj, recovery_from


def _record_view(data: tuple[Any, int, str]) -> EpisodeView:
    ds, i, split = data
    row = ds[i]
    traj, recovery_from = record_trajectory(row)
    step = int(row.get("failure_step", recovery_from - 1))
    notes = []
    if row.get("failure_source") == "injected":
        notes.append(f"Failure injected into a successful run: {row.get('injection') or 'perturbed step'}.")
    if row.get("attempts"):
        notes.append(f"{row.get('successful_attempts', '?')} of {row['attempts']} recovery attempts forked from this "
                     "failure state passed the verifier; this record keeps one of them.")  # fmt: skip
    try:  # the one record reader names the failure state (its id is the one every stage joins on)
        state = State.from_record(row).id
    except ValueError:
        state = ""
    meta = [("record", str(row.get("id", ""))), ("failure state", state), ("split", split),
            ("failed policy", row.get("source_policy") or ""),
            ("recovery by", row.get("teacher") or ""), ("license", row.get("task_license") or "")]  # fmt: skip
    return EpisodeView(traj, title=f"{row.get('task_id')}", failure_step=step if 0 <= step < len(traj.steps) else None,
                       failure_category=row.get("failure_category"), recovery_from=recovery_from,
                       meta=meta, notes=notes)  # fmt: skip


# ------------------------------------------------------------------------------ job folders
def _job_source(spec: str, path: Path) -> Source:
    from reterm.agent.atif import trajectory_from_trial
    from reterm.recovery.localise import localise

    if _is_trial_folder(path):
        trials = [path]
    else:
        trials = _trial_folders(path) or [t for job in _job_folders(path) for t in _trial_folders(job)]
    src = Source(spec, "job", "")
    skipped, unreadable = 0, []
    for trial in trials:
        try:
            traj = trajectory_from_trial(trial)
        except FileNotFoundError:
            skipped += 1
            continue
        except ValueError as exc:  # a torn or foreign result.json: name it in one line, keep the others
            unreadable.append(f"{trial.name}: {str(exc).splitlines()[0][:200]}")
            continue
        loc = localise(traj)
        primary = loc.primary
        cat = primary.category if primary else ""
        outcome = ("pass" if traj.outcome is Outcome.SUCCESS else "fail" if traj.outcome is Outcome.FAILURE
                   else f"infra: {traj.outcome.value}" if traj.outcome.is_infra_fault else traj.outcome.value)  # fmt: skip
        label = f"{trial.name} · {outcome}" + (f" · {cat}" if cat else "")
        src.items.append(Item(trial.name, label, cat))
        src._data[trial.name] = (trial, traj, loc)
    if not src.items:
        raise SourceError(f"{spec}: no trial in this Harbor job folder has a trajectory "
                          f"({skipped} trial folder(s) without agent/reterm_trajectory.json or agent/trajectory.json"
                          + (f"; {len(unreadable)} unreadable, e.g. {unreadable[0]}" if unreadable else "") + ")")  # fmt: skip
    passed = sum(1 for _, t, _ in src._data.values() if t.outcome is Outcome.SUCCESS)
    src.description = (f"Harbor job: {len(src.items)} trials with a trajectory ({passed} passed)"
                       + (f", {skipped} without one" if skipped else "")
                       + (f", {len(unreadable)} unreadable ({unreadable[0]})" if unreadable else ""))  # fmt: skip
    return src


def _job_view(data: tuple[Path, Trajectory, Any]) -> EpisodeView:
    trial, traj, loc = data
    primary = loc.primary
    view = EpisodeView(traj, title=f"{traj.task_id} · {trial.name}", labels=list(loc.step_labels),
                       meta=[("policy", traj.policy), ("stop", traj.stop_reason or ""), ("trial", trial.name)])  # fmt: skip
    if primary is not None and primary.step < len(traj.steps):
        view.failure_step, view.failure_category, view.failure_evidence = primary.step, primary.category, primary.evidence
        if primary.step + 1 < len(traj.steps):
            view.recovery_from = primary.step + 1
        if primary.localisation.resolved_by is not None:
            view.notes.append(f"The agent fixed this failure itself at step {primary.localisation.resolved_by + 1}.")
    elif loc.infra_fault:
        view.notes.append(f"Infrastructure fault: {loc.infra_reason or traj.error or traj.outcome.value} (not scored).")
    elif traj.outcome is Outcome.FAILURE:
        view.notes.append("The verifier failed but no failure state was found (e.g. out of turns while making progress).")
    return view


# ------------------------------------------------------------------------ trajectory folders
def _trajectory_files(path: Path, depth: int = 3) -> list[Path]:
    out: list[Path] = []

    def walk(d: Path, level: int) -> None:
        try:
            entries = sorted(d.iterdir())
        except OSError:
            return
        for p in entries:
            if p.is_file() and p.suffix == ".json" and _is_trajectory_file(p):
                out.append(p)
            elif p.is_dir() and level < depth and not p.name.startswith("."):
                walk(p, level + 1)

    walk(path, 1)
    return out


def _is_trajectory_file(path: Path) -> bool:
    try:
        with path.open("rb") as f:
            head = f.read(200)
    except OSError:
        return False
    return _SCHEMA.encode() in head


def group_key(traj: Trajectory) -> str:
    """The failure state an attempt was forked from, as ``<task_id>/<state_id>``: the state's id
    (:func:`reterm.recovery.state.state_id`, the one the dataset, the GRPO pool and the eval use) recorded in
    ``metadata["state_id"]`` (or ``["failure_state"]``), else computed from the attempt's history."""
    md = traj.metadata
    for k in ("state_id", "failure_state"):
        if md.get(k):
            return f"{traj.task_id}/{md[k]}"
    return f"{traj.task_id}/{state_id_of(traj, traj.steps[: traj.prefix_len])}"


def _trajectories_source(spec: str, files: list[Path]) -> Source:
    groups: dict[str, list[tuple[Path, Trajectory]]] = {}
    singles: list[tuple[Path, Trajectory]] = []
    for f in files:
        try:
            traj = Trajectory.load(f)
        except ValueError as exc:
            raise SourceError(str(exc)) from exc
        if traj.prefix_len > 0:
            groups.setdefault(group_key(traj), []).append((f, traj))
        else:
            singles.append((f, traj))
    src = Source(spec, "trajectories", "")
    for key, members in groups.items():
        members.sort(key=lambda m: (m[1].metadata.get("attempt") if isinstance(m[1].metadata.get("attempt"), int) else 0,
                                    m[0].name))  # fmt: skip
        trajs = [t for _, t in members]
        cat = trajs[0].metadata.get("failure_category") or ""
        passed = sum(t.outcome is Outcome.SUCCESS for t in trajs)
        label = (f"{trajs[0].task_id} · fan-out of {len(trajs)} · {passed} recovered" + (f" · {cat}" if cat else "")
                 + (f" · {trajs[0].policy}" if trajs[0].policy else ""))  # fmt: skip
        src.items.append(Item(f"group:{key}", label, cat))
        src._data[f"group:{key}"] = ("group", trajs)
    for f, traj in singles:
        key = f"file:{f}"
        outcome = ("pass" if traj.outcome is Outcome.SUCCESS else "fail" if traj.outcome is Outcome.FAILURE
                   else "not verified" if traj.outcome is Outcome.PENDING else traj.outcome.value)  # fmt: skip
        what = "episode" if traj.metadata.get("role") == "main" else f.stem
        src.items.append(Item(key, f"{traj.task_id} · {what} · {outcome} · {traj.policy}",
                              traj.metadata.get("failure_category") or ""))  # fmt: skip
        src._data[key] = ("single", traj, f)
    if not src.items:
        raise SourceError(f"{spec}: no trajectory files")
    src.description = f"Trajectory files: {len(groups)} recovery fan-out(s), {len(singles)} single episode(s)"
    return src


def _rollouts_source(spec: str, folder: Path) -> Source:
    """ReTerm-GRPO's ``rollouts/`` (:func:`reterm.training.grpo_outputs.read_rollout_file`): one fan-out per
    group of each step (G attempts from one failure state, or from the task start in standard mode).
    Attempts without a trajectory (infrastructure faults before the episode started) are counted, not shown."""
    src = Source(spec, "trajectories", "")
    n_groups = n_attempts = 0
    for path in sorted(folder.glob(ROLLOUT_FILES)):
        try:
            rows = read_rollout_file(path)
        except ValueError as exc:
            raise SourceError(str(exc)) from exc
        groups: dict[int, list[dict[str, Any]]] = {}
        for row in rows:
            groups.setdefault(row["group"], []).append(row)
        for g, members in groups.items():
            trajs = []
            for m in sorted(members, key=lambda r: r.get("attempt") or 0):
                if not m.get("trajectory"):
                    continue
                try:
                    traj = Trajectory.model_validate(m["trajectory"])
                except ValueError as exc:
                    raise SourceError(f"{path}: group {g}, attempt {m.get('attempt')}: not a trajectory: {exc}") from exc
                if m.get("category"):
                    traj.metadata.setdefault("failure_category", m["category"])
                trajs.append(traj)
            n_groups, n_attempts = n_groups + 1, n_attempts + len(members)
            if not trajs:
                continue
            first = members[0]
            passed = sum(m.get("outcome") == "success" for m in members)
            faults = sum(m.get("reward") is None for m in members)
            where = f"state {first.get('state_id')}" if trajs[0].prefix_len else "from the task start"
            label = (f"step {first.get('step')} · {first.get('task_id') or trajs[0].task_id} · group of {len(members)} · "
                     f"{passed} recovered" + (f" · {faults} infra" if faults else "") + f" · {where}"
                     + (f" · {first['category']}" if first.get("category") else ""))  # fmt: skip
            key = f"grpo:{path.stem}:{g}"
            src.items.append(Item(key, label, first.get("category") or ""))
            src._data[key] = ("group", trajs)
    if not src.items:
        raise SourceError(f"{spec}: GRPO rollouts without any attempt trajectory")
    src.description = f"ReTerm-GRPO rollouts: {n_groups} group(s), {n_attempts} attempt(s)"
    return src


def fanout_view(attempts: list[Trajectory], title: str | None = None) -> FanOutView:
    """A fan-out view from attempts sharing one failure prefix (``attempts[0].steps[:prefix_len]``).

    The failure step is ``metadata["failure_step"]`` when given, else the prefix's last step; the category
    is ``metadata["failure_category"]``, else the rules classifier's label of that step.
    """
    first = attempts[0]
    md = first.metadata
    prefix = first.model_copy(deep=True)
    prefix.steps = prefix.steps[: first.prefix_len]
    prefix.prefix_len = 0
    prefix.outcome, prefix.reward = Outcome.PENDING, None
    step = md.get("failure_step")
    step = int(step) if isinstance(step, int) else len(prefix.steps) - 1
    category = md.get("failure_category")
    evidence = md.get("failure_evidence") or ""
    if not category and prefix.steps:
        from reterm.recovery.localise import localise

        states = [s for s in localise(prefix, include_history=True).states if s.step == step]
        if states:
            category, evidence = states[0].category, states[0].evidence
    in_prefix = 0 <= step < len(prefix.steps)
    view = EpisodeView(prefix, title=title or f"{first.task_id}: failure prefix",
                       failure_step=step if in_prefix else None, failure_category=category,
                       failure_evidence=evidence, show_verifier=False,
                       meta=[("failed policy", md.get("source_policy") or ""), ("recovery policy", first.policy)],
                       prefix_note=f"🔀 state forked here into {len(attempts)} recovery attempts")  # fmt: skip
    if not in_prefix and category:
        view.notes.append(f"Failure: {category.replace('_', ' ')} (the episode ended here; "
                          "attempts continue from its last state).")
    return FanOutView(view, attempts, title=view.title)


def _traj_view(data: tuple) -> EpisodeView | FanOutView:
    if data[0] == "group":
        return fanout_view(data[1])
    _, traj, f = data
    from reterm.recovery.localise import localise

    loc = localise(traj)
    view = EpisodeView(traj, title=f"{traj.task_id} · {f.stem}", labels=list(loc.step_labels),
                       meta=[("policy", traj.policy), ("stop", traj.stop_reason or "")])  # fmt: skip
    primary = loc.primary
    if primary is not None and primary.step < len(traj.steps):
        view.failure_step, view.failure_category, view.failure_evidence = primary.step, primary.category, primary.evidence
        if primary.step + 1 < len(traj.steps):
            view.recovery_from = primary.step + 1
    return view
