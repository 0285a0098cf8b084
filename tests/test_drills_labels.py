"""Labels from evidence (reterm.data.drills.evidence_label): an error category only where a failing command shows
it; an attempt with parse errors only gets its own label, which the dataset card counts apart."""

from __future__ import annotations

from pathlib import Path

from reterm.data.drills import PARSE_ERRORS_ONLY, UNLOCALISED, evidence_label
from reterm.recovery.attempts import Attempt
from reterm.trajectory import Action, Step, Trajectory


def _attempt(*steps: Step) -> Attempt:
    traj = Trajectory(task_id="t", instruction="do it", system_prompt="sys", steps=list(steps))
    return Attempt(task_dir=Path("t"), trajectory=traj)


PROSE = Step(index=0, model_text="I think we should list files.", parse_error="no_tool_call", observation="x")
OK = Step(index=1, model_text="", action=Action(tool="bash", command="ls"), observation="a\n[exit status: 0]",
          exit_status=0)  # fmt: skip


def test_a_category_needs_evidence():
    parse_only = _attempt(PROSE, PROSE.model_copy(update={"index": 1}))
    assert evidence_label(parse_only, "missing_dependency", False, "own") == PARSE_ERRORS_ONLY
    assert evidence_label(_attempt(PROSE, OK), "missing_dependency", False, "own") == UNLOCALISED
    # the localiser found the failing step, or the drill's first mistake was typed: the category stands
    assert evidence_label(parse_only, "wrong_command", True, "own") == "wrong_command"
    assert evidence_label(_attempt(OK), "path_permission", False, "injected") == "path_permission"


def test_the_card_counts_labels_apart():
    from reterm.cards.dataset import NOT_A_CATEGORY, _is_category

    assert not _is_category(PARSE_ERRORS_ONLY) and not _is_category(UNLOCALISED) and set(NOT_A_CATEGORY) == {
        PARSE_ERRORS_ONLY, UNLOCALISED}
    assert _is_category("missing_dependency")
