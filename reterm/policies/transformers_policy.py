"""A local model run with transformers: the embedded SmolLM2, any Hub id or folder, Qwen3.5, PEFT adapters.

The prompt of every conversation is rendered by the tokenizer's own chat template
(``apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True)``), so the model sees its
native tool-call format; the reply is returned as raw text for the harness's parser
(:func:`reterm.agent.protocol.parse_action`). A batch of conversations is generated as one
left-padded batch (the episode loop batches GRPO groups and recovery fan-outs). Each conversation's
key/value states are kept between turns (:class:`reterm.policies.kv_cache.PrefixKVCache`), so a turn reads
only the tokens that are new since the last one (``kv_cache=False`` reads the whole prompt every turn).

Loading rules:
- ``smollm2`` is the embedded default model (:mod:`reterm.policies.smollm2`).
- A Qwen3.5 checkpoint (``model_type`` ``qwen3_5``/``qwen3_5_moe``, text-only or the vision-language
  layout of the released 9B) is loaded text-only as ``Qwen3_5ForCausalLM``/``Qwen3_5MoeForCausalLM``.
- A tokenizer whose chat template cannot render tools (no ``tools`` in the template, e.g. SmolLM2
  from the Hub) gets ReTerm's ChatML tool template ``reterm/agent/templates/chatml_tools.jinja``.
- A PEFT adapter folder is applied on top of its base model (merged for speed); a tokenizer saved
  with the adapter (trainers save one) is preferred over the base model's.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any

from reterm.policies.base import FINISH_CONTEXT_LENGTH, Generation
from reterm.policies.kv_cache import DEFAULT_MAX_BYTES, PrefixKVCache, cut_at_stop
from reterm.policies.sampling import SamplingParams
from reterm.policies.smollm2 import EMBEDDED_NAME, chat_template, resolve_model_name_or_path
from reterm.precision import auto_cpu_dtype

# model_type -> text-only causal-LM class name in transformers (the released Qwen3.5 checkpoints are
# vision-language models; ReTerm trains and runs the language model only).
QWEN3_5_TEXT_CLASSES = {
    "qwen3_5": "Qwen3_5ForCausalLM",
    "qwen3_5_text": "Qwen3_5ForCausalLM",
    "qwen3_5_moe": "Qwen3_5MoeForCausalLM",
    "qwen3_5_moe_text": "Qwen3_5MoeForCausalLM",
}

# End-of-turn tokens of common chat templates, added to the stop set when the vocabulary has them.
_END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>", "<|endoftext|>")

def template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages in the shape chat templates expect.

    - ``content`` ``None`` becomes ``""``; a list of OpenAI content parts becomes their joined text.
    - tool-call ``arguments`` given as JSON strings (the OpenAI/``datasets`` form) become mappings
      (Qwen3.5's template iterates them); ``reasoning_content`` and other keys are kept.

    Raises:
        ValueError: a tool call's ``arguments`` string is not a JSON object (message index named).
    """
    out = []
    for i, message in enumerate(messages):
        msg = dict(message)
        content = msg.get("content")
        if content is None:
            msg["content"] = ""
        elif isinstance(content, list):
            msg["content"] = "".join(
                part.get("text", "") if isinstance(part, dict) else str(part) for part in content
            )
        if msg.get("tool_calls"):
            calls = []
            for call in msg["tool_calls"]:
                call = dict(call)
                fn = dict(call.get("function", call))
                args = fn.get("arguments")
                if args is None or args == "":
                    args = {}
                if isinstance(args, str):
                    try:
                        args = json.loads(args)
                    except ValueError as exc:
                        raise ValueError(f"messages[{i}]: tool call arguments are not JSON: {args[:80]!r}") from exc
                if not isinstance(args, dict):
                    raise ValueError(f"messages[{i}]: tool call arguments must be a JSON object, got {args!r:.80}")
                fn["arguments"] = args
                call["function"] = fn
                call.setdefault("type", "function")
                calls.append(call)
            msg["tool_calls"] = calls
        else:
            msg.pop("tool_calls", None)
        out.append(msg)
    return out


def _is_adapter_folder(path: str) -> bool:
    p = Path(path)
    return p.is_dir() and (p / "adapter_config.json").is_file() and not (p / "config.json").is_file()


def _has_tokenizer(path: str | None) -> bool:
    return bool(path) and Path(path).is_dir() and any(
        (Path(path) / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
    )


class TransformersPolicy:
    """A local causal LM as a :class:`~reterm.policies.base.Policy`.

    Args:
        model: ``"smollm2"`` (the embedded default), a Hub id, a local checkpoint folder, or a PEFT
            adapter folder (its ``base_model_name_or_path`` is loaded underneath).
        adapter: optional PEFT adapter folder or Hub id applied on top of ``model``.
        sampling: a :class:`SamplingParams`; overridden field by field by ``temperature``, ``top_p``,
            ``max_new_tokens`` and ``seed`` when given.
        dtype: ``"auto"`` (on a CPU bfloat16 where it has bf16 matrix instructions, else float32:
            :func:`reterm.precision.auto_cpu_dtype`; bfloat16 on a GPU that supports it, else float16) or a
            torch dtype name (``"float32"``, ``"bfloat16"``, ...).
        device: ``"auto"`` (``cuda`` when available, else ``cpu``) or a torch device string.
        max_context: context length in tokens (prompt + generation); default: the model's
            ``max_position_embeddings``. See :meth:`generate` for prompts that do not fit.
        enable_thinking: passed to the chat template (Qwen3.5 thinks by default); ``None`` leaves the
            template's default.
        chat_template_kwargs: further keyword arguments for ``apply_chat_template``.
        chat_template: a template text or a path to a ``.jinja`` file replacing the tokenizer's.
        return_logprobs: fill :attr:`Generation.logprobs` (costs memory: the logits of every step).
        batch_size: at most this many conversations per forward batch (default: the whole batch).
        merge_adapter: merge the PEFT adapter into the weights (faster generation).
        name: the policy's name in trajectories; default ``hf:<model>`` (``smollm2`` for the default).
        trust_remote_code: passed to ``from_pretrained``.
        kv_cache: keep each conversation's key/value states between turns (same greedy tokens, far fewer
            tokens read per turn); ``False`` re-reads every prompt.
        kv_cache_bytes: bound on the key/value bytes kept (least recently used conversations go first).
        decode_weights: ``"float"`` (default) or ``"int8"``: decode a Llama model (SmolLM2) with int8 copies of
            its linear layers (about 2x faster decoding on a CPU; greedy tokens can differ, ``bench/decode.py
            --int8`` counts them; :mod:`reterm.policies.int8_weights`). Prompts are read in ``dtype``.

    Attributes:
        call_format: ``"qwen"`` when the chat template renders Qwen3.5's ``<function=...>`` calls, else
            ``"hermes"`` (JSON); the harness shows this syntax in parse-error observations.

    Raises:
        OSError/ValueError from transformers naming the model when it cannot be loaded.
    """

    def __init__(
        self,
        model: str | os.PathLike[str] = EMBEDDED_NAME,
        *,
        adapter: str | os.PathLike[str] | None = None,
        sampling: SamplingParams | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        max_new_tokens: int | None = None,
        seed: int | None = None,
        dtype: str = "auto",
        device: str = "auto",
        max_context: int | None = None,
        enable_thinking: bool | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        chat_template: str | os.PathLike[str] | None = None,
        return_logprobs: bool = False,
        batch_size: int | None = None,
        merge_adapter: bool = True,
        name: str | None = None,
        trust_remote_code: bool = False,
        kv_cache: bool = True,
        kv_cache_bytes: int = DEFAULT_MAX_BYTES,
        decode_weights: str = "float",
    ) -> None:
        import torch

        self.sampling = SamplingParams.merged(sampling, temperature=temperature, top_p=top_p,
                                              max_new_tokens=max_new_tokens, seed=seed)
        model_id = os.fspath(model)
        self.name = name or (EMBEDDED_NAME if model_id == EMBEDDED_NAME and adapter is None else f"hf:{model_id}")

        model_path = resolve_model_name_or_path(model_id)
        adapter_path = os.fspath(adapter) if adapter is not None else None
        if adapter_path is None and _is_adapter_folder(model_path):
            adapter_path = model_path
            cfg = json.loads((Path(model_path) / "adapter_config.json").read_text())
            if not cfg.get("base_model_name_or_path"):
                raise ValueError(f"{model_path}/adapter_config.json: no base_model_name_or_path")
            model_path = resolve_model_name_or_path(cfg["base_model_name_or_path"])
        self.model_path, self.adapter_path = model_path, adapter_path

        self.device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device)
        self.dtype = self._resolve_dtype(dtype, self.device)
        if self.sampling.seed is not None:
            torch.manual_seed(self.sampling.seed)

        self.tokenizer = self._load_tokenizer(model_path, adapter_path, chat_template, trust_remote_code)
        self.model = self._load_model(model_path, adapter_path, merge_adapter, trust_remote_code)
        self.model.eval()

        positions = getattr(self.model.config, "max_position_embeddings", None)
        limits = [int(x) for x in (max_context, positions) if x]
        if not limits:
            raise ValueError(f"{model_path}: the config has no max_position_embeddings; pass max_context")
        self.max_context = min(limits)
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        if enable_thinking is not None:
            self.chat_template_kwargs["enable_thinking"] = enable_thinking
        self.return_logprobs = return_logprobs
        self.batch_size = batch_size
        # a transformers streamer (``put``/``end``) given to every ``generate`` call while set: ``reterm serve``'s
        # token streaming sets it around one request (None: no streaming)
        self.streamer: Any = None
        self.stop_token_ids = self._stop_token_ids()
        # The tool-call syntax the template teaches (used by the harness's parse-error observations).
        self.call_format = "qwen" if "<function=" in (self.tokenizer.chat_template or "") else "hermes"
        self.pad_token_id = (
            self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.stop_token_ids[0]
        )
        self.kv_cache = PrefixKVCache(enabled=kv_cache, max_bytes=kv_cache_bytes, decode_weights=decode_weights)

    # ------------------------------------------------------------------------------ loading
    @staticmethod
    def _resolve_dtype(dtype: str, device):
        import torch

        if dtype == "auto":
            if device.type == "cpu":  # bf16 where the CPU has bf16 matrix instructions (reterm.precision)
                return getattr(torch, auto_cpu_dtype())
            if device.type == "cuda" and torch.cuda.is_bf16_supported():
                return torch.bfloat16
            return torch.float16
        value = getattr(torch, str(dtype).removeprefix("torch."), None)
        if not isinstance(value, torch.dtype):
            raise ValueError(f"dtype: unknown torch dtype {dtype!r} (use 'auto', 'float32', 'bfloat16', 'float16')")
        return value

    def _load_tokenizer(self, model_path, adapter_path, template, trust_remote_code):
        from transformers import AutoTokenizer

        source = adapter_path if _has_tokenizer(adapter_path) else model_path
        tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code)
        if template is not None:
            text = os.fspath(template)
            if text.endswith(".jinja") and Path(text).is_file():
                text = Path(text).read_text()
            tokenizer.chat_template = text
        elif not tokenizer.chat_template or "tools" not in tokenizer.chat_template:
            warnings.warn(
                f"{source}: the tokenizer's chat template cannot render tools; using ReTerm's ChatML tool template",
                stacklevel=3,
            )
            tokenizer.chat_template = chat_template()
        return tokenizer

    def _load_model(self, model_path, adapter_path, merge_adapter, trust_remote_code):
        import transformers
        from transformers import AutoConfig, AutoModelForCausalLM

        config = AutoConfig.from_pretrained(model_path, trust_remote_code=trust_remote_code)
        kwargs: dict[str, Any] = {"dtype": self.dtype, "trust_remote_code": trust_remote_code}
        class_name = QWEN3_5_TEXT_CLASSES.get(getattr(config, "model_type", ""))
        if class_name is not None:
            # Text-only: the released checkpoints are vision-language models; transformers' weight
            # conversion maps their `model.language_model.*` keys onto the causal LM (vision weights skipped).
            cls = getattr(transformers, class_name)
            model = cls.from_pretrained(model_path, config=config.get_text_config(), **kwargs)
        else:
            model = AutoModelForCausalLM.from_pretrained(model_path, **kwargs)
        if adapter_path is not None:
            from peft import PeftModel

            model = PeftModel.from_pretrained(model, adapter_path)
            if merge_adapter:
                model = model.merge_and_unload()
        return model.to(self.device)

    def _stop_token_ids(self) -> list[int]:
        """End-of-turn ids: the generation config's and tokenizer's EOS plus known end-of-turn tokens."""
        ids: list[int] = []

        def add(value):
            for v in value if isinstance(value, (list, tuple)) else [value]:
                if isinstance(v, int) and v >= 0 and v not in ids:
                    ids.append(v)

        add(getattr(self.model.generation_config, "eos_token_id", None))
        add(self.tokenizer.eos_token_id)
        vocab = self.tokenizer.get_vocab()
        for token in _END_OF_TURN_TOKENS:
            if token in vocab:
                add(vocab[token])
        if not ids:
            raise ValueError(f"{self.model_path}: the tokenizer defines no end-of-turn/EOS token")
        return ids

    # ----------------------------------------------------------------------------- prompting
    def prompt_ids(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
        """Token ids of one conversation's prompt (chat template + generation prompt)."""
        out = self.tokenizer.apply_chat_template(
            template_messages(messages),
            tools=tools or None,
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
            **self.chat_template_kwargs,
        )
        ids = out["input_ids"]
        return list(ids[0] if ids and isinstance(ids[0], list) else ids)

    # ---------------------------------------------------------------------------- generation
    def generate(self, batch: list[list[dict[str, Any]]], tools: list[dict[str, Any]]) -> list[Generation]:
        """Generate the next assistant turn for each conversation in ``batch``.

        Args:
            batch: ``B`` conversations (OpenAI-style message lists).
            tools: tool schemas rendered by the chat template (``reterm.agent.protocol.TOOLS``).

        Returns:
            ``B`` :class:`Generation` in order. ``text`` is the decoded reply without the end-of-turn
            token (special tokens such as ``<tool_call>`` kept); ``token_ids`` are the generated ids
            *including* the end-of-turn token when one was produced (what a trainer scores);
            ``completion_tokens == len(token_ids)``; ``prompt_tokens`` is the unpadded prompt length
            and ``extra["prompt_token_ids"]`` its ids;
            ``logprobs`` (with ``return_logprobs``) are the sampled tokens' log-probabilities under
            ``log_softmax(logits / temperature)`` (raw logits when greedy), as TRL's GRPO computes them.
            ``finish_reason``: ``"stop"`` (end-of-turn token), ``"length"`` (``max_new_tokens`` or
            the context filled up), or :data:`FINISH_CONTEXT_LENGTH`.

        Prompts that do not fit: generation is capped at ``max_context - prompt_tokens`` new tokens;
        when that is zero or less nothing is generated and the result is ``Generation(text="",
        finish_reason="context_length")``. Nothing raises for long prompts.

        Raises:
            ValueError: a malformed conversation (e.g. tool-call arguments that are not JSON), or the
                chat template's own error for an impossible message order.
        """
        prompts = [self.prompt_ids(messages, tools) for messages in batch]
        self.kv_cache.advance()
        results: list[Generation | None] = [None] * len(batch)
        groups: dict[int, list[int]] = {}
        for i, ids in enumerate(prompts):
            budget = min(self.sampling.max_new_tokens, self.max_context - len(ids))
            if budget <= 0:
                results[i] = Generation(text="", prompt_tokens=len(ids), completion_tokens=0, token_ids=[],
                                        logprobs=[] if self.return_logprobs else None,
                                        finish_reason=FINISH_CONTEXT_LENGTH,
                                        extra={"prompt_token_ids": ids})  # fmt: skip
            else:
                groups.setdefault(budget, []).append(i)
        for budget, indices in groups.items():
            step = self.batch_size or len(indices)
            for start in range(0, len(indices), step):
                chunk = indices[start : start + step]
                for i, gen in zip(chunk, self._generate_padded([prompts[i] for i in chunk], budget)):
                    results[i] = gen
        return [r for r in results if r is not None]

    def _generate_padded(self, prompts: list[list[int]], max_new_tokens: int) -> list[Generation]:
        import torch

        s = self.sampling
        gen_kwargs: dict[str, Any] = {}
        if s.greedy:
            gen_kwargs.update(do_sample=False, temperature=None, top_p=None)
        else:  # other fields of the checkpoint's generation_config (e.g. Qwen3.5's top_k=20) still apply
            gen_kwargs.update(do_sample=True, temperature=s.temperature, top_p=s.top_p)
        if self.streamer is not None:
            gen_kwargs["streamer"] = self.streamer
        out = self.kv_cache.generate(
            self.model, prompts, max_new_tokens=max_new_tokens, stop_token_ids=self.stop_token_ids,
            pad_token_id=self.pad_token_id, generation_kwargs=gen_kwargs, output_logits=self.return_logprobs,
        )  # fmt: skip
        new = out.new_ids
        logprobs = None
        if self.return_logprobs:
            logits = torch.stack(out.logits, dim=1).float()  # (B, T, V)
            if not s.greedy:
                logits = logits / s.temperature
            logprobs = torch.log_softmax(logits, dim=-1).gather(-1, new.to(logits.device).unsqueeze(-1))
            logprobs = logprobs.squeeze(-1).cpu()
        stops = set(self.stop_token_ids)
        results = []
        for row, ids in enumerate(prompts):
            kept, end = cut_at_stop(new[row].tolist(), stops)
            text_ids, finish = (kept, "length") if end is None else (kept[:end], "stop")
            results.append(
                Generation(
                    text=self.tokenizer.decode(text_ids, skip_special_tokens=False),
                    prompt_tokens=len(ids),
                    completion_tokens=len(kept),
                    token_ids=kept,
                    logprobs=logprobs[row, : len(kept)].tolist() if logprobs is not None else None,
                    finish_reason=finish,
                    extra={"prompt_token_ids": ids, "cached_prompt_tokens": out.reused[row]},
                )
            )
        return results

    def __repr__(self) -> str:
        return f"TransformersPolicy(name={self.name!r}, model={self.model_path!r}, device={self.device}, dtype={self.dtype})"
