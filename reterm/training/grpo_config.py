"""Configuration of ReTerm-GRPO: TRL's ``GRPOConfig`` plus the fields of multi-turn terminal rollouts.

The trainer (:class:`reterm.training.grpo_trainer.ReTermGRPOTrainer`) keeps TRL's meaning for every
inherited field; the ones that matter most here:

- ``num_generations`` (G): recovery attempts per failure state (a *group*); each runs in its own fork of
  the environment at that state.
- ``per_device_train_batch_size`` x ``gradient_accumulation_steps`` x processes / G: failure states per
  optimiser step.
- ``max_completion_length``: the token budget of one attempt, **all turns together**, observation tokens
  included (as in TRL's own tool loop). ``max_turn_tokens`` caps one turn.
- ``temperature``/``top_p``: sampling of every turn. ``chat_template_kwargs``: e.g. ``enable_thinking`` for
  Qwen3.5.
- ``loss_type`` (TRL default ``dapo``): token-level normalisation over the tokens that carry loss, so
  masked attempts (infrastructure faults, dropped groups) neither count nor dilute the loss.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trl import GRPOConfig

from reterm.generation import MAX_CONSECUTIVE_PARSE_ERRORS, MAX_TURN_TOKENS

MODES = ("reterm", "standard")
FORK_METHODS = ("auto", "snapshot", "replay")
DYNAMIC_SAMPLING = ("none", "skip", "resample")
ONLINE_STATES_FROM = ("any_group", "signal_groups")


@dataclass
class ReTermGRPOConfig(GRPOConfig):
    r"""
    Configuration class for [`ReTermGRPOTrainer`]: every field of TRL's [`~trl.GRPOConfig`] plus the ones below.

    Parameters:
        mode (`str`, *optional*, defaults to `"reterm"`):
            `"reterm"`: a group starts at a failure state (the agent's own history up to and including the failing
            step is the prompt, the G completions are recovery attempts from forks of that state). `"standard"`:
            standard GRPO, a group starts at the task's start (the baseline of the paper's comparison; same tasks,
            G, turns and token budgets).
        task_dirs (`list[str]`, *optional*, defaults to `["tasks"]`):
            Folders holding Harbor task folders; a row's `task_id` is looked up as `<dir>/<task_id>` in order.
            Relative paths are tried against the working directory, then the repository.
        environment (`str`, *optional*, defaults to `"local"`):
            Where attempts run: `"local"` (ReTerm's sandbox, `reterm.sandbox.local`), a Harbor environment type
            (`"docker"`, `"daytona"`, `"modal"`, ...) or an import path `module:Class`.
        fork_method (`str`, *optional*, defaults to `"auto"`):
            How the G attempts get the failure state: `"snapshot"` (snapshot once, fork G times; local sandbox
            only), `"replay"` (start G fresh environments and re-run the prefix's commands in each; any Harbor
            environment; a group in which a replay diverged is dropped and counted), `"auto"` (snapshot on the
            local sandbox, else replay).
        max_turns (`int`, *optional*, defaults to `30`):
            Turns generated per attempt (the failure prefix does not count).
        max_turn_tokens (`int`, *optional*, defaults to `reterm.generation.MAX_TURN_TOKENS`):
            Tokens generated per turn at most (the attempt's total is `max_completion_length`).
        command_timeout_s (`float` or `None`, *optional*, defaults to `None`):
            A command's timeout when the model gives none (`None`: the harness default, 30 s).
        agent_time_budget_s (`float` or `None`, *optional*, defaults to `None`):
            Wall time of one attempt (model + commands); `None`: the task's `[agent] timeout_sec`.
        max_consecutive_parse_errors (`int` or `None`, *optional*, defaults to `reterm.generation.MAX_CONSECUTIVE_PARSE_ERRORS`):
            End an attempt after this many replies in a row without a valid action.
        merged_generation (`bool`, *optional*, defaults to `False`):
            Generate rollouts from a plain copy of the policy with its LoRA update merged in, in bf16 when `bf16`
            (`reterm.training.generation_copy.MergedGenerationCopy`), re-synced after every optimiser step: what
            TRL's vLLM path does, inside the process. Needs the kit's transformers generation (`kv_cache`, no
            vLLM); costs one more copy of the weights.
        unsubmitted_reward_scale (`float`, *optional*, defaults to `1.0`):
            The trained reward of an attempt that ended without the agent's `submit` (turn limit, time budget,
            parse errors) is the verifier's reward times this (`reterm.rewards.training_reward`); `1.0`: the
            verifier's reward alone. Evaluation never scales.
        online_state_fraction (`float`, *optional*, defaults to `0.5`):
            ReTerm mode: probability that a group starts from a failure state of the current policy's own failed
            attempts (the online part of the pool) instead of a seed state of the dataset, once online states
            exist. `0` disables the online refresh.
        pool_refresh_steps (`int`, *optional*, defaults to `1`):
            Every this many optimiser steps, the failure states localised in failed attempts since the last refresh
            are added to the pool (gathered from every process, so the pool is identical on every rank).
        max_online_states (`int`, *optional*, defaults to `512`):
            Size of the online part of the pool; the oldest states are evicted first.
        online_states_per_group (`int`, *optional*, defaults to `1`):
            At most this many new failure states are taken from one group's failed attempts (diversity).
        online_states_from (`str`, *optional*, defaults to `"any_group"`):
            Which groups' failed attempts give online failure states: `"any_group"`, or `"signal_groups"`, only
            groups whose rewards differ (another attempt from the same state passed, so the task is within the
            current policy's reach there). Ours, not the paper's: on the embedded default, 15 groups from online
            states of any group gave 0 passes in 60 attempts while the seed states' groups gave 10 in 60
            (issue 30), so half the budget bought no gradient.
        max_state_prompt_tokens (`int` or `None`, *optional*, defaults to `None`):
            Failure states whose prompt is longer than this (tokens, chat template with tools) are left out of the
            pool (counted).
        snapshot_cache_size (`int`, *optional*, defaults to `16`):
            Snapshots of materialised failure states kept for reuse (local sandbox); least recently used released
            first.
        dynamic_sampling (`str`, *optional*, defaults to `"none"`):
            Groups whose rewards are all equal carry no gradient. `"none"`: keep them (their advantages are 0);
            `"skip"`: also give them zero loss weight; `"resample"`: replace them by groups from newly drawn states
            (DAPO's dynamic sampling, https://huggingface.co/papers/2503.14476) for up to
            `dynamic_sampling_max_rounds` rounds, then skip the rest.
        dynamic_sampling_max_rounds (`int`, *optional*, defaults to `2`):
            Resampling rounds per step with `dynamic_sampling="resample"`.
        skip_equal_after (`int`, *optional*, defaults to `0`):
            Skip a state (or task start) **before** rolling it out once its last `skip_equal_after` groups all gave
            equal rewards (0: never skip); a skipped state is replaced by another drawn from the pool, and is still
            tried with probability `skip_equal_explore`, so one the policy has come to solve sometimes can return
            (GRESO, https://huggingface.co/papers/2506.02177: skipping before rollout saves the attempts that
            resampling after it spends). Same rule in both modes; skipped draws are counted
            (`reterm/skipped_equal_states`).
        skip_equal_explore (`float`, *optional*, defaults to `0.2`):
            Probability of still rolling out a state that the rule above would skip.
        save_rollouts (`bool`, *optional*, defaults to `True`):
            Write every attempt's trajectory (JSON lines, one file per step) to `output_dir/rollouts/`.
        kv_cache (`bool`, *optional*, defaults to `True`):
            Transformers generation (not vLLM, which caches prefixes itself): keep each attempt's key/value states
            between its turns, so a turn reads only the new observation tokens
            (:class:`reterm.policies.kv_cache.PrefixKVCache`; cleared at every rollout, after the weights change).
    """

    mode: str = field(default="reterm", metadata={"help": "reterm (groups at failure states) or standard (task start)."})
    task_dirs: list[str] = field(
        default_factory=lambda: ["tasks"], metadata={"help": "Folders holding the Harbor task folders (task_id lookup)."}
    )
    environment: str = field(
        default="local", metadata={"help": "local, a Harbor environment type (docker, daytona, ...) or module:Class."}
    )
    fork_method: str = field(default="auto", metadata={"help": "auto, snapshot (local sandbox) or replay."})
    max_turns: int = field(default=30, metadata={"help": "Turns generated per attempt (the prefix does not count)."})
    max_turn_tokens: int = field(default=MAX_TURN_TOKENS, metadata={"help": "Tokens generated per turn at most."})
    command_timeout_s: float | None = field(default=None, metadata={"help": "Default command timeout (s)."})
    agent_time_budget_s: float | None = field(
        default=None, metadata={"help": "Wall time of one attempt (s); default: the task's [agent] timeout_sec."}
    )
    max_consecutive_parse_errors: int | None = field(
        default=MAX_CONSECUTIVE_PARSE_ERRORS, metadata={"help": "End an attempt after this many invalid replies in a row."}
    )
    merged_generation: bool = field(
        default=False, metadata={"help": "Generate from a merged (bf16 when bf16) copy of the policy, synced every step."}
    )
    unsubmitted_reward_scale: float = field(
        default=1.0, metadata={"help": "Trained reward of an attempt that never submitted: verifier reward x this."}
    )
    online_state_fraction: float = field(
        default=0.5, metadata={"help": "Share of groups drawn from the policy's own new failure states."}
    )
    pool_refresh_steps: int = field(default=1, metadata={"help": "Add new online failure states every N steps."})
    max_online_states: int = field(default=512, metadata={"help": "Online failure states kept (oldest evicted)."})
    online_states_per_group: int = field(default=1, metadata={"help": "New failure states taken from one group."})
    online_states_from: str = field(
        default="any_group", metadata={"help": "any_group, or signal_groups: online states only from groups whose rewards differ."}
    )
    max_state_prompt_tokens: int | None = field(
        default=None, metadata={"help": "Leave out failure states with longer prompts (tokens)."}
    )
    snapshot_cache_size: int = field(default=16, metadata={"help": "Failure-state snapshots kept for reuse."})
    dynamic_sampling: str = field(default="none", metadata={"help": "none, skip or resample zero-variance groups."})
    dynamic_sampling_max_rounds: int = field(default=2, metadata={"help": "Resampling rounds per step."})
    skip_equal_after: int = field(
        default=0, metadata={"help": "Skip states whose last N groups gave equal rewards before rollout (0: off)."}
    )
    skip_equal_explore: float = field(default=0.2, metadata={"help": "Chance to still try a skipped state."})
    save_rollouts: bool = field(default=True, metadata={"help": "Write attempts' trajectories to output_dir/rollouts."})
    kv_cache: bool = field(default=True, metadata={"help": "Transformers generation: reuse key/value states across turns."})

    def __post_init__(self):
        super().__post_init__()
        if self.mode not in MODES:
            raise ValueError(f"mode: {self.mode!r} is not one of {MODES}")
        if self.fork_method not in FORK_METHODS:
            raise ValueError(f"fork_method: {self.fork_method!r} is not one of {FORK_METHODS}")
        if self.fork_method == "snapshot" and self.environment != "local":
            raise ValueError(f"fork_method: 'snapshot' needs environment 'local' (got {self.environment!r}); use replay")
        if self.dynamic_sampling not in DYNAMIC_SAMPLING:
            raise ValueError(f"dynamic_sampling: {self.dynamic_sampling!r} is not one of {DYNAMIC_SAMPLING}")
        if self.skip_equal_after < 0 or not 0.0 <= self.skip_equal_explore <= 1.0:
            raise ValueError(f"skip_equal_after must be >= 0 (got {self.skip_equal_after}) and skip_equal_explore "
                             f"in [0, 1] (got {self.skip_equal_explore})")
        if not 0.0 <= self.unsubmitted_reward_scale <= 1.0:
            raise ValueError(f"unsubmitted_reward_scale: {self.unsubmitted_reward_scale} is not in [0, 1]")
        if not 0.0 <= self.online_state_fraction <= 1.0:
            raise ValueError(f"online_state_fraction: {self.online_state_fraction} is not in [0, 1]")
        if self.online_states_from not in ONLINE_STATES_FROM:
            raise ValueError(f"online_states_from: {self.online_states_from!r} is not one of {ONLINE_STATES_FROM}")
        for name in ("max_turns", "max_turn_tokens", "pool_refresh_steps", "snapshot_cache_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be at least 1, got {getattr(self, name)}")
        if self.max_completion_length is not None and self.max_turn_tokens > self.max_completion_length:
            raise ValueError(
                f"max_turn_tokens ({self.max_turn_tokens}) exceeds max_completion_length "
                f"({self.max_completion_length}), the budget of all turns of an attempt together"
            )
        if isinstance(self.task_dirs, str):
            self.task_dirs = [self.task_dirs]

    @property
    def resolved_fork_method(self) -> str:
        """``snapshot`` or ``replay`` (``auto``: snapshot on the local sandbox, replay elsewhere)."""
        if self.fork_method != "auto":
            return self.fork_method
        return "snapshot" if self.environment == "local" else "replay"
