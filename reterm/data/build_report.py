"""The build report: ``report.md`` and PNG plots next to the dataset.

Plots (matplotlib, Agg): records per failure category split by source (own failures / injected),
recovery success rate per category (successful / scored attempts, with the attempt counts), and the
length distributions of the kept records (recovery turns; characters per record). The markdown holds the
same numbers as tables plus the rollout outcomes, the injection results, the filter funnel with the
reasons, and the wall time of every stage.
"""

from __future__ import annotations

import statistics
from collections import Counter
from pathlib import Path
from typing import Any

from reterm.data.filters import record_chars


def _table(headers: list[str], rows: list[list[Any]]) -> str:
    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.3f}"
        return str(v)

    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" if i == 0 else "---:" for i in range(len(headers))) + "|"]
    out += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(out)


def plots(folder: Path, kept: list[dict[str, Any]], per_category: dict[str, dict[str, int]]) -> dict[str, Path]:
    """Write the three PNGs into ``folder``; returns name -> path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    cats = sorted(set(per_category) | {r["failure_category"] for r in kept})
    own = [sum(1 for r in kept if r["failure_category"] == c and r["failure_source"] == "own") for c in cats]
    inj = [sum(1 for r in kept if r["failure_category"] == c and r["failure_source"] == "injected") for c in cats]

    fig, ax = plt.subplots(figsize=(8, 4))
    ax.barh(cats, own, label="own failures")
    ax.barh(cats, inj, left=own, label="injected")
    ax.set_xlabel("records")
    ax.set_title("Records per failure category")
    ax.legend(loc="lower right")
    fig.tight_layout()
    paths["records_per_category"] = folder / "records_per_category.png"
    fig.savefig(paths["records_per_category"], dpi=110)
    plt.close(fig)

    rates = [(c, per_category.get(c, {}).get("successful_attempts", 0), per_category.get(c, {}).get("attempts", 0)) for c in cats]
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.barh([c for c, _, _ in rates], [s / a if a else 0.0 for _, s, a in rates], color="tab:green")
    for i, (_, s, a) in enumerate(rates):
        ax.text(0.01, i, f"{s}/{a}", va="center")
    ax.set_xlim(0, 1)
    ax.set_xlabel("successful / scored recovery attempts")
    ax.set_title("Recovery success rate per failure category")
    fig.tight_layout()
    paths["recovery_rate_per_category"] = folder / "recovery_rate_per_category.png"
    fig.savefig(paths["recovery_rate_per_category"], dpi=110)
    plt.close(fig)

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    axes[0].hist([r["recovery_turns"] for r in kept] or [0], bins=20)
    axes[0].set_xlabel("recovery turns")
    axes[0].set_ylabel("records")
    axes[1].hist([record_chars(r) for r in kept] or [0], bins=20, color="tab:orange")
    axes[1].set_xlabel("characters per record")
    fig.suptitle("Lengths of the kept records")
    fig.tight_layout()
    paths["lengths"] = folder / "lengths.png"
    fig.savefig(paths["lengths"], dpi=110)
    plt.close(fig)
    return paths


def markdown(info: dict[str, Any]) -> str:
    """The report text from the build's summary dict (see :func:`reterm.data.build.build`)."""

    kept = info["kept"]
    per_category = info["per_category"]
    lines = [f"# {info['name']}: build report", ""]
    lines += [f"- policy: `{info['policy']}`; recovery policy: `{info['teacher']}`; tasks: {info['n_tasks']} "
              f"({info['split']} split); environment: `{info['environment']}`",
              f"- records: **{len(kept)}** (from {len(info['categories_kept'])} error categories: "
              f"{', '.join(info['categories_kept']) or 'none'})",
              f"- wall time: {info['wall_s']:.0f} s" + (" (resumed)" if info.get("resumed") else ""), ""]  # fmt: skip
    ro = info["rollouts"]
    lines += ["## Rollouts", "", _table(["episodes", "succeeded", "failed", "infra faults", "pending", "turns",
                                         "unparseable turns", "trials that ran no command"],
                                        [[ro["episodes"], ro["succeeded"], ro["failed"], ro["infra_faults"], ro["pending"],
                                          ro.get("turns", "-"), ro.get("parse_error_turns", "-"),
                                          ro.get("trials_without_commands", "-")]]), ""]  # fmt: skip
    fs = info["failures"]
    lines += [f"Failure states from the policy's own failed trials: {fs.get('states', 0)} "
              f"({fs.get('unexplained_trials', 0)} failed trials had none, e.g. out of turns without an error; "
              f"{fs.get('duplicate_states', 0)} duplicates merged).", ""]  # fmt: skip
    inj = info.get("injection") or {}
    if inj:
        rows = [[k, v["tried"], v["kept"], ", ".join(f"{c} {n}" for c, n in sorted(v["categories"].items())) or "-"]
                for k, v in sorted(inj.get("kinds", {}).items())]  # fmt: skip
        lines += ["## Error injection", "",
                  f"Sources: {inj.get('sources', 0)} successful trajectories. A perturbation is kept only when the "
                  "localiser finds the run failing at or after the perturbed step.", "",
                  _table(["kind", "tried", "kept", "categories (localiser)"], rows), ""]  # fmt: skip
    rows = []
    for cat, c in per_category.items():
        a, s = c.get("attempts", 0), c.get("successful_attempts", 0)
        n_own = sum(1 for r in kept if r["failure_category"] == cat and r["failure_source"] == "own")
        n_inj = sum(1 for r in kept if r["failure_category"] == cat and r["failure_source"] == "injected")
        rows.append([cat, c.get("failure_states", 0), info["state_sources"].get(cat, {}).get("own", 0),
                     info["state_sources"].get(cat, {}).get("injected", 0), c.get("diverged", 0), a, s,
                     (s / a) if a else "-", n_own, n_inj])  # fmt: skip
    lines += ["## Failure states, recovery attempts and records per category", "",
              _table(["category", "states", "own", "injected", "replay diverged", "attempts", "verified",
                      "recovery rate", "records (own)", "records (injected)"], rows), "",
              "![records per category](plots/records_per_category.png)",
              "![recovery rate per category](plots/recovery_rate_per_category.png)", ""]  # fmt: skip
    f = info["funnel"]
    lines += ["## Filters", "", _table(["verified recoveries", "quality", "dedup", "decontamination", "kept"],
                                       [[f["verified_recoveries"], f["quality"], f["dedup"], f["decontamination"], f["kept"]]]),
              "", "Reasons:", ""]  # fmt: skip
    lines += [f"- {k}: {v}" for k, v in sorted(info["filter_reasons"].items())] or ["- none"]
    lines += ["", f"Decontamination against: {', '.join(info['benchmarks']) or 'nothing'} ({info['decon_method']}).", ""]
    turns = [r["recovery_turns"] for r in kept]
    chars = [record_chars(r) for r in kept]
    if kept:
        lines += ["## Lengths", "", _table(["", "min", "median", "mean", "max"], [
            ["recovery turns", min(turns), statistics.median(turns), statistics.mean(turns), max(turns)],
            ["messages", min(len(r["messages"]) for r in kept), statistics.median(len(r["messages"]) for r in kept),
             statistics.mean(len(r["messages"]) for r in kept), max(len(r["messages"]) for r in kept)],
            ["characters", min(chars), statistics.median(chars), statistics.mean(chars), max(chars)]]), "",
            "![lengths](plots/lengths.png)", ""]  # fmt: skip
    lines += ["## Stages", "", _table(["stage", "wall s", "summary"],
                                       [[k, v.get("wall_s", "-"), ", ".join(f"{a}={b}" for a, b in v.items()
                                                                            if a != "wall_s" and not isinstance(b, (dict, list)))]
                                        for k, v in info["stages"].items()]), ""]  # fmt: skip
    teachers = Counter(r["teacher"] for r in kept)
    lines += [f"Teachers of kept records: {dict(teachers)}. Failed attempts are in `failed_attempts/` "
              f"({info['failed_attempts']} rows).", ""]
    return "\n".join(lines)
