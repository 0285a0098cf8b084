"""The resumable stage journal of a build: what each stage finished, stored next to the output.

A build's working state lives in ``OUTPUT/.pipeline/`` (a hidden folder, so ``datasets.load_dataset``
never reads it)::

    .pipeline/
      config.json          the resolved config and its fingerprint (a resume must use the same config)
      journal.json         stage -> {"done": true, "summary": {...}} for every finished stage
      units/<stage>/<key>.json   one file per finished unit of work (a trajectory, a failure state's
                           recovery attempts...), keyed by a content hash
      jobs/                Harbor's job folder of the rollout stage (Harbor resumes it itself)

Rules that make ``kill -9`` at any point safe:

- every file is written atomically (temp file in the same folder, fsync, rename:
  :func:`reterm.trajectory.write_json_atomic`), so a file exists completely or not at all;
- a unit is done exactly when its file exists; a stage is done exactly when ``journal.json`` says so,
  and that is written after all its units;
- units are keyed by content hashes and processed in a sorted order, and a rerun skips the units
  whose files exist, so a resumed run computes exactly the units an uninterrupted run would have,
  once each.

Own code: neither Harbor nor ``datasets`` journals multi-stage jobs (Harbor resumes a single job).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from reterm.trajectory import write_json_atomic

WORK_DIR = ".pipeline"


class ConfigMismatchError(ValueError):
    """The output folder holds a build made with another config (the message lists what differs)."""


def _diff(old: Any, new: Any, prefix: str = "") -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for key in sorted(set(old) | set(new)):
            out += _diff(old.get(key), new.get(key), f"{prefix}.{key}" if prefix else str(key))
        return out
    return [] if old == new else [f"{prefix}: {old!r} -> {new!r}"]


class Journal:
    """The working folder of one build (see the module docstring).

    Args:
        output: the build's output folder; the journal lives in ``output/.pipeline``.
    """

    def __init__(self, output: str | Path) -> None:
        self.output = Path(output)
        self.root = self.output / WORK_DIR
        self.root.mkdir(parents=True, exist_ok=True)
        self._path = self.root / "journal.json"

    # ------------------------------------------------------------------------------ config
    def bind_config(self, resolved: dict[str, Any], fingerprint: str, *, fresh: bool = False) -> bool:
        """Record the config of this build, or check it against the recorded one.

        Returns True when the build resumes (a config was recorded before).

        Raises:
            ConfigMismatchError: the folder was built with a different config (unless ``fresh``, which
                discards the earlier work first).
        """
        path = self.root / "config.json"
        if fresh and path.exists():
            self.reset()
        if path.exists():
            try:
                old = json.loads(path.read_text())
            except ValueError:
                old = None
            if old is not None and old.get("fingerprint") != fingerprint:
                changes = _diff(old.get("config", {}), resolved)
                raise ConfigMismatchError(
                    f"{self.output}: holds a build made with a different config ({'; '.join(changes[:8])}). "
                    "Use another --output, or --fresh to discard the earlier work."
                )
            if old is not None:
                return True
        write_json_atomic(path, {"fingerprint": fingerprint, "config": resolved})
        return False

    def reset(self) -> None:
        """Remove every recorded unit, stage and the Harbor job (``--fresh``)."""
        shutil.rmtree(self.root, ignore_errors=True)
        self.root.mkdir(parents=True, exist_ok=True)

    # ------------------------------------------------------------------------------ stages
    def _read(self) -> dict[str, Any]:
        if not self._path.is_file():
            return {}
        return json.loads(self._path.read_text())

    def done(self, stage: str) -> bool:
        """True when ``stage`` finished in an earlier (or this) run."""
        return bool(self._read().get(stage, {}).get("done"))

    def summary(self, stage: str) -> dict[str, Any]:
        """The summary a finished stage recorded (``{}`` when it has not finished)."""
        return dict(self._read().get(stage, {}).get("summary", {}))

    def finish(self, stage: str, summary: dict[str, Any] | None = None) -> None:
        """Mark ``stage`` finished with its summary (counts, timings)."""
        data = self._read()
        data[stage] = {"done": True, "summary": summary or {}}
        write_json_atomic(self._path, data)

    def stages(self) -> dict[str, Any]:
        """Every recorded stage with its summary."""
        return self._read()

    # ------------------------------------------------------------------------------- units
    def unit_dir(self, stage: str) -> Path:
        d = self.root / "units" / stage
        d.mkdir(parents=True, exist_ok=True)
        return d

    def unit_path(self, stage: str, key: str) -> Path:
        if not key or "/" in key or key.startswith("."):
            raise ValueError(f"bad unit key {key!r} for stage {stage}")
        return self.unit_dir(stage) / f"{key}.json"

    def has_unit(self, stage: str, key: str) -> bool:
        return self.unit_path(stage, key).is_file()

    def write_unit(self, stage: str, key: str, obj: Any) -> Path:
        """Write one finished unit atomically."""
        return write_json_atomic(self.unit_path(stage, key), obj)

    def read_unit(self, stage: str, key: str) -> Any:
        path = self.unit_path(stage, key)
        try:
            return json.loads(path.read_text())
        except ValueError as exc:  # cannot happen with atomic writes; say where if it does
            raise ValueError(f"{path}: unreadable unit ({exc})") from exc

    def units(self, stage: str) -> list[str]:
        """Keys of the finished units of ``stage``, sorted."""
        return sorted(p.stem for p in self.unit_dir(stage).glob("*.json") if not p.name.startswith("."))
