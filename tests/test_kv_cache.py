"""KV-cache reuse across turns: greedy tokens identical with and without reuse, on real models (the embedded
SmolLM2 through the kit's TransformersPolicy, the tiny Qwen3.5 with its linear-attention layers), only the
new tokens read per turn, and bounded memory."""

from __future__ import annotations

import pytest
import torch

from reterm.agent.protocol import TOOLS, initial_messages
from reterm.policies.kv_cache import PrefixKVCache, cache_kwarg
from reterm.policies.transformers_policy import TransformersPolicy
from reterm.tiny_qwen import build_tiny_qwen3_5


@pytest.fixture(autouse=True)
def _default_decoding_path(monkeypatch):
    """These tests name the path they want or mean the default one: a RETERM_FAST_DECODE of the caller's shell
    (set to time a run on model.generate) must not change it."""
    monkeypatch.delenv("RETERM_FAST_DECODE", raising=False)


def _episode(policy: TransformersPolicy, turns: int) -> tuple[list[list[list[int]]], list[list[int]]]:
    """Greedy turns of three conversations of different lengths; returns the generated ids per turn and row,
    and the prompt tokens read from the cache per turn and row."""
    convs = [initial_messages("List the files."), initial_messages("Create /app/out.txt holding the word hello, then check it."),
             initial_messages("Run the tests.")]  # fmt: skip
    generated, cached = [], []
    for turn in range(turns):
        gens = policy.generate(convs, TOOLS)
        generated.append([g.token_ids for g in gens])
        cached.append([g.extra["cached_prompt_tokens"] for g in gens])
        for i, g in enumerate(gens):
            convs[i] = convs[i] + [{"role": "assistant", "content": g.text},
                                   {"role": "user", "content": f"[exit status: {turn + i}] no such file: out{turn}.txt"}]  # fmt: skip
    return generated, cached


@pytest.fixture(scope="module")
def smol() -> TransformersPolicy:
    # fp32: the identity of greedy tokens is exact there. With bf16 weights (dtype="auto" on a CPU with AMX) a cached
    # prefix and a fresh prefill round differently, and a near-tie can flip a greedy token (seen: 2 of 36 turns).
    return TransformersPolicy("smollm2", temperature=0, max_new_tokens=12, dtype="float32")


@pytest.mark.slow  # the real SmolLM2 (module fixture ~55 s to load under load, each test 12-50 s)
def test_smollm2_greedy_turns_identical_with_and_without_reuse(smol):
    smol.kv_cache.enabled = False
    smol.kv_cache.clear()
    plain, plain_cached = _episode(smol, 4)
    assert plain_cached == [[0, 0, 0]] * 4 and len(smol.kv_cache) == 0
    smol.kv_cache.enabled = True
    before = smol.kv_cache.reused_tokens, smol.kv_cache.fed_tokens
    reused, cached = _episode(smol, 4)
    assert reused == plain
    # turn 1: the three prompts share the system prompt and tool schema, read once for all three
    assert len(set(cached[0])) <= 2 and all(c > 300 for c in cached[0]), cached[0]
    # later turns read the system prompt, tool schema and the growing history from the cache
    assert all(cached[t][j] > cached[t - 1][j] for t in range(1, len(cached)) for j in range(3)), cached
    assert all(c > 300 for row in cached for c in row), cached
    assert len(smol.kv_cache) == 3 and smol.kv_cache.nbytes > 0
    reused_tokens, fed_tokens = smol.kv_cache.reused_tokens - before[0], smol.kv_cache.fed_tokens - before[1]
    assert reused_tokens > 2 * fed_tokens, (reused_tokens, fed_tokens)


@pytest.mark.slow  # the real SmolLM2 (module fixture ~55 s to load under load, each test 12-50 s)
def test_smollm2_cache_is_bounded(smol):
    smol.kv_cache.enabled = True
    smol.kv_cache.clear()
    old = smol.kv_cache.max_bytes, smol.kv_cache.max_idle_calls
    smol.kv_cache.max_idle_calls = 2
    try:
        smol.generate([initial_messages("one")], TOOLS)
        one = smol.kv_cache.nbytes
        smol.kv_cache.max_bytes = int(one * 2.5)
        smol.generate([initial_messages(w) for w in ("two", "three", "four")], TOOLS)
        assert len(smol.kv_cache) == 2 and smol.kv_cache.nbytes <= smol.kv_cache.max_bytes
        for _ in range(smol.kv_cache.max_idle_calls):  # conversations not continued are dropped
            smol.generate([initial_messages("five")], TOOLS)
        assert len(smol.kv_cache) == 1
    finally:
        smol.kv_cache.max_bytes, smol.kv_cache.max_idle_calls = old
        smol.kv_cache.clear()


@pytest.fixture(scope="module")
def tiny():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = build_tiny_qwen3_5()
    return AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def _token_turns(model, tok, kv: PrefixKVCache, rows: int, turns: int) -> tuple[list, list]:
    """Turns of ``rows`` token-level conversations (each prompt = the last prompt + its kept reply + an
    observation), as GRPO rollouts extend them."""
    stops = [tok.convert_tokens_to_ids("<|im_end|>")]
    pad = tok.pad_token_id if tok.pad_token_id is not None else stops[0]
    base = tok.apply_chat_template(initial_messages("List the files."), tools=TOOLS, add_generation_prompt=True,
                                   tokenize=True, return_dict=False)  # fmt: skip
    prompts = [list(base) + tok.encode(" row" * i) for i in range(rows)]
    out, reused = [], []
    for turn in range(turns):
        kv.advance()
        res = kv.generate(model, prompts, max_new_tokens=6, stop_token_ids=stops, pad_token_id=pad)
        out.append(res.new_ids.tolist())
        reused.append(res.reused)
        for i, seq in enumerate(res.new_ids.tolist()):
            end = next((k for k, t in enumerate(seq) if t in stops), None)
            kept = seq if end is None else seq[: end + 1]
            prompts[i] = prompts[i] + kept + tok.encode(f"<|im_end|>\n<|im_start|>user\nerror {turn} {i}<|im_end|>\n")
    return out, reused


def test_cache_keyword_is_the_one_the_installed_transformers_reads(tiny):
    # transformers 5.24 takes `cache`, 5.20 (the GPU set) `past_key_values` and passes an unknown keyword on unread:
    # the cache the kit hands over must come back filled, and a continuation from it must give the full-prompt logits
    from transformers import DynamicCache

    tok, model = tiny
    ids = torch.tensor([tok.encode("List the files in /app, then stop.")])
    n = ids.shape[1]
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        full = model(input_ids=ids).logits[0, -1]
        model(input_ids=ids[:, :-1], use_cache=True, **{cache_kwarg(model): cache})
        assert cache.get_seq_length() == n - 1
        last = model(input_ids=ids[:, -1:], position_ids=torch.tensor([[n - 1]]), use_cache=True,
                     **{cache_kwarg(model): cache}).logits[0, -1]  # fmt: skip
    assert cache.get_seq_length() == n
    torch.testing.assert_close(last, full, rtol=1e-4, atol=1e-4)


def test_tiny_qwen_linear_attention_reuse_is_exact(tiny):
    tok, model = tiny
    plain, _ = _token_turns(model, tok, PrefixKVCache(enabled=False), rows=1, turns=4)
    kv = PrefixKVCache()
    cached, reused = _token_turns(model, tok, kv, rows=1, turns=4)
    assert cached == plain
    assert reused[0] == [0] and all(r[0] > 400 for r in reused[1:]), reused
    # several conversations: recurrent states cannot be padded in the middle, so no reuse, same tokens
    plain3, _ = _token_turns(model, tok, PrefixKVCache(enabled=False), rows=3, turns=3)
    kv3 = PrefixKVCache()
    cached3, reused3 = _token_turns(model, tok, kv3, rows=3, turns=3)
    assert cached3 == plain3 and reused3 == [[0, 0, 0]] * 3 and len(kv3) == 0


@pytest.mark.slow  # the real SmolLM2 (module fixture ~55 s to load under load, each test 12-50 s)
def test_smollm2_token_turns_reuse_batched(smol):
    """Token-level extension as in GRPO rollouts (no re-rendering): every prompt token but the new ones
    comes from the cache, rows batched."""
    tok, model = smol.tokenizer, smol.model
    plain, _ = _token_turns(model, tok, PrefixKVCache(enabled=False), rows=3, turns=3)
    kv = PrefixKVCache()
    cached, reused = _token_turns(model, tok, kv, rows=3, turns=3)
    assert cached == plain
    assert all(r > 0 for row in reused[1:] for r in row)


@pytest.mark.parametrize("model_name,rows", [("tiny-qwen3.5", 1), ("tiny-qwen3.5", 3),
                                             pytest.param("smollm2", 3, marks=pytest.mark.slow)])  # smollm2: ~49 s
def test_grpo_rollout_generation_matches_trl(tmp_path, model_name, rows):
    """The GRPO trainer's cached generation gives, turn after turn, the tokens TRL's own transformers
    generation gives (greedy), from the token ids the rollout policy builds."""
    from pathlib import Path

    from datasets import load_dataset
    from transformers import AutoModelForCausalLM

    from reterm.training.failure_pool import FailurePool, seed_states_from_records
    from reterm.training.grpo_config import ReTermGRPOConfig
    from reterm.training.grpo_policy import GenerationRequest
    from reterm.training.grpo_trainer import ReTermGRPOTrainer
    from reterm.training.models import load_tokenizer, resolve_model_name_or_path

    fixtures = Path(__file__).resolve().parent / "fixtures"
    record = load_dataset(str(fixtures / "grpo_seed"), split="train")[0]
    (seed,), _ = seed_states_from_records([record], [fixtures / "tasks"])
    path = resolve_model_name_or_path(model_name)
    tok = load_tokenizer(path)
    args = ReTermGRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=2, num_generations=2,
                            max_steps=1, max_turns=3, max_turn_tokens=8, max_completion_length=256, use_cpu=True,
                            bf16=False, report_to="none", save_strategy="no", task_dirs=[str(fixtures / "tasks")],
                            generation_kwargs={"do_sample": False}, chat_template_kwargs={"enable_thinking": False})  # fmt: skip
    trainer = ReTermGRPOTrainer(AutoModelForCausalLM.from_pretrained(path), args, FailurePool([seed]), processing_class=tok)
    assert trainer.kv_cache.enabled
    prompt = trainer.rollout_policy.prompt_ids(seed.prompt)
    obs = trainer.rollout_policy.observation_ids([{"role": "user", "content": "[exit status: 1] nope"}], False)
    outputs = {}
    for reuse in (False, True):
        trainer.kv_cache.clear()
        trainer.kv_cache.enabled = reuse
        ids = [prompt + tok.encode(" x" * i) for i in range(rows)]
        turns = []
        for _ in range(3):
            out = trainer._generate_tokens([GenerationRequest(i, [], t) for i, t in enumerate(ids)], 8)
            turns.append([o[0] for o in out])
            ids = [t + o[0] + ([] if o[0][-1] in trainer.eos_token_ids else [tok.eos_token_id]) + obs
                   for t, o in zip(ids, out)]  # fmt: skip
        outputs[reuse] = turns
    assert outputs[True] == outputs[False]
    # SmolLM2's rollouts go through the kit's Llama decoding loop; TRL's own generation is the reference here
    assert (trainer.kv_cache.fast_calls > 0) == (model_name == "smollm2")
    hybrid = model_name.startswith("tiny-qwen")
    assert (trainer.kv_cache.reused_tokens > 0) == (rows == 1 or not hybrid)


@pytest.mark.slow  # the real SmolLM2 (module fixture), two calls of 8 rows x 40 tokens
def test_smollm2_early_release_same_tokens_and_logits(smol):
    """Early release (rows that ended leave the batch, the others go on in a smaller call from the store) gives
    the tokens and logits of one ``model.generate`` call. Rows end at their first period, so that they end at
    different steps."""
    tok, model = smol.tokenizer, smol.model
    stops = [tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids(".")]
    pad = tok.pad_token_id if tok.pad_token_id is not None else stops[0]
    asks = ["List the files.", "Why does make fail with a missing header? Explain in detail", "Say hi",
            "Describe three ways to find large files on a Linux machine and compare them",
            "Fix the permissions of /app/run.sh", "What is 2 + 2", "Write a long story about a terminal", "Run the tests"]
    prompts = [tok.apply_chat_template(initial_messages(a), tools=TOOLS, add_generation_prompt=True, tokenize=True,
                                       return_dict=False) for a in asks]  # fmt: skip
    runs = {}
    for release in (False, True):
        # the reference path: SmolLM2's default decoding loop drops finished rows itself (tests/test_llama_decode.py)
        kv = PrefixKVCache(early_release=release, fast_decode=False)
        runs[release] = kv, kv.generate(model, [list(p) for p in prompts], max_new_tokens=40, stop_token_ids=stops,
                                        pad_token_id=pad, output_logits=True)  # fmt: skip
    (kv_plain, plain), (kv_rel, rel) = runs[False], runs[True]
    assert kv_plain.released_rows == 0 and kv_rel.released_rows > 0  # some rows did go on in a smaller call
    assert rel.new_ids.tolist() == plain.new_ids.tolist()
    assert len(rel.logits) == len(plain.logits)
    for row, ids in enumerate(plain.new_ids.tolist()):
        end = next((k for k, t in enumerate(ids) if t in stops), len(ids) - 1)
        a = torch.stack([s[row] for s in plain.logits[: end + 1]])
        b = torch.stack([s[row] for s in rel.logits[: end + 1]])
        torch.testing.assert_close(b, a, atol=2e-3, rtol=1e-3)
    assert rel.reused == plain.reused
    # the released rows read one token each time they went on, not their prompt again
    assert sum(rel.fed) - sum(plain.fed) == kv_rel.released_rows


def test_early_release_only_where_stop_tokens_and_the_budget_end_rows():
    """A call with stopping rules of its own is generated in one piece (a row such a rule stopped would look
    released and be continued); the GRPO trainer's sampling config (TRL's keys) releases."""
    from transformers import GenerationConfig, StoppingCriteriaList

    from reterm.policies.kv_cache import _releasable

    assert _releasable(None) and _releasable({"do_sample": True, "temperature": 0.7})
    assert _releasable({"generation_config": GenerationConfig(max_new_tokens=96, do_sample=True, temperature=0.7,
                                                              top_p=1.0, top_k=0, repetition_penalty=1.0)})  # fmt: skip
    assert not _releasable({"stopping_criteria": StoppingCriteriaList([lambda ids, scores, **kw: False])})
    assert not _releasable({"max_time": 5.0}) and not _releasable({"min_new_tokens": 4})
    assert not _releasable({"generation_config": GenerationConfig(min_new_tokens=4)})
    assert not _releasable({"generation_config": GenerationConfig(stop_strings=["$ "])})
