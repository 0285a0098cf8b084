"""Held-out check: how likely a model finds the reference recoveries, given the failure states.

For each held-out ReTerm-10K record the model reads the failure state (``messages[:train_from_message_index]``,
rendered with tools by the chat template) and is scored on the reference recovery's assistant tokens,
exactly the tokens SFT trains on (:func:`tokenize_for_loss` reproduces TRL ``SFTTrainer``'s
prompt/completion tokenisation with ``assistant_only_loss``; ``tests/test_sft_data.py`` checks that they
agree token for token). After a working SFT run the SFT model gives the reference recoveries a higher
log-likelihood (a lower NLL per token) than its base model (the check that SFT learnt the recoveries).

TRL computes only the mean loss over a dataset (``trainer.evaluate()``, used during training); this
module adds per-record figures and the base-vs-SFT table, which TRL does not have.

Command line (prints a markdown table; the first ``--model`` is the reference)::

    python -m reterm.training.likelihood --dataset tests/fixtures/reterm10k_mini --split test \\
        --model smollm2 --model outputs/sft-smollm2/merged
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from reterm.training.merge import base_model_of
from reterm.training.models import causal_lm_class, resolve_model_name_or_path
from reterm.trajectory import write_json_atomic


def training_chat_template(tokenizer) -> str | None:
    """The template TRL's SFTTrainer trains with under ``assistant_only_loss``: ``None`` (the tokenizer's
    own) when it already has ``{% generation %}`` markers (ReTerm's ChatML template), else TRL's
    training variant (``qwen3_5_think_training.jinja`` for Qwen3.5)."""
    from trl.chat_template_utils import get_training_chat_template, has_generation_markers

    template = tokenizer.chat_template
    if isinstance(template, dict):
        template = template["default"]
    if has_generation_markers(template):
        return None
    return get_training_chat_template(tokenizer)


def tokenize_for_loss(
    tokenizer,
    prompt: list[dict[str, Any]],
    completion: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    chat_template: str | None = None,
    chat_template_kwargs: dict[str, Any] | None = None,
    completion_only: bool = True,
) -> tuple[list[int], list[int]]:
    """Token ids and labels of one prompt/completion conversation, as TRL's SFTTrainer builds them.

    Mirrors ``SFTTrainer._prepare_dataset`` (TRL 1.16) for conversational prompt/completion rows with
    ``assistant_only_loss=True``: the prompt is rendered with the generation prompt, the whole
    conversation with the assistant mask; the completion starts where the two token sequences diverge.

    Args:
        tokenizer: a tokenizer with a chat template.
        prompt, completion: chat messages (tool-call arguments as mappings).
        tools: tool schemas passed to the template.
        chat_template: the template to render with (see :func:`training_chat_template`); ``None`` = the
            tokenizer's.
        chat_template_kwargs: extra template variables (e.g. ``enable_thinking``).
        completion_only: ``True`` = only the completion's assistant tokens are labelled (recovery turns);
            ``False`` = every assistant token (``completion_only_loss=False``).

    Returns:
        ``(input_ids, labels)``, equal lengths; ``labels[i]`` is ``input_ids[i]`` for scored tokens and
        ``-100`` elsewhere.
    """
    from trl.data_utils import common_prefix_length

    kwargs = {"chat_template": chat_template, "tools": tools, **(chat_template_kwargs or {})}
    prompt_ids = tokenizer.apply_chat_template(
        prompt, tokenize=True, return_dict=True, add_generation_prompt=True, **kwargs
    )["input_ids"]
    full = tokenizer.apply_chat_template(
        prompt + completion, tokenize=True, return_dict=True, return_assistant_tokens_mask=True, **kwargs
    )
    ids, mask = list(full["input_ids"]), list(full["assistant_masks"])
    start = common_prefix_length(list(prompt_ids), ids) if completion_only else 0
    labels = [t if m and i >= start else -100 for i, (t, m) in enumerate(zip(ids, mask))]
    return ids, labels


def load_for_scoring(name_or_path: str):
    """A model (a full checkpoint, or a LoRA adapter folder on its base) and its tokenizer, in eval mode."""
    import torch
    from transformers import AutoTokenizer

    path = Path(resolve_model_name_or_path(name_or_path))
    if (path / "adapter_config.json").is_file():
        from peft import PeftModel

        base = resolve_model_name_or_path(base_model_of(path))
        model = causal_lm_class(base).from_pretrained(base, dtype=torch.float32)
        model = PeftModel.from_pretrained(model, path)
    else:
        model = causal_lm_class(str(path)).from_pretrained(str(path), dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(path)
    return model.eval(), tokenizer


def score_rows(
    model,
    tokenizer,
    rows: list[dict[str, Any]],
    completion_only: bool = True,
    max_length: int | None = None,
) -> list[dict[str, Any]]:
    """Log-likelihood of the labelled (recovery) tokens of each SFT row under ``model``.

    Args:
        model: a causal LM (eval mode; runs on its current device).
        tokenizer: its tokenizer.
        rows: SFT rows from :func:`reterm.training.sft_data.to_sft_dataset` (``prompt``, ``completion``,
            ``tools`` and optionally ``chat_template_kwargs``).
        completion_only: see :func:`tokenize_for_loss`.
        max_length: truncate longer sequences from the right, as SFT's ``keep_start`` does.

    Returns:
        One dict per row: ``id``, ``tokens`` (scored tokens), ``logprob`` (sum, nats), ``nll`` (mean
        negative log-likelihood per scored token, nats).
    """
    import torch

    template = training_chat_template(tokenizer)
    results = []
    for row in rows:
        tools = json.loads(row["tools"]) if isinstance(row.get("tools"), str) else row.get("tools")
        ids, labels = tokenize_for_loss(
            tokenizer, row["prompt"], row["completion"], tools, template,
            row.get("chat_template_kwargs"), completion_only,
        )
        if max_length is not None:
            ids, labels = ids[:max_length], labels[:max_length]
        input_ids = torch.tensor([ids], device=model.device)
        with torch.no_grad():
            logits = model(input_ids=input_ids).logits[0, :-1].float()
        target = torch.tensor(labels[1:], device=model.device)
        keep = target != -100
        logp = torch.log_softmax(logits[keep], dim=-1).gather(1, target[keep].unsqueeze(1)).squeeze(1)
        n = int(keep.sum())
        total = float(logp.sum())
        results.append({"id": row.get("id", ""), "tokens": n, "logprob": total, "nll": -total / n if n else math.nan})
    return results


def mean_nll(results: list[dict[str, Any]]) -> float:
    """Token-weighted mean NLL (nats per scored token) over :func:`score_rows` results."""
    tokens = sum(r["tokens"] for r in results)
    return -sum(r["logprob"] for r in results) / tokens if tokens else math.nan


def compare_models(
    models: list[str], dataset: str, split: str = "test", chat_template_kwargs: dict[str, Any] | None = None,
    max_records: int | None = None, completion_only: bool = True,
) -> dict[str, Any]:
    """Score the held-out split under each model; returns ``{"models": [...], "records": [...],
    "mean_nll": {model: float}}`` (records carry one ``nll``/``logprob`` per model)."""
    from reterm.training.sft_data import load_records, to_sft_dataset

    rows = list(to_sft_dataset(load_records(dataset, split), chat_template_kwargs, max_samples=max_records))
    per_model = {}
    for name in models:
        model, tokenizer = load_for_scoring(name)
        per_model[name] = score_rows(model, tokenizer, rows, completion_only=completion_only)
        del model
    records = []
    for i, row in enumerate(rows):
        rec = {"id": row["id"], "task_id": row["task_id"]}
        for name in models:
            rec[name] = {k: per_model[name][i][k] for k in ("tokens", "logprob", "nll")}
        records.append(rec)
    return {"models": models, "records": records, "mean_nll": {m: mean_nll(per_model[m]) for m in models}}


def markdown_table(report: dict[str, Any]) -> str:
    """The per-record NLL table of :func:`compare_models` (one column per model) with the mean last."""
    models = report["models"]
    head = "| record | task | " + " | ".join(f"NLL/token {Path(m).name or m}" for m in models) + " |"
    lines = [head, "|" + "---|" * (2 + len(models))]
    for rec in report["records"]:
        cells = " | ".join(f"{rec[m]['nll']:.3f}" for m in models)
        lines.append(f"| {rec['id'][:8]} | {rec['task_id']} | {cells} |")
    lines.append("| **mean** | | " + " | ".join(f"**{report['mean_nll'][m]:.3f}**" for m in models) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Print the held-out NLL table; exit 1 when ``--expect-improvement`` is given and the last model
    does not beat the first."""
    parser = argparse.ArgumentParser(prog="python -m reterm.training.likelihood", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", action="append", required=True, help="model name/folder/adapter (repeat)")
    parser.add_argument("--dataset", required=True, help="ReTerm-10K folder or Hub id")
    parser.add_argument("--split", default="test")
    parser.add_argument("--max-records", type=int, default=None)
    parser.add_argument("--enable-thinking", choices=["true", "false"], default=None, help="Qwen3.5 template flag")
    parser.add_argument("--all-assistant-turns", action="store_true", help="score every assistant turn")
    parser.add_argument("--out", default=None, help="also write the report as JSON here")
    parser.add_argument("--expect-improvement", action="store_true")
    args = parser.parse_args(argv)
    kwargs = None if args.enable_thinking is None else {"enable_thinking": args.enable_thinking == "true"}
    report = compare_models(
        args.model, args.dataset, args.split, kwargs, args.max_records, completion_only=not args.all_assistant_turns
    )
    print(markdown_table(report))
    if args.out:
        write_json_atomic(args.out, report)
    if len(args.model) > 1:
        first, last = (report["mean_nll"][m] for m in (args.model[0], args.model[-1]))
        better = last < first
        print(f"\nheld-out recovery NLL/token: {first:.4f} -> {last:.4f} "
              f"({'higher' if better else 'NOT higher'} likelihood of the reference recoveries)")
        if args.expect_improvement and not better:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
