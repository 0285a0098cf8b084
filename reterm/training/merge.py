"""Merge a LoRA adapter into its base model: a full checkpoint for publishing and for the harness.

A LoRA run saves only the adapter (a few MB). Publishing, vLLM serving and the agent harness
(``reterm.policies`` spec ``hf:<folder>``) want a plain checkpoint, so this folds the adapter into the
base weights with PEFT's ``merge_and_unload`` and saves model + tokenizer + chat template, plus the
run's record files (``training_summary.json``, curves, recipe, versions) when the adapter folder has
them.

Command line::

    python -m reterm.training.merge ADAPTER_DIR OUTPUT_DIR [--base smollm2]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from reterm.io import atomic_output, default_mode
from reterm.training.models import causal_lm_class, resolve_model_name_or_path

RUN_FILES = ("training_summary.json", "curves.csv", "curves.png", "recipe.yaml", "versions.json", "command.json")


def base_model_of(adapter_dir: str | Path) -> str:
    """The base model of an adapter folder: ``training_summary.json``'s ``base_model`` (the recipe's
    name, e.g. ``smollm2``, valid on any machine), else ``adapter_config.json``'s
    ``base_model_name_or_path``.

    Raises:
        FileNotFoundError: ``adapter_dir`` has no ``adapter_config.json``.
    """
    adapter_dir = Path(adapter_dir)
    cfg_path = adapter_dir / "adapter_config.json"
    if not cfg_path.is_file():
        raise FileNotFoundError(f"{adapter_dir}: no adapter_config.json (not a PEFT adapter folder)")
    summary = adapter_dir / "training_summary.json"
    if summary.is_file():
        base = json.loads(summary.read_text()).get("base_model")
        if base:
            return base
    return json.loads(cfg_path.read_text())["base_model_name_or_path"]


def merge_adapter(
    adapter_dir: str | Path, output_dir: str | Path, base_model: str | None = None, dtype: str | None = "float32"
) -> Path:
    """Fold a LoRA adapter into its base model and save a full checkpoint.

    Args:
        adapter_dir: a folder saved by a PEFT training run (``adapter_config.json``,
            ``adapter_model.safetensors``, tokenizer files).
        output_dir: where the merged checkpoint goes; replaced atomically if it exists.
        base_model: the base model name or folder (default: :func:`base_model_of`).
        dtype: torch dtype name to load and save the merged weights in (``"bfloat16"`` for a 9B model).

    Returns:
        ``output_dir``: ``config.json``, ``model.safetensors``, tokenizer files and
        ``chat_template.jinja`` (the adapter folder's tokenizer, i.e. the template the run trained with),
        loadable with ``AutoModelForCausalLM.from_pretrained``.
    """
    import torch
    from peft import PeftModel
    from transformers import AutoTokenizer

    adapter_dir, output_dir = Path(adapter_dir), Path(output_dir)
    base = resolve_model_name_or_path(base_model or base_model_of(adapter_dir))
    torch_dtype = getattr(torch, dtype) if dtype not in (None, "auto") else dtype
    model = causal_lm_class(base).from_pretrained(base, dtype=torch_dtype)
    merged = PeftModel.from_pretrained(model, adapter_dir).merge_and_unload()
    tok_src = adapter_dir if (adapter_dir / "tokenizer_config.json").is_file() else Path(base)
    tokenizer = AutoTokenizer.from_pretrained(tok_src)

    with atomic_output(output_dir, directory=True) as tmp:
        merged.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        for name in RUN_FILES:
            if (adapter_dir / name).is_file():
                shutil.copyfile(adapter_dir / name, tmp / name)
        # safetensors and other writers go through mkstemp (0600): the checkpoint is for others to load and
        # publish, so its files get what open() would give (0666 less the umask), like reterm.io's writes
        mode = default_mode()
        for path in tmp.rglob("*"):
            if path.is_file() and not path.is_symlink():
                path.chmod(mode)
        tmp.chmod(0o755)
    return output_dir


def main(argv: list[str] | None = None) -> int:
    """``python -m reterm.training.merge ADAPTER_DIR OUTPUT_DIR [--base NAME]``; prints the output folder."""
    parser = argparse.ArgumentParser(prog="python -m reterm.training.merge", description=__doc__.split("\n\n")[0])
    parser.add_argument("adapter_dir")
    parser.add_argument("output_dir")
    parser.add_argument("--base", default=None, help="base model (default: from the adapter folder)")
    args = parser.parse_args(argv)
    print(merge_adapter(args.adapter_dir, args.output_dir, args.base))
    return 0


if __name__ == "__main__":
    sys.exit(main())
