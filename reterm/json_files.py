"""Reading JSON files that a pydantic model validates, with errors that name the file and the fields.

Used by the cards (``reterm.data.dataset_stats.load_stats``, ``reterm.cards.model_inputs.load_results``) and anything
else that reads a JSON file another stage wrote.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)


def read_validated_json(path: str | Path, model: type[M], what: str, missing_hint: str) -> M:
    """Parse ``path`` as JSON and validate it with ``model``.

    Args:
        path: the JSON file.
        model: the pydantic model of its content.
        what: what the file holds, for messages ("stats", "evaluation results").
        missing_hint: said when the file is missing (which stage writes it).

    Raises:
        FileNotFoundError: no file at ``path`` (the message names it and ``missing_hint``).
        ValueError: not JSON, or fields missing/wrong; the message names the file and each field.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: {what} not found ({missing_hint})")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON: {exc}") from None
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        problems = "\n".join(
            f"  - {'.'.join(str(p) for p in err['loc']) or '(top level)'}: {err['msg']}" for err in exc.errors()
        )
        raise ValueError(f"{path}: invalid {what}:\n{problems}") from None
