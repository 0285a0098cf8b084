"""Render the ReTerm-10K dataset card from the pipeline's published folder.

Inputs (the folder :mod:`reterm.data.layout` describes): ``data/{split}-*.parquet`` with
:data:`reterm.record_features.FEATURES` and ``stats.json`` (:class:`reterm.data.dataset_stats.DatasetStats`; the run's
config is its ``config`` field). Output: a ``huggingface_hub.DatasetCard`` whose metadata carries the
licence, task categories, tags, size category, language, ``configs`` (one ``data/{split}-*`` pattern per
split, for the dataset viewer and ``load_dataset``) and ``dataset_info`` (features and split sizes, as
``push_to_hub`` writes them); its body (``templates/dataset.md``) explains how the data was made, the schema with a
worked example, per-category counts and recovery rates, the filter funnel, decontamination, source
licences, limitations and a citation.

The renderer cross-checks ``stats.json`` against the shards (splits, row counts, schema, records per
failure category and per failure source) and validates the metadata with
:func:`reterm.hub_metadata.validate_card_metadata`; any disagreement raises ``ValueError`` naming the file
and field, before anything is uploaded.

Command line (writes the card next to the data, or to ``--out``)::

    python dataset_card/render.py FOLDER --repo-id ORG/NAME [--out README.md]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import yaml
from huggingface_hub import DatasetCard, DatasetCardData

from reterm.agent.protocol import SYSTEM_PROMPT
from reterm.data.dataset_stats import DatasetStats, load_stats
from reterm.data.layout import dataset_shards
from reterm.hub_metadata import check_readme, size_category
from reterm.recovery.taxonomy import DEFINITIONS

TEMPLATE = Path(__file__).with_name("templates") / "dataset.md"

TAGS = ["agent", "terminal", "tool-use", "error-recovery", "trajectories", "sft", "grpo", "reterm"]

# What each column holds (the card's schema table). Kept next to the card; a test checks that every
# column of reterm.record_features.FEATURES is described here.
COLUMN_DOCS: dict[str, str] = {
    "id": "`<task_id>:<first 16 hex digits of trajectory_sha256>` (the release's id; identical records share it)",
    "task_id": "id of the terminal task the episode ran on",
    "task_license": "licence of the task's source collection",
    "instruction": "the task instruction given to the agent",
    "messages": "the whole conversation: system, user instruction, assistant tool calls, tool observations",
    "tools": "JSON of the tool schemas the conversation used (`bash`, `submit`)",
    "train_from_message_index": "index in `messages` of the first assistant message trained on: the recovery's first "
                                "turn, after the mistake and its observation (and, for attempt-level records, after "
                                "the feedback message); everything before it is context",
    "target_attempt_index": "the attempt trained on: 2 = a second attempt in the state a failed first attempt left "
                            "(the release's protocol), 1 = a recovery inside the same attempt",
    "trajectory_sha256": "SHA-256 of `messages` as canonical JSON (docs/PROTOCOL.md)",
    "prompt_version": "version of the kit's system prompt and tool schema the conversation used",
    "family": "the recovery drill's family, for drill tasks; else empty",
    "failure_step": "index (0-based) among the assistant turns of the step the record marks as the mistake: the "
                    "failing step (`target_attempt_index` 1) or the last step of the failed first attempt (2); "
                    "never trained on",
    "failure_category": "error category of the failing step (ReTerm taxonomy id)",
    "failure_source": "`own` (the policy's own failure), `injected` (a scripted mistake) or `task_start` (a whole "
                      "reference solution: no failure, `failure_step` -1, `failure_category` `none`)",
    "injection": "the scripted failure, for injected ones: `first_mistake` (the drill's natural first mistake), "
                 "`part1_submit`, `part2_mistake`, `part1_mistake` (two-stage drills); else empty",
    "failure_command": "the failing step's command",
    "failure_output": "the failing step's observation, truncated as the model saw it",
    "replay_commands": "bash commands of the prefix, to rebuild the failure state by replay (empty when the "
                       "recovery continues the same attempt)",
    "verifier_reward": "the task verifier's reward for the recovery (1.0 = pass)",
    "attempts": "recovery attempts forked from this failure state",
    "successful_attempts": "attempts the verifier accepted",
    "recovery_turns": "assistant turns in the recovery",
    "source_policy": "the policy whose attempt failed (`first-mistake`: the scripted policy that types a drill's "
                     "first mistake)",
    "teacher": "the policy that wrote the kept recovery",
    "trajectory_id": "id of the failure state the recovery started from (`state_id`: a hash of the task and "
                     "`messages[:train_from_message_index]`; records from one state share it)",
}


def _cell(text: Any, limit: int = 160) -> str:
    """One markdown table cell: single line, pipes escaped, truncated to ``limit`` characters."""
    s = str(text).replace("\r", "")
    s = s if len(s) <= limit else s[: limit - 1] + "…"
    return s.replace("|", "\\|").replace("\n", "<br>")


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f}%"


NOT_A_CATEGORY = {
    "parse_errors_only": "the attempt made no valid tool call (parse errors only); not an error category",
    "unlocalised": "no failing command shows an error category (the attempt's commands succeeded)",
}
"""Labels a record may carry instead of an error category (:data:`reterm.data.drills.NOT_CATEGORIES`): the card
counts them apart from the taxonomy's categories."""


def _category_label(cat: str) -> str:
    return cat.replace("_", " ")


def _is_category(cat: str) -> bool:
    """Whether ``cat`` is an error category of the taxonomy (anything else is counted apart)."""
    return cat not in NOT_A_CATEGORY


def _category_definitions(categories: list[str]) -> dict[str, str]:
    """One-line definitions of the taxonomy ids (:mod:`reterm.recovery.taxonomy`), first clause only."""
    by_id = {getattr(k, "value", str(k)): v for k, v in DEFINITIONS.items()}
    return {c: by_id[c].split(":")[0].split(" (")[0] for c in categories if c in by_id}


# ------------------------------------------------------------------------------------- checks
def _read_shards(folder: Path, stats: DatasetStats) -> tuple[dict[str, int], Counter, Counter, dict[str, Any], dict[str, int]]:
    """Row counts per split, records per category and per failure source, one example record, and sizes
    (``{split: Arrow bytes}`` plus ``"download_size"``: bytes of the parquet files).

    Raises ``ValueError`` when the shards disagree with ``stats`` or with ``reterm.record_features.FEATURES``.
    """
    import pyarrow.parquet as pq
    from datasets import Features

    from reterm.record_features import FEATURES

    shards = dataset_shards(folder)
    if set(shards) != set(stats.splits):
        raise ValueError(
            f"{folder}: splits in data/ ({sorted(shards)}) differ from stats.json splits ({sorted(stats.splits)})"
        )
    rows: dict[str, int] = {}
    sizes: dict[str, int] = {"download_size": 0}
    categories: Counter = Counter()
    sources: Counter = Counter()
    columns: dict[str, Counter] = {"teacher": Counter(), "source_policy": Counter(), "target_attempt_index": Counter()}
    example: dict[str, Any] | None = None
    example_split = "train" if "train" in shards else sorted(shards)[0]
    for split, paths in sorted(shards.items()):
        rows[split] = 0
        for path in paths:
            schema = pq.read_schema(path)
            features = Features.from_arrow_schema(schema)
            if features != FEATURES:
                missing = sorted(set(FEATURES) - set(features))
                extra = sorted(set(features) - set(FEATURES))
                changed = sorted(k for k in set(FEATURES) & set(features) if FEATURES[k] != features[k])
                raise ValueError(
                    f"{path}: columns differ from reterm.record_features.FEATURES "
                    f"(missing {missing}, unexpected {extra}, different types {changed})"
                )
            table = pq.read_table(path)
            rows[split] += table.num_rows
            sizes[split] = sizes.get(split, 0) + table.nbytes
            sizes["download_size"] += path.stat().st_size
            categories.update(table.column("failure_category").to_pylist())
            sources.update(table.column("failure_source").to_pylist())
            for col, counter in columns.items():
                counter.update(table.column(col).to_pylist())
            if split == example_split:
                example = _pick_example(table.to_pylist(), example)
        if rows[split] != stats.splits[split]:
            raise ValueError(f"{folder}: split {split!r} has {rows[split]} rows, stats.json says {stats.splits[split]}")
    want = {c: s.records for c, s in stats.categories.items() if s.records}
    if dict(categories) != want:
        raise ValueError(f"{folder}: records per failure_category in data/ {dict(categories)} != stats.json {want}")
    want_sources = {k: v for k, v in stats.failure_sources.items() if v}
    if dict(sources) != want_sources:
        raise ValueError(f"{folder}: records per failure_source in data/ {dict(sources)} != stats.json {want_sources}")
    assert example is not None
    sizes["columns"] = columns  # type: ignore[assignment]
    return rows, categories, sources, example, sizes


def _pick_example(records: list[dict[str, Any]], best: dict[str, Any] | None) -> dict[str, Any] | None:
    """The worked example: the shortest conversation that fails and then recovers (ties: smallest id)."""

    def key(r: dict[str, Any]) -> tuple[int, int, str]:
        return (len(r["messages"]), sum(len(m["content"]) for m in r["messages"]), r["id"])

    for r in records:
        if 0 < r["train_from_message_index"] < len(r["messages"]) and (best is None or key(r) < key(best)):
            best = r
    return best


# --------------------------------------------------------------------------------- sections
def _example_markdown(record: dict[str, Any]) -> str:
    """The worked example: every message in order, the failing step and the recovery marked."""

    out = []
    assistant_steps = -1
    for i, m in enumerate(record["messages"]):
        if i == record["train_from_message_index"]:
            out.append(f"> ⤵ **recovery starts here** (`train_from_message_index` = {i}): training targets are the assistant turns below.\n")
        role = m["role"]
        if role == "system":
            same = "the kit's system prompt (`reterm.agent.protocol.SYSTEM_PROMPT`)" if m["content"] == SYSTEM_PROMPT else ""
            text = same or _fence(m["content"], 400)
            out.append(f"**[{i}] system**: {text}\n")
            continue
        if role == "user":
            out.append(f"**[{i}] user**:\n\n{_quote(m['content'])}\n")
            continue
        if role == "assistant":
            assistant_steps += 1
            marker = " ❌ *failing step*" if assistant_steps == record["failure_step"] else ""
            head = f"**[{i}] assistant** (step {assistant_steps}){marker}"
            body = [_quote(m["content"])] if m["content"] else []
            for call in m["tool_calls"]:
                args = call["function"]["arguments"]
                try:
                    parsed = json.loads(args or "{}")
                except json.JSONDecodeError:
                    parsed = {}
                if call["function"]["name"] == "bash" and "command" in parsed:
                    body.append(f"calls `bash`:\n\n{_fence(parsed['command'], 600, 'bash')}")
                else:
                    body.append(f"calls `{call['function']['name']}` with `{args}`")
            out.append(head + ":\n\n" + "\n\n".join(body) + "\n")
            continue
        out.append(f"**[{i}] {role}**" + (f" (`{m['name']}`)" if m["name"] else "") + ":\n\n" + _fence(m["content"], 800) + "\n")
    return "\n".join(out)


def _quote(text: str) -> str:
    return "\n".join("> " + line if line else ">" for line in text.strip().splitlines()) or "> (empty)"


def _fence(text: str, limit: int, lang: str = "text") -> str:
    text = text if len(text) <= limit else text[:limit] + f"\n… ({len(text) - limit} more characters)"
    fence = "````" if "```" in text else "```"
    return f"{fence}{lang}\n{text}\n{fence}"


def _schema_rows() -> list[tuple[str, str, str]]:
    from reterm.record_features import FEATURES

    def type_name(feature: Any) -> str:
        name = type(feature).__name__
        if name == "Value":
            return feature.dtype
        if name == "List":
            return f"list[{type_name(feature.feature)}]"
        if isinstance(feature, dict):
            return "{" + ", ".join(f"{k}: {type_name(v)}" for k, v in feature.items()) + "}"
        return name

    missing = [c for c in FEATURES if c not in COLUMN_DOCS]
    if missing:
        raise ValueError(f"reterm.cards.dataset.COLUMN_DOCS lacks a description of columns {missing}")
    return [(col, type_name(FEATURES[col]), COLUMN_DOCS[col]) for col in FEATURES]


def _example_fields(record: dict[str, Any]) -> list[tuple[str, str]]:
    skip = {"messages", "tools", "instruction"}
    return [(k, _cell(v if not isinstance(v, float) else f"{v:g}", 120)) for k, v in record.items() if k not in skip]


# ------------------------------------------------------------------------------------- render
def card_metadata(stats: DatasetStats, rows: dict[str, int], sizes: dict[str, int] | None = None) -> DatasetCardData:
    """The card's YAML metadata (see the module docstring); ``sizes`` as returned by ``_read_shards``."""
    from datasets import DatasetInfo, SplitDict, SplitInfo
    from datasets.info import DatasetInfosDict
    from datasets.utils.metadata import MetadataConfigs

    from reterm.record_features import FEATURES

    data = DatasetCardData(
        pretty_name=stats.name,
        license=stats.license,
        language=stats.language,
        task_categories=["text-generation"],
        tags=TAGS,
        size_categories=[size_category(stats.records)],
        annotations_creators=["machine-generated"],
        language_creators=["machine-generated"],
        multilinguality=["monolingual"],
        source_datasets=["original"],
    )
    MetadataConfigs(
        {"default": {"data_files": [{"split": s, "path": f"data/{s}-*"} for s in _split_order(rows)]}}
    ).to_dataset_card_data(data)
    sizes = sizes or {}
    splits = SplitDict()
    for s in _split_order(rows):
        splits.add(SplitInfo(name=s, num_examples=rows[s], num_bytes=sizes.get(s, 0)))
    info = DatasetInfo(
        features=FEATURES,
        splits=splits,
        download_size=sizes.get("download_size"),
        dataset_size=sum(sizes.get(s, 0) for s in rows) or None,
    )
    DatasetInfosDict({"default": info}).to_dataset_card_data(data)
    return data


def _split_order(rows: dict[str, int]) -> list[str]:
    order = {"train": 0, "validation": 1, "test": 2}
    return sorted(rows, key=lambda s: (order.get(s, 3), s))


def _counts(counter: Counter | dict[str, int], total: int | None = None) -> str:
    """``a (n, p%), b (m, q%)`` by decreasing count; the share of ``total`` (default their sum)."""
    items = sorted(((k, v) for k, v in counter.items() if v), key=lambda kv: (-kv[1], kv[0]))
    total = total if total is not None else sum(v for _, v in items)
    return ", ".join(f"`{k}` ({v:,}, {_pct(v / total if total else None)})" for k, v in items)


def filters_that_ran(stats: DatasetStats) -> list[str]:
    """The filters of the funnel that the build ran: ``config.filters_run`` where the builder records it (the
    drills builder runs only deduplication), else all three (``reterm.data.build`` runs them all)."""
    config = stats.config if isinstance(stats.config, dict) else {}
    listed = config.get("filters_run")
    return [f for f in ("quality", "dedup", "decontamination") if listed is None or f in listed]


def card_claims(stats: DatasetStats, sources: Counter, columns: dict[str, Counter]) -> dict[str, Any]:
    """Every sentence of the dataset card that states a number or a claim ("own", "teacher", which categories
    are most frequent), computed from the records (``sources``: records per ``failure_source``; ``columns``:
    records per ``teacher`` and ``source_policy``) and ``stats.json``; nothing is asserted that the data do
    not show.

    Returns:
        ``{"version", "filters", "title", "headline", "teachers", "source_policies", "episodes", "categories",
        "injected", "injected_count", "failure_state", "teacher_count"}`` (markdown; ``injected_count`` an int).
    """
    total = stats.records
    own, injected = sources.get("own", 0), sources.get("injected", 0)
    parts = []
    if own:
        parts.append(f"{own:,} from the policy's own failed attempts")
    if injected:
        parts.append(f"{injected:,} from injected mistakes")
    whole = sources.get("task_start", 0)
    if whole:
        parts.append(f"{whole:,} whole reference solutions from the task's start (no mistake, `failure_step` -1)")
    other = total - own - injected - whole
    if other:
        parts.append(f"{other:,} of other sources")
    # whole solutions from the task's start recover from nothing: a set with them is "records", not "recoveries"
    lead = "verified records of a terminal agent" if whole else "verified recoveries of a terminal agent from failure states"
    headline = f"**{total:,} {lead}: {', '.join(parts)}.**"
    teachers = columns["teacher"]
    episodes = stats.config.get("episodes_by_policy") if isinstance(stats.config, dict) else None
    if isinstance(episodes, dict) and episodes:
        ep = "; by policy: " + ", ".join(f"`{k}` {int(v):,}" for k, v in sorted(episodes.items(), key=lambda kv: -kv[1]))
        if "first-mistake" in episodes:
            ep += " (`first-mistake` is a scripted policy that types each drill's natural first mistake, not a model)"
    else:
        ep = f" by {stats.policy}"
    cats = {c: s.records for c, s in stats.categories.items() if _is_category(c) and s.records}
    apart = {c: s.records for c, s in stats.categories.items() if not _is_category(c) and s.records}
    top = sorted(cats.items(), key=lambda kv: (-kv[1], kv[0]))[:2]
    categories = ("The most frequent categories here are " + " and ".join(
        f"{_category_label(c)} ({_pct(n / total)})" for c, n in top) + "; the balance follows the mistakes that were "
        "mined (see the table above)") if top else "No record carries an error category"  # fmt: skip
    if apart:
        categories += "; " + ", ".join(f"{n:,} records are labelled `{c}`" for c, n in sorted(apart.items()))
    kinds = columns.get("target_attempt_index") or Counter()
    where = {2: "at the end of the failed attempt, before the verifier ran (the release's protocol: "
                "`target_attempt_index` = 2, {n:,} records)",
             1: "just after the failing step, inside the attempt (`target_attempt_index` = 1, {n:,} records)"}
    states = [where[k].format(n=n) if k in where else f"of `target_attempt_index` = {k} ({n:,} records)"
              for k, n in sorted(kinds.items(), key=lambda kv: -kv[0]) if n]
    config = stats.config if isinstance(stats.config, dict) else {}
    filters_run = filters_that_ran(stats)
    names = {"quality": "for quality", "dedup": "for duplicates", "decontamination": "for overlap with evaluation tasks"}
    ran = [names[f] for f in ("quality", "dedup", "decontamination") if f in filters_run]
    version = f"Version {stats.version}"
    round_, extends = config.get("round"), config.get("extends")
    if isinstance(round_, int):
        version += f" (round {round_})"
    version += f", built {stats.created}"
    if isinstance(extends, dict):
        version += (f": it extends version {extends.get('version')} (`{extends.get('folder')}`, "
                    f"{int(extends.get('records') or 0):,} records, built {extends.get('created')}), whose records it "
                    "keeps, and adds the records of the policies this round ran")
    return {
        "version": version + ", with the ReTerm kit.",
        "filters": ("filtered " + ", ".join(ran[:-1]) + (" and " if len(ran) > 1 else "") + ran[-1]) if ran
                   else "kept as they were (no filter ran)",
        "title": "verified recoveries of terminal agents from their own failures" if own
                 else "verified recoveries of terminal agents from failure states",
        "headline": headline,
        "teachers": _counts(teachers, total),
        "teacher_count": f"{len([t for t in teachers if teachers[t]]):,}",
        "source_policies": _counts(columns["source_policy"], total),
        "episodes": f"{stats.rollouts.episodes:,} episodes ran{ep}",
        "categories": categories + ".",
        "injected": f"{injected:,} of the {total:,} records" if injected else "none of the records",
        "injected_count": injected,
        "failure_state": "the sandbox state " + (" or ".join(states) if states else "after a failing step"),
    }


def render_dataset_card(folder: str | Path, repo_id: str) -> DatasetCard:
    """Render the card of the dataset folder ``folder`` to be published as ``repo_id``.

    Args:
        folder: the pipeline's output folder (``data/*.parquet`` + ``stats.json``).
        repo_id: the Hub id (``ORG/NAME``) the card will live at (used in the usage snippet and citation).

    Returns:
        The card; ``str(card)`` is the README.md text, and ``DatasetCard(str(card))`` parses it back.

    Raises:
        FileNotFoundError: no ``stats.json`` or no shards.
        ValueError: stats and shards disagree, or the metadata is invalid (message names the field).
    """
    folder = Path(folder)
    if repo_id.count("/") != 1:
        raise ValueError(f"repo_id must be ORG/NAME, got {repo_id!r}")
    stats = load_stats(folder / "stats.json")
    rows, categories, sources, example, sizes = _read_shards(folder, stats)
    columns = sizes.pop("columns")
    card_data = card_metadata(stats, rows, sizes)
    claims = card_claims(stats, sources, columns)

    total = stats.records
    cat_names = sorted(stats.categories, key=lambda c: (not _is_category(c), -stats.categories[c].records, c))
    definitions = _category_definitions(cat_names)
    category_rows = [
        {
            "name": c,
            "label": _category_label(c),
            "records": s.records,
            "share": _pct(s.records / total if total else None),
            "failure_states": s.failure_states,
            "attempts": s.attempts,
            "successful": s.successful_attempts,
            "rate": _pct(s.recovery_rate),
            "definition": _cell(definitions.get(c, NOT_A_CATEGORY.get(c, "")), 200),
            "apart": not _is_category(c),
        }
        for c, s in ((c, stats.categories[c]) for c in cat_names)
    ]
    totals = {
        "failure_states": sum(s.failure_states for s in stats.categories.values()),
        "attempts": sum(s.attempts for s in stats.categories.values()),
        "successful": sum(s.successful_attempts for s in stats.categories.values()),
        "rate": _pct(stats.recovery_rate),
    }
    config_yaml = yaml.safe_dump(stats.config, sort_keys=False, allow_unicode=True).strip() if stats.config else ""
    year = stats.created[:4]
    key = repo_id.split("/")[1].lower().replace("-", "").replace(".", "").replace("_", "")
    citation = stats.citation or (
        f"@misc{{{key}{year},\n"
        f"  title        = {{{{{stats.name}}}: {claims['title']}}},\n"
        f"  year         = {{{year}}},\n"
        f"  note         = {{Version {stats.version}, built with the ReTerm kit}},\n"
        f"  howpublished = {{\\url{{https://huggingface.co/datasets/{repo_id}}}}}\n"
        "}"
    )
    licences = sorted({s.license for s in stats.sources})
    card = DatasetCard.from_template(
        card_data,
        template_path=str(TEMPLATE),
        repo_id=repo_id,
        stats=stats,
        total=total,
        splits=[(s, rows[s]) for s in _split_order(rows)],
        categories=category_rows,
        category_totals=totals,
        failure_sources=sorted(stats.failure_sources.items(), key=lambda kv: -kv[1]),
        schema=_schema_rows(),
        example=example,
        example_fields=_example_fields(example),
        example_markdown=_example_markdown(example),
        example_category=_category_label(example["failure_category"]),
        config_yaml=config_yaml,
        citation=citation,
        source_licences=licences,
        pct=_pct,
        claims=claims,
        filters_run=filters_that_ran(stats),
    )
    check_readme(str(card), "dataset", where=f"dataset card of {folder}")
    return card


def main(argv: list[str] | None = None) -> int:
    """``python dataset_card/render.py FOLDER --repo-id ORG/NAME [--out PATH]``."""
    parser = argparse.ArgumentParser(prog="python dataset_card/render.py", description="Render the dataset card.")
    parser.add_argument("folder", type=Path)
    parser.add_argument("--repo-id", required=True)
    parser.add_argument("--out", type=Path, help="where to write the card (default: FOLDER/README.md)")
    args = parser.parse_args(argv)
    try:
        card = render_dataset_card(args.folder, args.repo_id)
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    out = args.out or args.folder / "README.md"
    card.save(out)
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
