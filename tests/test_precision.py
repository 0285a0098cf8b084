"""bf16 on the CPU (reterm.precision, issue 30): detection, the training switch, and numerics that agree with fp32.

The agreement tests run the real SmolLM2-135M: the SFT loss of a real drills record under bf16 autocast is
within 2% of fp32's, and greedy generation from the kit's prompt with bf16 weights (what ``dtype="auto"`` loads
on a CPU with AMX) gives the same first tokens as fp32. They are skipped on a CPU without bf16 instructions,
where the kit does not use bf16.
"""

from __future__ import annotations

import json

import pytest

from reterm import precision


def test_detection_follows_the_cpu_flags_and_the_override(monkeypatch):
    monkeypatch.delenv("RETERM_CPU_BF16", raising=False)
    monkeypatch.setattr(precision, "_cpu_flags", lambda: frozenset({"sse4_2", "avx512f"}))
    assert not precision.cpu_bf16_fast() and precision.auto_cpu_dtype() == "float32"
    monkeypatch.setattr(precision, "_cpu_flags", lambda: frozenset({"avx512f", "amx_bf16", "amx_tile"}))
    assert precision.cpu_bf16_fast() and precision.auto_cpu_dtype() == "bfloat16"
    monkeypatch.setenv("RETERM_CPU_BF16", "0")
    assert not precision.cpu_bf16_fast()
    monkeypatch.setenv("RETERM_CPU_BF16", "yes")
    with pytest.raises(ValueError, match="RETERM_CPU_BF16='yes'"):
        precision.cpu_bf16_fast()


def test_a_cpu_recipes_bf16_is_kept_only_where_the_cpu_has_it(monkeypatch, tmp_path):
    from trl import SFTConfig

    monkeypatch.setenv("RETERM_CPU_BF16", "0")
    args = SFTConfig(output_dir=str(tmp_path), use_cpu=True, bf16=True)
    msg = precision.resolve_training_bf16(args)
    assert args.bf16 is False and args.mixed_precision == "no" and "bf16 off" in msg
    monkeypatch.setenv("RETERM_CPU_BF16", "1")
    args = SFTConfig(output_dir=str(tmp_path), use_cpu=True, bf16=True)
    assert "autocast" in precision.resolve_training_bf16(args) and args.bf16 is True
    args = SFTConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False)
    assert precision.resolve_training_bf16(args) is None and args.bf16 is False


def test_the_policy_loads_bf16_weights_on_such_a_cpu(monkeypatch):
    import torch

    from reterm.policies.transformers_policy import TransformersPolicy

    monkeypatch.setenv("RETERM_CPU_BF16", "1")
    assert TransformersPolicy._resolve_dtype("auto", torch.device("cpu")) is torch.bfloat16
    monkeypatch.setenv("RETERM_CPU_BF16", "0")
    assert TransformersPolicy._resolve_dtype("auto", torch.device("cpu")) is torch.float32
    assert TransformersPolicy._resolve_dtype("float32", torch.device("cpu")) is torch.float32


def test_a_trainer_built_after_bf16_off_runs_its_forward_without_autocast(monkeypatch, tmp_path):
    """The Trainer's accelerator follows the switch: no bf16 autocast around the model's forward (accelerate reads
    ``mixed_precision``, which ``TrainingArguments`` derived from the recipe's ``bf16: true``)."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    from reterm.tiny_qwen import build_tiny_qwen3_5

    monkeypatch.setenv("RETERM_CPU_BF16", "0")
    path = build_tiny_qwen3_5()
    args = SFTConfig(output_dir=str(tmp_path), use_cpu=True, bf16=True, max_steps=1, report_to="none",
                     per_device_train_batch_size=1, save_strategy="no")  # fmt: skip
    assert args.mixed_precision == "bf16"  # what transformers derived from the recipe's value
    precision.resolve_training_bf16(args)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    seen = []
    model.register_forward_hook(lambda *_: seen.append(torch.is_autocast_enabled("cpu")))
    trainer = SFTTrainer(model=model, args=args, processing_class=AutoTokenizer.from_pretrained(path),
                         train_dataset=Dataset.from_list([{"text": "hello world " * 8}]))  # fmt: skip
    assert trainer.accelerator.mixed_precision == "no"
    trainer.train()
    assert seen and not any(seen)


needs_bf16 = pytest.mark.skipif(not precision.cpu_bf16_fast(), reason="this CPU has no bf16 matrix instructions")


@pytest.fixture(scope="module")
def smollm2():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from reterm.policies.smollm2 import embedded_model_path

    path = embedded_model_path()
    return path, AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path, dtype="float32")


def _record_ids(tokenizer):
    """A real recovery conversation (the kit's prompt and tools, a failed command, its fix) as token ids and labels
    on the assistant turns after the failure."""
    import torch

    from reterm.agent.protocol import TOOLS, initial_messages

    call = lambda cid, cmd: {"role": "assistant", "content": "", "tool_calls": [  # noqa: E731
        {"id": cid, "type": "function", "function": {"name": "bash", "arguments": json.dumps({"command": cmd})}}]}
    msgs = initial_messages("Write 'ok' into /srv/out/2024/status.txt.", TOOLS) + [
        call("c0", "echo ok > /srv/out/2024/status.txt"),
        {"role": "tool", "tool_call_id": "c0", "content": "bash: /srv/out/2024/status.txt: No such file or directory\n[exit status: 1]"},
        call("c1", "mkdir -p /srv/out/2024 && echo ok > /srv/out/2024/status.txt"),
    ]  # fmt: skip
    prefix = tokenizer.apply_chat_template(msgs[:-1], tools=TOOLS, tokenize=True, return_dict=True)["input_ids"]
    ids = tokenizer.apply_chat_template(msgs, tools=TOOLS, tokenize=True, return_dict=True)["input_ids"]
    labels = [-100] * len(prefix) + ids[len(prefix) :]
    return torch.tensor([ids]), torch.tensor([labels])


@pytest.mark.slow
@needs_bf16
def test_sft_loss_under_bf16_autocast_agrees_with_fp32(smollm2):
    import torch

    _, tokenizer, model = smollm2
    ids, labels = _record_ids(tokenizer)
    with torch.no_grad():
        fp32 = float(model(input_ids=ids, labels=labels).loss)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            bf16 = float(model(input_ids=ids, labels=labels).loss)
    assert fp32 > 0.1  # a real loss, not a degenerate one
    assert abs(bf16 - fp32) / fp32 < 0.02, (fp32, bf16)


@pytest.mark.slow
@needs_bf16
def test_greedy_tokens_with_bf16_weights_agree_with_fp32(smollm2):
    import torch
    from transformers import AutoModelForCausalLM

    from reterm.agent.protocol import TOOLS, initial_messages

    path, tokenizer, model = smollm2
    msgs = initial_messages("Count the lines of /data/quartz.csv and write the number to /root/count.txt.", TOOLS)
    ids = tokenizer.apply_chat_template(msgs, tools=TOOLS, add_generation_prompt=True, return_tensors="pt",
                                        return_dict=True)["input_ids"]  # fmt: skip
    bf16_model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)
    with torch.no_grad():
        a = model.generate(ids, max_new_tokens=12, do_sample=False)[0, ids.shape[1] :].tolist()
        b = bf16_model.generate(ids, max_new_tokens=12, do_sample=False)[0, ids.shape[1] :].tolist()
    assert len(a) >= 8 and a[:8] == b[:8], (tokenizer.decode(a), tokenizer.decode(b))
