"""Stage 6: records from verified attempts, the dataset folder in the Hub layout, and ``stats.json``.

- A **record** (:data:`reterm.record_features.FEATURES`) is one attempt's whole conversation in the training
  format (:meth:`reterm.trajectory.Trajectory.to_messages`, normalised with
  :func:`reterm.records.normalise_message`): the failure prefix, then the recovery, ``train_from_message_index``
  pointing at the first recovery message. Its ``id`` is a hash of task and messages, so identical
  records share it.
- The folder is written by :func:`reterm.data.layout.write_dataset_folder` (``data/train-*.parquet`` +
  ``stats.json``, :class:`reterm.data.dataset_stats.DatasetStats`); ``datasets.load_dataset(FOLDER)`` loads it.
- Failed attempts go to ``failed_attempts/attempts-00000-of-00001.parquet`` with the same columns
  (``verifier_reward`` 0): for analysis and as GRPO failure states. ``load_dataset(FOLDER)`` reads only
  ``data/``; ``load_dataset("parquet", data_files=FOLDER/failed_attempts/*.parquet)`` reads them.
- Next to them: ``run_config.yaml`` (the resolved config) and ``versions.json`` (Python and packages).
"""

from __future__ import annotations

import hashlib
import os
import platform
import sys
from collections import Counter, defaultdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml

from reterm.data.config import PipelineConfig
from reterm.data.layout import write_dataset_folder
from reterm.data.recover import WorkItem
from reterm.data.tasks import TaskInfo
from reterm.io import atomic_output, default_mode, write_text_atomic
from reterm.record_features import FEATURES
from reterm.trajectory import Outcome, Trajectory, write_json_atomic

FAILED_DIR = "failed_attempts"
PACKAGES = ("torch", "transformers", "trl", "datasets", "huggingface_hub", "harbor", "pydantic", "peft",
            "accelerate", "pyarrow")  # fmt: skip


def make_record(item: WorkItem, attempt: Trajectory, task: TaskInfo, scored: int, successes: int) -> dict[str, Any]:
    """The row of one recovery attempt from ``item``'s failure state, written by the one record writer
    (:meth:`reterm.recovery.state.State.to_record`: the release columns, ``target_attempt_index`` from the
    state's level, ``trajectory_id`` the state's id)."""
    st = item.state
    return st.to_record(attempt, task_license=task.license, failure_step=st.step, injection=item.injection,
                        failure_command=st.command, failure_output=st.output, attempts=scored,
                        successful_attempts=successes, source_policy=item.source_policy)  # fmt: skip


def attempt_trajectories(unit: dict[str, Any]) -> list[Trajectory]:
    return [Trajectory.model_validate(a) for a in unit.get("attempts", [])]


def records_from_unit(item: WorkItem, unit: dict[str, Any], task: TaskInfo, per_state: int
                      ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:  # fmt: skip
    """(candidate records, failed-attempt rows) of one failure state's recovery unit.

    Candidates are the state's verified attempts, fewest recovery turns first (then id), at most
    ``per_state``; identical attempts (same record id) count once. Infrastructure faults give no row.
    """
    attempts = attempt_trajectories(unit)
    scored = [a for a in attempts if a.outcome in (Outcome.SUCCESS, Outcome.FAILURE)]
    ok = [a for a in scored if a.outcome is Outcome.SUCCESS]
    rows_ok, rows_failed, seen = [], [], set()
    for a in ok:
        r = make_record(item, a, task, len(scored), len(ok))
        if r["id"] not in seen:
            seen.add(r["id"])
            rows_ok.append(r)
    rows_ok.sort(key=lambda r: (r["recovery_turns"], r["id"]))
    for a in scored:
        if a.outcome is Outcome.FAILURE:
            r = make_record(item, a, task, len(scored), len(ok))
            if r["id"] not in seen:
                seen.add(r["id"])
                rows_failed.append(r)
    rows_failed.sort(key=lambda r: r["id"])
    return rows_ok[:per_state], rows_failed


def write_parquet(rows: list[dict[str, Any]], path: Path) -> Path:
    """Rows with :data:`FEATURES` as one parquet file, atomically."""
    from datasets import Dataset

    path.parent.mkdir(parents=True, exist_ok=True)
    if rows:
        ds = Dataset.from_list(rows, features=FEATURES)
    else:  # from_list cannot infer an empty table's columns
        ds = Dataset.from_dict({name: [] for name in FEATURES}, features=FEATURES)
    with atomic_output(path) as tmp:
        ds.to_parquet(str(tmp))
        os.chmod(tmp, default_mode())  # records are for everyone to read
    return path


def versions() -> dict[str, Any]:
    """Python, platform and the versions of the packages a build depends on."""
    from importlib.metadata import PackageNotFoundError, version

    pkgs = {}
    for name in PACKAGES:
        try:
            pkgs[name] = version(name)
        except PackageNotFoundError:
            pkgs[name] = None
    return {"python": sys.version.split()[0], "platform": platform.platform(), "packages": pkgs}


def build_stats(cfg: PipelineConfig, kept: list[dict[str, Any]], splits: dict[str, list[dict[str, Any]]],
                per_category: dict[str, dict[str, int]],
                rollouts: dict[str, int], infra_faults: int, funnel: dict[str, int], benchmarks: list[str],
                decon_method: str, tasks: list[TaskInfo], policy: str, teacher: str) -> dict[str, Any]:  # fmt: skip
    """The ``stats.json`` dict (validated by :class:`reterm.data.dataset_stats.DatasetStats` when written);
    ``splits`` is :func:`split_records` of ``kept``."""
    records_per_cat = Counter(r["failure_category"] for r in kept)
    categories = {}
    for cat in sorted(set(per_category) | set(records_per_cat)):
        c = per_category.get(cat, {})
        categories[cat] = {"failure_states": c.get("failure_states", 0), "attempts": c.get("attempts", 0),
                           "successful_attempts": c.get("successful_attempts", 0),
                           "records": records_per_cat.get(cat, 0)}  # fmt: skip
    if not categories:
        categories = {"other": {"failure_states": 0, "attempts": 0, "successful_attempts": 0, "records": 0}}
    licences = Counter(t.license for t in tasks)
    records_per_licence = Counter(r["task_license"] for r in kept)
    sources = []
    for lic in sorted(licences):
        name = cfg.dataset.source_name if len(licences) == 1 else f"{cfg.dataset.source_name} ({lic})"
        sources.append({"name": name, "license": lic, "tasks": licences[lic], "records": records_per_licence.get(lic, 0),
                        "url": cfg.dataset.source_url})  # fmt: skip
    sources_by_src = Counter(r["failure_source"] for r in kept)
    return {
        "name": cfg.dataset.name,
        "version": cfg.dataset.version,
        "created": datetime.now(timezone.utc).date().isoformat(),
        "license": cfg.dataset.license,
        "splits": {name: len(rows) for name, rows in splits.items()},
        "categories": categories,
        "failure_sources": {"own": sources_by_src.get("own", 0), "injected": sources_by_src.get("injected", 0)},
        "rollouts": {"episodes": rollouts["episodes"], "failed": rollouts["failed"], "infra_faults": infra_faults},
        "attempts_per_state": cfg.recovery.attempts,
        "filters": funnel,
        "decontamination": {"benchmarks": benchmarks or ["none"], "method": decon_method},
        "sources": sources,
        "policy": policy,
        "teacher": teacher,
        "config": cfg.resolved(),
        "citation": cfg.dataset.citation,
    }


def held_out_task_ids(kept: list[dict[str, Any]], n_tasks: int, seed: int) -> list[str]:
    """The ``n_tasks`` task ids (among those with records) whose records form the held-out split.

    Chosen by a seeded hash of the task id, so the choice is the same on every run and resume with the
    same records and seed. At least one task always stays in ``train``: with ``n_tasks`` >= the number of
    tasks that have records, fewer are held out (all but one). Returns ``[]`` for ``n_tasks`` 0.
    """
    tasks = sorted({r["task_id"] for r in kept})
    n = min(n_tasks, max(len(tasks) - 1, 0))
    ranked = sorted(tasks, key=lambda t: hashlib.sha1(f"{seed}:{t}".encode()).hexdigest())
    return sorted(ranked[:n])


def split_records(kept: list[dict[str, Any]], cfg: PipelineConfig) -> dict[str, list[dict[str, Any]]]:
    """``{"train": rows}``, plus ``"test"``: the rows of :func:`held_out_task_ids` when
    ``dataset.held_out_tasks`` > 0 (whole tasks held out, so no state of a held-out task is trained on)."""
    held = set(held_out_task_ids(kept, cfg.dataset.held_out_tasks, cfg.seed))
    if not held:
        return {"train": kept}
    return {"train": [r for r in kept if r["task_id"] not in held], "test": [r for r in kept if r["task_id"] in held]}


def write_output(output: Path, splits: dict[str, list[dict[str, Any]]], failed: list[dict[str, Any]],
                 stats: dict[str, Any], cfg: PipelineConfig) -> dict[str, Any]:  # fmt: skip
    """Write the dataset folder (``splits``: :func:`split_records`), the failed attempts, the run's config
    and versions. Returns the paths."""

    shards = write_dataset_folder(output, splits, stats)
    failed_path = write_parquet(failed, output / FAILED_DIR / "attempts-00000-of-00001.parquet")
    cfg_path = output / "run_config.yaml"
    write_text_atomic(cfg_path, yaml.safe_dump(cfg.resolved(), sort_keys=False))
    vers = write_json_atomic(output / "versions.json", versions())
    return {"shards": [str(p) for name in splits for p in shards[name]], "failed_attempts": str(failed_path),
            "config": str(cfg_path), "versions": str(vers)}  # fmt: skip


def per_category_counts(items: list[WorkItem], units: dict[str, dict[str, Any]]) -> dict[str, dict[str, int]]:
    """Per category: failure states (sent to recovery), scored attempts, successful attempts, diverged
    rebuilds and infrastructure faults."""
    out: dict[str, dict[str, int]] = defaultdict(lambda: Counter())  # type: ignore[arg-type]
    for item in items:
        c = out[item.state.category]
        c["failure_states"] += 1
        unit = units.get(item.state.id)
        if unit is None:
            continue
        c["diverged"] += int(unit["status"] == "diverged")
        c["diverged_attempts"] += int(unit.get("diverged_attempts", 0))
        c["rebuild_infra"] += int(unit["status"] == "infra")
        for a in attempt_trajectories(unit):
            if a.outcome.is_infra_fault:
                c["infra_attempts"] += 1
            elif a.outcome in (Outcome.SUCCESS, Outcome.FAILURE):
                c["attempts"] += 1
                c["successful_attempts"] += int(a.outcome is Outcome.SUCCESS)
    return {k: dict(v) for k, v in sorted(out.items())}
