"""``stats.json``: the numbers the data pipeline reports next to the ReTerm-10K parquet shards.

The pipeline (``pipeline/``) writes it with :func:`reterm.data.layout.write_dataset_folder`; the
dataset card (:mod:`reterm.cards.dataset`) reads it. Counts are plain integers, rates are derived here
(never stored), so the file cannot disagree with itself. :class:`DatasetStats` checks that the totals
agree (records per split = per category = per source = kept after the filters) and the renderer checks
them against the parquet shards.

Shape (``schema_version`` ``"reterm-dataset-stats/1"``)::

    {
      "schema_version": "reterm-dataset-stats/1",
      "name": "ReTerm-10K",                   # pretty name of the dataset
      "version": "1.0.0",
      "created": "2026-10-01",                # ISO 8601 date (or datetime) of the build
      "license": "apache-2.0",                # Hub licence id of the dataset as a whole
      "language": ["en"],
      "splits": {"train": 9500, "test": 500}, # records per split (the parquet shards' row counts)
      "categories": {                         # per reterm.recovery.taxonomy failure category id
        "missing_dependency": {
          "failure_states": 4210,             # failure states mined in this category
          "attempts": 33680,                  # recovery attempts forked from them (infra faults excluded)
          "successful_attempts": 12010,       # attempts the task's verifier accepted
          "records": 4400                     # records kept in the published dataset
        }, ...
      },
      "failure_sources": {"own": 8000, "injected": 2000},  # records per `failure_source`
      "rollouts": {"episodes": 20000,         # policy episodes rolled out to find failures
                   "failed": 14000,           # episodes the verifier failed (agent failures only)
                   "infra_faults": 310},      # episodes and attempts lost to infrastructure faults
      "attempts_per_state": 8,                # recovery attempts forked per failure state
      "filters": {                            # the funnel from verified recoveries to records
        "verified_recoveries": 12500,         # candidate records (successful attempts kept)
        "quality": 1700,                      # removed by the quality filter
        "dedup": 600,                         # removed as near-duplicates
        "decontamination": 200,               # removed for overlap with evaluation tasks
        "kept": 10000                         # = verified - quality - dedup - decontamination
      },
      "decontamination": {"benchmarks": ["terminal-bench@2.0"],
                          "method": "13-gram overlap of instruction and commands, threshold 0.5"},
      "sources": [                            # task collections the episodes ran on
        {"name": "TermiGen", "license": "apache-2.0", "tasks": 900, "records": 7000,
         "url": "https://..."}, ...
      ],
      "policy": "Qwen/Qwen3.5-9B",            # the policy whose rollouts failed
      "teacher": "Qwen/Qwen3.5-397B-A17B",    # the policy that wrote the kept recoveries
      "config": {...},                        # the run's resolved config (no secrets)
      "citation": null                        # optional BibTeX for the dataset
    }
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from reterm.json_files import read_validated_json

SCHEMA_VERSION = "reterm-dataset-stats/1"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CategoryStats(_Strict):
    """Counts for one failure category (ids of :mod:`reterm.recovery.taxonomy`)."""

    failure_states: int = Field(ge=0, description="failure states mined in this category")
    attempts: int = Field(ge=0, description="recovery attempts forked from them (infra faults excluded)")
    successful_attempts: int = Field(ge=0, description="attempts the task's verifier accepted")
    records: int = Field(ge=0, description="records of this category in the published dataset")

    @model_validator(mode="after")
    def _consistent(self) -> "CategoryStats":
        if self.successful_attempts > self.attempts:
            raise ValueError(f"successful_attempts ({self.successful_attempts}) > attempts ({self.attempts})")
        return self

    @property
    def recovery_rate(self) -> float | None:
        """successful_attempts / attempts (``None`` without attempts): the teacher's recovery rate."""
        return self.successful_attempts / self.attempts if self.attempts else None


class Rollouts(_Strict):
    """The policy rollouts that failure states were mined from."""

    episodes: int = Field(ge=0)
    failed: int = Field(ge=0, description="episodes the verifier failed (agent failures only)")
    infra_faults: int = Field(ge=0, description="episodes and attempts lost to infrastructure faults")


class FilterCounts(_Strict):
    """The funnel from verified recoveries to published records."""

    verified_recoveries: int = Field(ge=0)
    quality: int = Field(ge=0, description="removed by the quality filter")
    dedup: int = Field(ge=0, description="removed as duplicates")
    decontamination: int = Field(ge=0, description="removed for overlap with evaluation tasks")
    kept: int = Field(ge=0)

    @model_validator(mode="after")
    def _funnel(self) -> "FilterCounts":
        expected = self.verified_recoveries - self.quality - self.dedup - self.decontamination
        if expected != self.kept:
            raise ValueError(
                f"kept ({self.kept}) != verified_recoveries - quality - dedup - decontamination ({expected})"
            )
        return self


class Decontamination(_Strict):
    benchmarks: list[str] = Field(min_length=1, description="evaluation sets checked, e.g. terminal-bench@2.0")
    method: str = Field(min_length=1, description="how overlap was measured and the threshold")


class SourceTasks(_Strict):
    """A task collection the rollouts ran on, and its licence (carried into the card)."""

    name: str = Field(min_length=1)
    license: str = Field(min_length=1, description="licence id (Hub id or SPDX)")
    tasks: int = Field(ge=0)
    records: int = Field(ge=0)
    url: str | None = None


class DatasetStats(_Strict):
    """The parsed ``stats.json`` (see the module docstring for the file's shape)."""

    schema_version: Literal["reterm-dataset-stats/1"] = SCHEMA_VERSION
    name: str = "ReTerm-10K"
    version: str
    created: str
    license: str
    language: list[str] = Field(default_factory=lambda: ["en"])
    splits: dict[str, int] = Field(min_length=1)
    categories: dict[str, CategoryStats] = Field(min_length=1)
    failure_sources: dict[str, int]
    rollouts: Rollouts
    attempts_per_state: int = Field(ge=1)
    filters: FilterCounts
    decontamination: Decontamination
    sources: list[SourceTasks] = Field(min_length=1)
    policy: str
    teacher: str
    config: dict[str, Any] = Field(default_factory=dict)
    citation: str | None = None

    @model_validator(mode="after")
    def _totals(self) -> "DatasetStats":
        kept = self.filters.kept
        totals = {
            "splits": sum(self.splits.values()),
            "categories[*].records": sum(c.records for c in self.categories.values()),
            "failure_sources": sum(self.failure_sources.values()),
            "sources[*].records": sum(s.records for s in self.sources),
        }
        bad = {k: v for k, v in totals.items() if v != kept}
        if bad:
            raise ValueError(
                f"totals disagree with filters.kept ({kept}): " + ", ".join(f"sum of {k} = {v}" for k, v in bad.items())
            )
        for split, n in self.splits.items():
            if n < 0 or not split.replace("_", "").isalnum():
                raise ValueError(f"splits: bad split {split!r} -> {n}")
        return self

    @property
    def records(self) -> int:
        """Records in the published dataset (all splits)."""
        return self.filters.kept

    @property
    def recovery_rate(self) -> float | None:
        """Successful / forked recovery attempts over all categories."""
        attempts = sum(c.attempts for c in self.categories.values())
        return sum(c.successful_attempts for c in self.categories.values()) / attempts if attempts else None


def load_stats(path: str | Path) -> DatasetStats:
    """Read and validate ``stats.json``.

    Raises:
        FileNotFoundError: no file at ``path``.
        ValueError: not JSON, or a field is missing/wrong; the message names the file and the fields.
    """
    return read_validated_json(path, DatasetStats, "stats", "the pipeline writes it next to data/")
