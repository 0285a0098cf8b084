"""Failure localisation: the failure states of a trajectory, ready to fork recovery attempts from.

:func:`localise` reads a :class:`~reterm.trajectory.Trajectory`, labels every step with the classifier
(rules, plus the optional LLM judge), and returns a :class:`LocalisationResult` holding the failure
states, as :class:`reterm.recovery.state.State` objects (the kit's one failure-state type; source ``own``,
:meth:`State.with_source` relabels one): the history up to the failing step (``Trajectory.prefix``) shown
after the trajectory's system prompt and instruction, its content-derived id, the failing step (``step``,
``command``, ``output``, ``exit_status``, ``evidence``), its category, how to rebuild its environment
(``replay_commands``), and what else the localiser found in :attr:`State.localisation`
(:class:`reterm.recovery.state.Localisation`: confidence, labelling source and rule, signals,
``resolved_by``, ``repeats``, ``consequential``, ``primary``, ``trial_passed``, ``origin_id``).

Rules (docs/ERROR_TAXONOMY.md, "Localisation", has the rationale):

- **What counts.** A step is a failure when the classifier gives it a failure category: a non-zero exit
  that matters (probes answering "no" do not), error patterns even with exit 0, a timed-out step. A
  step with no error is also a failure when a later step explicitly **undoes** it (``git checkout --``
  / ``rm`` of the file it wrote, ``pip uninstall`` of what it installed, ``git revert``/``reset`` of its
  commit): category from what was undone, low confidence.
- **Repeats** of the same failure (same category, a near-identical command) are merged into the first
  occurrence (``localisation.repeats``); they are one failure state, not several.
- **Resolved** failures: a later near-identical command (same program, similar text) succeeds;
  ``localisation.resolved_by`` holds its index and the state is not ``consequential``.
- **Premature completion.** A failed trial that ended in ``submit`` with no unresolved failure before
  it gets a ``premature_completion`` state at the submit step; its history stops *before* the submit
  (a recovery must continue the work instead of submitting).
- **The** failure state (``localisation.primary``): the first consequential (unresolved) failure; if every failure
  was resolved, the first failure. The pipeline forks recovery attempts there by default (ReTerm
  recovers from the first consequential error; later errors are often its consequences), and may
  choose every consequential state instead (:meth:`LocalisationResult.select`).
- **Parse errors** (no valid action) are not failure states: the environment did not change and the
  harness already answered with a correction; they are listed in ``parse_error_steps``.
- **Infrastructure faults** never become failure states: a trajectory whose ``outcome`` is an infra
  fault yields none (``infra_fault`` is set), and a step labelled ``infra`` (sandbox/runtime/harness
  errors in its output, or ``Step.extra["infra_fault"]``) is tagged in ``infra_steps``; failures at or
  after the first such step are dropped, since the environment can no longer be trusted.
- Steps copied from a given history (``steps[:prefix_len]`` of a recovery attempt) are context only:
  failure states are searched in the generated steps, unless ``include_history=True``.

Written for this kit: Harbor records trajectories but does not localise failures.
"""

from __future__ import annotations

import difflib
import re
from typing import Iterable, Literal

from pydantic import BaseModel, Field, InstanceOf

from reterm.recovery import shell
from reterm.recovery.classify import Classification, StepRecord, running_program
from reterm.recovery.judge import Classifier
from reterm.recovery.state import Level, Localisation, Source, State, history_messages, state_id
from reterm.recovery.taxonomy import Category
from reterm.trajectory import Outcome, Step, Trajectory

SelectMode = Literal["first", "consequential", "all"]

_CODE_SUFFIX = re.compile(
    r"\.(py|c|cc|cpp|h|hpp|rs|go|js|ts|tsx|java|rb|php|sh|pl|lua|kt|swift|scala|sql|r|jl|cs|zig|ml|hs|ex|exs)$", re.I
)


class InfraTag(BaseModel):
    """A step tagged as an infrastructure fault (never a failure state)."""

    step: int
    evidence: str


class LocalisationResult(BaseModel):
    """Everything :func:`localise` found in one trajectory.

    ``states`` are :class:`reterm.recovery.state.State` objects (source ``own``, level ``in_attempt``, each with
    its :class:`reterm.recovery.state.Localisation`) in step order; ``step_labels`` holds the classifier's label id of every step ("" for
    history steps that were not examined). ``infra_fault`` is True when the trajectory's outcome is an
    infrastructure fault (then ``states`` is empty). ``unexplained`` is True for a failed trial in which
    no failure state was found (no error, no submit: e.g. out of turns while making progress).
    """

    task_id: str
    origin_id: str = ""
    outcome: Outcome
    reward: float | None = None
    infra_fault: bool = False
    infra_reason: str | None = None
    infra_steps: list[InfraTag] = Field(default_factory=list)
    parse_error_steps: list[int] = Field(default_factory=list)
    step_labels: list[str] = Field(default_factory=list)
    states: list[InstanceOf[State]] = Field(default_factory=list)
    unexplained: bool = False

    @property
    def primary(self) -> State | None:
        """The failure state (first consequential, else first), or ``None``."""
        return next((s for s in self.states if s.localisation.primary), None)

    @property
    def scored(self) -> bool:
        """True when the trial counts as an agent success or failure (not infra, not pending)."""
        return self.outcome in (Outcome.SUCCESS, Outcome.FAILURE)

    def select(self, mode: SelectMode = "first", max_states: int | None = None) -> list[State]:
        """The states to fork recovery attempts from.

        ``"first"``: the primary state only; ``"consequential"``: every unresolved state, in step order;
        ``"all"``: every state. ``max_states`` caps the list (earliest first).
        Raises ``ValueError`` for an unknown mode.
        """
        if mode == "first":
            chosen = [s for s in self.states if s.localisation.primary]
        elif mode == "consequential":
            chosen = [s for s in self.states if s.localisation.consequential]
        elif mode == "all":
            chosen = list(self.states)
        else:
            raise ValueError(f"unknown selection mode {mode!r}; use first, consequential or all")
        return chosen if max_states is None else chosen[:max_states]


# ----------------------------------------------------------------------------------- records
def step_records(trajectory: Trajectory) -> list[StepRecord]:
    """One :class:`StepRecord` per step of ``trajectory``, with the context the classifier reads
    (earlier commands, files written by earlier steps, the verifier's verdict for submit steps)."""
    verdict = trajectory.passed if trajectory.outcome in (Outcome.SUCCESS, Outcome.FAILURE) else None
    records: list[StepRecord] = []
    previous: list[str] = []
    files: list[str] = []
    foreground: str | None = None  # program left running by the previous step
    for i, step in enumerate(trajectory.steps):
        if step.action is None:
            tool = "parse_error"
        else:
            tool = step.action.tool
        running = step.extra.get("running") if isinstance(step.extra.get("running"), str) else None
        if running is None and tool == "bash":
            running = running_program(step.observation or "")
        records.append(
            StepRecord(
                command=step.command,
                output=step.observation or "",
                exit_status=step.exit_status,
                timed_out=step.timed_out,
                tool=tool,
                previous_commands=list(previous),
                agent_files=list(files),
                verifier_passed=verdict if tool == "submit" else None,
                infra_flag=bool(step.extra.get("infra_fault")),
                running=running,
                typed_into=foreground if tool == "bash" else None,
                id=f"{trajectory.task_id}#{i}",
            )
        )
        if tool == "bash":
            foreground = running
        if step.command:
            previous.append(step.command)
            files.extend(f for f in shell.written_files(step.command) if f not in files)
    return records


def _origin_id(trajectory: Trajectory) -> str:
    return str(trajectory.metadata.get("rollout_id") or trajectory.metadata.get("id") or "")


def _similar(a: str | None, b: str | None, threshold: float) -> bool:
    if not a or not b:
        return False
    pa, pb = shell.segments(a), shell.segments(b)
    if {s.program for s in pa} & {s.program for s in pb} == set():
        return False
    na, nb = " ".join(a.split()), " ".join(b.split())
    return na == nb or difflib.SequenceMatcher(None, na, nb).ratio() >= threshold


# --------------------------------------------------------------------------------------- undo
def _undo_targets(command: str) -> tuple[set[str], set[str], bool]:
    """What a command undoes: (files restored/removed, packages removed, reverts the last commit)."""
    files: set[str] = set()
    packages: set[str] = set()
    reverts_commit = False
    for seg in shell.segments(command):
        args = [a for a in seg.args if not a.startswith("-")]
        sub = args[0] if args else ""
        if seg.program == "git" and sub in ("checkout", "restore") and ("--" in seg.args or sub == "restore"):
            after = seg.args[seg.args.index("--") + 1 :] if "--" in seg.args else args[1:]
            files.update(a for a in after if not a.startswith("-"))
        elif seg.program == "git" and (sub == "revert" or (sub == "reset" and any("HEAD~" in a or "HEAD^" in a for a in seg.args))):
            reverts_commit = True
        elif seg.program == "rm":
            files.update(args)
        elif seg.program in ("pip", "pip3") and sub == "uninstall":
            packages.update(a.lower() for a in args[1:])
        elif seg.program in ("apt", "apt-get") and sub in ("remove", "purge"):
            packages.update(a.lower() for a in args[1:])
        elif seg.program in ("npm", "yarn") and sub in ("uninstall", "remove", "rm"):
            packages.update(a.lower() for a in args[1:])
    return files, packages, reverts_commit


def _installs(command: str) -> set[str]:
    out: set[str] = set()
    for seg in shell.segments(command):
        args = [a for a in seg.args if not a.startswith("-")]
        if seg.program in ("pip", "pip3", "apt", "apt-get", "npm", "yarn", "gem", "cargo") and args[:1] in (["install"], ["add"]):
            out.update(re.split(r"[<>=\[@]", a, maxsplit=1)[0].lower() for a in args[1:])
    return out


def _commits(command: str) -> bool:
    return any(s.program == "git" and s.args[:1] == ["commit"] for s in shell.segments(command))


def _undone_steps(trajectory: Trajectory, labels: list[Classification], start: int, stop: int) -> dict[int, tuple[int, str, str]]:
    """Steps without an error that a later step undoes: ``{step: (undoing step, category, what)}``."""
    steps = trajectory.steps
    found: dict[int, tuple[int, str, str]] = {}
    for j in range(start + 1, len(steps)):
        cmd = steps[j].command
        if not cmd:
            continue
        files, packages, reverts = _undo_targets(cmd)
        for target in files:
            # the last earlier step that wrote this file
            for i in range(j - 1, start - 1, -1):
                c = steps[i].command
                if c and shell.path_matches(target, shell.written_files(c)):
                    if i < stop and labels[i].label is Category.NONE and i not in found:
                        cat = Category.FAULTY_IMPLEMENTATION if _CODE_SUFFIX.search(target) else Category.WRONG_COMMAND
                        found[i] = (j, cat.value, f"file {target} undone by step {j}")
                    break
        for pkg in packages:
            for i in range(j - 1, start - 1, -1):
                c = steps[i].command
                if c and pkg in _installs(c):
                    if i < stop and labels[i].label is Category.NONE and i not in found:
                        found[i] = (j, Category.MISSING_DEPENDENCY.value, f"package {pkg} uninstalled by step {j}")
                    break
        if reverts:
            for i in range(j - 1, start - 1, -1):
                c = steps[i].command
                if c and _commits(c):
                    if i < stop and labels[i].label is Category.NONE and i not in found:
                        found[i] = (j, Category.FAULTY_IMPLEMENTATION.value, f"commit reverted by step {j}")
                    break
    return found


# ---------------------------------------------------------------------------------- localise
def _make_state(trajectory: Trajectory, step: int, history_len: int, category: str, label: Classification | None,
                signals: list[str], *, confidence: float, source: str, rule: str, evidence: str) -> State:
    """The in-attempt :class:`State` whose history is ``trajectory.prefix(history_len)``, failing at ``step``."""
    history = trajectory.prefix(history_len)
    replay = [s.command for s in history if s.command]
    timeouts = [s.action.timeout if s.action else None for s in history if s.command]
    messages = history_messages(trajectory, history)
    s = trajectory.steps[step]
    verdict = trajectory.passed if trajectory.outcome in (Outcome.SUCCESS, Outcome.FAILURE) else None
    return State(
        id=state_id(trajectory.task_id, messages),
        task_id=trajectory.task_id,
        messages=messages,
        category=category,
        source=Source.OWN,
        level=Level.IN_ATTEMPT,
        history=history,
        replay_commands=replay,
        replay_timeouts=timeouts,
        step=step,
        command=s.command or "",
        output=s.observation or "",
        exit_status=s.exit_status,
        evidence=evidence,
        localisation=Localisation(confidence=confidence, source=source, rule=rule, signals=signals,
                                  trial_passed=verdict, origin_id=_origin_id(trajectory)),
    )


def _signals(step: Step, label: Classification) -> list[str]:
    out = []
    if step.exit_status not in (None, 0):
        out.append(f"exit_status={step.exit_status}")
    if step.timed_out:
        out.append("timed_out")
    out.append(f"{label.source}:{label.rule}")
    return out


def _localise_one(trajectory: Trajectory, labels: list[Classification], include_history: bool) -> LocalisationResult:
    steps = trajectory.steps
    result = LocalisationResult(
        task_id=trajectory.task_id,
        origin_id=_origin_id(trajectory),
        outcome=trajectory.outcome,
        reward=trajectory.reward,
    )
    start = 0 if include_history else min(trajectory.prefix_len, len(steps))
    result.step_labels = ["" if i < start else lab.label.value for i, lab in enumerate(labels)]
    result.parse_error_steps = [i for i in range(start, len(steps)) if steps[i].action is None]
    result.infra_steps = [InfraTag(step=i, evidence=labels[i].evidence) for i in range(len(steps))
                          if labels[i].label is Category.INFRA]
    if trajectory.outcome.is_infra_fault:
        result.infra_fault = True
        result.infra_reason = trajectory.error or trajectory.outcome.value
        return result
    stop = min([t.step for t in result.infra_steps if t.step >= start], default=len(steps))

    # 1. steps the classifier calls failures (submit handled below), merging repeats
    states: list[State] = []
    for i in range(start, stop):
        lab = labels[i]
        if not lab.is_failure or lab.label is Category.PREMATURE_COMPLETION or steps[i].action is None:
            continue
        first = next((s for s in states if s.category == lab.label.value
                      and (s.localisation.resolved_by is None or i < s.localisation.resolved_by)
                      and _similar(s.command, steps[i].command, 0.8)), None)
        if first is not None:
            first.localisation.repeats.append(i)
            first.localisation.signals.append(f"repeated_at:{i}")
            continue
        states.append(_make_state(trajectory, i, i + 1, lab.label.value, lab, _signals(steps[i], lab),
                                  confidence=lab.confidence, source=lab.source, rule=lab.rule, evidence=lab.evidence))
        # resolution: a later near-identical command succeeds
        for j in range(i + 1, len(steps)):
            if (labels[j].label is Category.NONE and steps[j].exit_status in (0, None) and not steps[j].timed_out
                    and _similar(steps[i].command, steps[j].command, 0.6)):
                found = states[-1].localisation
                found.resolved_by, found.consequential = j, False
                found.signals.append(f"resolved_by:{j}")
                break

    # 2. steps without an error that a later step undoes
    for i, (j, category, what) in _undone_steps(trajectory, labels, start, stop).items():
        states.append(_make_state(trajectory, i, i + 1, category, None, [f"undone_by:{j}"],
                                  confidence=0.5, source="localiser", rule="undone_by_later_step", evidence=what))
    states.sort(key=lambda s: s.step)

    # 3. premature completion: a failed trial submitted with no unresolved failure before the submit
    last = len(steps) - 1
    if (trajectory.outcome is Outcome.FAILURE and steps and last < stop and last >= start
            and steps[last].action is not None and steps[last].action.tool == "submit"
            and not any(s.localisation.consequential for s in states)):
        lab = labels[last]
        states.append(_make_state(trajectory, last, last, Category.PREMATURE_COMPLETION.value, lab,
                                  ["submit", "verifier_failed"], confidence=0.9, source="localiser",
                                  rule="submitted_but_failed", evidence=f"submit; verifier reward {trajectory.reward}"))

    primary = next((s for s in states if s.localisation.consequential), states[0] if states else None)
    if primary is not None:
        primary.localisation.primary = True
    result.states = states
    result.unexplained = trajectory.outcome is Outcome.FAILURE and not states
    return result


def localise_many(trajectories: Iterable[Trajectory], classifier: Classifier | None = None, *,
                  include_history: bool = False) -> list[LocalisationResult]:
    """:func:`localise` for many trajectories with one classifier call (one batched judge request)."""
    trajectories = list(trajectories)
    classifier = classifier or Classifier()
    per = [step_records(t) for t in trajectories]
    flat = [r for records in per for r in records]
    # the judge is only asked about steps that can become failure states (not copied history)
    ask = [include_history or i >= t.prefix_len for t, records in zip(trajectories, per) for i in range(len(records))]
    labels = classifier.classify(flat, ask=ask)
    out, k = [], 0
    for t, records in zip(trajectories, per):
        out.append(_localise_one(t, labels[k : k + len(records)], include_history))
        k += len(records)
    return out


def localise(trajectory: Trajectory, classifier: Classifier | None = None, *,
             include_history: bool = False) -> LocalisationResult:
    """Find the failure states of one trajectory (see the module docstring for the rules).

    Args:
        trajectory: any trajectory (scored, pending or an infrastructure fault).
        classifier: rules only by default; ``Classifier(judge=LLMJudge(policy))`` adds the judge.
        include_history: also search the steps copied from a given history (``steps[:prefix_len]``).

    Returns:
        A :class:`LocalisationResult`; its ``states`` (:class:`reterm.recovery.state.State`, source ``own``,
        level ``in_attempt``) are empty for infrastructure faults.
    """
    return localise_many([trajectory], classifier, include_history=include_history)[0]
