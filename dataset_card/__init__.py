"""The ReTerm-10K dataset card: ``stats.json`` schema, the published folder layout, and the renderer.

- :mod:`dataset_card.stats`: :class:`DatasetStats`, the shape of ``stats.json`` the pipeline writes.
- :mod:`dataset_card.layout`: :func:`write_dataset_folder` (parquet shards + stats.json in the Hub layout).
- :mod:`dataset_card.render`: :func:`render_dataset_card` (``template.md`` filled from the folder).
"""

from typing import Any

from dataset_card.layout import dataset_shards, write_dataset_folder
from dataset_card.stats import DatasetStats, load_stats

__all__ = ["DatasetStats", "dataset_shards", "load_stats", "render_dataset_card", "write_dataset_folder"]


def __getattr__(name: str) -> Any:  # lazy, so `python -m dataset_card.render` runs without a warning
    if name == "render_dataset_card":
        from dataset_card.render import render_dataset_card

        return render_dataset_card
    raise AttributeError(name)
