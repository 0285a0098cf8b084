"""What a training run leaves next to its checkpoint, for people and for the model card.

- ``curves.csv`` / ``curves.png``: training loss and mean token accuracy per logging step, and the
  held-out (eval) values where evaluated, read from the trainer's ``state.log_history``.
- ``recipe.yaml``: a byte-for-byte copy of the recipe; ``command.json``: the full command line.
- ``versions.json``: Python and package versions.
- ``training_summary.json``: the model card's inputs (base model, dataset, method, key hyper-
  parameters, steps, losses).

Every file is written atomically (temporary file, then rename).
"""

from __future__ import annotations

import csv
import importlib.metadata
import io
import os
import platform
import sys
from pathlib import Path
from typing import Any

from reterm.io import write_bytes_atomic as _write_bytes_atomic
from reterm.trajectory import write_json_atomic

CURVE_COLUMNS = (
    "step",
    "epoch",
    "loss",
    "mean_token_accuracy",
    "learning_rate",
    "grad_norm",
    "num_tokens",
    "eval_loss",
    "eval_mean_token_accuracy",
)

PACKAGES = (
    "torch",
    "transformers",
    "trl",
    "peft",
    "accelerate",
    "datasets",
    "huggingface_hub",
    "tokenizers",
    "deepspeed",
    "flash-attn",
    "liger-kernel",
    "reterm",
)


def write_bytes_atomic(path: Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically with mode 0644 (:func:`reterm.io.write_bytes_atomic`)."""
    return _write_bytes_atomic(path, data, mode=0o644, fsync=False)


def write_csv_atomic(path: Path, fieldnames: list[str], rows: list[dict[str, Any]]) -> Path:
    """Write ``rows`` (dicts keyed by ``fieldnames``) as a CSV file with a header, atomically; returns ``path``."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=fieldnames)
    writer.writeheader()
    writer.writerows(rows)
    return write_bytes_atomic(path, buf.getvalue().encode())


def save_figure_atomic(fig: Any, path: Path, dpi: int = 100) -> Path:
    """Render a matplotlib figure to PNG at ``dpi``, write it atomically, close the figure; returns ``path``."""
    import matplotlib.pyplot as plt

    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=dpi)
    plt.close(fig)
    return write_bytes_atomic(path, png.getvalue())


def curve_rows(log_history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per logged step (train and eval entries at the same step are merged).

    Args:
        log_history: ``Trainer.state.log_history``: dicts with ``step`` and ``loss`` /
            ``mean_token_accuracy`` (train logs) or ``eval_loss`` / ``eval_mean_token_accuracy``.

    Returns:
        Rows with the keys of :data:`CURVE_COLUMNS` (missing values are ``None``), sorted by step.
        The end-of-training summary entry (``train_loss``, ``train_runtime``) is not a row.
    """
    rows: dict[int, dict[str, Any]] = {}
    for entry in log_history:
        if "train_runtime" in entry or "step" not in entry:
            continue
        keys = [k for k in CURVE_COLUMNS if k in entry and k not in ("step",)]
        if not any(k in entry for k in ("loss", "eval_loss", "mean_token_accuracy")):
            continue
        row = rows.setdefault(int(entry["step"]), {c: None for c in CURVE_COLUMNS} | {"step": int(entry["step"])})
        for k in keys:
            row[k] = entry[k]
    return [rows[s] for s in sorted(rows)]


def write_curves(log_history: list[dict[str, Any]], out_dir: str | Path, title: str = "SFT") -> dict[str, Path]:
    """Write ``curves.csv`` and ``curves.png`` (loss and token accuracy against step) to ``out_dir``.

    Returns:
        ``{"csv": path, "png": path}``.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    rows = curve_rows(log_history)
    csv_path = write_csv_atomic(out / "curves.csv", list(CURVE_COLUMNS), rows)

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for ax, key, label in ((axes[0], "loss", "loss (NLL / token)"), (axes[1], "mean_token_accuracy", "token accuracy")):
        train = [(r["step"], r[key]) for r in rows if r[key] is not None]
        evals = [(r["step"], r[f"eval_{key}"]) for r in rows if r[f"eval_{key}"] is not None]
        if train:
            ax.plot(*zip(*train), marker=".", label="train")
        if evals:
            ax.plot(*zip(*evals), marker="o", linestyle="--", label="held-out")
        ax.set_xlabel("step")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        if train or evals:
            ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    png_path = save_figure_atomic(fig, out / "curves.png", dpi=110)
    return {"csv": csv_path, "png": png_path}


def package_versions() -> dict[str, str]:
    """Python, platform and the versions of the training stack (packages not installed are left out)."""
    versions = {"python": platform.python_version(), "platform": platform.platform()}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    try:
        import torch

        versions["cuda"] = torch.version.cuda or "none"
        if torch.cuda.is_available():
            versions["gpu"] = f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"
    except ImportError:
        pass
    return versions


def write_run_files(out_dir: str | Path, recipe_path: str | Path | None, argv: list[str] | None = None) -> None:
    """Copy the recipe (``recipe.yaml``), and write ``command.json`` and ``versions.json`` to ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if recipe_path is not None:
        write_bytes_atomic(out / "recipe.yaml", Path(recipe_path).read_bytes())
    command = {"argv": list(sys.argv if argv is None else argv)}
    for name, obj in (("command.json", command), ("versions.json", package_versions())):
        os.chmod(write_json_atomic(out / name, obj), 0o644)


def write_training_summary(out_dir: str | Path, summary: dict[str, Any]) -> Path:
    """Write ``training_summary.json`` (the model card's inputs) to ``out_dir``."""
    path = write_json_atomic(Path(out_dir) / "training_summary.json", summary)
    os.chmod(path, 0o644)
    return path
