"""Checks of a repo card's YAML metadata (the block between ``---`` lines at the top of README.md).

The Hub validates this block when a commit touches README.md (``POST /api/validate-yaml``) and
rejects the commit when it is malformed; ``huggingface_hub`` calls that endpoint before uploading.
:func:`validate_card_metadata` runs the same kind of checks locally, so that ``reterm publish`` fails
*before* creating a repo or sending a byte, with a message naming the field. It covers the subset
of the Hub's schema that our cards use (licence ids, list-of-string fields, size categories,
``base_model``/``base_model_relation``, ``model-index``, dataset ``configs``, Space ``sdk``); the
Hub's own schema is larger. The local test server (``tests/hub_server.py``) answers
``validate-yaml`` with the same function.

Sources: https://huggingface.co/docs/hub/repositories-licenses (licence ids),
https://huggingface.co/docs/hub/model-cards and ``datasetcard`` docs (fields),
``huggingface_hub.repocard`` (front-matter regex, ``model-index`` parsing).
"""

from __future__ import annotations

import re
from typing import Any

import yaml
from huggingface_hub.repocard import REGEX_YAML_BLOCK
from huggingface_hub.repocard_data import model_index_to_eval_results

# Licence identifiers accepted by the Hub (https://huggingface.co/docs/hub/repositories-licenses).
HUB_LICENSES: frozenset[str] = frozenset(
    """
    apache-2.0 mit openrail bigscience-openrail-m creativeml-openrail-m bigscience-bloom-rail-1.0
    bigcode-openrail-m afl-3.0 artistic-2.0 bsl-1.0 bsd bsd-2-clause bsd-3-clause bsd-3-clause-clear c-uda
    cc cc0-1.0 cc-by-2.0 cc-by-2.5 cc-by-3.0 cc-by-4.0 cc-by-sa-3.0 cc-by-sa-4.0 cc-by-nc-2.0 cc-by-nc-3.0
    cc-by-nc-4.0 cc-by-nd-4.0 cc-by-nc-nd-3.0 cc-by-nc-nd-4.0 cc-by-nc-sa-2.0 cc-by-nc-sa-3.0 cc-by-nc-sa-4.0
    cdla-sharing-1.0 cdla-permissive-1.0 cdla-permissive-2.0 wtfpl ecl-2.0 epl-1.0 epl-2.0 etalab-2.0
    eupl-1.1 eupl-1.2 agpl-3.0 gfdl gpl gpl-2.0 gpl-3.0 lgpl lgpl-2.1 lgpl-3.0 isc h-research
    intel-research lppl-1.3c ms-pl apple-ascl apple-amlr mpl-2.0 odc-by odbl openrail++ osl-3.0 postgresql
    ofl-1.1 ncsa unlicense zlib pddl lgpl-lr deepfloyd-if-license fair-noncommercial-research-license
    llama2 llama3 llama3.1 llama3.2 llama3.3 llama4 gemma unknown other
    """.split()
)

SIZE_CATEGORIES: tuple[str, ...] = (
    "n<1K", "1K<n<10K", "10K<n<100K", "100K<n<1M", "1M<n<10M", "10M<n<100M",
    "100M<n<1B", "1B<n<10B", "10B<n<100B", "100B<n<1T", "n>1T", "other",
)  # fmt: skip

BASE_MODEL_RELATIONS: tuple[str, ...] = ("adapter", "merge", "quantized", "finetune")
SPACE_SDKS: tuple[str, ...] = ("gradio", "streamlit", "docker", "static")

# Fields that hold a string or a list of strings.
_STR_OR_LIST = (
    "tags", "datasets", "metrics", "language", "task_categories", "task_ids", "size_categories",
    "language_creators", "annotations_creators", "source_datasets", "multilinguality", "base_model",
    "models", "license",
)  # fmt: skip
_STR = ("pipeline_tag", "library_name", "license_name", "license_link", "pretty_name", "title", "app_file")
_REPO_ID = re.compile(r"^(?:[A-Za-z0-9][\w.-]*/)?[\w.-]+$")


def size_category(n: int) -> str:
    """The Hub's ``size_categories`` bucket for ``n`` examples (e.g. 10_000 -> ``"10K<n<100K"``)."""
    if n < 0:
        raise ValueError(f"size_category: negative count {n}")
    bounds = [10**3, 10**4, 10**5, 10**6, 10**7, 10**8, 10**9, 10**10, 10**11, 10**12]
    for bound, name in zip(bounds, SIZE_CATEGORIES[:-2], strict=True):
        if n < bound:
            return name
    return "n>1T"


def split_front_matter(content: str) -> tuple[dict[str, Any] | None, str]:
    """Split a README into ``(metadata, body)``.

    Returns ``(None, content)`` when there is no ``---`` block. Raises ``ValueError`` when the block
    is not valid YAML or not a mapping (the message says which).
    """
    match = REGEX_YAML_BLOCK.search(content)
    if not match:
        return None, content
    try:
        data = yaml.safe_load(match.group(2))
    except yaml.YAMLError as exc:
        raise ValueError(f"the YAML metadata block is not valid YAML: {exc}") from exc
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ValueError(f"the YAML metadata block must be a mapping, got {type(data).__name__}")
    return data, content[match.end() :]


def _is_str_list(value: Any) -> bool:
    return isinstance(value, str) or (isinstance(value, list) and all(isinstance(v, str) for v in value))


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def validate_card_metadata(metadata: dict[str, Any], repo_type: str = "model") -> list[str]:
    """Check a card's metadata mapping; return the list of problems (empty when valid).

    Args:
        metadata: the parsed YAML block (``yaml.safe_load`` of the front matter).
        repo_type: ``"model"``, ``"dataset"`` or ``"space"``; selects the type-specific checks.

    Returns:
        One human-readable message per problem, each starting with the field name in quotes.
    """
    errors: list[str] = []
    if repo_type not in ("model", "dataset", "space"):
        return [f'"repoType" must be model, dataset or space, got {repo_type!r}']
    for key in _STR_OR_LIST:
        if key in metadata and not _is_str_list(metadata[key]):
            errors.append(f'"{key}" must be a string or a list of strings, got {metadata[key]!r}')
    for key in _STR:
        if key in metadata and not isinstance(metadata[key], str):
            errors.append(f'"{key}" must be a string, got {metadata[key]!r}')
    if _is_str_list(metadata.get("license")):
        for lic in _as_list(metadata.get("license")):
            if lic not in HUB_LICENSES:
                errors.append(f'"license" {lic!r} is not a Hub licence id (use "other" with license_name/license_link)')
    if metadata.get("license") == "other" and repo_type == "model" and not metadata.get("license_name"):
        errors.append('"license_name" is required when "license" is "other"')
    if _is_str_list(metadata.get("size_categories")):
        for cat in _as_list(metadata.get("size_categories")):
            if cat not in SIZE_CATEGORIES:
                errors.append(f'"size_categories" {cat!r} is not one of {", ".join(SIZE_CATEGORIES)}')
    if _is_str_list(metadata.get("base_model")):
        for ref in _as_list(metadata.get("base_model")):
            if not _REPO_ID.match(ref):
                errors.append(f'"base_model" {ref!r} is not a Hub model id (ORG/NAME)')
    if "base_model_relation" in metadata:
        if metadata["base_model_relation"] not in BASE_MODEL_RELATIONS:
            errors.append(
                f'"base_model_relation" must be one of {", ".join(BASE_MODEL_RELATIONS)}, '
                f"got {metadata['base_model_relation']!r}"
            )
        if "base_model" not in metadata:
            errors.append('"base_model_relation" needs "base_model"')
    if _is_str_list(metadata.get("datasets")):
        for ref in _as_list(metadata.get("datasets")):
            if not _REPO_ID.match(ref):
                errors.append(f'"datasets" {ref!r} is not a Hub dataset id (ORG/NAME)')
    if "model-index" in metadata:
        try:
            model_index_to_eval_results(metadata["model-index"])
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            errors.append(f'"model-index" is malformed: {type(exc).__name__}: {exc}')
    if "configs" in metadata:
        errors += _validate_configs(metadata["configs"])
    if repo_type == "space":
        if metadata.get("sdk") not in SPACE_SDKS:
            errors.append(f'"sdk" must be one of {", ".join(SPACE_SDKS)}, got {metadata.get("sdk")!r}')
    return errors


def _validate_configs(configs: Any) -> list[str]:
    if not isinstance(configs, list) or not configs:
        return [f'"configs" must be a non-empty list, got {configs!r}']
    errors = []
    for i, cfg in enumerate(configs):
        if not isinstance(cfg, dict) or not isinstance(cfg.get("config_name"), str):
            errors.append(f'"configs[{i}]" must be a mapping with a string "config_name"')
            continue
        files = cfg.get("data_files")
        if files is None:
            continue
        ok = _is_str_list(files) or (
            isinstance(files, list)
            and all(
                isinstance(f, dict) and isinstance(f.get("split"), str) and _is_str_list(f.get("path"))
                for f in files
            )
        )
        if not ok:
            errors.append(f'"configs[{i}].data_files" must be paths or a list of {{split, path}}, got {files!r}')
    return errors


def check_readme(content: str, repo_type: str, where: str = "README.md") -> dict[str, Any]:
    """Parse and validate a README's metadata; raise ``ValueError`` naming ``where`` on any problem.

    Returns the metadata mapping (``{}`` when the README has none).
    """
    try:
        metadata, _ = split_front_matter(content)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None
    problems = validate_card_metadata(metadata or {}, repo_type)
    if problems:
        raise ValueError(f"{where}: invalid card metadata:\n" + "\n".join(f"  - {p}" for p in problems))
    return metadata or {}
