"""ReTerm-GRPO: TRL's ``GRPOTrainer`` with groups of multi-turn recovery attempts forked from failure states.

What the subclass changes (everything else, the GRPO loss, advantages, optimisation, logging, saving,
is TRL's):

- **Rollouts.** ``_generate_and_score_completions`` first picks each group's failure state
  (:class:`reterm.training.failure_pool.FailurePool`: the sampled seed row or an online state), then runs
  every group's G attempts through the kit's one harness in lock-step
  (:class:`reterm.training.grpo_rollout.RolloutEngine`: forks of the state, one batched generation per
  turn, commands of all attempts concurrently, the task's verifier), then hands TRL the exact token ids
  through TRL's ``rollout_func`` contract (``prompt_ids``, ``completion_ids``, ``logprobs``, ``env_mask``).
  TRL's own tool loop (sequential rollouts) is not used.
- **Generation** goes through TRL's own backend (``GRPOTrainer._generate_single_turn``: transformers, or
  vLLM when ``use_vllm``) with the turn's token budget, from the token ids the model produced so far
  (:class:`reterm.training.grpo_policy.TokenTrajectoryPolicy`). With transformers generation and ``kv_cache``
  (default), the model is driven with TRL's generation config directly and every attempt's key/value states
  are kept between its turns (:class:`reterm.policies.kv_cache.PrefixKVCache`), so a turn reads only the new
  observation tokens; the states are dropped at every rollout (the weights changed). ``merged_generation``
  generates from a plain copy of the policy with the LoRA update merged in, re-synced after every optimiser
  step (:class:`reterm.training.generation_copy.MergedGenerationCopy`; ``bench/grpo_generation.py``: 2.51x the
  tokens/s on a CPU).
- **Rewards.** The verifier's reward (0/1), times ``unsubmitted_reward_scale`` for an attempt that never
  submitted (:func:`reterm.rewards.training_reward`; 1.0 by default): TRL's ``reward`` and ``reterm/reward_mean``
  log this trained reward, ``reterm/pass_rate`` the verifier's passes. Infrastructure faults and dropped groups (a replay that
  diverged) return ``None``: TRL turns ``None`` into NaN, leaves those attempts out of the group's mean
  and std and sets their advantage to 0 (TRL 1.16 ``_generate_and_score_completions``); their
  ``env_mask`` is all 0 as well, so they carry **zero loss weight** (no policy-gradient, KL or entropy
  term, and they do not count in ``dapo``'s token normaliser).
- **Zero-variance groups** (all rewards equal: no gradient) are counted; ``dynamic_sampling`` ``skip``
  gives them zero loss weight, ``resample`` replaces them by groups from newly drawn states first (DAPO).
- **Completion tokens only.** TRL's fused LM head scores only the completion tokens on GPUs; on CPUs it
  scored every position: :func:`reterm.training.lean.lean_fused_lm_head` makes it score only those there too.
- **Skipped zero-gradient micro-batches.** With ``beta: 0``, a micro-batch whose advantages are all 0
  (zero-variance groups, masked attempts) has an exactly zero gradient; ``compute_loss`` then skips the
  model's forward and backward (single process; ``reterm/skipped_microbatch_share``).
- **Online failure states.** Failed attempts are localised (:mod:`reterm.recovery`); new states join the
  pool every ``pool_refresh_steps`` (gathered from every rank, identical pools everywhere).
- **Metrics** per step (``reterm/...``): reward mean, recovery rate per error category, zero-variance group
  share, infrastructure-fault share, dropped groups, turns per attempt, fork time, generated tokens per
  second, pool sizes. Each attempt's trajectory goes to ``output_dir/rollouts/`` (``save_rollouts``).

Multi-process runs: each rank runs its own lock-step loop, so ranks make different numbers of generation
calls; that is safe when generation has no collective operation per call: vLLM in ``colocate`` mode with
``vllm_tensor_parallel_size: 1``, or transformers generation without ZeRO-3/FSDP. Other set-ups raise at
construction.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
import warnings
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from trl import GRPOTrainer

from reterm.policies.kv_cache import PrefixKVCache
from reterm.recovery import localise
from reterm.training.failure_pool import (
    FailurePool,
    PoolState,
    SnapshotCache,
    merge_group_parts,
    online_states_from_attempt,
)
from reterm.training.generation_copy import MergedGenerationCopy
from reterm.training.grpo_config import ReTermGRPOConfig
from reterm.training.grpo_outputs import rollout_file_name, rollout_rows, write_rollout_file
from reterm.training.grpo_policy import GenerateFn, GenerationRequest, TokenTrajectoryPolicy
from reterm.training.grpo_rollout import GroupRollout, RolloutEngine, RolloutSettings
from reterm.training.lean import lean_fused_lm_head
from reterm.training.likelihood import training_chat_template
from reterm.trajectory import write_json_atomic

POOL_STATE_FILE = "failure_pool.json"


class _MaskedRewardLogFilter(logging.Filter):
    """Drops TRL's warning for rows whose every reward is ``None`` (it prints the whole conversation): ReTerm
    gives no reward to infrastructure faults and dropped groups on purpose and counts them
    (``reterm/infra_fault_share``, ``reterm/dropped_group_share``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "All reward functions returned None" not in record.getMessage()


_MASKED_FILTER = _MaskedRewardLogFilter()


def verifier_reward(completions: list[Any], verifier_reward: list[float | None] | None = None, **kwargs: Any) -> list[float | None]:
    """The reward of each attempt: the task verifier's reward (0/1 for Terminal-Bench tasks), scaled by
    ``unsubmitted_reward_scale`` for an attempt that never submitted (:func:`reterm.rewards.training_reward`);
    ``None`` for attempts without a reward signal (infrastructure faults, dropped groups). Filled by the rollout."""
    if verifier_reward is None:
        raise ValueError("verifier_reward: the rollout did not provide the verifier's rewards")
    return list(verifier_reward)


class ReTermGRPOTrainer(GRPOTrainer):
    """
    Trainer for ReTerm-GRPO (and the standard-GRPO baseline with ``mode="standard"``) on terminal tasks.

    Args:
        model (`str` or [`~transformers.PreTrainedModel`] or [`~peft.PeftModel`]):
            The policy to train, as for [`~trl.GRPOTrainer`].
        args ([`ReTermGRPOConfig`]):
            The configuration (TRL's GRPO fields plus the rollout and pool fields).
        pool ([`FailurePool`]):
            Where groups start: seed failure states (ReTerm mode) or task starts (standard mode). Its seed
            rows become the training dataset.
        processing_class ([`~transformers.PreTrainedTokenizerBase`], *optional*):
            The tokenizer (its ``eos_token_id`` must be the chat template's end of turn).
        callbacks, optimizers, peft_config:
            As for [`~trl.GRPOTrainer`].
        generate_fn (`GenerateFn`, *optional*):
            Replaces generation by the trainer's model (tests and benchmarks: scripted replies, see
            :func:`reterm.training.grpo_policy.scripted_generate_fn`). The loss is still computed by the model.

    Raises:
        TypeError: ``args`` is not a [`ReTermGRPOConfig`].
        ValueError: a multi-process set-up whose generation would deadlock (see the module docstring),
            ``dynamic_sampling`` with groups that span processes, or ``merged_generation`` without the kit's
            transformers generation or with a PEFT layer that does not merge (DoRA, LoRA bias, embeddings).
    """

    _tag_names = ["trl", "grpo", "reterm"]
    _name = "ReTerm-GRPO"

    def __init__(
        self,
        model: Any,
        args: ReTermGRPOConfig,
        pool: FailurePool,
        processing_class: Any = None,
        callbacks: list | None = None,
        optimizers: tuple = (None, None),
        peft_config: Any = None,
        generate_fn: GenerateFn | None = None,
    ) -> None:
        if not isinstance(args, ReTermGRPOConfig):
            raise TypeError(f"args must be a ReTermGRPOConfig, got {type(args).__name__}")
        self.pool = pool

        lean_fused_lm_head()  # CPUs: log-probabilities of the completion tokens only, in small tiles
        logging.getLogger("trl.trainer.grpo_trainer").addFilter(_MASKED_FILTER)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="You are using 'rollout_func'")
            super().__init__(
                model=model, reward_funcs=[verifier_reward], args=args, train_dataset=pool.dataset(),
                processing_class=processing_class, callbacks=callbacks, optimizers=optimizers,
                peft_config=peft_config, rollout_func=self._rollout_func,
            )  # fmt: skip

        self.rollout_chat_template = training_chat_template(self._tokenizer)
        positions = getattr(self.model.config.get_text_config(), "max_position_embeddings", None) or 32768
        self.rollout_policy = TokenTrajectoryPolicy(
            self._tokenizer, generate_fn or self._generate_tokens, chat_template=self.rollout_chat_template,
            chat_template_kwargs=self.chat_template_kwargs, max_turn_tokens=args.max_turn_tokens,
            max_completion_tokens=args.max_completion_length, max_context=int(positions),
            eos_token_ids=self.eos_token_ids, name=f"grpo:{Path(str(args.output_dir)).name}",
        )  # fmt: skip

        self.kv_cache = PrefixKVCache(enabled=self._kv_reuse_possible(args))
        self.generation_copy: MergedGenerationCopy | None = None
        self._copy_step: int | None = self.state.global_step  # the constructor's sync holds this step's weights
        if args.merged_generation:  # built with a generate_fn too (tests), where it is synced but not used
            if not self.kv_cache.enabled:
                raise ValueError("merged_generation: needs the kit's transformers generation (kv_cache: true, no "
                                 "vLLM, no ZeRO-3/FSDP); vLLM keeps its own merged copy")  # fmt: skip
            import torch

            policy = self.accelerator.unwrap_model(self.model)
            self.generation_copy = MergedGenerationCopy(policy, torch.bfloat16 if args.bf16 else policy.dtype)
        self.snapshots = SnapshotCache(args.snapshot_cache_size)
        self.engine = RolloutEngine(
            RolloutSettings(max_turns=args.max_turns, command_timeout_s=args.command_timeout_s,
                            time_budget_s=args.agent_time_budget_s,
                            max_consecutive_parse_errors=args.max_consecutive_parse_errors,
                            unsubmitted_reward_scale=args.unsubmitted_reward_scale,
                            environment=args.environment, fork_method=args.resolved_fork_method),
            cache=self.snapshots, lookup=pool.by_id.get,
        )  # fmt: skip
        self._pending_rollout: dict[str, Any] | None = None
        self._generation_round = 0
        self.totals: Counter = Counter()  # whole-run counts (training_summary.json)
        self._check_multiprocess(args)

    # ------------------------------------------------------------------------------- set-up
    def _check_multiprocess(self, args: ReTermGRPOConfig) -> None:
        n = self.accelerator.num_processes
        if args.dynamic_sampling != "none" and (args.generation_batch_size // n) % args.num_generations:
            raise ValueError(
                f"dynamic_sampling={args.dynamic_sampling!r} needs whole groups on each process: "
                f"generation_batch_size / processes ({args.generation_batch_size} / {n}) must be a multiple of "
                f"num_generations ({args.num_generations})"
            )
        if n == 1:
            return
        if self.use_vllm:
            if args.vllm_mode == "colocate" and args.vllm_tensor_parallel_size == 1:
                return
            raise ValueError(
                "ReTerm-GRPO runs one lock-step rollout loop per process, and processes make different numbers "
                "of generation calls; vLLM server mode and tensor parallelism use a collective operation per call. "
                "Use vllm_mode: colocate with vllm_tensor_parallel_size: 1."
            )
        zero3 = self.is_deepspeed_enabled and getattr(self.accelerator.state.deepspeed_plugin, "zero_stage", 0) == 3
        if zero3 or self.is_fsdp_enabled:
            raise ValueError(
                "ReTerm-GRPO with several processes and transformers generation under ZeRO-3/FSDP would deadlock "
                "(parameters are gathered collectively at every generation call). Use use_vllm: true with "
                "vllm_mode: colocate, or ZeRO-2/DDP."
            )

    # --------------------------------------------------------------------------- generation
    def _kv_reuse_possible(self, args: ReTermGRPOConfig) -> bool:
        """Whether rollouts generate through :attr:`kv_cache` (transformers generation of a whole model on this
        process, default cache) rather than TRL's ``_generate_single_turn``."""
        zero3 = self.is_deepspeed_enabled and getattr(self.accelerator.state.deepspeed_plugin, "zero_stage", 0) == 3
        return bool(args.kv_cache) and not (self.use_vllm or getattr(args, "use_transformers_paged", False)
                                            or getattr(args, "cache_implementation", None) or zero3
                                            or self.is_fsdp_enabled)  # fmt: skip

    @contextlib.contextmanager
    def _turn_budget(self, max_new_tokens: int):
        """Temporarily set TRL's generation length to one turn's budget."""
        if self.use_vllm:
            old = self.vllm_generation.max_completion_length
            self.vllm_generation.max_completion_length = max_new_tokens
            try:
                yield
            finally:
                self.vllm_generation.max_completion_length = old
        else:
            old_cfg, old_kw = self.generation_config.max_new_tokens, self.generation_kwargs.get("max_new_tokens")
            self.generation_config.max_new_tokens = max_new_tokens
            self.generation_kwargs["max_new_tokens"] = max_new_tokens
            try:
                yield
            finally:
                self.generation_config.max_new_tokens = old_cfg
                self.generation_kwargs["max_new_tokens"] = old_kw

    def _generate_tokens(self, requests: list[GenerationRequest], max_new_tokens: int):
        """:data:`GenerateFn` over TRL's generation backend (``_generate_single_turn``: transformers or vLLM)."""
        prompt_ids = [r.token_ids for r in requests]
        if self.kv_cache.enabled:
            return self._generate_cached(prompt_ids, max_new_tokens)
        with self._turn_budget(max_new_tokens):
            completion_ids, logprobs = self._generate_single_turn(prompt_ids, None, {}, num_generations=1)
        out = []
        for k, ids in enumerate(completion_ids):
            lps = None if logprobs is None else [float(x) for x in logprobs[k]]
            out.append(([int(t) for t in ids], lps))
        return out

    def _generate_cached(self, prompt_ids: list[list[int]], max_new_tokens: int):
        """TRL's transformers generation (same unwrapping, same generation config) through :attr:`kv_cache`;
        ids after the first end-of-turn token are cut, as TRL does. No log-probabilities (as TRL's path)."""
        import torch
        from trl.models import unwrap_model_for_generation

        pad = self._tokenizer.pad_token_id if self._tokenizer.pad_token_id is not None else self.eos_token_ids[0]
        self.kv_cache.advance()
        if self.generation_copy is not None:  # merged weights, already in their dtype: no autocast
            model_ctx, precision = contextlib.nullcontext(self.generation_copy.model), contextlib.nullcontext()
        else:
            model_ctx = unwrap_model_for_generation(
                self.model_wrapped, self.accelerator, gather_deepspeed3_params=self.args.ds3_gather_for_generation,
                generation_kwargs=self.generation_kwargs,
                gradient_checkpointing_kwargs=self.args.gradient_checkpointing_kwargs)  # fmt: skip
            precision = self.accelerator.autocast()  # bf16 matrix products when the run is bf16 (AMX CPUs too)
        with model_ctx as model, torch.no_grad(), precision:
            out = self.kv_cache.generate(model, prompt_ids, max_new_tokens=max_new_tokens,
                                         stop_token_ids=list(self.eos_token_ids), pad_token_id=pad,
                                         generation_kwargs={"generation_config": self.generation_config})  # fmt: skip
        stops = set(self.eos_token_ids)
        results = []
        for seq in out.new_ids.tolist():
            end = next((k for k, t in enumerate(seq) if t in stops), None)
            results.append((seq if end is None else seq[: end + 1], None))
        return results

    def _rollout_func(self, prompts: list[Any], trainer: Any) -> dict[str, Any]:
        """TRL's ``rollout_func``: returns what :meth:`_generate_and_score_completions` prepared."""
        if self._pending_rollout is None or len(self._pending_rollout["prompt_ids"]) != len(prompts):
            raise RuntimeError("ReTermGRPOTrainer: no rollout prepared for this batch")
        return self._pending_rollout

    # ----------------------------------------------------------------------------- rollouts
    def _local_groups(self, states: list[PoolState], group_size: int) -> list[tuple[PoolState, list[int], int]]:
        """``(state, positions, global group index)`` of each group (part) held by this process."""
        base = self.accelerator.process_index * len(states)
        groups: list[tuple[PoolState, list[int], int]] = []
        for i, state in enumerate(states):
            g = (base + i) // group_size
            if groups and groups[-1][2] == g:
                groups[-1][1].append(i)
            else:
                groups.append((state, [i], g))
        return groups

    async def _rollouts(self, groups: list[tuple[PoolState, list[int], int]], step: int) -> tuple[list[GroupRollout], int]:
        args: ReTermGRPOConfig = self.args
        results = await self.engine.run(self.rollout_policy, [(s, len(p), g) for s, p, g in groups])
        resampled = 0
        if args.dynamic_sampling == "resample":
            for rnd in range(1, args.dynamic_sampling_max_rounds + 1):
                bad = [k for k, r in enumerate(results) if r.dropped is not None or r.zero_variance]
                if not bad:
                    break
                used = {r.state.state_id for r in results}
                self._retire(results)
                new = [self.pool.draw(step, (groups[k][2], rnd), exclude=used) for k in bad]
                again = await self.engine.run(self.rollout_policy,
                                              [(s, len(groups[k][1]), groups[k][2]) for s, k in zip(new, bad)])  # fmt: skip
                for k, r in zip(bad, again):
                    results[k] = r
                resampled += len(bad)
        if args.dynamic_sampling in ("skip", "resample"):
            for r in results:
                if r.zero_variance:
                    for a in r.attempts:
                        a.mask_reason = a.mask_reason or "zero_variance"
        return results, resampled

    def _retire(self, results: list[GroupRollout]) -> None:
        for r in results:
            if r.dropped is not None and r.dropped.startswith("diverged"):
                self.pool.mark_retired(r.state.state_id)

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        mode = "train" if self.model.training else "eval"
        group_size = self.num_generations if mode == "train" else self.num_generations_eval
        step = self.state.global_step
        if self.use_vllm and step != self._last_loaded_step:  # every rank, before its own loop (collective)
            self.vllm_generation.sync_weights()
            self._last_loaded_step = step
        if self.generation_copy is not None and step != self._copy_step:
            self.generation_copy.sync(self.accelerator.unwrap_model(self.model))
            self._copy_step = step
        self.kv_cache.clear()  # states computed with the weights before the last optimiser step
        states = self.pool.choose([x["state_id"] for x in inputs], step, self.accelerator.process_index, group_size)
        groups = self._local_groups(states, group_size)
        self._last_groups = groups
        t0 = time.monotonic()
        try:
            results, resampled = asyncio.run(self._rollouts(groups, step))
        finally:
            self.kv_cache.clear()
        rollout_s = time.monotonic() - t0
        self._retire(results)

        prompt_ids, completion_ids, env_mask, logprobs, rewards = [], [], [], [], []
        for (_, positions, _), gr in zip(groups, results):
            for pos, attempt in zip(positions, gr.attempts):
                inputs[pos] = gr.state.row()
                tok = attempt.tokens
                assert tok is not None
                masked = attempt.mask_reason is not None
                prompt_ids.append(tok.prompt_ids)
                completion_ids.append(tok.completion_ids)
                env_mask.append([0] * len(tok.env_mask) if masked else tok.env_mask)
                logprobs.append(tok.logprobs)
                no_signal = masked and attempt.mask_reason != "zero_variance"  # infra fault or dropped group
                rewards.append(None if no_signal else attempt.reward)
        self._pending_rollout = {
            "prompt_ids": prompt_ids,
            "completion_ids": completion_ids,
            "logprobs": None if any(lp is None for lp in logprobs) else logprobs,
            "env_mask": env_mask,
            "verifier_reward": rewards,
        }
        try:
            output = super()._generate_and_score_completions(inputs)
        finally:
            self._pending_rollout = None
        self._generation_round += 1
        self._after_rollout(mode, results, rollout_s, resampled, step)
        return output

    # ------------------------------------------------------------------------ bookkeeping
    def _after_rollout(self, mode: str, results: list[GroupRollout], rollout_s: float, resampled: int, step: int) -> None:
        args: ReTermGRPOConfig = self.args
        from accelerate.utils import gather_object

        local = self._summary(results, rollout_s, resampled)
        parts = gather_object([local])
        self._log_summary(mode, parts)
        if args.save_rollouts and mode == "train":
            self._save_rollouts(results, step)
        scored = [(gr.state.state_id, g, [a.reward for a in gr.attempts if a.reward is not None])
                  for (_, _, g), gr in zip(self._last_groups, results) if gr.dropped is None]  # fmt: skip
        if mode == "train" and args.skip_equal_after > 0:
            self.pool.record_groups(scored, gather=gather_object)
        if mode == "train" and args.mode == "reterm" and args.online_state_fraction > 0:
            signal = None  # global group indices whose rewards differ (judged on every rank's part of the group)
            if args.online_states_from == "signal_groups":
                signal = {g for (_, g), rewards in merge_group_parts(scored, gather_object).items() if len(set(rewards)) > 1}
            for (_, _, g), gr in zip(self._last_groups, results):
                if gr.dropped is not None or (signal is not None and g not in signal):
                    continue
                found: list[PoolState] = []
                for a in gr.attempts:
                    if len(found) >= args.online_states_per_group:
                        break
                    if a.trajectory is not None and a.mask_reason in (None, "zero_variance"):
                        found += online_states_from_attempt(a.trajectory, gr.state, step,
                                                            max_states=args.online_states_per_group - len(found))  # fmt: skip
                self.pool.add_candidates(found)
        if mode == "train" and self._generation_round % args.pool_refresh_steps == 0:
            evicted = self.pool.refresh(gather=gather_object)
            self.snapshots.discard(evicted)

    def _summary(self, results: list[GroupRollout], rollout_s: float, resampled: int) -> dict[str, Any]:
        s: dict[str, Any] = defaultdict(float)
        s["categories"] = []
        s["rollout_s"] = rollout_s
        s["resampled"] = resampled
        standard = self.args.mode == "standard"
        for gr in results:
            s["groups"] += 1
            s["online_groups"] += gr.state.source == "online"
            if gr.dropped is not None:
                s[f"dropped_{gr.dropped.split(':', 1)[0]}"] += 1
                s["attempts"] += len(gr.attempts)
                continue
            s["fork_s"] += gr.rebuild_s + gr.fork_s
            s["rebuilt"] += not gr.cached
            scored = [a for a in gr.attempts if a.reward is not None]
            s["scored_groups"] += bool(scored)
            s["zero_variance_groups"] += bool(scored) and gr.zero_variance
            # attempts that carry a learning signal: scored ones in a group whose rewards differ (issue 24)
            signal = len(scored) if len(scored) >= 2 and not gr.zero_variance else 0
            s["signal_attempts"] += signal
            s[f"signal_attempts/{gr.state.source}"] += signal
            s[f"scored/{gr.state.source}"] += len(scored)
            for a in gr.attempts:
                s["attempts"] += 1
                s["run_attempts"] += 1
                s["infra"] += a.mask_reason == "infra_fault"
                s["turns"] += a.turns
                if a.tokens is not None:
                    s["generated_tokens"] += a.tokens.generated_tokens
                    s["inexact_tokens"] += not a.tokens.exact
                if a.reward is None:
                    continue
                s["scored"] += 1
                s["reward"] += a.reward
                s["passed"] += a.trajectory is not None and a.trajectory.passed
                s["submitted"] += a.trajectory is not None and a.trajectory.stop_reason == "submitted"
                if standard and a.trajectory is not None:
                    cats = {fs.category for fs in localise(a.trajectory, include_history=True).states}
                    s["categories"] += [(c, a.trajectory.passed) for c in sorted(cats)]
                elif not standard:
                    s["categories"].append((gr.state.category or "unknown", bool(a.trajectory and a.trajectory.passed)))
        s["generation_s"] = self.rollout_policy.generation_s
        return dict(s)

    def _log_summary(self, mode: str, parts: list[dict[str, Any]]) -> None:
        total: Counter = Counter()
        cats: dict[str, list[bool]] = defaultdict(list)
        for p in parts:
            for k, v in p.items():
                if k == "categories":
                    for c, ok in v:
                        cats[c].append(bool(ok))
                elif k not in ("rollout_s", "generation_s"):
                    total[k] += v
        wall = max(p["rollout_s"] for p in parts)
        gen_s = max(p["generation_s"] for p in parts)
        if mode == "train":
            self.totals.update(total)
            self.totals["rollout_s"] += wall
            for c, oks in cats.items():
                self.totals[f"cat_attempts/{c}"] += len(oks)
                self.totals[f"cat_passed/{c}"] += sum(oks)
        nan = float("nan")
        m = self._metrics[mode]
        div = lambda a, b: a / b if b else nan  # noqa: E731
        dropped = sum(v for k, v in total.items() if k.startswith("dropped_"))
        m["reterm/reward_mean"].append(div(total["reward"], total["scored"]))
        m["reterm/pass_rate"].append(div(total["passed"], total["scored"]))
        m["reterm/submitted_share"].append(div(total["submitted"], total["scored"]))
        m["reterm/zero_variance_group_share"].append(div(total["zero_variance_groups"], total["scored_groups"]))
        m["reterm/signal_attempt_share"].append(div(total["signal_attempts"], total["scored"]))
        m["reterm/infra_fault_share"].append(div(total["infra"], total["attempts"]))
        m["reterm/dropped_group_share"].append(div(dropped, total["groups"]))
        m["reterm/turns_per_attempt"].append(div(total["turns"], total["run_attempts"]))
        m["reterm/fork_s"].append(div(total["fork_s"], total["groups"] - dropped))
        m["reterm/rollout_s"].append(wall)
        m["reterm/tokens_per_s"].append(div(total["generated_tokens"], gen_s))
        m["reterm/online_group_share"].append(div(total["online_groups"], total["groups"]))
        m["reterm/resampled_groups"].append(float(total["resampled"]))
        m["reterm/pool_online_states"].append(float(len(self.pool.online)))
        m["reterm/skipped_equal_states"].append(float(self.pool.counts.get("skipped_equal", 0)))
        for c, oks in sorted(cats.items()):
            m[f"reterm/recovery_rate/{c}"].append(sum(oks) / len(oks))

    def _save_rollouts(self, results: list[GroupRollout], step: int) -> None:
        folder = Path(self.args.output_dir) / "rollouts"
        folder.mkdir(parents=True, exist_ok=True)
        name = rollout_file_name(self._generation_round, step, self.accelerator.process_index)
        write_rollout_file(folder / name, rollout_rows(results, step, self._generation_round))

    # ------------------------------------------------------------------------------- loss
    def _zero_gradient_batch(self, model: Any, inputs: dict[str, Any]) -> bool:
        """Whether this micro-batch's GRPO loss has an exactly zero gradient, so its forward and backward can be
        skipped (our own shortcut, not TRL's): every advantage is 0 (zero-variance groups, masked attempts) or no
        token carries loss, with ``beta == 0`` (no KL term), a loss type whose every term is multiplied by the
        advantage (``grpo``/``bnpo``/``dr_grpo``/``dapo``/``luspo``; TRL 1.16 ``_compute_loss``), no entropy bonus
        and no router auxiliary loss. Single process only (DDP/DeepSpeed expect a forward pass on every rank).
        On 2 CPU cores one skipped SmolLM2 micro-batch saves ~10-20 s; most of a small model's groups are
        zero-variance."""
        if not model.training or self.accelerator.num_processes != 1 or self.is_deepspeed_enabled:
            return False
        if self.beta != 0.0 or self.loss_type not in ("grpo", "bnpo", "dr_grpo", "dapo", "luspo"):
            return False
        if getattr(self, "_entropy_bonus_enabled", False) or getattr(self, "aux_loss_enabled", False):
            return False
        mask = inputs["completion_mask"] if "tool_mask" not in inputs else inputs["completion_mask"] * inputs["tool_mask"]
        return bool((inputs["advantages"] == 0).all()) or not bool(mask.any())

    def compute_loss(self, model: Any, inputs: dict[str, Any], return_outputs: bool = False, num_items_in_batch: Any = None):
        """TRL's loss, except for a micro-batch whose gradient is exactly zero (:meth:`_zero_gradient_batch`):
        then a zero that gives every trainable parameter a zero gradient (so the optimiser sees the same update
        as after the full computation), without the model's forward and backward. Logged as
        ``reterm/skipped_microbatch_share``."""
        skip = not return_outputs and self._zero_gradient_batch(model, inputs)
        if model.training:
            m = self._metrics["train"]
            m["reterm/skipped_microbatch_share"].append(float(skip))
            adv = inputs["advantages"].float()
            m["reterm/advantage_abs_mean"].append(float(adv.abs().mean()))  # |A| of this micro-batch's attempts
            m["reterm/advantage_nonzero_share"].append(float((adv != 0).float().mean()))
        if not skip:
            return super().compute_loss(model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch)
        return sum(p.sum() for p in model.parameters() if p.requires_grad) * 0.0

    # ---------------------------------------------------------------------- checkpoints, end
    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        super()._save_checkpoint(model, trial)
        if self.args.should_save:
            from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

            folder = Path(self._get_output_dir(trial=trial)) / f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
            write_json_atomic(folder / POOL_STATE_FILE, {"pool": self.pool.state_dict(), "totals": dict(self.totals),
                                                         "generation_round": self._generation_round})  # fmt: skip

    def load_pool_state(self, checkpoint: str | os.PathLike[str]) -> bool:
        """Restore the online pool and the run's counts saved with a checkpoint (resume); returns whether
        the checkpoint had them."""
        path = Path(checkpoint) / POOL_STATE_FILE
        if not path.is_file():
            return False
        saved = json.loads(path.read_text())
        self.pool.load_state_dict(saved.get("pool", saved))
        self.totals = Counter(saved.get("totals", {}))
        self._generation_round = int(saved.get("generation_round", 0))
        return True

    def close(self) -> None:
        """Release the cached failure-state snapshots (end of training; idempotent)."""
        self.snapshots.close()

    def train(self, *args: Any, **kwargs: Any):
        try:
            return super().train(*args, **kwargs)
        finally:
            self.close()
