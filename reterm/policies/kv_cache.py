"""KV-cache reuse across the turns of a conversation, batched across conversations.

An agent's turn ``t + 1`` is the prompt of turn ``t``, the reply the model generated and the observation
that answered it. Re-reading the whole prompt (system prompt, tool schema, history) every turn costs most
of a small model's time on a CPU; :class:`PrefixKVCache` keeps, per conversation, the key/value states of
every token the model has already read (``prompt + generated[:-1]``: the last generated token is never fed
back) and a turn feeds the model only the tokens that are new.

How a batch reuses its caches (attention-only models, every cache layer a ``DynamicLayer``):

- Each prompt ``p_i`` (``T_i`` tokens) is matched to the stored entry with the longest common token prefix
  ``r_i`` (at most ``T_i - 1``: the last prompt token is always fed, it gives the first logits).
- The batch is left-padded to ``W = max T_i`` as without reuse. With ``S = max(T_i - r_i)`` new columns, the
  first ``C = W - S`` columns come from the caches: row ``i``'s first ``T_i - S`` tokens (``<= r_i``) are
  copied in, right-aligned, padding columns are zero and masked. ``model.generate`` then reads only the last
  ``S`` columns (``cache=...``, ``past_key_values=...`` on transformers 5.20: :func:`cache_kwarg`;
  transformers' continuation from a filled cache). Rows whose cached prefix is
  longer than needed recompute a few tokens; a row with no entry recomputes everything.
- Rows that share a prompt prefix no entry holds (the G attempts of a group at their first turn, a
  fan-out from one history) get it read once, in a one-row forward, and copied into each row.
- After generation each row's states are sliced out of the batch cache (``prompt + kept[:-1]``) and stored
  under those token ids; the entries the call started from are dropped (the new ones hold their prefix).

Llama-architecture models (the embedded SmolLM2) decode through :mod:`reterm.policies.llama_decode` instead of
``model.generate`` (``fast_decode``, on by default): the same batch cache and store, keys/values written in place,
grouped-head attention, rows that ended dropped from the batch within the call (so the restarts of early release
are not needed there). Greedy tokens are the same (tested).

Models with recurrent state (Qwen3.5's linear-attention layers, sliding windows) cannot be cut back to a
shorter prefix nor padded in the middle: there a cache is reused only when the call has one conversation
and the stored tokens are an exact prefix of its prompt (the whole cache object is passed on); batches of
several conversations are generated without reuse.

Position ids come from the attention mask (transformers' ``generate``), so a row's positions are the same
with and without reuse; under greedy decoding the tokens are the same (tested), up to float rounding of
the different matrix shapes (no difference seen in float32).

Memory stays bounded: entries are evicted least recently used first beyond ``max_bytes`` or
``max_entries``, and an entry not used for ``max_idle_calls`` rounds (turns) is dropped (a finished
conversation).
"""

from __future__ import annotations

import os
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any

from reterm.policies import llama_decode
from reterm.policies.cache_keyword import cache_kwarg
from reterm.policies.int8_weights import DECODE_WEIGHTS

#: A shared prompt prefix shorter than this is not read separately (not worth a forward of its own).
MIN_SHARED_PREFIX = 32
#: Default bound on the bytes of cached key/value states (SmolLM2-135M: about 46 KB a token in float32).
DEFAULT_MAX_BYTES = 1 << 30
#: Early release (:meth:`PrefixKVCache.generate`): a call of at least this many rows stops once at most half of
#: them are still generating, and those go on in a smaller call. Below it a decoding step costs about the same
#: whatever the rows (per-operation overhead: SmolLM2 bf16 on 2 cores, ~85 ms a step at 8 rows, ~140 at 32).
MIN_RELEASE_ROWS = 8
#: ... and only while at least this many of the call's steps are left (a restart costs about one step).
MIN_RELEASE_STEPS = 8


@dataclass(eq=False)  # entries are compared by identity
class _Entry:
    tokens: list[int]
    layers: list[tuple[Any, Any]] | None = None  # per layer (keys, values) of shape (heads, n, head_dim)
    cache: Any = None  # a whole single-row Cache object (models with recurrent state)
    nbytes: int = 0
    last_used: int = 0


@dataclass
class CachedGeneration:
    """What :meth:`PrefixKVCache.generate` returns.

    ``new_ids``: ``(B, steps)`` generated ids per row (pad after a row's end-of-turn token);
    ``logits``: ``steps`` tensors of ``(B, V)`` raw logits when asked for, else ``None``;
    ``reused``: prompt tokens read from the cache per row; ``fed``: prompt tokens the model read per row.
    """

    new_ids: Any
    logits: tuple[Any, ...] | None
    reused: list[int] = field(default_factory=list)
    fed: list[int] = field(default_factory=list)


def _reserved_layer_class():
    from transformers.cache_utils import DynamicLayer

    class ReservedLayer(DynamicLayer):
        """A ``DynamicLayer`` whose key/value storage is reserved ahead, so that a decoding step writes its
        token in place instead of concatenating the whole cache (``torch.cat`` of every layer at every step
        took about half of a batched CPU decoding step). ``keys``/``values`` are views of the storage."""

        def __init__(self, capacity: int) -> None:
            super().__init__()
            self.capacity = capacity
            self._k = self._v = None

        def update(self, key_states, value_states, *args, **kwargs):
            import torch

            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            n, new = self.get_seq_length(), key_states.shape[-2]
            ours = self._k is not None and (n == 0 or self.keys.untyped_storage().data_ptr()
                                              == self._k.untyped_storage().data_ptr())  # fmt: skip
            if not ours or n + new > self._k.shape[-2]:
                cap = max(self.capacity, n + new, 2 * n)
                b, h, _, dk = key_states.shape
                k = torch.empty((b, h, cap, dk), dtype=key_states.dtype, device=key_states.device)
                v = torch.empty((b, h, cap, value_states.shape[-1]), dtype=value_states.dtype, device=value_states.device)
                if n:
                    k[:, :, :n] = self.keys
                    v[:, :, :n] = self.values
                self._k, self._v = k, v
            self._k[:, :, n : n + new] = key_states
            self._v[:, :, n : n + new] = value_states
            self.keys, self.values = self._k[:, :, : n + new], self._v[:, :, : n + new]
            return self.keys, self.values

    return ReservedLayer


_RESERVED = None


def _reserved_cache(model: Any, capacity: int) -> Any:
    """An empty ``DynamicCache`` for ``model`` with reserved storage, or ``None`` when the model's cache is not
    made of plain attention layers (recurrent or sliding-window layers keep transformers' own)."""
    global _RESERVED
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    cache = DynamicCache(config=model.config)
    if not cache.layers or not all(type(layer) is DynamicLayer for layer in cache.layers):
        return None
    if _RESERVED is None:
        _RESERVED = _reserved_layer_class()
    cache.layers = [_RESERVED(capacity) for _ in cache.layers]
    return cache


_PLAIN_ATTENTION: "weakref.WeakKeyDictionary[Any, bool]" = weakref.WeakKeyDictionary()


def _plain_attention(model: Any) -> bool:
    """Whether ``model``'s cache is made of plain attention layers (:func:`_reserved_cache` can reserve it),
    decided once per model."""
    if model not in _PLAIN_ATTENTION:
        _PLAIN_ATTENTION[model] = _reserved_cache(model, 1) is not None
    return _PLAIN_ATTENTION[model]


def _without_streamer(generation_kwargs: dict[str, Any] | None) -> dict[str, Any] | None:
    """``generation_kwargs`` less a ``streamer``: the decoding loop feeds one itself (``reterm serve``'s streaming
    then decodes as its non-streamed requests do)."""
    if not generation_kwargs or "streamer" not in generation_kwargs:
        return generation_kwargs
    return {k: v for k, v in generation_kwargs.items() if k != "streamer"}


def cut_at_stop(seq: list[int], stops: set[int]) -> tuple[list[int], int | None]:
    """A generated row up to and including its first stop token.

    Args:
        seq: the row's generated token ids (after its end a batch pads it).
        stops: the stop token ids.

    Returns:
        ``(kept, end)``: ``seq[: end + 1]`` and the index of the first stop token, or ``(seq, None)`` when the row
        has none (it ran to its token budget).
    """
    end = next((k for k, t in enumerate(seq) if t in stops), None)
    return (seq if end is None else seq[: end + 1]), end


_LIBC: Any = None


def release_freed_memory() -> bool:
    """Return the heap memory freed since the last call to the operating system (glibc ``malloc_trim(0)``).

    Why: a batched CPU ``generate`` allocates and frees gigabytes of activations of a different shape every
    call, from the generation worker thread's and the OpenMP threads' malloc arenas. glibc keeps freed arena
    memory for reuse, and with the shapes changing it fragments: a 48-task mechanism run grew to 23 GB
    resident and was OOM-killed (issue 30). Measured with ``bench/generation_memory.py --calls 8`` (SmolLM2
    bf16, 32 rows of 300-1200 tokens a call): 3.46 GB resident after 8 calls without, 1.05 GB flat with;
    129 s against 135 s. Returns False where there is no glibc (nothing done)."""
    global _LIBC
    if _LIBC is None:
        import ctypes
        import ctypes.util

        try:
            _LIBC = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            _LIBC.malloc_trim  # noqa: B018  (raises AttributeError without glibc)
        except (OSError, AttributeError):
            _LIBC = False
    if not _LIBC:
        return False
    _LIBC.malloc_trim(0)
    return True


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


#: The environment variable that picks :class:`PrefixKVCache`'s decoding path where the caller does not:
#: ``1`` (or unset) the decoding loop, ``0`` ``model.generate``.
FAST_DECODE_ENV = "RETERM_FAST_DECODE"


def fast_decode_default() -> bool:
    """Whether :class:`PrefixKVCache` decodes through the loop when its caller does not say.

    Returns:
        :data:`FAST_DECODE_ENV` as a bool: ``True`` for ``1``, unset or empty; ``False`` for ``0``.

    Raises:
        ValueError: the variable holds anything else.
    """
    value = os.environ.get(FAST_DECODE_ENV, "").strip() or "1"
    if value not in ("0", "1"):
        raise ValueError(f"{FAST_DECODE_ENV}={value!r}: use 1 (the decoding loop) or 0 (model.generate)")
    return value == "1"


class PrefixKVCache:
    """Per-conversation KV caches of one causal LM, keyed by the token ids they hold (see module doc).

    Args:
        enabled: ``False`` turns reuse off (every turn reads its whole prompt; the reference behaviour).
        max_bytes: bound on the stored key/value bytes (least recently used entries go first).
        max_entries: bound on the number of stored conversations.
        max_idle_calls: an entry not used in this many consecutive rounds is dropped (a round: one
            :meth:`advance`, called by a policy once per turn of its conversations).
        early_release: let rows that finished early leave a batch (see :meth:`generate`); only with reuse
            ``enabled`` and a model whose cache can be sliced.
        fast_decode: decode Llama-architecture models (SmolLM2) with :mod:`reterm.policies.llama_decode` (a
            cache written in place, grouped-head attention, finished rows dropped from the batch) instead of
            ``model.generate``; other models and settings it does not reproduce always use ``model.generate``.
            ``False`` is the reference path (``bench/decode.py`` compares the two). ``None`` (the default)
            reads :data:`FAST_DECODE_ENV` (unset or ``1``: the loop, ``0``: ``model.generate``), so a whole
            run's stages can be timed on either path without changing their command lines.
        decode_weights: ``"float"`` (the model's weights in its own dtype: oneDNN-packed copies where
            :func:`reterm.policies.packed_weights.usable`, else the modules) or ``"int8"``: that loop's decoding steps multiply by
            int8 copies of the linear layers (:mod:`reterm.policies.int8_weights`; faster on a CPU, greedy tokens
            can differ; float32 models only). Ignored where the loop does not run.

    The cache belongs to one model's weights: call :meth:`clear` after the weights change (a training step).
    """

    def __init__(self, *, enabled: bool = True, max_bytes: int = DEFAULT_MAX_BYTES, max_entries: int = 64,
                 max_idle_calls: int = 16, early_release: bool = True, fast_decode: bool | None = None,
                 decode_weights: str = "float") -> None:  # fmt: skip
        if fast_decode is None:
            fast_decode = fast_decode_default()
        if decode_weights not in DECODE_WEIGHTS:
            raise ValueError(f"PrefixKVCache: decode_weights must be one of {DECODE_WEIGHTS}, got {decode_weights!r}")
        if decode_weights == "int8" and not fast_decode:
            raise ValueError(f"PrefixKVCache: decode_weights='int8' needs the decoding loop, and fast_decode is off "
                             f"({FAST_DECODE_ENV}={os.environ.get(FAST_DECODE_ENV)!r})")  # fmt: skip
        if max_bytes < 0 or max_entries < 0 or max_idle_calls < 1:
            raise ValueError(f"PrefixKVCache: max_bytes/max_entries must be >= 0 and max_idle_calls >= 1, got "
                             f"{max_bytes}, {max_entries}, {max_idle_calls}")  # fmt: skip
        self.enabled = enabled
        self.early_release = early_release
        self.fast_decode = fast_decode
        self.decode_weights = decode_weights
        self.max_bytes, self.max_entries, self.max_idle_calls = max_bytes, max_entries, max_idle_calls
        self._entries: list[_Entry] = []
        self._calls = 0
        self._lock = threading.Lock()
        self.released_rows = 0  # rows that went on in a later call after an early release, all calls
        self.reused_tokens = 0  # prompt tokens read from a cache, all calls
        self.fed_tokens = 0  # prompt tokens the model read, all calls
        self.fast_calls = 0  # calls decoded by reterm.policies.llama_decode
        self.compactions = 0  # times finished rows left such a call's batch

    # ------------------------------------------------------------------------------- store
    def advance(self) -> None:
        """Start a new round (a policy's turn over its conversations; may span several :meth:`generate`
        calls): entries unused for ``max_idle_calls`` rounds are dropped at the next store."""
        self._calls += 1

    def clear(self) -> None:
        """Drop every entry (after a weight update, or to free memory)."""
        self._entries = []

    @property
    def nbytes(self) -> int:
        """Bytes of key/value states held now."""
        return sum(e.nbytes for e in self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def _best(self, prompt: list[int], exact: bool) -> tuple[_Entry | None, int]:
        best, best_n = None, 0
        for e in self._entries:
            if exact:
                n = len(e.tokens) if len(e.tokens) < len(prompt) and prompt[: len(e.tokens)] == e.tokens else 0
            else:
                n = min(_common_prefix(e.tokens, prompt), len(prompt) - 1)
            if n > best_n:
                best, best_n = e, n
        return best, best_n

    def _evict(self) -> None:
        self._entries = [e for e in self._entries if self._calls - e.last_used < self.max_idle_calls]
        self._entries.sort(key=lambda e: e.last_used, reverse=True)
        total, kept = 0, []
        for e in self._entries:
            if len(kept) < self.max_entries and total + e.nbytes <= self.max_bytes:
                kept.append(e)
                total += e.nbytes
        self._entries = kept

    # -------------------------------------------------------------------------- generation
    @staticmethod
    def _sliceable(cache: Any) -> bool:
        from transformers.cache_utils import DynamicLayer

        layers = getattr(cache, "layers", None)
        return bool(layers) and all(type(layer) is DynamicLayer or type(layer) is _RESERVED for layer in layers)

    def generate(self, model: Any, prompts: list[list[int]], **kwargs: Any) -> "CachedGeneration":
        """See :meth:`_generate` (calls are serialised: the store is shared). The memory the call freed goes
        back to the operating system (:func:`release_freed_memory`).

        **Early release.** ``model.generate`` runs a batch until its last row ends: a row that wrote a 20-token
        tool call keeps being computed (as padding) while another writes 96 tokens. With ``early_release`` (and
        reuse on, a sliceable cache, at least :data:`MIN_RELEASE_ROWS` rows), a call stops as soon as at most
        half of its rows are still generating (and at least :data:`MIN_RELEASE_STEPS` steps are left); the
        finished rows are done, and the others go on in a new call whose prompts are their prompt plus what they
        generated so far. Their key/value states come from the store (the first call stored them; the store is
        not trimmed to its bounds until the last call, so that they are still there), so the new call reads one
        token a row: the continuation is the same decoding, in a smaller batch (greedy: the same tokens, up to
        the rounding of other matrix shapes; sampling: the same distributions, other random draws). The result
        is that of one call: ``new_ids`` ``(B, steps)`` padded after each row's end, ``logits`` per step
        ``(B, V)`` (zeros after a row's end), ``reused`` from the first call, ``fed`` summed. Not used when the
        call has stopping rules of its own (``stopping_criteria``, ``stop_strings``, ``max_time``, a minimum
        length in ``generation_kwargs`` or their ``generation_config``): a row they stop would look released."""
        with self._lock:
            try:
                if self._fast(model, kwargs.get("generation_kwargs")):  # drops finished rows itself
                    return self._generate(model, prompts, **kwargs)
                if not (self.early_release and self.enabled and len(prompts) >= MIN_RELEASE_ROWS
                        and _releasable(kwargs.get("generation_kwargs"))
                        and _plain_attention(model)):  # fmt: skip
                    return self._generate(model, prompts, **kwargs)
                return self._generate_releasing(model, prompts, **kwargs)
            finally:
                release_freed_memory()

    def _generate_releasing(self, model: Any, prompts: list[list[int]], *, max_new_tokens: int,
                            stop_token_ids: list[int], pad_token_id: int, **kwargs: Any) -> "CachedGeneration":  # fmt: skip
        import torch

        stops = set(stop_token_ids)
        B = len(prompts)
        done: list[list[int]] = [[] for _ in range(B)]  # generated ids per row, across calls
        logits: list[list[Any]] = [[] for _ in range(B)]
        reused, fed = [0] * B, [0] * B
        rows, first = list(range(B)), True
        while rows:
            budget = max(max_new_tokens - len(done[i]) for i in rows)
            release = len(rows) // 2 if len(rows) >= MIN_RELEASE_ROWS else 0
            out = self._generate(model, [prompts[i] + done[i] for i in rows], max_new_tokens=budget,
                                 stop_token_ids=stop_token_ids, pad_token_id=pad_token_id,
                                 release_at=release, evict=False, **kwargs)  # fmt: skip
            still = []
            for j, i in enumerate(rows):
                seq = out.new_ids[j].tolist()[: max_new_tokens - len(done[i])]
                kept, end = cut_at_stop(seq, stops)
                if out.logits is not None:
                    logits[i].extend(step[j] for step in out.logits[: len(kept)])
                done[i].extend(kept)
                reused[i] = out.reused[j] if first else reused[i]
                fed[i] += out.fed[j]
                if end is None and len(done[i]) < max_new_tokens and len(seq) < budget:
                    still.append(i)  # released before its end
            rows, first = still, False
            self.released_rows += len(still)
        self._evict()
        steps = max(len(d) for d in done)
        new_ids = torch.full((B, steps), pad_token_id, dtype=torch.long)
        for i, d in enumerate(done):
            new_ids[i, : len(d)] = torch.tensor(d, dtype=torch.long)
        out_logits = None
        if kwargs.get("output_logits"):
            ref = next(row[0] for row in logits if row)
            out_logits = tuple(torch.stack([row[t] if t < len(row) else torch.zeros_like(ref) for row in logits])
                               for t in range(steps))  # fmt: skip
        return CachedGeneration(new_ids=new_ids, logits=out_logits, reused=reused, fed=fed)

    def _generate(
        self,
        model: Any,
        prompts: list[list[int]],
        *,
        max_new_tokens: int,
        stop_token_ids: list[int],
        pad_token_id: int,
        generation_kwargs: dict[str, Any] | None = None,
        output_logits: bool = False,
        release_at: int = 0,
        evict: bool = True,
    ) -> CachedGeneration:
        """Generate a continuation of each prompt as one left-padded batch, reusing stored states.

        Args:
            model: a transformers causal LM (``generate`` with a ``DynamicCache``).
            prompts: ``B`` non-empty token id lists.
            max_new_tokens: tokens generated per row at most.
            stop_token_ids: ids that end a row (passed as ``eos_token_id``).
            pad_token_id: id of padding (left) and of positions after a row's end.
            generation_kwargs: further ``generate`` arguments (``do_sample``, ``temperature``,
                ``generation_config``...).
            output_logits: also return the raw logits of every step.
            release_at: stop the whole call once at most this many rows (but at least one) have not ended and at
                least :data:`MIN_RELEASE_STEPS` steps are left (0: never); see :meth:`generate`.
            evict: trim the store to its bounds after storing this call's rows (``False``: the caller does).

        Returns:
            :class:`CachedGeneration`.

        Raises:
            ValueError: an empty prompt.
        """
        import torch

        if any(not p for p in prompts):
            raise ValueError("PrefixKVCache.generate: empty prompt")
        device = next(model.parameters()).device
        B, W = len(prompts), max(len(p) for p in prompts)
        input_ids = torch.full((B, W), pad_token_id, dtype=torch.long)
        attention = torch.zeros((B, W), dtype=torch.long)
        for row, ids in enumerate(prompts):
            input_ids[row, W - len(ids) :] = torch.tensor(ids, dtype=torch.long)
            attention[row, W - len(ids) :] = 1

        if self.enabled:
            self._share_prefix(model, prompts, device)
        sliceable = self._entries[0].layers is not None if self._entries else None
        cache = None
        cached_columns = 0
        used: list[_Entry] = []
        reused = [0] * B
        if self.enabled and self._entries:
            if sliceable:
                matches = [self._best(p, exact=False) for p in prompts]
                S = max(len(p) - n for p, (_, n) in zip(prompts, matches))
                C = W - S
                if C > 0:
                    cache = self._batch_cache(model, prompts, matches, W, C, device, W + max_new_tokens)
                    cached_columns = C
                    for row, (p, (e, n)) in enumerate(zip(prompts, matches)):
                        reused[row] = max(0, len(p) - S)
                        if e is not None and reused[row] > 0:
                            used.append(e)
            elif B == 1:
                e, n = self._best(prompts[0], exact=True)
                if e is not None:
                    cache, reused[0] = e.cache, n
                    used.append(e)
                    self._entries.remove(e)  # generate extends the object in place

        if cache is None and sliceable is not False:
            cache = _reserved_cache(model, W + max_new_tokens)
        fast = release_at == 0 and cache is not None and self._fast(model, generation_kwargs)
        if fast:

            with torch.inference_mode():
                loop = llama_decode.generate(
                    model, input_ids.to(device), attention.to(device), cache, cached_columns,
                    max_new_tokens=max_new_tokens, stop_token_ids=list(stop_token_ids), pad_token_id=pad_token_id,
                    sampling=llama_decode.sampling_of(model, _without_streamer(generation_kwargs)),
                    output_logits=output_logits, keep_states=self.enabled, int8=self.decode_weights == "int8",
                    streamer=(generation_kwargs or {}).get("streamer"))  # fmt: skip
            fed = [len(p) - r for p, r in zip(prompts, reused)]
            self.reused_tokens += sum(reused)
            self.fed_tokens += sum(fed)
            self.fast_calls += 1
            self.compactions += loop.compactions
            if self.enabled:
                for e in used:
                    if e in self._entries:
                        self._entries.remove(e)
                self._store_states(prompts, loop.new_ids, loop.states, stop_token_ids)
                if evict:
                    self._evict()
            return CachedGeneration(new_ids=loop.new_ids, logits=loop.logits, reused=reused, fed=fed)
        kwargs = dict(generation_kwargs or {})
        kwargs.update(max_new_tokens=max_new_tokens, eos_token_id=list(stop_token_ids), pad_token_id=pad_token_id,
                      return_dict_in_generate=True, output_logits=output_logits, use_cache=True)  # fmt: skip
        if cache is not None:
            kwargs[cache_kwarg(model)] = cache
        if release_at > 0:
            from transformers import StoppingCriteriaList

            kwargs["stopping_criteria"] = StoppingCriteriaList([_ReleaseWhenFew(stop_token_ids, release_at,
                                                                                max_new_tokens)])  # fmt: skip
        with torch.inference_mode():
            out = model.generate(input_ids=input_ids.to(device), attention_mask=attention.to(device), **kwargs)
        new = out.sequences[:, W:]
        fed = [len(p) - r for p, r in zip(prompts, reused)]
        self.reused_tokens += sum(reused)
        self.fed_tokens += sum(fed)

        if self.enabled:
            for e in used:
                if e in self._entries:
                    self._entries.remove(e)
            self._store(_output_cache(out), prompts, new,
                        stop_token_ids, W)  # fmt: skip
            if evict:
                self._evict()
        return CachedGeneration(new_ids=new.cpu(), logits=tuple(out.logits) if output_logits else None,
                                reused=reused, fed=fed)  # fmt: skip

    def _share_prefix(self, model: Any, prompts: list[list[int]], device: Any) -> None:
        """Read the rows' common prompt prefix once (one-row forward from the best entry) and store it."""
        import torch
        from transformers import DynamicCache

        if len(prompts) < 2 or (self._entries and self._entries[0].layers is None):
            return
        n = min(min(_common_prefix(prompts[0], p) for p in prompts[1:]), min(len(p) for p in prompts) - 1)
        prefix = prompts[0][:n]
        entry, m = self._best(prefix + [-1], exact=False)
        if n - m < MIN_SHARED_PREFIX:
            return
        past = [(k[None, :, :m], v[None, :, :m]) for k, v in entry.layers] if entry is not None and m > 0 else None
        cache = DynamicCache(ddp_cache_data=past, config=model.config)
        if not self._sliceable(cache):
            return
        ids = torch.tensor([prefix[m:]], dtype=torch.long, device=device)
        with torch.inference_mode():
            model(input_ids=ids, attention_mask=torch.ones((1, n), dtype=torch.long, device=device),
                  position_ids=torch.arange(m, n, device=device)[None], use_cache=True, logits_to_keep=1,
                  **{cache_kwarg(model): cache})  # fmt: skip
        layers, nbytes = [], 0
        for layer in cache.layers:
            k, v = layer.keys[0, :, :n].clone(), layer.values[0, :, :n].clone()
            layers.append((k, v))
            nbytes += k.numel() * k.element_size() + v.numel() * v.element_size()
        self.fed_tokens += n - m
        self._entries.append(_Entry(tokens=prefix, layers=layers, nbytes=nbytes, last_used=self._calls))

    def _batch_cache(self, model, prompts, matches, W, C, device, capacity):
        import torch

        ref = next(e for e, n in matches if e is not None)
        layers = []
        for li, (k_ref, v_ref) in enumerate(ref.layers):
            H, _, Dk = k_ref.shape
            Dv = v_ref.shape[-1]
            keys = torch.zeros((len(prompts), H, C, Dk), dtype=k_ref.dtype, device=device)
            values = torch.zeros((len(prompts), H, C, Dv), dtype=v_ref.dtype, device=device)
            for row, (p, (e, n)) in enumerate(zip(prompts, matches)):
                r = C - (W - len(p))  # this row's tokens inside the cached columns
                if r > 0:
                    assert e is not None and r <= n
                    k, v = e.layers[li]
                    keys[row, :, C - r :] = k[:, :r]
                    values[row, :, C - r :] = v[:, :r]
            layers.append((keys, values))
        cache = _reserved_cache(model, capacity)
        for layer, (keys, values) in zip(cache.layers, layers):
            layer.update(keys, values)
        return cache

    def _fast(self, model: Any, generation_kwargs: dict[str, Any] | None) -> bool:
        """Whether this call decodes with :mod:`reterm.policies.llama_decode` (on, a model it supports, settings it
        reproduces)."""

        return (self.fast_decode and llama_decode.supports(model)
                and llama_decode.sampling_of(model, _without_streamer(generation_kwargs)) is not None)  # fmt: skip

    def _store_states(self, prompts: list[list[int]], new: Any, states: list[Any], stop_token_ids: list[int]) -> None:
        """Store each row's states as :func:`reterm.policies.llama_decode.generate` cut them out (per layer
        ``(heads, n, head_dim)`` for ``prompt + kept[:-1]``)."""
        stops = set(stop_token_ids)
        if self._entries and self._entries[0].layers is None:
            self._entries = []
        for p, seq, layers in zip(prompts, new.tolist(), states):
            kept, _ = cut_at_stop(seq, stops)
            nbytes = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in layers)
            self._entries.append(_Entry(tokens=list(p) + kept[:-1], layers=layers, nbytes=nbytes,
                                        last_used=self._calls))  # fmt: skip

    def _store(self, cache: Any, prompts: list[list[int]], new: Any, stop_token_ids: list[int], W: int) -> None:
        if cache is None:
            return
        stops = set(stop_token_ids)
        rows = new.tolist()
        sliceable = self._sliceable(cache)
        if not sliceable and len(prompts) != 1:
            return
        for row, p in enumerate(prompts):
            seq = rows[row]
            kept, _ = cut_at_stop(seq, stops)
            tokens = list(p) + kept[:-1]
            if sliceable:
                start, stop = W - len(p), W + len(kept) - 1
                layers, nbytes = [], 0
                for layer in cache.layers:
                    k = layer.keys[row, :, start:stop].clone()
                    v = layer.values[row, :, start:stop].clone()
                    layers.append((k, v))
                    nbytes += k.numel() * k.element_size() + v.numel() * v.element_size()
                entry = _Entry(tokens=tokens, layers=layers, nbytes=nbytes, last_used=self._calls)
            else:
                if len(kept) != len(seq):  # generation went on past the end of the row: states are not its own
                    continue
                nbytes = sum(t.numel() * t.element_size() for t in _tensors(cache))
                entry = _Entry(tokens=tokens, cache=cache, nbytes=nbytes, last_used=self._calls)
            if self._entries and (self._entries[0].layers is None) != (entry.layers is None):
                self._entries = []
            self._entries.append(entry)


def _releasable(generation_kwargs: dict[str, Any] | None) -> bool:
    """Whether a call's ``generate`` arguments leave every row's end to its stop tokens and ``max_new_tokens`` (early
    release needs that: a row stopped by another rule would look released and be continued)."""
    kw = dict(generation_kwargs or {})
    config = kw.pop("generation_config", None)
    for source in (kw, vars(config) if config is not None else {}):
        if source.get("stopping_criteria") or source.get("stop_strings") or source.get("max_time"):
            return False
        if (source.get("min_new_tokens") or 0) > 0 or (source.get("min_length") or 0) > 0:
            return False
    return True


def _release_criterion_class():
    from transformers import StoppingCriteria

    class ReleaseWhenFew(StoppingCriteria):
        """Stops every row once at most ``at`` rows (but at least one) have not written a stop token and at least
        :data:`MIN_RELEASE_STEPS` of the call's ``max_new_tokens`` steps are left (early release)."""

        def __init__(self, stop_token_ids: list[int], at: int, max_new_tokens: int) -> None:
            self.stops, self.at, self.max_new_tokens = list(stop_token_ids), at, max_new_tokens
            self.ended = None
            self.steps = 0

        def __call__(self, input_ids, scores, **kwargs):
            import torch

            last = input_ids[:, -1]
            hit = torch.isin(last, torch.tensor(self.stops, device=last.device))
            self.ended = hit if self.ended is None else self.ended | hit
            self.steps += 1
            running = int((~self.ended).sum())
            stop = 0 < running <= self.at and self.max_new_tokens - self.steps >= MIN_RELEASE_STEPS
            return torch.full_like(hit, stop)

    return ReleaseWhenFew


def _ReleaseWhenFew(stop_token_ids: list[int], at: int, max_new_tokens: int) -> Any:
    """A ``ReleaseWhenFew`` stopping criterion (the class is built on first use: transformers imports late)."""
    global _RELEASE
    if _RELEASE is None:
        _RELEASE = _release_criterion_class()
    return _RELEASE(stop_token_ids, at, max_new_tokens)


_RELEASE = None


def _tensors(cache: Any):
    """Every tensor a cache object holds (for its size)."""
    import torch

    for layer in getattr(cache, "layers", []):
        for value in vars(layer).values():
            if isinstance(value, torch.Tensor):
                yield value
            elif isinstance(value, dict):
                yield from (t for t in value.values() if isinstance(t, torch.Tensor))


def _output_cache(out: Any) -> Any:
    """The cache object a ``generate`` output carries (``cache`` in newer transformers, else ``past_key_values``)."""
    for name in ("cache", "past_key_values"):
        if name in getattr(out, "keys", lambda: [])():
            return out[name]
    return getattr(out, "cache", None)
