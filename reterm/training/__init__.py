"""Training helpers shared by ``train/sft.py`` and ``train/grpo.py``.

- :mod:`reterm.training.sft_data`: ReTerm-10K records -> conversational prompt/completion rows.
- :mod:`reterm.training.models`: model names (``smollm2``, ``tiny-qwen3.5``) -> folders, model/tokenizer
  loading (Qwen3.5 as ``Qwen3_5ForCausalLM``), the LoRA config.
- :mod:`reterm.training.merge`: merge a LoRA adapter into a full checkpoint for publishing.
- :mod:`reterm.training.check`: ``--check`` overrides (tiny model, CPU, one step) for GPU recipes.
- :mod:`reterm.training.outputs`: curves (PNG + CSV), package versions, recipe copy, training summary.
- :mod:`reterm.training.likelihood`: held-out log-likelihood of reference recoveries.
- :mod:`reterm.training.grpo_config` / :mod:`reterm.training.grpo_trainer`: ``ReTermGRPOConfig`` and
  ``ReTermGRPOTrainer`` (TRL's GRPO with groups of recovery attempts forked from failure states).
- :mod:`reterm.training.failure_pool`: seed and online failure states, per-group choices, snapshot cache.
- :mod:`reterm.training.grpo_rollout`: rebuild a state, fork G environments, run the attempts in lock-step.
- :mod:`reterm.training.grpo_policy`: the rollout policy that keeps exact token ids (``env_mask``).
- :mod:`reterm.training.grpo_outputs`: GRPO learning curves (CSV + PNG) and the recovery table.
"""
