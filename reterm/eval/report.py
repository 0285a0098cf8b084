"""Evaluation reports: ``results.json``, ``report.md`` and PNG plots, several models in one report.

``results.json`` (read by the model-card renderer; schema ``reterm-eval/1``)::

    {
      "schema": "reterm-eval/1",
      "name": str,                          # the eval config's name
      "created_at": str,                    # ISO 8601, UTC
      "dataset": {"name": str, "version": str | None, "path": str | None, "split": str | None,
                  "n_tasks": int, "tasks": [str]},
      "harness": {"agent": str,             # this kit's agent name ("reterm") or the first agent used
                  "version": str,           # reterm kit version
                  "harbor_version": str, "environment": str, "trials_per_task": int,
                  "timeouts_modified": bool, # False: every timeout as the tasks define it
                  "timeout_overrides": {...}},  # only the overrides that were set
      "models": [                           # in config order (base, SFT, GRPO, ReTerm-GRPO...)
        {"name": str, "agent": str, "policy": str | None, "model": str | None,
         "agent_kwargs": {...},             # the agent's settings (max_turns, api_base, sampling...)
         "job_dir": str,                    # the raw Harbor job folder, relative to results.json's folder
         "pass_at_1": {"mean": float | None, "stderr": float | None, "n_trials": int, "n_tasks": int},
         "pass_at_k": {"1": float, "2": float, ...},       # keys are k as strings (JSON)
         "per_task": {task: {"n_trials", "n_passed", "pass_rate", "n_infra_faults",
                             "n_agent_timeouts", "categories", "difficulty"}},
         "infra_faults": {"n", "by_outcome": {outcome: n}, "by_exception": {type: n},
                          "incomplete_trials", "trials": [{task, trial, outcome, exception, message}]},
         "agent_timeouts": int, "broken_by_agent": int,   # scored failures: timeouts, sandboxes the agent broke
         "n_trials_total": int,
         "recovery": {category: {"failure_states": int, "recovered": int, "rate": float | None,
                                 "stderr": float | None}},      # within trials; {} without trajectories
         "recovery_from_states": {category: {"failure_states": int,   # distinct states attempted
                                             "attempts": int, "recovered": int,  # scored / passing attempts
                                             "rate": float | None,    # recovered / attempts
                                             "stderr": float | None, "states_recovered": int,
                                             "state_recovery_rate": float | None, "infra_faults": int}}
                                 | None}                # None: not configured for this model
      ]
    }

Definitions of every number: :mod:`reterm.eval.metrics` (Pass@1, stderr, pass@k, faults) and
:mod:`reterm.eval.recovery` (recovery rates). ``report.md`` holds the same numbers as markdown tables;
``pass_rate.png`` (Pass@1 per model with ±stderr error bars) and ``recovery_rate.png`` (recovery rate
per error category per model) are drawn with matplotlib.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from reterm.trajectory import write_json_atomic

SCHEMA = "reterm-eval/1"


_FAULTS_SHOWN = 5  # faulted trials listed per model in report.md (all of them are in results.json)
_FAULT_MESSAGE_CHARS = 160


def _colour(i: int) -> str:
    """The colour of the ``i``-th model of the config (the same in every plot)."""
    return f"C{i % 10}"


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}"


def _pass1(p: dict[str, Any]) -> str:
    if p["mean"] is None:
        return "n/a"
    if p["stderr"] is None:
        return f"{_pct(p['mean'])} ± n/a"
    return f"{_pct(p['mean'])} ± {_pct(p['stderr'])}"


def _rate_cell(entry: dict[str, Any] | None) -> str:
    """``rate (recovered/n)``; ``n`` is the scored attempts for recovery from states, else the states."""
    if not entry or not entry.get("failure_states"):
        return "–"
    return f"{_pct(entry['rate'])} ({entry['recovered']}/{entry.get('attempts', entry['failure_states'])})"


def _categories(models: list[dict[str, Any]], key: str) -> list[str]:
    cats: set[str] = set()
    for m in models:
        cats.update((m.get(key) or {}).keys())
    return sorted(cats)


def markdown(results: dict[str, Any]) -> str:
    """The report as markdown: summary table, recovery tables, per-task table, infrastructure faults."""
    models = results["models"]
    ds, h = results["dataset"], results["harness"]
    ks = sorted({int(k) for m in models for k in m["pass_at_k"]} - {1})
    lines = [
        f"# Evaluation: {results['name']}",
        "",
        f"Dataset **{ds['name']}**" + (f" @ {ds['version']}" if ds.get("version") else "")
        + (f", split `{ds['split']}`" if ds.get("split") else "") + f": {ds['n_tasks']} tasks. "
        f"Environment `{h['environment']}`, {h['trials_per_task']} trial(s) per task, Harbor {h['harbor_version']}, "
        + ("timeouts **modified**: " + ", ".join(f"{k}={v}" for k, v in h["timeout_overrides"].items())
           if h["timeouts_modified"] else "timeouts as the tasks define them") + ".",
        "",
        "Pass@1 in % (mean over tasks of the per-task pass rate ± standard error over trials); "
        "infrastructure faults are excluded from every denominator and counted apart; agent timeouts and "
        "sandboxes the agent broke (docs/SCORING.md) are failures.",
        "",
        "| model | agent | Pass@1 (%) | " + "".join(f"pass@{k} (%) | " for k in ks)
        + "scored trials | tasks | infra faults | agent timeouts | broke its sandbox |",
        "|---|---|---|" + "---|" * len(ks) + "---|---|---|---|---|",
    ]
    for m in models:
        p = m["pass_at_1"]
        lines.append(
            f"| {m['name']} | {m['agent']} | {_pass1(p)} | "
            + "".join(f"{_pct(m['pass_at_k'].get(str(k)))} | " for k in ks)
            + f"{p['n_trials']} | {p['n_tasks']} | {m['infra_faults']['n']} | {m['agent_timeouts']} | "
            + f"{m.get('broken_by_agent', 0)} |"
        )
    lines += ["", "Agents: " + "; ".join(
        f"**{m['name']}** = {m['agent']}"
        + (f" policy `{m['policy']}`" if m.get("policy") else "") + (f" model `{m['model']}`" if m.get("model") else "")
        + (" (" + ", ".join(f"{k}={json.dumps(v)}" for k, v in m["agent_kwargs"].items()) + ")" if m.get("agent_kwargs") else "")
        for m in models) + "."]
    for key, title, note in (
        ("recovery", "Recovery within trials",
         "Per error category: failure states the agent hit, and the share of them after which the trial "
         "still passed. Rate in % (recovered/failure states)."),
        ("recovery_from_states", "Recovery from recorded failure states",
         "The agent started from stored failure states (Recovery-Bench style): share of recovery attempts "
         "that reached a passing verifier. Rate in % (recovered/scored attempts)."),
    ):
        cats = _categories(models, key)
        if not cats:
            continue
        lines += ["", f"## {title}", "", note, "",
                  "| category | " + " | ".join(m["name"] for m in models) + " |",
                  "|---|" + "---|" * len(models)]
        for c in cats:
            lines.append(f"| {c} | " + " | ".join(_rate_cell((m.get(key) or {}).get(c)) for m in models) + " |")
    tasks = sorted({t for m in models for t in m["per_task"]})
    if tasks:
        lines += ["", "## Per task", "", "Passed/scored trials; `+f` marks infrastructure faults.", "",
                  "| task | task categories | " + " | ".join(m["name"] for m in models) + " |",
                  "|---|---|" + "---|" * len(models)]
        for t in tasks:
            row = []
            cat = ""
            for m in models:
                e = m["per_task"].get(t)
                if e is None:
                    row.append("–")
                    continue
                cat = cat or ", ".join(e.get("categories") or [])
                row.append(f"{e['n_passed']}/{e['n_trials']}" + (f" +{e['n_infra_faults']}f" if e["n_infra_faults"] else ""))
            lines.append(f"| {t} | {cat} | " + " | ".join(row) + " |")
    faulted = [m for m in models if m["infra_faults"]["n"]]
    if faulted:
        lines += ["", "## Infrastructure faults", ""]
        for m in faulted:
            f = m["infra_faults"]
            parts = [f"{k}: {v}" for k, v in sorted(f["by_exception"].items())]
            if f["incomplete_trials"]:
                parts.append(f"incomplete: {f['incomplete_trials']}")
            lines.append(f"- **{m['name']}**: {f['n']} ({'; '.join(parts)})")
            shown = f.get("trials", [])[:_FAULTS_SHOWN]
            for t in shown:  # the message says what broke (the type alone rarely does)
                msg = " ".join((t.get("message") or "").split())
                msg = (msg[:_FAULT_MESSAGE_CHARS] + " ...") if len(msg) > _FAULT_MESSAGE_CHARS else msg
                lines.append(f"  - `{t['trial']}` ({t['task']}): {t.get('exception') or t['outcome']}"
                             + (f": {msg.replace('|', '/')}" if msg else ""))  # fmt: skip
            if len(f.get("trials", [])) > len(shown):
                lines.append(f"  - ... {len(f['trials']) - len(shown)} more in results.json")
    lines += ["", "Raw Harbor job folders: " + ", ".join(f"`{m['job_dir']}`" for m in models), ""]
    return "\n".join(lines)


def plot_pass_rates(results: dict[str, Any], path: str | Path) -> Path:
    """Bar chart of Pass@1 (%) per model with ±stderr error bars; writes a PNG and returns its path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = results["models"]
    names = [m["name"] for m in models]
    means = [100 * (m["pass_at_1"]["mean"] or 0.0) for m in models]
    errs = [100 * (m["pass_at_1"]["stderr"] or 0.0) for m in models]
    fig, ax = plt.subplots(figsize=(max(4.0, 1.3 * len(models) + 2), 3.6), dpi=120)
    bars = ax.bar(names, means, yerr=errs, capsize=5, color=[_colour(i) for i in range(len(models))])
    for bar, m, err in zip(bars, models, errs):
        label = _pass1(m["pass_at_1"])
        ax.annotate(label, (bar.get_x() + bar.get_width() / 2, bar.get_height() + err), ha="center",
                    va="bottom", fontsize=8, xytext=(0, 3), textcoords="offset points")
    ax.set_ylabel("Pass@1 (%)")
    ax.set_ylim(0, 110)
    ds = results["dataset"]
    ax.set_title(f"{ds['name']}: Pass@1 ± stderr ({results['harness']['trials_per_task']} trials/task)", fontsize=10)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_recovery_rates(results: dict[str, Any], path: str | Path, key: str = "recovery") -> Path | None:
    """Grouped bars: recovery rate (%) per error category (x) per model (colour). ``None`` if no data."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = results["models"]
    cats = _categories(models, key)
    if not cats:
        return None
    shown = [(i, m) for i, m in enumerate(models) if m.get(key)]  # colour index = place in the config
    width = 0.8 / len(shown)
    fig, ax = plt.subplots(figsize=(max(5.0, 1.1 * len(cats) * len(shown) ** 0.5 + 2), 3.8), dpi=120)
    for k, (i, m) in enumerate(shown):
        xs, ys, labels = [], [], []
        for j, c in enumerate(cats):
            e = m[key].get(c)
            if e and e.get("failure_states"):
                xs.append(j + (k - (len(shown) - 1) / 2) * width)
                ys.append(100 * (e["rate"] or 0.0))
                labels.append(f"{e['recovered']}/{e.get('attempts', e['failure_states'])}")
        bars = ax.bar(xs, ys, width=width, label=m["name"], color=_colour(i))
        for bar, lab in zip(bars, labels):
            ax.annotate(lab, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom",
                        fontsize=7, xytext=(0, 2), textcoords="offset points")
    ax.set_xticks(range(len(cats)), cats, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("recovery rate (%)")
    ax.set_ylim(0, 110)
    title = "recovery within trials" if key == "recovery" else "recovery from recorded failure states"
    ax.set_title(f"{results['dataset']['name']}: {title}, per error category", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path


def write_report(results: dict[str, Any], out_dir: str | Path) -> dict[str, Path]:
    """Write ``results.json``, ``report.md`` and the PNGs into ``out_dir``; return ``{kind: path}``.

    Raises ``ValueError`` when ``results`` lacks a key of the schema above (naming it).
    """
    for key in ("name", "dataset", "harness", "models"):
        if key not in results:
            raise ValueError(f"results lack the key {key!r} (schema {SCHEMA})")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    results = {"schema": SCHEMA, **results}
    paths = {"results": write_json_atomic(out / "results.json", results)}
    md = out / "report.md"
    md.write_text(markdown(results))
    paths["markdown"] = md
    paths["pass_rate_png"] = plot_pass_rates(results, out / "pass_rate.png")
    for key, name in (("recovery", "recovery_rate.png"), ("recovery_from_states", "recovery_from_states.png")):
        p = plot_recovery_rates(results, out / name, key)
        if p:
            paths[key + "_png"] = p
    return paths
