"""The one reader of verifier rewards: from Harbor's reward mapping to one checked scalar.

Harbor's :class:`harbor.verifier.verifier.Verifier` reads ``/logs/verifier/reward.txt`` (one number)
or ``reward.json`` (a flat mapping) and rejects non-numeric and non-finite values. What it leaves to
the caller, and this module decides for every stage (the episode loop's verifier, evaluation of
Harbor job folders, task verification):

- the scalar: ``rewards["reward"]``, or the only value when there is one key;
- several keys and none named ``reward``, a non-number (``true`` included), a non-finite number or
  a value outside ``[0, 1]`` -> :class:`RewardError`, a verifier fault naming the file and the value
  (never a zero, never an agent failure: the reward file is written by the task's tests, and a task
  whose tests write 1.7 or ``{"a": 1, "b": 0}`` is broken, whatever the agent did);
- no reward at all -> ``None`` (Harbor: a missing reward file is an error, not a zero; the caller
  decides whether that is a fault or, after an agent timeout, a failure).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

REWARD_MIN, REWARD_MAX = 0.0, 1.0
REWARD_FILES = ("reward.json", "reward.txt")  # the order Harbor reads them in


class RewardError(ValueError):
    """A reward that cannot be scored (out of range, not a number, ambiguous): a verifier fault.

    The message names where the reward came from and the offending value.
    """


def reward_source(verifier_dir: str | Path | None, fallback: str = "/logs/verifier/reward.{json,txt}") -> str:
    """The reward file a verifier folder holds (``reward.json`` before ``reward.txt``, as Harbor reads
    them), for messages; ``fallback`` when neither exists or no folder is given."""
    if verifier_dir is not None:
        for name in REWARD_FILES:
            path = Path(verifier_dir) / name
            if path.is_file():
                return str(path)
    return fallback


def scalar_reward(rewards: Mapping[str, Any] | float | int | None, source: str) -> float | None:
    """The checked scalar reward of a verifier result.

    Args:
        rewards: Harbor's ``VerifierResult.rewards`` (a mapping), a bare number, or ``None``.
        source: where the rewards came from (a file path), named in errors.

    Returns:
        A float in ``[REWARD_MIN, REWARD_MAX]``, or ``None`` when there is no reward (``None`` or ``{}``).

    Raises:
        RewardError: several rewards and none named ``reward``; a value that is not a finite number
            (booleans included) or lies outside ``[0, 1]``.
    """
    if rewards is None:
        return None
    if isinstance(rewards, Mapping):
        if not rewards:
            return None
        if "reward" in rewards:
            key, value = "reward", rewards["reward"]
        elif len(rewards) == 1:
            key, value = next(iter(rewards.items()))
        else:
            raise RewardError(f"{source}: several rewards {sorted(rewards)} and none named 'reward'; "
                              "cannot score it as pass/fail")  # fmt: skip
    else:
        key, value = "reward", rewards
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RewardError(f"{source}: reward {key!r} is {value!r}, not a number")
    value = float(value)
    if not math.isfinite(value) or not REWARD_MIN <= value <= REWARD_MAX:
        raise RewardError(f"{source}: reward {key!r} is {value!r}, outside [{REWARD_MIN:g}, {REWARD_MAX:g}]")
    return value


def training_reward(reward: float, submitted: bool, unsubmitted_scale: float = 1.0) -> float:
    """The reward GRPO trains on: the verifier's reward, scaled down for an attempt that never submitted.

    Args:
        reward: the verifier's checked scalar reward (:func:`scalar_reward`), in ``[0, 1]``.
        submitted: whether the attempt ended with the agent's own ``submit`` (not the turn limit, the time
            budget or the parse-error stop).
        unsubmitted_scale: the factor in ``[0, 1]`` for an attempt that did not submit. ``1.0`` trains on the
            verifier's reward alone (the default); ``0.5`` ranks a pass the agent declared above one it reached
            by running out of turns, while both stay above a failure.

    Returns:
        ``reward`` if ``submitted`` else ``reward * unsubmitted_scale``.

    Raises:
        ValueError: ``unsubmitted_scale`` outside ``[0, 1]``.

    Why: with the 0/1 verifier reward alone nothing favours ending an attempt, and the CPU ReTerm-GRPO run of
    2026-12-05 stopped submitting (3 of 150 recovery attempts submitted; issue 30). Terminal-Bench gives an agent
    that never declares done only its timeout, so the habit costs time there. Evaluation always scores the
    verifier's reward as is.
    """
    if not 0.0 <= unsubmitted_scale <= 1.0:
        raise ValueError(f"unsubmitted_reward_scale: {unsubmitted_scale} is not in [0, 1]")
    return reward if submitted else reward * unsubmitted_scale
