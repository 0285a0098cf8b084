"""The published folder of ReTerm-10K, in the Hub layout ``datasets.push_to_hub`` writes::

    FOLDER/
      data/{split}-{i:05d}-of-{n:05d}.parquet   rows with reterm.record_features.FEATURES
      stats.json                               reterm.data.dataset_stats.DatasetStats
      README.md                                the card (written by ``reterm publish``, not here)

``load_dataset(FOLDER)`` and, once uploaded, ``load_dataset("org/name")`` read every split; the card's
``configs`` maps each split to ``data/{split}-*``.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any, Iterable, Mapping

from reterm.data.dataset_stats import DatasetStats
from reterm.io import atomic_output, default_mode
from reterm.trajectory import write_json_atomic

# datasets' default max_shard_size for push_to_hub.
MAX_SHARD_BYTES = 500 * 1024 * 1024
_SHARD_RE = re.compile(r"^(?P<split>[A-Za-z0-9_]+)-(?P<i>\d{5})-of-(?P<n>\d{5})\.parquet$")


def write_dataset_folder(
    folder: str | Path,
    splits: Mapping[str, Iterable[dict[str, Any]]],
    stats: DatasetStats | Mapping[str, Any],
    max_shard_bytes: int = MAX_SHARD_BYTES,
) -> dict[str, list[Path]]:
    """Write the parquet shards of every split and ``stats.json`` into ``folder``.

    Args:
        folder: output folder (created). Existing ``data/*.parquet`` shards of the written splits are
            replaced, so a re-run never leaves stale shards behind.
        splits: split name -> rows (dicts with the columns of :data:`reterm.record_features.FEATURES`).
        stats: the run's statistics (validated with :class:`DatasetStats`).
        max_shard_bytes: Arrow bytes per shard (as ``push_to_hub``'s ``max_shard_size``).

    Returns:
        split -> shard paths.

    Raises:
        ValueError: invalid stats, rows that do not fit FEATURES, or split sizes that disagree with
            ``stats.splits``.
    """
    from datasets import Dataset

    from reterm.record_features import FEATURES

    stats = stats if isinstance(stats, DatasetStats) else DatasetStats.model_validate(dict(stats))
    folder = Path(folder)
    data_dir = folder / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    written: dict[str, list[Path]] = {}
    for split, rows in splits.items():
        ds = Dataset.from_list(list(rows), features=FEATURES)
        if stats.splits.get(split) != len(ds):
            raise ValueError(f"split {split!r} has {len(ds)} rows but stats.splits says {stats.splits.get(split)}")
        for old in data_dir.glob(f"{split}-*.parquet"):
            old.unlink()
        n = max(1, min(len(ds), math.ceil(ds.data.nbytes / max_shard_bytes)))
        written[split] = []
        for i in range(n):
            path = data_dir / f"{split}-{i:05d}-of-{n:05d}.parquet"
            with atomic_output(path) as tmp:
                ds.shard(num_shards=n, index=i, contiguous=True).to_parquet(str(tmp))
                os.chmod(tmp, default_mode())  # a published shard is for everyone to read
            written[split].append(path)
    missing = set(stats.splits) - set(splits)
    if missing:
        raise ValueError(f"stats.splits names splits with no rows given: {sorted(missing)}")
    write_json_atomic(folder / "stats.json", stats.model_dump(mode="json"))
    return written


def dataset_shards(folder: str | Path) -> dict[str, list[Path]]:
    """Split -> parquet shards found under ``folder/data`` (``{split}-NNNNN-of-NNNNN.parquet``).

    Raises:
        FileNotFoundError: no ``data/`` shards.
        ValueError: a file in ``data/`` that does not follow the naming, or a split with missing shards.
    """
    data_dir = Path(folder) / "data"
    shards: dict[str, list[Path]] = {}
    if not data_dir.is_dir():
        raise FileNotFoundError(f"{data_dir}: no data/ folder (expected data/{{split}}-00000-of-00001.parquet)")
    for path in sorted(data_dir.iterdir()):
        if path.suffix != ".parquet":
            continue
        m = _SHARD_RE.match(path.name)
        if not m:
            raise ValueError(f"{path}: shard name must be {{split}}-NNNNN-of-NNNNN.parquet")
        shards.setdefault(m.group("split"), []).append(path)
    if not shards:
        raise FileNotFoundError(f"{data_dir}: no parquet shards")
    for split, paths in shards.items():
        n = int(_SHARD_RE.match(paths[0].name).group("n"))  # type: ignore[union-attr]
        if len(paths) != n:
            raise ValueError(f"{data_dir}: split {split!r} has {len(paths)} shards, names say {n}")
    return shards
