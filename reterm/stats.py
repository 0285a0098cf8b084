"""Intervals for rates and for paired differences: what every reported number of the kit carries.

- :func:`wilson`: the Wilson score interval of a binomial rate (95% by default). Unlike the normal
  approximation it stays inside [0, 1] and is informative at 0/n and n/n (Wilson 1927; the interval the
  recovery-benchmark literature reports for pass rates).
- :func:`paired_bootstrap`: the percentile bootstrap interval of the difference of two models' mean scores
  on the *same* items (resampling items, so that item difficulty cancels). A difference is called real
  only when its interval excludes 0.

A rate is reported as :func:`rate` ``{"value", "ci95": [lo, hi], "n"}`` (``value`` None when ``n`` is 0).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any

Z95 = 1.959963984540054


def wilson(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval ``(lo, hi)`` of ``successes / n``.

    Raises:
        ValueError: ``n < 0`` or ``successes`` outside ``0..n``.
    """
    if n < 0 or not 0 <= successes <= n:
        raise ValueError(f"wilson: successes={successes}, n={n}")
    if n == 0:
        return (0.0, 1.0)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def rate(outcomes: Sequence[bool | int | float]) -> dict[str, Any]:
    """``{"value", "ci95": [lo, hi], "n", "successes"}`` of binary outcomes (values >= 0.5 count as passed)."""
    n = len(outcomes)
    k = sum(1 for o in outcomes if float(o) >= 0.5)
    lo, hi = wilson(k, n)
    return {"value": (k / n) if n else None, "ci95": [round(lo, 4), round(hi, 4)], "n": n, "successes": k}


def paired_bootstrap(a: Sequence[float], b: Sequence[float], *, n_boot: int = 5000, seed: int = 0,
                     level: float = 0.95) -> dict[str, Any]:  # fmt: skip
    """Mean of ``b - a`` over paired items with a percentile bootstrap interval.

    Args:
        a, b: per-item scores (0/1 or rewards) of two models on the same items, in the same order.
        n_boot: bootstrap resamples.
        seed: resampling seed (the interval is reproducible).
        level: coverage of the interval.

    Returns:
        ``{"diff", "ci95": [lo, hi], "n", "excludes_zero"}`` (``diff`` None and no interval when n is 0).

    Raises:
        ValueError: ``a`` and ``b`` differ in length.
    """
    if len(a) != len(b):
        raise ValueError(f"paired_bootstrap: {len(a)} vs {len(b)} items (they must be the same items)")
    n = len(a)
    if n == 0:
        return {"diff": None, "ci95": None, "n": 0, "excludes_zero": False}
    d = [float(y) - float(x) for x, y in zip(a, b)]
    rng = random.Random(seed)
    means = sorted(sum(d[rng.randrange(n)] for _ in range(n)) / n for _ in range(n_boot))
    lo = means[int((1 - level) / 2 * n_boot)]
    hi = means[min(n_boot - 1, int((1 + level) / 2 * n_boot))]
    return {"diff": round(sum(d) / n, 4), "ci95": [round(lo, 4), round(hi, 4)], "n": n,
            "excludes_zero": lo > 0 or hi < 0}


def group_signal(rewards: list[float | None]) -> tuple[int, bool]:
    """``(scored attempts, whether their rewards differ)`` of one group (``None`` = an infrastructure fault)."""
    scored = [r for r in rewards if r is not None]
    return len(scored), len(scored) >= 2 and len(set(scored)) > 1


def signal_attempt_share(groups: list[list[float | None]], *, n_boot: int = 5000, seed: int = 0) -> dict[str, Any]:
    """The share of attempts that carry a GRPO learning signal, over some groups: ``{"value", "ci95", "n", "groups", "signal_groups"}``.

    ``value`` = attempts in groups with differing rewards / scored attempts; ``n`` = scored attempts; the
    interval is a percentile bootstrap over groups (attempts of one group are not independent). A group
    whose rewards are all equal has zero advantages and no gradient (GRPO; TRL 1.16), so only attempts in
    groups with differing rewards count. Groups with fewer than two scored attempts are left out.

    Args:
        groups: per group, its attempts' rewards (``None`` for an infrastructure fault).
    """
    cells = [group_signal(g) for g in groups]
    cells = [(k, s) for k, s in cells if k >= 2]
    total = sum(k for k, _ in cells)
    if not total:
        return {"value": None, "ci95": None, "n": 0, "groups": 0, "signal_groups": 0}
    value = sum(k for k, s in cells if s) / total
    rng = random.Random(seed)
    boots = []
    for _ in range(n_boot):
        draw = [cells[rng.randrange(len(cells))] for _ in cells]
        den = sum(k for k, _ in draw)
        boots.append(sum(k for k, s in draw if s) / den)
    boots.sort()
    lo, hi = boots[int(0.025 * n_boot)], boots[min(n_boot - 1, int(0.975 * n_boot))]
    return {"value": round(value, 4), "ci95": [round(lo, 4), round(hi, 4)], "n": total, "groups": len(cells),
            "signal_groups": sum(1 for _, s in cells if s)}  # fmt: skip


POWER_Z = 7.85
"""``(z_{0.975} + z_{0.8})^2``: the constant of the paired sample-size formula (80% power, 95% two-sided)."""


def min_detectable(psi: float, n: int) -> float | None:
    """Smallest paired difference detected with 80% power at 95% with ``n`` items and discordance ``psi``."""
    if n <= 0 or psi <= 0:
        return None
    return round(math.sqrt(POWER_Z * psi / (n + POWER_Z)), 4)


def items_needed(psi: float, delta: float) -> int | None:
    """Paired items needed to detect ``delta`` (80% power, 95%) at discordance ``psi`` (None if impossible)."""
    if delta <= 0 or psi <= delta**2:
        return None
    return math.ceil(POWER_Z * (psi - delta**2) / delta**2)


def paired_power(a: Sequence[float], b: Sequence[float]) -> dict[str, Any]:
    """The power of a paired comparison of 0/1 outcomes: ``{"discordance", "min_detectable_80"}``.

    ``discordance`` (psi) is the share of items on which ``a`` and ``b`` differ; with n items, a difference
    smaller than ``min_detectable_80`` = sqrt(7.85 psi / (n + 7.85)) is missed more than 20% of the time
    (the normal approximation of McNemar's test; n = 7.85 (psi - delta^2) / delta^2 solved for delta).
    """
    n = len(a)
    psi = sum(float(x) != float(y) for x, y in zip(a, b)) / n if n else 0.0
    return {"discordance": round(psi, 4), "min_detectable_80": min_detectable(psi, n)}
