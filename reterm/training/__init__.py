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

Recipes and scripts name activation checkpointing ``gradient_checkpointing`` (``_kwargs``): the one name both the
GPU set's transformers 5.20 (requirements-gpu.txt, which vLLM 0.33 caps below 5.21) and the CPU kit's 5.24 read.
5.24 renamed the field ``activation_checkpointing`` and keeps the old name as an alias, with a FutureWarning that
advises the new name, which 5.20's parser refuses; importing this package silences that one warning (only the
``TrainingArguments`` field's, not other deprecations).
"""

import warnings

warnings.filterwarnings(
    "ignore",
    message=r"`gradient_checkpointing(_kwargs)?` is deprecated and will be removed in v6",
    category=FutureWarning,
)
