"""The Llama decoding loop (reterm.policies.llama_decode) against ``model.generate`` on the real SmolLM2 in float32:
the same greedy tokens (rows of different lengths, left padding, a second turn from the prefix store, rows that
end at different steps and leave the batch), the same logits, transformers' sampling warpers, the fallback for
models and settings it does not reproduce, and GRPO's merged copy read as it is after an optimiser step."""

from __future__ import annotations

import pytest
import torch

from reterm.agent.protocol import TOOLS, initial_messages
from reterm.policies import llama_decode
from reterm.policies.kv_cache import PrefixKVCache, cut_at_stop


@pytest.fixture(autouse=True)
def _default_decoding_path(monkeypatch):
    """These tests name the path they want or mean the default one: a RETERM_FAST_DECODE of the caller's shell
    (set to time a run on model.generate) must not change it."""
    monkeypatch.delenv("RETERM_FAST_DECODE", raising=False)


ASKS = ["List the files.", "Create /app/out.txt holding the word hello, then check it.", "Run the tests.",
        "Fix the permissions of /app/run.sh so that it runs, then run it twice and compare the two outputs.",
        "Why does make fail?"]  # fmt: skip
GREEDY = {"do_sample": False, "temperature": None, "top_p": None}


@pytest.fixture(scope="module")
def smol():
    from reterm.policies.transformers_policy import TransformersPolicy

    return TransformersPolicy("smollm2", temperature=0, max_new_tokens=24, dtype="float32")


def _prompts(policy) -> list[list[int]]:
    return [policy.prompt_ids(initial_messages(a), TOOLS) for a in ASKS]


def _run(policy, prompts, fast: bool, stops, kv=None, **kw):
    kv = kv if kv is not None else PrefixKVCache(fast_decode=fast)
    out = kv.generate(policy.model, prompts, max_new_tokens=kw.pop("max_new_tokens", 24), stop_token_ids=stops,
                      pad_token_id=policy.pad_token_id, generation_kwargs=kw.pop("generation_kwargs", GREEDY), **kw)  # fmt: skip
    return kv, out


def test_supports_only_what_it_reproduces():
    from transformers import AutoModelForCausalLM, GenerationConfig

    from reterm.tiny_qwen import build_tiny_qwen3_5

    tiny = AutoModelForCausalLM.from_pretrained(build_tiny_qwen3_5(), dtype=torch.float32).eval()
    assert not llama_decode.supports(tiny)  # another architecture: model.generate
    assert llama_decode.sampling_of(tiny, {"do_sample": False}) == llama_decode.Sampling(greedy=True)
    s = llama_decode.sampling_of(tiny, {"generation_config": GenerationConfig(do_sample=True, temperature=0.7, top_p=0.9,
                                                                              top_k=0, disable_compile=True)})  # fmt: skip
    assert s == llama_decode.Sampling(greedy=False, temperature=0.7, top_k=0, top_p=0.9)
    trl = GenerationConfig(max_new_tokens=96, do_sample=True, temperature=0.9, top_p=1.0, top_k=0, min_p=None,
                           repetition_penalty=1.0, cache_implementation=None, disable_compile=True)  # GRPO's (TRL)
    assert llama_decode.sampling_of(tiny, {"generation_config": trl}) == llama_decode.Sampling(False, 0.9, 0, 1.0)
    for other in ({"repetition_penalty": 1.1}, {"min_new_tokens": 3}, {"num_beams": 2}, {"no_repeat_ngram_size": 3},
                  {"generation_config": GenerationConfig(min_p=0.1, do_sample=True)}, {"stop_strings": ["$"]}):
        assert llama_decode.sampling_of(tiny, other) is None, other


def test_warp_is_transformers_sampling():
    from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    torch.manual_seed(0)
    logits = torch.randn(4, 500) * 3
    for temperature, top_k, top_p in ((0.7, 0, 0.95), (1.0, 20, 1.0), (1.3, 50, 0.8)):
        procs = [TemperatureLogitsWarper(temperature)]
        procs += [TopKLogitsWarper(top_k)] if top_k else []
        procs += [TopPLogitsWarper(top_p)] if top_p < 1 else []
        want = LogitsProcessorList(procs)(torch.zeros(4, 1, dtype=torch.long), logits.clone())
        got = llama_decode.warp(logits, llama_decode.Sampling(False, temperature, top_k, top_p))
        assert torch.equal(torch.isinf(got), torch.isinf(want))
        torch.testing.assert_close(got[~torch.isinf(got)], want[~torch.isinf(want)])


@pytest.mark.slow  # the real SmolLM2 (module fixture), 5 rows x 24 tokens, two turns, both paths
def test_greedy_tokens_and_logits_equal_generate_across_turns(smol):
    prompts = _prompts(smol)
    assert len({len(p) for p in prompts}) > 1  # rows of different lengths: left padding
    stops = smol.stop_token_ids
    kv_ref, ref = _run(smol, prompts, False, stops, output_logits=True)
    kv_new, new = _run(smol, prompts, True, stops, output_logits=True)
    assert kv_ref.fast_calls == 0 and kv_new.fast_calls == 1
    assert new.new_ids.tolist() == ref.new_ids.tolist()
    assert new.reused == ref.reused and new.fed == ref.fed  # the shared system prompt is read once, both ways
    for row, ids in enumerate(ref.new_ids.tolist()):
        n = len(cut_at_stop(ids, set(stops))[0])
        torch.testing.assert_close(torch.stack([s[row] for s in new.logits[:n]]),
                                   torch.stack([s[row] for s in ref.logits[:n]]), atol=2e-3, rtol=1e-3)  # fmt: skip
    # turn 2 from each path's own store: the loop's stored states continue as generate's do
    obs = smol.tokenizer.encode("<|im_end|>\n<|im_start|>user\n[exit status: 1] no such file<|im_end|>\n"
                                "<|im_start|>assistant\n")  # fmt: skip
    nxt = [p + cut_at_stop(ids, set(stops))[0] + obs for p, ids in zip(prompts, ref.new_ids.tolist())]
    _, ref2 = _run(smol, nxt, False, stops, kv=kv_ref)
    _, new2 = _run(smol, nxt, True, stops, kv=kv_new)
    assert all(r > 300 for r in new2.reused) and new2.reused == ref2.reused
    assert new2.new_ids.tolist() == ref2.new_ids.tolist()


@pytest.mark.slow  # the real SmolLM2, 8 rows x 40 tokens, both paths
def test_rows_that_end_leave_the_batch_with_the_same_tokens(smol):
    """Rows end at their first period or newline, at different steps: the loop drops them from the batch
    (compactions) and the others' tokens are those of one ``model.generate`` call."""
    tok = smol.tokenizer
    stops = smol.stop_token_ids + [tok.convert_tokens_to_ids("."), tok.encode("\n")[0]]
    prompts = _prompts(smol) + [smol.prompt_ids(initial_messages(a), TOOLS) for a in
                                ("Say hi", "Write a long story about a terminal", "What is 2 + 2")]  # fmt: skip
    _, ref = _run(smol, prompts, False, stops, max_new_tokens=40)
    kv, new = _run(smol, prompts, True, stops, max_new_tokens=40)
    lengths = [len(cut_at_stop(r, set(stops))[0]) for r in ref.new_ids.tolist()]
    assert len(set(lengths)) > 2, lengths
    assert kv.compactions > 0
    assert new.new_ids.tolist() == ref.new_ids.tolist()


@pytest.mark.slow  # the real SmolLM2 with a LoRA adapter, one optimiser step, three short generations
def test_rollouts_follow_the_merged_copy_after_an_optimiser_step():
    """GRPO generates from :class:`MergedGenerationCopy` (synced after every optimiser step) through the kit's
    cache; the loop reads the copy's live parameters: after a step and a sync its tokens are the LoRA model's
    own (``model.generate`` on the PEFT model), and differ from those before the step."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from reterm.training.generation_copy import MergedGenerationCopy
    from reterm.training.models import resolve_model_name_or_path

    path = resolve_model_name_or_path("smollm2")
    tok = AutoTokenizer.from_pretrained(path)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32),
                           LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", lora_dropout=0.0))  # fmt: skip
    copy = MergedGenerationCopy(model, torch.float32)
    assert llama_decode.supports(copy.model) and not llama_decode.supports(model)
    prompts = [tok.apply_chat_template(initial_messages(a), tools=TOOLS, add_generation_prompt=True, tokenize=True,
                                       return_dict=False) for a in ASKS[:3]]  # fmt: skip
    stops = [tok.convert_tokens_to_ids("<|im_end|>")]

    def gen(m, fast):
        kv = PrefixKVCache(fast_decode=fast)
        out = kv.generate(m, [list(p) for p in prompts], max_new_tokens=8, stop_token_ids=stops,
                          pad_token_id=stops[0], generation_kwargs=GREEDY)  # fmt: skip
        assert kv.fast_calls == (1 if fast else 0)
        return out.new_ids.tolist()

    before = gen(copy.model, True)
    # one optimiser step that makes the model say "zebra" after each prompt
    target = tok.encode(" zebra")[0]
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
    model.train()
    ids = torch.tensor([list(prompts[0])])
    for _ in range(3):
        loss = torch.nn.functional.cross_entropy(model(input_ids=ids).logits[:, -1], torch.tensor([target]))
        loss.backward()
        opt.step()
        opt.zero_grad()
    model.eval()
    stale = gen(copy.model, True)
    assert stale == before  # not synced yet: the copy still holds the old weights
    copy.sync(model)
    after = gen(copy.model, True)
    assert after != before
    with torch.no_grad():
        assert after == gen(model, False)  # the LoRA model itself, through model.generate


def test_int8_decoding_reads_the_prompt_in_float_and_follows_the_weights(smol):
    """``decode_weights="int8"``: the prompt is read by the model's own float32 forward (the first token's logits are
    float32's, bit for bit), the decoding steps multiply by int8 copies (close to float32's logits, not equal: the
    greedy tokens may part later), and the copies are rebuilt after a weight changes in place (an optimiser step)."""
    from reterm.policies import int8_weights

    prompts, stops = _prompts(smol), smol.stop_token_ids
    _, ref = _run(smol, prompts, True, stops, output_logits=True)
    kv8 = PrefixKVCache(decode_weights="int8")
    _, q = _run(smol, prompts, True, stops, kv=kv8, output_logits=True)
    assert kv8.fast_calls == 1
    assert torch.equal(q.logits[0], ref.logits[0])
    assert [r[0] for r in q.new_ids.tolist()] == [r[0] for r in ref.new_ids.tolist()]
    rel = ((q.logits[1] - ref.logits[1]).norm(dim=-1) / ref.logits[1].norm(dim=-1)).tolist()
    assert all(0 < e < 0.3 for e in rel), rel  # int8 arithmetic: near float32's second-step logits, not equal
    w8 = int8_weights.for_model(smol.model)
    assert int8_weights.for_model(smol.model) is w8  # unchanged weights: the same copies
    layer = smol.model.model.layers[0].mlp.down_proj
    w = layer.weight
    with torch.no_grad():
        saved = w.clone()
        w.mul_(2.0)
        try:
            rebuilt = int8_weights.for_model(smol.model)
            assert rebuilt is not w8
            x = torch.randn(3, w.shape[1])
            exact = x @ w.t()
            err = (rebuilt(layer, x) - exact).norm() / exact.norm()
            assert err < 0.05, err  # the doubled weights' product, to int8 precision
        finally:
            w.copy_(saved)
    with pytest.raises(ValueError, match="decode_weights"):
        PrefixKVCache(decode_weights="int4")


def test_decode_mask_closes_and_zeroes_the_columns_not_yet_written():
    """The loop's attention reads a cache's whole storage: :func:`llama_decode.decode_mask` zeroes the columns
    after the prompt (reserved storage starts as whatever memory held, here NaN) and closes them, padding stays
    closed, and each step opens its own column; a closed column gets exactly 0 attention."""
    B, W, cap = 2, 3, 6
    keys = [torch.full((B, 1, cap, 4), float("nan"))]
    values = [torch.full((B, 1, cap, 4), float("nan"))]
    for t in keys + values:
        t[:, :, :W] = 1.0
    att = torch.tensor([[0, 1, 1], [1, 1, 1]])
    mask = llama_decode.decode_mask(keys, values, att)
    low = torch.finfo(torch.float32).min
    assert mask.tolist() == [[low, 0, 0, low, low, low], [0, 0, 0, low, low, low]]
    assert torch.equal(keys[0][:, :, W:], torch.zeros(B, 1, cap - W, 4))
    assert not values[0].isnan().any()
    probs = torch.softmax(torch.zeros(B, cap) + mask, dim=-1)
    assert probs[:, W:].eq(0).all() and probs[0, 0] == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_weights_multiply_as_the_modules_and_follow_in_place_changes(smol, dtype):
    """The loop's default copies of the weights (:mod:`reterm.policies.packed_weights`, oneDNN's layout, the model's
    own dtype): each layer's product equals the module's to rounding, the copies are kept while the weights are
    unchanged and rebuilt after one changes in place (an optimiser step, a weight sync)."""
    from reterm.policies import packed_weights

    if not packed_weights.available():
        pytest.skip("this torch build has no oneDNN packed linear kernels")
    model = smol.model if dtype == torch.float32 else copy_in(smol.model, dtype)
    assert packed_weights.usable(model)
    pk = packed_weights.for_model(model)
    assert packed_weights.for_model(model) is pk
    assert copy_in(model, dtype) is not model  # the copies live beside the model: deepcopy still works
    x = torch.randn(5, model.config.hidden_size, dtype=dtype)
    with torch.inference_mode():
        for module in (model.model.layers[0].self_attn.q_proj, model.model.layers[3].mlp.up_proj, model.lm_head):
            torch.testing.assert_close(pk(module, x), module(x), atol=1e-3 if dtype == torch.float32 else 2e-2,
                                       rtol=1e-3 if dtype == torch.float32 else 2e-2)  # fmt: skip
    layer = model.model.layers[0].mlp.gate_proj
    w = layer.weight
    with torch.no_grad():
        saved = w.clone()
        w.mul_(2.0)
        try:
            rebuilt = packed_weights.for_model(model)
            assert rebuilt is not pk
            with torch.inference_mode():
                torch.testing.assert_close(rebuilt(layer, x), layer(x), atol=2e-3 if dtype == torch.float32 else 4e-2,
                                           rtol=1e-3 if dtype == torch.float32 else 2e-2)  # fmt: skip
        finally:
            w.copy_(saved)


def test_packed_weights_only_where_a_linear_layer_is_all_its_forward_does(smol):
    """A layer whose forward adds something (a hook here; LoRA injected in place, an offload hook) keeps the
    model's own modules: the loop runs, its tokens equal ``model.generate``'s, the packed copies are not used; and
    :func:`packed_weights.invalidate` drops copies a write outside autograd's version counter left stale."""
    from reterm.policies import packed_weights

    if not packed_weights.available():
        pytest.skip("this torch build has no oneDNN packed linear kernels")
    model = smol.model
    assert packed_weights.usable(model)
    layer = model.model.layers[2].mlp.up_proj
    handle = layer.register_forward_hook(lambda mod, inp, out: out * 1.5)
    try:
        assert not packed_weights.plain_linears(model) and not packed_weights.usable(model)
        prompts, stops = _prompts(smol)[:2], smol.stop_token_ids
        _, ref = _run(smol, prompts, False, stops, max_new_tokens=6)
        kv, new = _run(smol, prompts, True, stops, max_new_tokens=6)
        assert kv.fast_calls == 1 and new.new_ids.tolist() == ref.new_ids.tolist()  # the hook is honoured
        with pytest.raises(ValueError, match="plain"):
            _run(smol, prompts, True, stops, kv=PrefixKVCache(decode_weights="int8"), max_new_tokens=2)
    finally:
        handle.remove()
    assert packed_weights.usable(model)
    pk = packed_weights.for_model(model)
    w = model.model.layers[0].self_attn.o_proj.weight
    saved = w.detach().clone()
    w.data.mul_(2.0)  # bypasses the version counter: the signature cannot see it
    try:
        assert packed_weights.for_model(model) is pk
        packed_weights.invalidate(model)
        assert packed_weights.for_model(model) is not pk
    finally:
        w.data.copy_(saved)
        packed_weights.invalidate(model)


def copy_in(model, dtype):
    """A copy of ``model`` in ``dtype`` (the fixture's float32 model stays as it is)."""
    import copy

    return copy.deepcopy(model).to(dtype)


def test_the_environment_picks_the_path_where_the_caller_does_not(smol, monkeypatch):
    """RETERM_FAST_DECODE=0 sends a default PrefixKVCache through model.generate (a run's stages timed on the
    reference path), unset or 1 through the loop; a caller's explicit choice wins; another value is an error."""
    calls = []
    real = llama_decode.generate

    def spy(*args, **kw):
        calls.append(1)
        return real(*args, **kw)

    monkeypatch.setattr(llama_decode, "generate", spy)
    prompts = _prompts(smol)[:2]
    stops = [smol.tokenizer.eos_token_id]
    outs = {}
    for value, explicit, loop in (("0", None, False), ("1", None, True), (None, None, True), ("0", True, True)):
        if value is None:
            monkeypatch.delenv("RETERM_FAST_DECODE", raising=False)
        else:
            monkeypatch.setenv("RETERM_FAST_DECODE", value)
        calls.clear()
        _, out = _run(smol, prompts, explicit, stops, kv=PrefixKVCache(fast_decode=explicit), max_new_tokens=8)
        assert bool(calls) is loop, (value, explicit)
        outs[(value, explicit)] = out.new_ids.tolist()
    assert len({str(v) for v in outs.values()}) == 1  # float32: the same greedy tokens on both paths
    monkeypatch.setenv("RETERM_FAST_DECODE", "yes")
    with pytest.raises(ValueError, match="RETERM_FAST_DECODE='yes'"):
        PrefixKVCache()
