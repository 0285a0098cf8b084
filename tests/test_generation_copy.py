"""The merged generation copy of a LoRA policy (reterm.training.generation_copy) on the real SmolLM2: its weights
are the base plus the LoRA update after a sync (and stale before one), and it predicts what the LoRA model
predicts under bf16 autocast."""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer

from reterm.agent.protocol import SYSTEM_PROMPT
from reterm.training.generation_copy import MergedGenerationCopy
from reterm.training.models import resolve_model_name_or_path


@pytest.fixture(scope="module")
def lora():
    path = resolve_model_name_or_path("smollm2")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    torch.manual_seed(0)  # LoRA's A and the B below: the same adapter whatever ran before in this process
    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", lora_dropout=0.0))
    with torch.no_grad():  # a trained-looking adapter: B is zero at initialisation
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.02)
    return model, AutoTokenizer.from_pretrained(path)


def _q_proj(model):
    return model.get_base_model().model.layers[0].self_attn.q_proj


def test_sync_writes_base_plus_lora_update_in_the_copy_dtype(lora):
    model, _ = lora
    copy = MergedGenerationCopy(model, torch.bfloat16)
    layer = _q_proj(model)
    expected = layer.base_layer.weight + layer.get_delta_weight("default")
    got = copy.model.model.layers[0].self_attn.q_proj.weight
    assert got.dtype == torch.bfloat16 and not got.requires_grad
    assert torch.equal(got, expected.detach().to(torch.bfloat16))
    assert not torch.equal(got, layer.base_layer.weight.detach().to(torch.bfloat16))  # the update is in it
    # an optimiser step changes B: the copy is stale until the next sync
    with torch.no_grad():
        layer.lora_B["default"].weight.add_(0.05)
    try:
        assert not torch.equal(got, (layer.base_layer.weight + layer.get_delta_weight("default")).to(torch.bfloat16))
        copy.sync(model)
        after = copy.model.model.layers[0].self_attn.q_proj.weight
        assert torch.equal(after, (layer.base_layer.weight + layer.get_delta_weight("default")).to(torch.bfloat16))
        assert copy.syncs == 2
    finally:
        with torch.no_grad():
            layer.lora_B["default"].weight.sub_(0.05)
    # the embeddings stay tied to the LM head in the copy, as in SmolLM2
    assert copy.model.lm_head.weight.data_ptr() == copy.model.model.embed_tokens.weight.data_ptr()


def test_the_copy_predicts_what_the_lora_model_predicts(lora):
    """An fp32 copy gives the LoRA model's logits (the merge is exact); the bf16 copy is as close to them as the
    LoRA model's own bf16 autocast is (measured: mean |logit gap| 0.11 vs 0.09; the adapter's effect 0.40)."""
    model, tok = lora
    messages = [{"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": "Create the directory /app/out and write ok to /app/out/status."}]  # fmt: skip
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
    with torch.no_grad():
        ref = model(input_ids=ids).logits[0]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            autocast = model(input_ids=ids).logits[0].float()
        with model.disable_adapter():
            no_lora = model(input_ids=ids).logits[0]
        exact = MergedGenerationCopy(model, torch.float32).model(input_ids=ids).logits[0]
        bf16 = MergedGenerationCopy(model, torch.bfloat16).model(input_ids=ids).logits[0].float()
    gap = lambda x: (x - ref).abs().mean().item()  # noqa: E731
    assert torch.allclose(exact, ref, atol=1e-3), gap(exact)
    assert gap(bf16) < 2 * gap(autocast) < 0.5 * gap(no_lora), (gap(bf16), gap(autocast), gap(no_lora))
    assert (bf16.argmax(-1) == ref.argmax(-1)).float().mean().item() > 0.9
    assert bf16[-1].argmax() == ref[-1].argmax()  # the first generated token


def test_a_long_prompt_keeps_the_copy_close(lora):
    """Positions near the rollouts' length (~1,500 tokens): the copy keeps the rotary frequencies in fp32, as
    ``from_pretrained(dtype=bfloat16)`` does (cast to bf16 they are off by up to 2**-9 relative, a phase error
    that grows with the distance), and its logits stay as close to the LoRA model's as its bf16 autocast."""
    model, tok = lora
    copy = MergedGenerationCopy(model, torch.bfloat16)
    assert all(b.dtype == torch.float32 for n, b in copy.model.named_buffers() if "inv_freq" in n)
    text = "\n".join(f"line {k}: ls -la /srv/data/part-{k} && cat /srv/data/part-{k}/README" for k in range(90))
    ids = tok(text, return_tensors="pt")["input_ids"][:, :1500]
    assert ids.shape[1] == 1500
    with torch.no_grad():
        ref = model(input_ids=ids).logits[0, -200:]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            autocast = model(input_ids=ids).logits[0, -200:].float()
        got = copy.model(input_ids=ids).logits[0, -200:].float()
    gap = lambda x: (x - ref).abs().mean().item()  # noqa: E731
    assert gap(got) < 2 * gap(autocast), (gap(got), gap(autocast))


@pytest.mark.parametrize("extra, says", [({"use_dora": True}, "uses DoRA"),
                                         ({"target_modules": ["q_proj", "embed_tokens"]}, "Embedding LoRA layer")])
def test_adapters_that_do_not_merge_into_a_linear_weight_are_named(extra, says):
    path = resolve_model_name_or_path("smollm2")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    config = {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj"], **extra}
    model = get_peft_model(model, LoraConfig(**config))
    with pytest.raises(ValueError, match=f"merged_generation: .* {says}"):
        MergedGenerationCopy(model, torch.bfloat16)
