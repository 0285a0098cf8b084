"""ReTerm-10K records -> TRL conversational prompt/completion rows for SFT.

A record (:data:`reterm.record_features.FEATURES`) is a whole conversation: the failure prefix (system prompt,
task, the agent's own steps up to and including the failing step's observation) followed by a verified
recovery. SFT (paper: the cold start before ReTerm-GRPO) learns the recovery *given* the failure state,
so each record becomes::

    prompt     = messages[:train_from_message_index]   # ends with the failing step's observation
    completion = messages[train_from_message_index:]   # recovery: assistant turns and their tool observations
    tools      = the record's tool schemas (JSON), rendered by the chat template exactly as at inference

With TRL's ``SFTConfig(assistant_only_loss=True)`` and ``completion_only_loss=True`` the loss covers only
the completion's assistant turns (tool observations never carry loss); ``completion_only_loss=False``
trains on every assistant turn of the conversation, prefix included (TRL's own switch, set in the
recipe).

Messages are stored with datasets' ``Json`` feature: a plain struct column would merge the keys of every
tool call's ``arguments`` (``{"command": ...}`` vs ``submit``'s ``{}``) and hand the chat template
``{"command": None}`` for ``submit``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from datasets import Dataset, Features, Json, List, Value, load_dataset

from reterm.agent.protocol import TOOLS
from reterm.records import chat_messages

REQUIRED_COLUMNS = ("messages", "train_from_message_index")
"""What SFT needs of a dataset. The release (``twothsnd/ReTerm-10K``) has only its six columns
(:data:`reterm.records.RELEASE_COLUMNS`); a dataset without ``tools`` is rendered with the kit's tool schemas
(:data:`reterm.agent.protocol.TOOLS`), the release's one ``bash`` tool being the kit's first."""

SFT_FEATURES = Features(
    {
        "id": Value("string"),  # the record's id (kept for tracing a row back to its record)
        "task_id": Value("string"),
        "prompt": List(Json()),  # chat messages, tool-call arguments as mappings
        "completion": List(Json()),
        "tools": Value("string"),  # JSON list of tool schemas; TRL parses it and passes tools= to the template
    }
)


def load_records(dataset_name: str, split: str, config: str | None = None) -> Dataset:
    """Load one split of a ReTerm-10K dataset from a local folder (Hub layout) or a Hub id.

    Args:
        dataset_name: a local folder holding ``data/{split}-*.parquet`` (as ``push_to_hub`` writes) or a
            Hugging Face Hub dataset id.
        split: split name, e.g. ``"train"`` or ``"test"``.
        config: dataset config name, if any.

    Raises:
        ValueError: the split does not exist (the message lists the splits there are) or a required
            column (``messages``, ``train_from_message_index``, ``tools``) is missing.
    """
    path = Path(dataset_name).expanduser()
    try:
        if path.is_file() and path.suffix in (".jsonl", ".json"):  # one JSON-lines file: its rows are `split`
            ds = load_dataset("json", data_files={split: str(path)}, split=split)
        else:
            ds = load_dataset(str(path) if path.is_dir() else dataset_name, config, split=split)
    except ValueError as exc:
        if "split" in str(exc).lower():
            raise ValueError(f"{dataset_name}: no split {split!r} ({exc})") from exc
        raise
    missing = [c for c in REQUIRED_COLUMNS if c not in ds.column_names]
    if missing:
        raise ValueError(
            f"{dataset_name} [{split}]: missing column(s) {missing}; a ReTerm-10K record has "
            f"{list(REQUIRED_COLUMNS)} (see reterm/records.py)"
        )
    return ds


def record_to_prompt_completion(record: dict[str, Any]) -> dict[str, Any]:
    """Split one record at its failure state into a conversational prompt/completion row.

    Args:
        record: a row with ``messages`` (:data:`reterm.record_features.MESSAGE` layout), ``train_from_message_index`` and
            ``tools`` (JSON string); ``id``/``task_id`` are copied when present.

    Returns:
        ``{"id", "task_id", "prompt", "completion", "tools"}`` (see :data:`SFT_FEATURES`).

    Raises:
        ValueError: naming the record id and the field when ``train_from_message_index`` does not point at an
            assistant message after at least one user message, or ``tools`` is not a JSON list.
    """
    rid = record.get("id") or "?"
    messages = chat_messages(record["messages"])
    k = record["train_from_message_index"]
    if not isinstance(k, int) or not 0 < k < len(messages):
        raise ValueError(f"record {rid}: train_from_message_index={k!r} is outside 1..{len(messages) - 1} (messages)")
    if messages[k]["role"] != "assistant":
        raise ValueError(
            f"record {rid}: train_from_message_index={k} points at a {messages[k]['role']!r} message; "
            "it must be the first assistant message of the recovery"
        )
    if not any(m["role"] == "user" for m in messages[:k]):
        raise ValueError(f"record {rid}: the prompt (messages[:{k}]) holds no user message (the task)")
    if not record.get("tools"):
        record = {**record, "tools": json.dumps(TOOLS, ensure_ascii=False)}
    try:
        tools = json.loads(record["tools"]) if record["tools"] else []
    except json.JSONDecodeError as exc:
        raise ValueError(f"record {rid}: field 'tools' is not valid JSON ({exc})") from exc
    if not isinstance(tools, list):
        raise ValueError(f"record {rid}: field 'tools' must be a JSON list of tool schemas")
    return {
        "id": record.get("id") or "",
        "task_id": record.get("task_id") or "",
        "prompt": messages[:k],
        "completion": messages[k:],
        "tools": record["tools"],
    }


def to_sft_dataset(
    records: Dataset,
    chat_template_kwargs: dict[str, Any] | None = None,
    max_samples: int | None = None,
    num_proc: int | None = None,
) -> Dataset:
    """Map a records split to SFT rows (:func:`record_to_prompt_completion`).

    Args:
        records: a split loaded with :func:`load_records`.
        chat_template_kwargs: extra chat-template variables for every row (e.g.
            ``{"enable_thinking": False}`` for Qwen3.5); TRL reads them from a ``chat_template_kwargs``
            column.
        max_samples: keep only the first ``max_samples`` records (smoke runs).
        num_proc: processes for ``Dataset.map``.

    Returns:
        A ``Dataset`` with :data:`SFT_FEATURES` (plus ``chat_template_kwargs`` when given).
    """
    if max_samples is not None:
        records = records.select(range(min(max_samples, len(records))))
    features = SFT_FEATURES.copy()
    extra: dict[str, Any] = {}
    if chat_template_kwargs:
        features["chat_template_kwargs"] = Json()
        extra["chat_template_kwargs"] = dict(chat_template_kwargs)
    return records.map(
        lambda r: {**record_to_prompt_completion(r), **extra},
        remove_columns=records.column_names,
        features=features,
        num_proc=num_proc,
        desc="Splitting records at the failure state",
    )
