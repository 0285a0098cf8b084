"""The decoding loop of Llama-architecture models (the embedded SmolLM2) written with plain torch operations.

``model.generate`` spends most of a batched CPU decoding step outside the matrix products that must be done:
with a padding mask transformers' SDPA path repeats SmolLM2's 3 key/value heads into its 9 query heads (the
whole cache copied and tripled every layer, every step), and every finished row is computed to the call's end.
This loop, used by :class:`reterm.policies.kv_cache.PrefixKVCache` for every model it :func:`supports`:

- reads the prompt with the model's own forward (the same call ``generate`` makes, so the first token's logits
  are the same), into a key/value cache whose storage is reserved for the whole call
  (:func:`reterm.policies.kv_cache._reserved_cache`);
- then runs each decoding step itself: the model's own modules for embeddings and norms, oneDNN-packed copies
  of its projections, MLP and LM head weights in the model's dtype (:mod:`reterm.policies.packed_weights`, rebuilt
  whenever a weight changed: a copy synced after an optimiser step is read as it is now; the modules themselves
  where packing is not usable), the rotary
  embedding from the model's own ``rotary_emb``, each token's key/value written in place into the reserved
  storage, and attention computed per key/value head group: the ``n_rep`` query heads that share a key/value
  head are one ``(n_rep, head_dim)`` block multiplied against that head's keys and values as they lie in the
  cache (no repetition, no copy);
- drops rows that have ended from the batch (their key/value states are cut out first for the prefix store),
  so that finished rows cost nothing; the rows left are compacted once enough have ended;
- picks tokens as ``generate`` does: greedy argmax, or temperature, top-k and top-p then a multinomial draw.

Anything this loop does not reproduce (other logits processors, a repetition penalty, stopping rules, beams,
models of another architecture, a PEFT wrapper) is left to ``model.generate`` (:func:`supports`,
:func:`sampling_of`). Exactness: greedy tokens equal ``generate``'s on the test prompt set in float32
(``tests/test_llama_decode.py``); the attention's and the packed products' sums run in another order, so a
near-tie could in principle flip a token (in bf16 it does: ``docs/REPRODUCING.md``).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from reterm.policies import int8_weights, packed_weights
from reterm.policies.cache_keyword import cache_kwarg

#: Generation settings the loop reproduces; a config that sets anything else goes to ``model.generate``.
_HANDLED = {"do_sample", "temperature", "top_k", "top_p", "max_new_tokens", "max_length", "eos_token_id",
            "pad_token_id", "bos_token_id", "transformers_version", "return_dict_in_generate", "output_logits",
            "use_cache", "_from_model_config", "cache_implementation", "disable_compile"}  # fmt: skip


#: Finished rows leave the batch (a copy of the live rows' key/value states) once they are this share (1/n) of it...
COMPACT_DEAD_SHARE = 4
#: ... and at least this many of the call's steps are left (the copy costs about two steps' reads).
MIN_COMPACT_STEPS = 8

#: Output switches the loop honours when off.
_OFF = {"output_attentions", "output_hidden_states", "output_scores"}
#: Settings at the value that does nothing (TRL's GRPO config sets ``repetition_penalty=1.0``).
_NEUTRAL = {"repetition_penalty": 1.0, "encoder_repetition_penalty": 1.0, "length_penalty": 1.0, "num_beams": 1,
            "num_return_sequences": 1, "num_beam_groups": 1, "guidance_scale": 1.0}  # fmt: skip
#: Sampling warpers: ignored by greedy decoding.
_WARPERS = {"temperature", "top_k", "top_p", "min_p", "typical_p", "epsilon_cutoff", "eta_cutoff"}


@dataclass
class Sampling:
    """How a step's token is picked: ``greedy`` argmax, else softmax of ``logits / temperature`` restricted to the
    ``top_k`` most likely tokens (0: all) and the smallest set holding ``top_p`` of the mass (1.0: all)."""

    greedy: bool = True
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0


def supports(model: Any) -> bool:
    """Whether :func:`generate` can run ``model``: a transformers ``LlamaForCausalLM`` (not under a PEFT wrapper:
    its LoRA layers would be skipped), single tensor-parallel rank, no attention dropout (a model in training mode
    then computes what it computes in eval mode), whose decoder layers have the Llama attention modules."""
    if type(model).__name__ != "LlamaForCausalLM":
        return False
    cfg = model.config
    if getattr(cfg, "model_type", None) != "llama" or getattr(cfg, "pretraining_tp", 1) != 1:
        return False
    if model.training and float(getattr(cfg, "attention_dropout", 0.0) or 0.0) > 0:
        return False
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "rotary_emb"):
        return False
    for layer in inner.layers:
        attn = getattr(layer, "self_attn", None)
        if attn is None or not all(hasattr(attn, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj", "scaling")):
            return False
        mlp = getattr(layer, "mlp", None)
        if mlp is None or not all(hasattr(mlp, n) for n in ("gate_proj", "up_proj", "down_proj", "act_fn")):
            return False
    return True


def sampling_of(model: Any, generation_kwargs: dict[str, Any] | None) -> Sampling | None:
    """The :class:`Sampling` that ``model.generate(**generation_kwargs)`` would use, or ``None`` when those
    arguments (or the model's or the given ``generation_config``) ask for anything else: a repetition penalty,
    other logits processors, stopping rules, beams, ``min_new_tokens``, ..."""
    kw = dict(generation_kwargs or {})
    config = copy.deepcopy(model.generation_config)
    given = kw.pop("generation_config", None)
    if given is not None:
        for key, value in given.to_diff_dict().items():
            setattr(config, key, value)
    unused = config.update(**kw)
    if unused:
        return None
    for key, value in config.to_diff_dict().items():
        if key in _HANDLED or (key in _OFF and not value) or (key in _WARPERS and not config.do_sample) \
                or (key in _NEUTRAL and value == _NEUTRAL[key]):
            continue
        return None
    if not config.do_sample:
        return Sampling(greedy=True)
    return Sampling(greedy=False, temperature=float(config.temperature if config.temperature is not None else 1.0),
                    top_k=int(config.top_k or 0), top_p=float(config.top_p if config.top_p is not None else 1.0))


@dataclass
class LoopOutput:
    """What :func:`generate` returns: ``new_ids`` ``(B, steps)`` (pad after a row's stop token), ``logits``
    (``steps`` tensors ``(B, V)``, zeros after a row's end; only when asked), ``states`` per row the
    ``(keys, values)`` per layer, each ``(kv_heads, n, head_dim)``, of ``prompt + kept[:-1]`` (only when asked),
    ``compactions``: how many times finished rows left the batch."""

    new_ids: Any
    logits: tuple[Any, ...] | None
    states: list[list[tuple[Any, Any]]] | None
    compactions: int = 0


def warp(logits: Any, s: Sampling) -> Any:
    """Sampling scores of ``logits`` ``(b, V)`` float32: divided by the temperature, then every token outside the
    ``top_k`` highest and outside the smallest set holding ``top_p`` of the mass set to ``-inf`` (transformers'
    ``TemperatureLogitsWarper``, ``TopKLogitsWarper`` and ``TopPLogitsWarper``, in that order)."""
    import torch

    scores = logits / s.temperature if s.temperature != 1.0 else logits.clone()
    if s.top_k and s.top_k < scores.shape[-1]:
        kth = torch.topk(scores, s.top_k)[0][..., -1, None]
        scores = scores.masked_fill(scores < kth, -float("inf"))
    if s.top_p < 1.0:
        sorted_logits, sorted_idx = torch.sort(scores, descending=False)
        cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        remove = cum <= (1 - s.top_p)
        remove[..., -1:] = False  # keep at least one token
        scores = scores.masked_fill(remove.scatter(1, sorted_idx, remove), -float("inf"))
    return scores


def _pick(logits: Any, s: Sampling) -> Any:
    """One token per row from ``logits`` ``(b, V)`` float32: argmax, or a draw from ``softmax(warp(logits))``."""
    import torch

    if s.greedy:
        return torch.argmax(logits, dim=-1)
    probs = torch.softmax(warp(logits, s), dim=-1)
    return torch.multinomial(probs, num_samples=1).squeeze(1)


def _rotate(x: Any, cos: Any, sin: Any) -> Any:
    """Rotary embedding of ``x`` ``(b, heads, head_dim)`` with ``cos``/``sin`` ``(b, 1, head_dim)`` (Llama's
    ``apply_rotary_pos_emb``: ``x * cos + rotate_half(x) * sin``)."""
    import torch

    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return (x * cos) + (rotated * sin)


def _step(model: Any, tokens: Any, positions: Any, keys: list[Any], values: list[Any], col: int, mask: Any,
          linears: Any = None) -> Any:
    """One decoding step of ``b`` rows: feed ``tokens`` ``(b,)`` at ``positions`` ``(b,)``, write their keys and
    values into column ``col`` of each layer's ``keys``/``values`` ``(b, kv_heads, capacity, head_dim)``, open
    column ``col`` of the additive ``mask`` ``(b, capacity)`` (set to 0 in place) and attend to every column under
    it; returns the logits ``(b, V)``. The caller prepares ``mask`` and the storage with :func:`decode_mask`
    (columns not yet written are zeros under a closed mask, so they add exactly nothing). With ``linears``
    (:class:`reterm.policies.packed_weights.PackedLinears` or :class:`reterm.policies.int8_weights.Int8Linears`
    of this model, called as ``linears(module, x)``) the linear layers and LM head multiply by its copies of the
    weights instead of the modules' own.

    Attention reads the whole storage rather than its first ``col + 1`` columns: a slice of the position axis is
    not contiguous across rows, and a bf16 batched product on the CPU copies such an operand first (SmolLM2 bf16,
    32 rows x 435 columns, 2 threads of an AVX-512 BF16 EPYC: 63 ms a step for the 30 layers' attention on the
    slices, 20 ms on contiguous operands; float32 45 against 39 ms). The columns read beyond ``col`` cost
    ``capacity / (col + 1) - 1`` more arithmetic (under 25% for a call of 96 new tokens after 400 prompt tokens).
    The products are 3-D (rows x key/value heads as the batch), the scale and mask inside ``baddbmm``: a 4-D
    ``matmul`` of the same operands took 1.6-1.9x as long on that CPU (both dtypes)."""
    import torch

    if linears is None:
        def lin(module: Any, x: Any) -> Any:
            return module(x)
    else:
        lin = linears

    inner = model.model
    cfg = model.config
    b = tokens.shape[0]
    hq, hkv = cfg.num_attention_heads, cfg.num_key_value_heads
    d = getattr(cfg, "head_dim", None) or cfg.hidden_size // hq
    rep = hq // hkv
    h = inner.embed_tokens(tokens)  # (b, hidden)
    cos, sin = inner.rotary_emb(h[:, None], positions[:, None])  # (b, 1, d)
    cos, sin = cos.to(h.dtype), sin.to(h.dtype)
    mask[:, col] = 0
    capacity = mask.shape[1]
    bias = mask[:, None, :].expand(b, hq, capacity).reshape(b * hkv, rep, capacity)  # one per query head
    for li, layer in enumerate(inner.layers):
        attn = layer.self_attn
        x = layer.input_layernorm(h)
        q = _rotate(lin(attn.q_proj, x).view(b, hq, d), cos, sin)
        k = _rotate(lin(attn.k_proj, x).view(b, hkv, d), cos, sin)
        v = lin(attn.v_proj, x).view(b, hkv, d)
        K, V = keys[li], values[li]
        K[:, :, col] = k
        V[:, :, col] = v
        q = q.view(b * hkv, rep, d)  # query head j reads key/value head j // rep (transformers' repeat_kv)
        scores = torch.baddbmm(bias, q, K.view(b * hkv, capacity, d).transpose(1, 2), alpha=attn.scaling)
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)  # (b * hkv, rep, capacity)
        out = torch.bmm(probs, V.view(b * hkv, capacity, d)).reshape(b, hq * d)
        h = h + lin(attn.o_proj, out)
        mlp = layer.mlp
        x = layer.post_attention_layernorm(h)
        h = h + lin(mlp.down_proj, mlp.act_fn(lin(mlp.gate_proj, x)) * lin(mlp.up_proj, x))
    if linears is not None:
        return linears(model.lm_head, inner.norm(h)).float()
    return _head(model.lm_head, inner.norm(h)).float()


def decode_mask(keys: list[Any], values: list[Any], attention_mask: Any) -> Any:
    """Prepare a reserved cache for :func:`_step`: zero every layer's ``keys``/``values`` ``(B, kv_heads,
    capacity, head_dim)`` beyond the prompt's ``W`` columns (in place) and return the additive mask ``(B,
    capacity)``: 0 on the rows' prompt tokens, the dtype's lowest value on padding and on the columns not yet
    written (each :func:`_step` opens its own column). Softmax gives a closed column exactly 0 (``exp`` of about
    ``-3.4e38`` underflows), and its zero key/value adds exactly nothing.

    Args:
        keys, values: per layer, as the reserved cache holds them after the prompt's ``W`` columns.
        attention_mask: ``(B, W)``, 1 on prompt tokens, 0 on left padding.

    Returns:
        ``(B, capacity)`` tensor in the cache's dtype.
    """
    import torch

    B, W = attention_mask.shape
    capacity, dtype = keys[0].shape[2], keys[0].dtype
    for k, v in zip(keys, values):
        k[:, :, W:].zero_()
        v[:, :, W:].zero_()
    mask = torch.full((B, capacity), torch.finfo(dtype).min, dtype=dtype, device=keys[0].device)
    mask[:, :W].masked_fill_(attention_mask.to(mask.device) != 0, 0)
    return mask


#: Vocabulary rows of the LM head multiplied at a time (see :func:`_head`).
HEAD_CHUNK = 4096


def _head(head: Any, x: Any) -> Any:
    """``head(x)`` for a bias-free linear LM head, computed :data:`HEAD_CHUNK` vocabulary rows at a time: one
    product of SmolLM2's ``(49152, 576)`` head at 32 rows took 111 ms against 47 ms in chunks of 4096 (AVX2 EPYC, 2
    threads, loaded machine, best of 4; the same values bit for bit there: each logit is the same dot product)."""
    import torch
    import torch.nn.functional as F

    weight = getattr(head, "weight", None)
    if type(head) is not torch.nn.Linear or head.bias is not None or weight.shape[0] <= 2 * HEAD_CHUNK:
        return head(x)
    return torch.cat([F.linear(x, weight[i : i + HEAD_CHUNK]) for i in range(0, weight.shape[0], HEAD_CHUNK)], -1)


def generate(model: Any, input_ids: Any, attention_mask: Any, cache: Any, cached_columns: int, *,
             max_new_tokens: int, stop_token_ids: list[int], pad_token_id: int, sampling: Sampling,
             output_logits: bool = False, keep_states: bool = False, int8: bool = False,
             streamer: Any = None) -> LoopOutput:  # fmt: skip
    """Generate up to ``max_new_tokens`` tokens for each row of a left-padded batch.

    Args:
        model: a model :func:`supports` accepts.
        input_ids: ``(B, W)`` left-padded prompt ids.
        attention_mask: ``(B, W)``, 1 on each row's prompt tokens, 0 on padding.
        cache: a ``DynamicCache`` of reserved layers (:func:`reterm.policies.kv_cache._reserved_cache`) with room
            for ``W + max_new_tokens`` columns, holding the first ``cached_columns`` columns of the batch already.
        cached_columns: ``C``; the prompt's last ``W - C`` columns are read here (``W - C >= 1``).
        max_new_tokens, stop_token_ids, pad_token_id: as ``generate``'s ``max_new_tokens``, ``eos_token_id``,
            ``pad_token_id``.
        sampling: :func:`sampling_of`'s result.
        output_logits: also return each step's raw logits.
        keep_states: also return each row's key/value states (for the prefix store).
        int8: decoding steps multiply by int8 copies of the linear layers and LM head
            (:mod:`reterm.policies.int8_weights`; the prompt is read in the model's own precision). Otherwise
            they multiply by oneDNN-packed copies in the model's own dtype where :func:`packed_weights.usable`
            (:mod:`reterm.policies.packed_weights`), else by the modules themselves.
        streamer: a transformers streamer (``put``/``end``), fed as ``model.generate`` feeds one: ``put`` of the
            prompt ids ``(B, W)``, then of each step's tokens ``(B,)`` (``pad_token_id`` for rows that have
            ended), then ``end``.

    Returns:
        :class:`LoopOutput`.

    Raises:
        ValueError: no column left to read (``cached_columns >= W``), ``max_new_tokens < 1``, or ``int8`` with a
            model whose weights are not float32 or whose linear layers are not plain.
    """
    import torch

    B, W = input_ids.shape
    if cached_columns >= W or max_new_tokens < 1:
        raise ValueError(f"llama_decode.generate: cached_columns={cached_columns} of W={W}, "
                         f"max_new_tokens={max_new_tokens}")  # fmt: skip
    linears = None  # the step's copies of the weights: int8, packed, or the modules themselves
    if int8:
        if model.lm_head.weight.dtype != torch.float32:
            raise ValueError(f"llama_decode.generate: int8 decoding needs float32 weights, the model has "
                             f"{model.lm_head.weight.dtype}")  # fmt: skip
        if not packed_weights.plain_linears(model):
            raise ValueError("llama_decode.generate: int8 decoding needs plain torch.nn.Linear layers without hooks "
                             "(a layer with LoRA injected or an offload hook would lose what its forward adds)")
        linears = int8_weights.for_model(model)
    elif packed_weights.usable(model):
        linears = packed_weights.for_model(model)
    device = input_ids.device
    positions = (attention_mask.long().cumsum(-1) - 1).masked_fill(attention_mask == 0, 1)
    out = model(input_ids=input_ids[:, cached_columns:], attention_mask=attention_mask,
                position_ids=positions[:, cached_columns:], use_cache=True, **{cache_kwarg(model): cache},
                logits_to_keep=1)  # fmt: skip
    logits = out.logits[:, -1, :].float()
    layers = cache.layers
    keys = [layer._k for layer in layers]
    values = [layer._v for layer in layers]
    capacity = keys[0].shape[2]
    if capacity < W + max_new_tokens - 1:
        raise ValueError(f"llama_decode.generate: cache capacity {capacity} < {W + max_new_tokens - 1} columns")
    mask = decode_mask(keys, values, attention_mask)
    lengths = attention_mask.long().sum(-1)  # real tokens per row
    stops = torch.tensor(sorted(set(stop_token_ids)), device=device)

    rows = torch.arange(B, device=device)  # original row of each batch row
    alive = torch.ones(B, dtype=torch.bool, device=device)  # batch rows still generating
    new_ids = torch.full((B, max_new_tokens), pad_token_id, dtype=torch.long)
    step_logits: list[Any] = []
    states: list[Any] = [None] * B
    produced = torch.zeros(B, dtype=torch.long)  # tokens kept per original row
    pos = positions[:, -1]  # position of each row's last prompt token
    compactions = 0
    if streamer is not None:
        streamer.put(input_ids.cpu())
    for t in range(max_new_tokens):
        tok = _pick(logits, sampling)
        live_at = alive.nonzero().flatten()
        live = rows[live_at].tolist()
        new_ids[live, t] = tok[live_at].cpu()
        if streamer is not None:
            streamer.put(new_ids[:, t].clone())
        produced[live] = t + 1
        if output_logits:
            full = torch.zeros((B, logits.shape[-1]), dtype=logits.dtype)
            full[live] = logits[live_at].cpu()
            step_logits.append(full)
        ended = torch.isin(tok, stops) & alive
        col = W + t  # the column this step's token goes to
        last = t + 1 == max_new_tokens
        if keep_states:  # rows that end here: their states are prompt + generated[:-1], columns up to col
            for j in (live_at if last else ended.nonzero().flatten()).tolist():
                start = W - int(lengths[rows[j]])
                states[int(rows[j])] = [(k[j, :, start:col].clone(), v[j, :, start:col].clone())
                                        for k, v in zip(keys, values)]  # fmt: skip
        if last:
            break
        alive &= ~ended
        n_alive = int(alive.sum())
        if n_alive == 0:
            break
        dead = alive.numel() - n_alive
        if dead and (dead * COMPACT_DEAD_SHARE >= alive.numel() or n_alive == 1) \
                and max_new_tokens - t >= MIN_COMPACT_STEPS:
            idx = alive.nonzero().flatten()  # a copy of the live rows' states: about two steps' reads
            tok, pos, rows, alive = tok[idx], pos[idx], rows[idx], alive[idx]
            keys = [k.index_select(0, idx) for k in keys]
            values = [v.index_select(0, idx) for v in values]
            mask = mask.index_select(0, idx)
            compactions += 1
        pos = pos + 1
        logits = _step(model, tok, pos, keys, values, col, mask, linears)
    if streamer is not None:
        streamer.end()
    steps = int(produced.max())
    return LoopOutput(new_ids=new_ids[:, :steps], logits=tuple(step_logits[:steps]) if output_logits else None,
                      states=states if keep_states else None, compactions=compactions)
