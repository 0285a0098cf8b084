"""The tiny Qwen3.5 test model: built offline, deterministic, and recognised by TRL as Qwen3.5."""

from __future__ import annotations

from reterm.agent.protocol import TOOLS, initial_messages
from reterm.tiny_qwen import build_tiny_qwen3_5


def test_build_is_deterministic_and_cached(tmp_path):
    a = build_tiny_qwen3_5(tmp_path / "a")
    b = build_tiny_qwen3_5(tmp_path / "b")
    names = sorted(p.name for p in a.iterdir())
    assert {"config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja"} <= set(names)
    assert names == sorted(p.name for p in b.iterdir())
    assert all((a / n).read_bytes() == (b / n).read_bytes() for n in names)
    mtime = (a / "model.safetensors").stat().st_mtime_ns
    assert build_tiny_qwen3_5(a) == a and (a / "model.safetensors").stat().st_mtime_ns == mtime  # not rebuilt
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folder left


def test_trl_recognises_it_as_qwen3_5():
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl.chat_template_utils import (
        add_response_schema,
        get_training_chat_template,
        qwen3_5_think_chat_template,
        qwen3_5_think_training_chat_template,
    )

    path = build_tiny_qwen3_5()
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    assert type(model).__name__ == "Qwen3_5ForCausalLM"
    assert model.config.layer_types.count("linear_attention") == 3 and model.config.hidden_size == 64
    assert model.config.vocab_size == len(tok) and tok.eos_token == "<|im_end|>"
    assert tok.chat_template == qwen3_5_think_chat_template
    assert get_training_chat_template(tok) == qwen3_5_think_training_chat_template
    # Qwen's tool/think tags are single added tokens that survive skip_special_tokens, as in Qwen's tokenizer
    for tag in ("<tool_call>", "</tool_call>", "<think>", "</think>", "<tool_response>"):
        ids = tok(tag, add_special_tokens=False)["input_ids"]
        assert len(ids) == 1 and tok.decode(ids, skip_special_tokens=True) == tag
    add_response_schema(tok)
    prompt = tok.apply_chat_template(initial_messages("List the files."), tools=TOOLS, add_generation_prompt=True,
                                     tokenize=False)  # fmt: skip
    text = "I will list.\n</think>\n\n<tool_call>\n<function=bash>\n<parameter=command>\nls -la\n</parameter>\n" \
           "</function>\n</tool_call><|im_end|>"  # fmt: skip
    parsed = tok.parse_response(text, prefix=prompt)
    assert parsed["tool_calls"][0]["function"] == {"name": "bash", "arguments": {"command": "ls -la"}}
