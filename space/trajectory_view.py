"""HTML views of trajectories for the Space: steps as collapsible cards with terminal panes, the failure
step marked with its error category, the recovery after it, and recovery fan-outs side by side.

The Space renders with ``gr.HTML`` rather than ``gr.Chatbot`` because a fan-out needs G columns next to
each other and a terminal pane needs its own styling; every piece of trajectory text goes through
:func:`esc` (HTML-escaped, and ``{``, ``}``, ``$`` turned into character references so that neither
Gradio's HTML template nor anything else can interpret terminal output).

Views (:class:`EpisodeView`, :class:`FanOutView`) are built by ``replay_sources`` (records, Harbor job
folders, folders of attempt trajectories) and ``live_run`` (a run in progress) from
:class:`reterm.trajectory.Trajectory` objects. Written for this kit (no library renders agent
trajectories as terminal sessions).
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass, field
from typing import Any

from reterm.trajectory import Outcome, Step, Trajectory

# Lines that :func:`reterm.agent.protocol.format_observation` appends after a command's output.
_STATUS_LINE = re.compile(r"^\[(exit status|timed out after|still running|exit status unknown)")
_NOTE_LINE = re.compile(r"^\[(note: |the terminal|\.\.\. earlier output)")
_CATEGORY_TEXT = {
    "missing_dependency": "missing dependency",
    "wrong_command": "wrong command",
    "path_permission": "path / permission",
    "faulty_implementation": "faulty implementation",
    "wrong_state": "wrong environment state",
    "timeout_hang": "timeout / hang",
    "premature_completion": "premature completion",
    "other": "other",
}


def esc(text: Any) -> str:
    """``text`` as inert HTML text: escaped, with ``{``, ``}`` and ``$`` as character references."""
    out = html.escape("" if text is None else str(text), quote=True)
    return out.replace("{", "&#123;").replace("}", "&#125;").replace("$", "&#36;")


def category_text(category: str | None) -> str:
    """A failure category id (``reterm.recovery.taxonomy``) in words (unknown ids are shown as given)."""
    if not category:
        return ""
    return _CATEGORY_TEXT.get(category, category.replace("_", " "))


@dataclass
class EpisodeView:
    """One trajectory with what the Space highlights in it.

    Attributes:
        trajectory: the episode (its ``reward``/``outcome`` give the verifier banner).
        title: heading of the card.
        failure_step: index in ``trajectory.steps`` of the failing step (marked), or ``None``.
        failure_category: its error category id.
        failure_evidence: the text that made it a failure (shown under the step).
        recovery_from: index of the first step after the failure state (a divider is drawn before it).
        labels: per step, the classifier's label id ("" or "none" for no error), shown as small badges.
        meta: (label, value) pairs shown under the title (policy, source, ids...).
        notes: sentences shown under the title (e.g. "failure injected: ...").
        running: the episode is still running (live mode): a pulsing line at the end.
        show_verifier: draw the verifier banner at the end.
        prefix_note: shown as a divider after the failure step when the episode stops there (live fan-out).
    """

    trajectory: Trajectory
    title: str = ""
    failure_step: int | None = None
    failure_category: str | None = None
    failure_evidence: str = ""
    recovery_from: int | None = None
    labels: list[str] = field(default_factory=list)
    meta: list[tuple[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    running: bool = False
    show_verifier: bool = True
    prefix_note: str = ""


@dataclass
class FanOutView:
    """Recovery attempts forked from one failure state (a GRPO group, a pipeline or eval fan-out, a live run).

    Attributes:
        prefix: the episode up to and including the failure step (attempts share it).
        attempts: one trajectory per attempt; ``steps[prefix_len:]`` are the attempt's own steps.
        title: heading.
        running: attempts still running (live mode).
    """

    prefix: EpisodeView
    attempts: list[Trajectory]
    title: str = ""
    running: bool = False


# ----------------------------------------------------------------------------------- pieces
def _split_observation(observation: str) -> tuple[list[str], str, list[str]]:
    """(note lines, output, status lines) of an observation written by ``format_observation``."""
    lines = (observation or "").split("\n")
    notes: list[str] = []
    while lines and _NOTE_LINE.match(lines[0]) and lines[0].endswith("]"):
        notes.append(lines.pop(0))
    status: list[str] = []
    while lines and _STATUS_LINE.match(lines[-1]):
        status.insert(0, lines.pop())
    return notes, "\n".join(lines), status


def _status_class(step: Step) -> str:
    if step.timed_out:
        return "warn"
    if step.exit_status is None:
        return "warn"
    return "ok" if step.exit_status == 0 else "err"


def _badge(text: str, kind: str) -> str:
    return f'<span class="rt-badge rt-{kind}">{esc(text)}</span>'


def _summary_line(step: Step, number: int, failure: bool, category: str | None, label: str) -> str:
    parts = [f'<span class="rt-num">{number}</span>']
    if step.action is None:
        parts.append(f'<span class="rt-what rt-muted">no valid action ({esc(step.parse_error or "parse error")})</span>')
    elif step.action.tool == "submit":
        parts.append('<span class="rt-what"><b>submit</b> <span class="rt-muted">(declares the task done)</span></span>')
    else:
        cmd = (step.action.command or "").strip()
        first = cmd.split("\n", 1)[0]
        more = " …" if "\n" in cmd else ""
        parts.append(f'<span class="rt-what"><span class="rt-dollar">$</span> <code>{esc(first[:160])}{esc(more)}</code></span>')
        if step.timed_out:
            parts.append(_badge("timed out", "warn"))
        elif step.exit_status is not None:
            parts.append(_badge(f"exit {step.exit_status}", "ok" if step.exit_status == 0 else "err"))
        elif step.extra.get("running"):
            parts.append(_badge("still running", "warn"))
    if step.extra.get("injected"):
        parts.append(_badge("typed by the user", "info"))
    if failure:
        parts.append(_badge(f"✗ failure · {category_text(category) or 'error'}", "fail"))
    elif label and label not in ("none", ""):
        parts.append(_badge(f"error: {category_text(label)}", "soft"))
    return "".join(parts)


def render_step(step: Step, number: int, *, failure: bool = False, category: str | None = None,
                evidence: str = "", label: str = "", role: str = "", open_: bool = False) -> str:
    """One step as a ``<details>`` card: summary line (number, command, exit badge, failure badge),
    body with the model's reasoning and a terminal pane (command, output, status line).

    Args:
        number: the step number shown (1-based).
        failure: mark it as the failure step (``category`` names its error category).
        role: extra CSS class: ``prefix``, ``recovery``, ``after``.
        open_: render it expanded.
    """
    classes = ["rt-step"]
    if role:
        classes.append(f"rt-{role}")
    if failure:
        classes.append("rt-failure")
    body: list[str] = []
    reasoning = (step.reasoning or "").strip()
    if step.action is None:
        body.append(f'<div class="rt-label">model reply (not a valid action)</div><pre class="rt-raw">{esc(step.model_text.strip())}</pre>')
    elif reasoning:
        body.append(f'<div class="rt-reason"><span class="rt-label">model</span> {esc(reasoning)}</div>')
    if step.action is not None and step.action.tool == "bash":
        notes, output, status = _split_observation(step.observation)
        term = [f'<span class="rt-prompt">$</span> <span class="rt-cmd">{esc(step.action.command or "")}</span>']
        for n in notes:
            term.append(f'<span class="rt-tnote">{esc(n)}</span>')
        if output.strip():
            term.append(esc(output))
        for s in status:
            term.append(f'<span class="rt-status rt-{_status_class(step)}">{esc(s)}</span>')
        timing = []
        if step.generation_s:
            timing.append(f"model {step.generation_s:.1f} s")
        if step.execution_s:
            timing.append(f"run {step.execution_s:.1f} s")
        bar = esc(" · ".join(timing)) if timing else ""
        body.append(
            '<div class="rt-term"><div class="rt-term-bar"><i></i><i></i><i></i>'
            f'<span>bash — sandbox</span><span class="rt-term-time">{bar}</span></div>'
            f'<pre class="rt-term-body">{chr(10).join(term)}</pre></div>'
        )
    elif step.action is None and step.observation:
        body.append(f'<div class="rt-label">harness reply</div><pre class="rt-raw">{esc(step.observation)}</pre>')
    if failure:
        what = category_text(category) or "error"
        ev = f": <code>{esc(evidence[:300])}</code>" if evidence else ""
        body.append(f'<div class="rt-fail-note">Failure state · <b>{esc(what)}</b>{ev}</div>')
    summary = _summary_line(step, number, failure, category, label)
    return (f'<details class="{" ".join(classes)}" data-step="{number}"{" open" if open_ else ""}>'
            f'<summary>{summary}</summary><div class="rt-step-body">{"".join(body)}</div></details>')


def verifier_banner(traj: Trajectory) -> str:
    """The verifier's verdict: passed / failed with the reward, an infrastructure fault, or not run."""
    if traj.outcome is Outcome.SUCCESS:
        return f'<div class="rt-verdict rt-pass">✓ verifier passed · reward {traj.reward:g}</div>'
    if traj.outcome is Outcome.FAILURE:
        return f'<div class="rt-verdict rt-nopass">✗ verifier failed · reward {traj.reward if traj.reward is not None else 0:g}</div>'
    if traj.outcome.is_infra_fault:
        why = f": {traj.error}" if traj.error else ""
        return (f'<div class="rt-verdict rt-infra">⚠ infrastructure fault ({esc(traj.outcome.value)}) — not scored'
                f'{esc(why[:300])}</div>')
    return '<div class="rt-verdict rt-pending">verifier not run</div>'


def _reward_badge(traj: Trajectory) -> str:
    if traj.outcome is Outcome.SUCCESS:
        return _badge(f"✓ reward {traj.reward:g}", "ok")
    if traj.outcome is Outcome.FAILURE:
        return _badge(f"✗ reward {traj.reward if traj.reward is not None else 0:g}", "err")
    if traj.outcome.is_infra_fault:
        return _badge("infra fault", "warn")
    return _badge("running" if traj.outcome is Outcome.PENDING else traj.outcome.value, "soft")


def _steps_html(view: EpisodeView, steps: list[Step], start: int, expand_all: bool) -> str:
    out = []
    for i, step in enumerate(steps, start=start):
        if view.recovery_from is not None and i == view.recovery_from:
            out.append('<div class="rt-divider rt-div-rec">↻ recovery from the failure state</div>')
        failure = view.failure_step == i
        if view.failure_step is None:
            role = ""
        elif i < view.failure_step:
            role = "prefix"
        elif failure:
            role = ""
        else:
            role = "recovery" if view.trajectory.outcome is Outcome.SUCCESS else "after"
        label = view.labels[i] if i < len(view.labels) else ""
        out.append(render_step(step, i + 1, failure=failure, category=view.failure_category,
                               evidence=view.failure_evidence, label=label, role=role, open_=expand_all))
    return "".join(out)


def _header(title: str, traj: Trajectory, meta: list[tuple[str, str]], notes: list[str], badges: str = "") -> str:
    meta_html = "".join(f'<span class="rt-meta-item"><span class="rt-muted">{esc(k)}</span> {esc(v)}</span>'
                        for k, v in meta if v not in (None, ""))
    notes_html = "".join(f'<div class="rt-note">{esc(n)}</div>' for n in notes)
    instr = (traj.instruction or "").strip()
    short = instr if len(instr) <= 400 else instr[:400] + " …"
    instr_html = (f'<details class="rt-instr"><summary><span class="rt-label">task</span> {esc(short.split(chr(10))[0][:200])}'
                  f'</summary><pre class="rt-raw">{esc(instr)}</pre></details>') if instr else ""
    return (f'<div class="rt-head"><div class="rt-title">{esc(title)} {badges}</div>'
            f'<div class="rt-meta">{meta_html}</div>{notes_html}{instr_html}</div>')


# ----------------------------------------------------------------------------------- views
def render_episode(view: EpisodeView, *, expand_all: bool = False) -> str:
    """An episode card: header (title, badges, task instruction), its steps, the verifier banner.

    Returns an HTML fragment (``<div class="rt-episode">``) for ``gr.HTML``.
    """
    traj = view.trajectory
    badges = ""
    if view.failure_step is not None:
        badges += _badge(f"failure: {category_text(view.failure_category)}", "fail")
    if view.show_verifier and not view.running:
        badges += _reward_badge(traj)
    parts = [_header(view.title or traj.task_id, traj, view.meta, view.notes, badges)]
    parts.append(f'<div class="rt-steps">{_steps_html(view, traj.steps, 0, expand_all)}</div>')
    if view.prefix_note:
        parts.append(f'<div class="rt-divider rt-div-fork">{esc(view.prefix_note)}</div>')
    if view.running:
        parts.append('<div class="rt-running">● running …</div>')
    elif view.show_verifier:
        parts.append(verifier_banner(traj))
    return f'<div class="rt-episode">{"".join(parts)}</div>'


def render_attempts(attempts: list[Trajectory], *, running: bool = False, expand_all: bool = False,
                    labels: list[list[str]] | None = None) -> str:
    """G recovery attempts side by side: one column per attempt with its own steps and reward.

    ``attempts[k].steps[:prefix_len]`` (the shared failure prefix) are not repeated in the columns.
    """
    cols = []
    for k, traj in enumerate(attempts):
        own = traj.steps[traj.prefix_len:]
        cls = ("rt-col-pass" if traj.outcome is Outcome.SUCCESS else
               "rt-col-fail" if traj.outcome is Outcome.FAILURE else
               "rt-col-infra" if traj.outcome.is_infra_fault else "rt-col-run")  # fmt: skip
        lab = labels[k] if labels and k < len(labels) else []
        steps_html = "".join(
            render_step(s, i + 1, label=(lab[i] if i < len(lab) else ""), role="recovery" if traj.outcome is Outcome.SUCCESS else "",
                        open_=expand_all)
            for i, s in enumerate(own, start=traj.prefix_len)
        )  # fmt: skip
        if not own:
            steps_html = '<div class="rt-muted rt-empty">no steps yet</div>'
        done = traj.outcome is not Outcome.PENDING or not running
        tail = verifier_banner(traj) if done else '<div class="rt-running">● running …</div>'
        stop = f'<span class="rt-muted">stop: {esc(traj.stop_reason)}</span>' if traj.stop_reason else ""
        cols.append(f'<div class="rt-col {cls}" data-attempt="{k + 1}"><div class="rt-col-head"><b>Attempt {k + 1}</b> '
                    f'{_reward_badge(traj) if done else _badge("running", "soft")} {stop}</div>{steps_html}{tail}</div>')
    if not cols:
        return ""
    n_pass = sum(t.outcome is Outcome.SUCCESS for t in attempts)
    n_scored = sum(t.outcome in (Outcome.SUCCESS, Outcome.FAILURE) for t in attempts)
    summary = (f"{n_pass} of {n_scored} scored attempts recovered" if n_scored else "attempts running")
    infra = sum(t.outcome.is_infra_fault for t in attempts)
    if infra:
        summary += f" · {infra} infrastructure fault{'s' if infra > 1 else ''} (not scored)"
    return (f'<div class="rt-fan"><div class="rt-fan-head">🔀 {len(attempts)} recovery attempts forked from the failure '
            f'state · {esc(summary)}</div><div class="rt-grid">{"".join(cols)}</div></div>')


def render_fanout(view: FanOutView, *, expand_all: bool = False, include_prefix: bool = True) -> str:
    """A fan-out: the shared failure prefix (failure step marked) then the attempts side by side."""
    parts = []
    if include_prefix:
        prefix = view.prefix
        prefix.show_verifier = False
        parts.append(render_episode(prefix, expand_all=expand_all))
    parts.append(render_attempts(view.attempts, running=view.running, expand_all=expand_all))
    return f'<div class="rt-fanout">{"".join(parts)}</div>'


def render_notice(text: str, kind: str = "info") -> str:
    """A one-paragraph notice box (``kind``: info, warn, error)."""
    return f'<div class="rt-notice rt-notice-{esc(kind)}">{esc(text)}</div>'


CSS = """
.rt-episode, .rt-fanout, .rt-notice { font-size: 14px; line-height: 1.45; }
.rt-head { margin: 2px 0 10px 0; }
.rt-title { font-size: 17px; font-weight: 650; display: flex; flex-wrap: wrap; gap: 6px; align-items: center; }
.rt-meta { display: flex; flex-wrap: wrap; gap: 4px 14px; margin-top: 4px; font-size: 12.5px; }
.rt-muted { opacity: .65; }
.rt-note { margin-top: 4px; font-size: 13px; padding: 4px 8px; border-radius: 6px; background: rgba(59,130,246,.10); }
.rt-instr { margin-top: 6px; font-size: 13px; }
.rt-instr summary { cursor: pointer; }
.rt-label { font-size: 11px; text-transform: uppercase; letter-spacing: .04em; font-weight: 650; opacity: .6; margin-right: 4px; }
.rt-badge { display: inline-block; font-size: 11.5px; font-weight: 600; padding: 1px 8px; border-radius: 999px;
  white-space: nowrap; border: 1px solid transparent; }
.rt-ok { background: rgba(22,163,74,.14); color: #15803d; border-color: rgba(22,163,74,.35); }
.rt-err { background: rgba(220,38,38,.12); color: #b91c1c; border-color: rgba(220,38,38,.35); }
.rt-warn { background: rgba(217,119,6,.14); color: #b45309; border-color: rgba(217,119,6,.35); }
.rt-fail { background: #dc2626; color: #fff; }
.rt-info { background: rgba(59,130,246,.14); color: #1d4ed8; border-color: rgba(59,130,246,.35); }
.rt-soft { background: rgba(100,116,139,.14); color: inherit; border-color: rgba(100,116,139,.3); }
.rt-steps { display: flex; flex-direction: column; gap: 6px; }
.rt-step { border: 1px solid rgba(100,116,139,.28); border-left: 4px solid rgba(100,116,139,.45); border-radius: 8px;
  background: var(--block-background-fill, #fff); }
.rt-step > summary { cursor: pointer; padding: 6px 10px; display: flex; flex-wrap: wrap; gap: 8px; align-items: center;
  list-style: none; }
.rt-step > summary::-webkit-details-marker { display: none; }
.rt-step > summary::before { content: "▸"; opacity: .55; font-size: 12px; }
.rt-step[open] > summary::before { content: "▾"; }
.rt-step.rt-prefix { opacity: .92; }
.rt-step.rt-recovery { border-left-color: #16a34a; }
.rt-step.rt-after { border-left-color: rgba(217,119,6,.6); }
.rt-step.rt-failure { border: 2px solid #dc2626; border-left: 6px solid #dc2626; background: rgba(220,38,38,.07);
  box-shadow: 0 0 0 3px rgba(220,38,38,.10); }
.rt-num { font-variant-numeric: tabular-nums; font-weight: 700; min-width: 22px; opacity: .7; }
.rt-what { flex: 1 1 240px; min-width: 0; overflow: hidden; text-overflow: ellipsis; }
.rt-what code { font-family: ui-monospace, "DejaVu Sans Mono", Menlo, Consolas, monospace; font-size: 12.5px;
  background: transparent; padding: 0; }
.rt-dollar { color: #16a34a; font-family: ui-monospace, "DejaVu Sans Mono", monospace; font-weight: 700; }
.rt-step-body { padding: 0 10px 10px 10px; display: flex; flex-direction: column; gap: 8px; }
.rt-reason { font-size: 13.5px; white-space: pre-wrap; }
.rt-raw { white-space: pre-wrap; word-break: break-word; font-family: ui-monospace, "DejaVu Sans Mono", monospace;
  font-size: 12.5px; padding: 8px; border-radius: 6px; background: rgba(100,116,139,.10); margin: 0; max-height: 260px; overflow: auto; }
.rt-term { border-radius: 8px; overflow: hidden; border: 1px solid #30363d; background: #0d1117;
  box-shadow: 0 1px 3px rgba(0,0,0,.25); }
.rt-term-bar { display: flex; align-items: center; gap: 6px; padding: 5px 10px; background: #161b22; color: #9da7b3 !important;
  font-size: 11.5px; font-family: ui-monospace, "DejaVu Sans Mono", monospace; }
.rt-term-bar i { width: 10px; height: 10px; border-radius: 50%; background: #30363d; display: inline-block; }
.rt-term-bar i:nth-child(1) { background: #ff5f56; } .rt-term-bar i:nth-child(2) { background: #ffbd2e; }
.rt-term-bar i:nth-child(3) { background: #27c93f; }
.rt-term-bar span { margin-left: 6px; color: #9da7b3 !important; } .rt-term-time { margin-left: auto !important; }
.rt-term-body { margin: 0; padding: 10px 12px; color: #e6edf3; background: #0d1117; font-size: 12.5px; line-height: 1.45;
  font-family: ui-monospace, "DejaVu Sans Mono", Menlo, Consolas, monospace; white-space: pre-wrap; word-break: break-word;
  max-height: 340px; overflow: auto; border: 0; }
.rt-prompt { color: #3fb950; font-weight: 700; } .rt-cmd { color: #f0f6fc; font-weight: 600; }
.rt-tnote { color: #d29922; }
.rt-status { display: inline-block; margin-top: 2px; font-weight: 600; }
.rt-status.rt-ok { color: #3fb950; background: none; border: 0; } .rt-status.rt-err { color: #ff7b72; background: none; border: 0; }
.rt-status.rt-warn { color: #d29922; background: none; border: 0; }
.rt-fail-note { font-size: 13px; color: #b91c1c; }
.rt-fail-note code { font-size: 12px; }
.rt-divider { margin: 8px 0; padding: 6px 10px; border-radius: 8px; font-weight: 600; font-size: 13px; }
.rt-div-rec { background: rgba(22,163,74,.10); color: #15803d; border: 1px dashed rgba(22,163,74,.5); }
.rt-div-fork { background: rgba(124,58,237,.10); color: #6d28d9; border: 1px dashed rgba(124,58,237,.5); }
.rt-verdict { margin-top: 10px; padding: 8px 12px; border-radius: 8px; font-weight: 650; }
.rt-pass { background: rgba(22,163,74,.14); color: #15803d; } .rt-nopass { background: rgba(220,38,38,.10); color: #b91c1c; }
.rt-infra { background: rgba(217,119,6,.14); color: #b45309; } .rt-pending { background: rgba(100,116,139,.12); }
.rt-running { margin-top: 8px; color: #2563eb; font-weight: 600; animation: rt-pulse 1.2s ease-in-out infinite; }
@keyframes rt-pulse { 50% { opacity: .35; } }
.rt-fan { margin-top: 14px; }
.rt-fan-head { font-weight: 650; margin-bottom: 8px; color: #6d28d9; }
.rt-grid { display: grid; grid-template-columns: repeat(auto-fit, minmax(300px, 1fr)); gap: 10px; align-items: start; }
.rt-col { border: 1px solid rgba(100,116,139,.3); border-top: 4px solid rgba(100,116,139,.5); border-radius: 10px; padding: 8px;
  display: flex; flex-direction: column; gap: 6px; min-width: 0; }
.rt-col-pass { border-top-color: #16a34a; } .rt-col-fail { border-top-color: #dc2626; } .rt-col-infra { border-top-color: #d97706; }
.rt-col-run { border-top-color: #2563eb; }
.rt-col-head { display: flex; flex-wrap: wrap; gap: 6px; align-items: center; font-size: 13.5px; }
.rt-col .rt-verdict { margin-top: 4px; font-size: 13px; padding: 6px 10px; }
.rt-empty { font-size: 13px; padding: 6px; }
.rt-notice { padding: 10px 14px; border-radius: 8px; }
.rt-notice-info { background: rgba(59,130,246,.10); } .rt-notice-warn { background: rgba(217,119,6,.14); }
.rt-notice-error { background: rgba(220,38,38,.10); }
"""
"""Styles of the views (passed to ``launch(css=...)`` with the app's own)."""
