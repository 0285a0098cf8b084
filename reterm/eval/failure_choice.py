"""Which failed attempt of a group becomes the failure state that recovery attempts fork from.

One rule for every experiment that picks a policy's own failure state on a multi-stage drill (the mechanism's
``failure_state`` arm, :mod:`reterm.eval.mechanism`, and the drills evaluation's Recovery@1 from own chain
failure states, :mod:`reterm.eval.drills`): the failed attempt that got furthest. On a chain the verifier reports
its stages done (:func:`reterm.drills.multistage.stages_done`), and the failed attempt with the most stages done is
chosen (ties, and drills without the report: :func:`reterm.recovery.attempts.most_progress`: fewest failed
verifier checks, then more commands that exited 0, fewer parse errors, the earliest).
"""

from __future__ import annotations

from typing import Any

from reterm.drills.multistage import stages_done
from reterm.recovery.attempts import most_progress


def attempt_stages_done(attempt: Any) -> int | None:
    """Stages done by an attempt (the last ``STAGES DONE: j of k`` line of its verifier output, kept in its
    trajectory's ``metadata["verifier_output_tail"]``); ``None`` without one (not a chain, or no verifier run).

    Raises:
        ValueError: a malformed progress line (:func:`reterm.drills.multistage.stages_done`).
    """
    sd = stages_done(attempt.trajectory.metadata.get("verifier_output_tail"))
    return None if sd is None else sd[0]


def chain_most_progress(attempts: list[Any]) -> Any | None:
    """The failed attempt (with at least one step) with the most stages done, ties broken by
    :func:`most_progress`; plain :func:`most_progress` when no failed attempt has the report. ``None``: no failed
    attempt with a step. ``attempts``: :class:`reterm.recovery.attempts.Attempt` objects of one task."""
    failed = [a for a in attempts if a.failed and a.trajectory.steps]
    known = [(d, a) for a in failed if (d := attempt_stages_done(a)) is not None]
    if not known:
        return most_progress(attempts)
    best = max(d for d, _ in known)
    return most_progress([a for d, a in known if d == best])
