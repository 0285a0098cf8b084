"""Thinking on or off, pinned into a chat template, so that one recipe setting reaches every stage.

Qwen3.5's chat template thinks unless the caller passes ``enable_thinking=False``; a checkpoint trained
without thinking (``enable_thinking: false`` in the recipe) and then served by vLLM or another harness that
passes nothing (Harbor's Terminus-2 through LiteLLM) would be evaluated with thinking on. Pinning the value
in the template itself (a first line ``{%- set enable_thinking = false %}``, which shadows any value a caller
passes) makes the saved tokenizer, every server of it and every harness use the recipe's setting.

Used by ``train/sft.py`` and ``train/grpo.py`` (the saved ``chat_template.jinja``) and ``train/stages.py
with-vllm --enable-thinking`` (the base model, served from its Hub id). Written for this kit.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

_PIN = re.compile(r"\A\{%- set enable_thinking = (true|false) %\}\n")


def pin_thinking(template: str, enable: bool) -> str:
    """``template`` with ``enable_thinking`` fixed to ``enable`` (an earlier pin is replaced).

    Raises:
        ValueError: the template never reads ``enable_thinking`` (pinning it would change nothing: the
            setting would silently not apply).
    """
    body = _PIN.sub("", template, count=1)
    if "enable_thinking" not in body:
        raise ValueError("the chat template does not read enable_thinking; it cannot be switched on or off")
    return f"{{%- set enable_thinking = {'true' if enable else 'false'} %}}\n{body}"


def pinned_value(template: str) -> bool | None:
    """The pinned ``enable_thinking`` of a template, ``None`` when it is not pinned."""
    m = _PIN.match(template)
    return None if m is None else m.group(1) == "true"


def pin_saved_template(folder: str | Path, enable: bool) -> Path:
    """Pin ``enable_thinking`` in a saved tokenizer's template (``chat_template.jinja``, else the
    ``chat_template`` of ``tokenizer_config.json``). Returns the file written.

    Raises:
        FileNotFoundError: the folder has no chat template.
        ValueError: see :func:`pin_thinking`.
    """
    folder = Path(folder)
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        jinja.write_text(pin_thinking(jinja.read_text(), enable))
        return jinja
    cfg = folder / "tokenizer_config.json"
    data = json.loads(cfg.read_text()) if cfg.is_file() else {}
    if not isinstance(data.get("chat_template"), str):
        raise FileNotFoundError(f"{folder}: no chat_template.jinja and no chat_template in tokenizer_config.json")
    data["chat_template"] = pin_thinking(data["chat_template"], enable)
    cfg.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    return cfg
