"""Generation caps under which a drill is winnable: the tokens of the reference's longest turn, its turns.

A cap on tokens per turn or on turns that the task's own reference solution does not fit in makes the item
unwinnable for every model, which confounds any comparison of models (issue 24: 36 of 120 held-out items
needed a tool call longer than the evaluation's 56 tokens). These functions measure what the reference
needs, in the evaluated model's tokens, so that a run can state its unwinnable items and a test can check
the run's configuration (``tests/test_caps.py``).

A turn is the assistant's tool-call text as :mod:`reterm.policies.scripted` writes it (the harness's own
format, :func:`reterm.agent.protocol.format_tool_call`) plus the end-of-turn token, which a model's turn
also spends (:func:`reterm.policies.scripted.turn_tokens`, the count :class:`~reterm.policies.scripted.TokenCapped`
cuts by).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reterm.drills.generate import recovery_commands
from reterm.policies.scripted import bash_call, submit_call, turn_tokens


@dataclass(frozen=True)
class ReferenceNeeds:
    """What the reference needs on one drill: tokens of its longest turn, and its turns (submit included).

    ``solution_*`` is the whole attempt from the task's start (``solution/solve.sh``); ``recovery_*`` the
    recovery attempt after the family's first mistake (``[metadata] recovery``, else the solution).
    """

    task: str
    solution_turn_tokens: int
    solution_turns: int
    recovery_turn_tokens: int
    recovery_turns: int

    def fits(self, max_turn_tokens: int, max_turns: int) -> bool:
        """Both the solution and the recovery fit in ``max_turn_tokens`` a turn and ``max_turns`` turns."""
        return (max(self.solution_turn_tokens, self.recovery_turn_tokens) <= max_turn_tokens
                and max(self.solution_turns, self.recovery_turns) <= max_turns)  # fmt: skip


def reference_needs(task_dir: str | Path, tokenizer: Any) -> ReferenceNeeds:
    """The :class:`ReferenceNeeds` of one drill folder (or any task with a ``solution/solve.sh``).

    Raises:
        ValueError: the task has no solution steps (named by folder).
    """
    from reterm.tasks import solution_steps

    task_dir = Path(task_dir)
    solution = list(solution_steps(task_dir))
    if not solution:
        raise ValueError(f"{task_dir}: the task has no solution steps (solution/solve.sh)")
    recovery = recovery_commands(task_dir)
    submit = turn_tokens(submit_call(), tokenizer)

    def longest(cmds: list[str]) -> int:
        return max([submit] + [turn_tokens(bash_call(c), tokenizer) for c in cmds])

    return ReferenceNeeds(task_dir.name, longest(solution), len(solution) + 1, longest(recovery), len(recovery) + 1)


def unwinnable(task_dirs: Iterable[str | Path], tokenizer: Any, *, max_turn_tokens: int,
               max_turns: int) -> list[ReferenceNeeds]:  # fmt: skip
    """The drills whose reference does not fit the caps (empty: every item is winnable)."""
    needs = [reference_needs(d, tokenizer) for d in task_dirs]
    return [n for n in needs if not n.fits(max_turn_tokens, max_turns)]
