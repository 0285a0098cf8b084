"""What a run of ``train/run_all.sh`` keeps about itself: the four models, stage records
(``RUN/stages/NAME.json``), paths as written in reports, and small formatting helpers.

Standard library only: ``train/stages.py run`` uses it before ``.venv`` exists.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

# The four models of the final table: eval name -> (label, run sub-folder of the checkpoint or None for the base).
MODELS = {
    "base": ("base model", None),
    "sft": ("SFT", "sft"),
    "grpo-standard": ("standard GRPO", "grpo-standard"),
    "grpo-reterm": ("ReTerm-GRPO", "grpo-reterm"),
}
# Other names of the same four models in an eval config (eval/configs/terminal-bench-2.0.yaml, this kit's harness).
ALIASES = {
    "base": ["reterm-base"],
    "sft": ["reterm-sft"],
    "grpo-standard": ["reterm-grpo-standard"],
    "grpo-reterm": ["reterm-grpo"],
}


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _reterm_io() -> Any:
    """The module ``reterm.io`` (atomic writes): the installed one, or, before ``.venv`` exists (the set-up
    stage runs under any Python), this checkout's ``reterm/io.py`` loaded by path. That file uses only the
    standard library (``tests/test_run_all.py`` runs the stage runner under ``python -I -S`` to keep it so)."""
    try:
        import reterm.io

        return reterm.io
    except ModuleNotFoundError as exc:
        if exc.name not in ("reterm", "reterm.io"):
            raise
    import importlib.util

    name = "_reterm_io_standalone"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO / "reterm" / "io.py")
        if spec is None or spec.loader is None:
            raise ModuleNotFoundError(f"{REPO / 'reterm' / 'io.py'}: cannot be loaded", name="reterm.io")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[name] = module
    return sys.modules[name]


def write_json_atomic(path: Path, data: Any) -> None:
    """``data`` as JSON (indent 1, a final newline) at ``path``, atomically (:func:`reterm.io.write_text_atomic`)."""
    _reterm_io().write_text_atomic(path, json.dumps(data, indent=1, sort_keys=False) + "\n")


def git_commit(repo: Path = REPO) -> dict[str, Any] | None:
    """The checkout's commit: ``{"commit": SHA, "dirty": bool}`` (dirty: tracked files changed), or ``None``
    outside a git checkout or without git. Recorded with each stage, so a report can say what code ran."""
    import subprocess

    try:
        sha = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=30)
        if sha.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=30)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    return {"commit": sha.stdout.strip(), "dirty": bool(dirty.stdout.strip())}


def machine() -> dict[str, Any]:
    """What the run ran on: CPUs, memory, CPU model and whether it has bf16 matrix units (``/proc``; fields
    that cannot be read are ``None``)."""
    info: dict[str, Any] = {"cpus": os.cpu_count(), "memory_gb": None, "cpu_model": None, "bf16_units": None}
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                info["memory_gb"] = round(int(line.split()[1]) / 1024**2, 1)
                break
        cpuinfo = Path("/proc/cpuinfo").read_text()
        model = next((ln.split(":", 1)[1].strip() for ln in cpuinfo.splitlines() if ln.startswith("model name")), None)
        flags = next((ln.split(":", 1)[1].split() for ln in cpuinfo.splitlines() if ln.startswith("flags")), [])
        info.update(cpu_model=model, bf16_units=[f for f in ("amx_bf16", "avx512_bf16") if f in flags])
    except OSError:
        pass
    return info


def fmt_duration(seconds: float | None) -> str:
    """``3725.2`` -> ``"1h02m05s"``, ``65`` -> ``"1m05s"``, ``None`` -> ``"-"``."""
    if seconds is None:
        return "-"
    s = int(round(seconds))
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s" if m else f"{s}s"


def fmt_mb(mb: float | None) -> str:
    """Megabytes as ``"812 MB"`` or ``"3.4 GB"``; ``None`` -> ``"-"``."""
    if mb is None:
        return "-"
    return f"{mb / 1024:.1f} GB" if mb >= 1024 else f"{mb:.0f} MB"


_COMMENT = re.compile(r"(?:^|\s)#.*$")


def config_text(text: str) -> str:
    """A YAML config's text without its comments and blank lines: what a stage's watched recipe *sets*.

    A ``#`` starts a comment at the line's start or after whitespace (YAML's rule); a line whose text before that
    ``#`` holds an odd number of quote characters keeps it (the ``#`` is inside a quoted string). Trailing blanks
    are dropped, so re-wording or re-wrapping a comment changes nothing here."""
    out = []
    for line in text.splitlines():
        m = _COMMENT.search(line)
        if m and line[: m.start()].count('"') % 2 == 0 and line[: m.start()].count("'") % 2 == 0:
            line = line[: m.start()]
        if line.strip():
            out.append(line.rstrip())
    return "\n".join(out)


def config_digest(path: Path) -> str | None:
    """The digest a stage records for a file it watches (``train/stages.py run --watch``): 16 hex of the SHA-256 of
    :func:`config_text` for a ``.yaml``/``.yml`` file (a comment-only edit of a recipe re-runs nothing), of the
    bytes for any other file; ``None`` when the file does not exist."""
    if not path.is_file():
        return None
    data = path.read_bytes()
    if path.suffix in (".yaml", ".yml"):
        data = config_text(data.decode()).encode()
    return hashlib.sha256(data).hexdigest()[:16]


def raw_digest(path: Path) -> str | None:
    """The digest of a watched file as stage records written before :func:`config_digest` hold it (SHA-256 of the
    bytes, comments included): a completed stage recorded that way is still recognised as done."""
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16] if path.is_file() else None


def marker_path(run_dir: Path, stage: str) -> Path:
    """Where the completion record of ``stage`` lives (``RUN/stages/NAME.json``)."""
    return Path(run_dir) / "stages" / f"{stage}.json"


_NUMBERS = ("wall_s", "last_attempt_wall_s", "peak_mem_mb", "max_process_rss_mb", "load_avg_mean",
            "earlier_s", "earlier_peak_mb", "elapsed_s", "earlier_attempts")  # fmt: skip


def read_record(path: Path) -> dict[str, Any] | None:
    """A stage record (``NAME.json`` or ``NAME.running.json``): ``None`` when missing; when unreadable
    (torn, not a JSON object) a warning naming the file on stderr and ``None``. Numeric fields that are
    not numbers are dropped (with a warning), so a hand-edited record cannot break the summary."""
    path = Path(path)
    if not path.exists():
        return None
    try:
        rec = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        print(f"warning: stage record {path} is unreadable ({exc}); treated as missing", file=sys.stderr, flush=True)
        return None
    if not isinstance(rec, dict):
        print(f"warning: stage record {path} is not a JSON object; treated as missing", file=sys.stderr, flush=True)
        return None
    for k in _NUMBERS:
        v = rec.get(k)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            print(f"warning: stage record {path}: {k} = {v!r} is not a number; ignored", file=sys.stderr, flush=True)
            rec.pop(k)
    return rec


def read_marker(run_dir: Path, stage: str) -> dict[str, Any] | None:
    """The completion record of ``stage``, or ``None`` when the stage has not completed (see :func:`read_record`)."""
    return read_record(marker_path(run_dir, stage))


def load_json(path: Path) -> Any:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def rel_path(path: Path) -> str:
    """``path`` relative to the repository root when it is inside it, else absolute."""
    p = Path(path).resolve()
    return str(p.relative_to(REPO)) if p.is_relative_to(REPO) else str(p)


def path_spec(path: Path) -> str:
    """:func:`rel_path` written as a path for ``hf:`` policy specs (``./runs/...``; a bare relative name
    would be read as a Hub id)."""
    rel = rel_path(path)
    return rel if Path(rel).is_absolute() else f"./{rel}"
