"""The final report of a run of ``train/run_all.sh``: ``RUN/summary.md``, ``RUN/summary.json`` and the plots
under ``RUN/plots/`` (``python train/stages.py summary --run-dir RUN``).

Reads only what the stages wrote (stage records, ``eval/results.json``, training summaries); a stage not run yet
leaves ``-`` in the tables.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

from run_records import (
    ALIASES,
    MODELS,
    fmt_duration,
    fmt_mb,
    git_commit,
    load_json,
    machine,
    path_spec,
    read_marker,
    rel_path,
    write_json_atomic,
)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _overall(block: dict[str, Any] | None, num: str = "recovered", den: str = "failure_states") -> str:
    """``"3/12 (25.0%)"`` summed over the categories of a recovery block; ``"-"`` when empty."""
    if not block:
        return "-"
    if den == "failure_states" and any("attempts" in v for v in block.values()):
        den = "attempts"
    n = sum(int(v.get(num) or 0) for v in block.values())
    d = sum(int(v.get(den) or 0) for v in block.values())
    return f"{n}/{d} ({_pct(n / d)})" if d else "-"



def build_summary(run_dir: Path, stage_order: list[str]) -> tuple[str, dict[str, Any]]:
    """The final report of a run: the four models' scores, recovery per category, training, time and
    memory per stage, where the artefacts are, and how to open the Space. Returns ``(markdown, data)``.

    Missing inputs (a stage not run yet) leave ``-`` in the tables rather than failing.
    """
    run_dir = Path(run_dir)
    rel = rel_path(run_dir)
    results = load_json(run_dir / "eval" / "results.json") or {}
    by_name = {m["name"]: m for m in results.get("models", [])}
    for name, others in ALIASES.items():
        for other in others:
            if name not in by_name and other in by_name:
                by_name[name] = by_name[other]
    lines = [f"# ReTerm run `{rel}`", ""]
    ds = results.get("dataset") or {}
    h = results.get("harness") or {}
    if results:
        lines += [f"Evaluation: {ds.get('n_tasks')} tasks of `{ds.get('path') or ds.get('name')}` "
                  f"(split `{ds.get('split')}`), {h.get('trials_per_task')} trials per task, environment "
                  f"`{h.get('environment')}`, timeouts {'modified' if h.get('timeouts_modified') else 'as the tasks define them'}.", ""]  # fmt: skip
    lines += ["## The four models", "",
              "| model | checkpoint | Pass@1 ± stderr | pass@k | recovery within trials | recovery from recorded failure states | infra faults |",
              "|---|---|---|---|---|---|---|"]  # fmt: skip
    table = []
    for name, (label, sub) in MODELS.items():
        m = by_name.get(name)
        ckpt = f"`{rel}/{sub}`" if sub is not None else "SmolLM2-135M-Instruct (embedded)"
        if m is not None and sub is None and m.get("policy") not in (None, "smollm2"):
            ckpt = f"`{m.get('policy') or m.get('model')}`"
        if m is None:
            lines.append(f"| {label} | {ckpt} | - | - | - | - | - |")
            table.append({"model": name, "label": label})
            continue
        p1 = m.get("pass_at_1") or {}
        mean, se = p1.get("mean"), p1.get("stderr")
        p1s = "-" if mean is None else f"{_pct(mean)} ± {_pct(se) if se is not None else 'n/a'}"
        pk = m.get("pass_at_k") or {}
        k = max(pk, key=int) if pk else None
        pks = f"pass@{k} {_pct(pk[k])}" if k else "-"
        inf = (m.get("infra_faults") or {}).get("n", 0)
        lines.append(f"| {label} | {ckpt} | {p1s} | {pks} | {_overall(m.get('recovery'))} | "
                     f"{_overall(m.get('recovery_from_states'))} | {inf} |")  # fmt: skip
        table.append({"model": name, "label": label, "pass_at_1": p1, "pass_at_k": pk,
                      "recovery": m.get("recovery"), "recovery_from_states": m.get("recovery_from_states"),
                      "infra_faults": inf})  # fmt: skip
    cats = sorted({c for m in by_name.values() for c in (m.get("recovery_from_states") or {})})
    if cats:
        lines += ["", "## Recovery rate per error category, from recorded failure states", "",
                  "Successful attempts / attempts, per category (the same states for every model).", "",
                  "| category | " + " | ".join(MODELS[n][0] for n in MODELS) + " |",
                  "|---|" + "---|" * len(MODELS)]  # fmt: skip
        for c in cats:
            row = []
            for n in MODELS:
                e = ((by_name.get(n) or {}).get("recovery_from_states") or {}).get(c)
                row.append(
                    "-"
                    if not e
                    else f"{e.get('recovered', 0)}/{e.get('attempts', e.get('failure_states', 0))} ({_pct(e.get('rate'))})"
                )
            lines.append(f"| {c} | " + " | ".join(row) + " |")
    # training
    sft = load_json(run_dir / "sft" / "training_summary.json") or {}
    grpo = {n: load_json(run_dir / n / "training_summary.json") or {} for n in ("grpo-reterm", "grpo-standard")}
    lines += ["", "## Data and training", ""]
    # the dataset versions: data/ (what SFT trained on) and, on the embedded default, data-mined/ (the second
    # round, GRPO's seed states), each a folder of its own
    for folder, role in (("data", "SFT's training data"), ("data-mined", "the second round: GRPO's seed states")):
        data_stats = load_json(run_dir / folder / "stats.json") or {}
        if not data_stats:
            continue
        cats_d = data_stats.get("categories") or {}
        lines.append(f"- dataset `{rel}/{folder}` ({role}; version {data_stats.get('version')}): "
                     f"{sum((data_stats.get('splits') or {}).values())} records from "
                     f"{sum(1 for v in cats_d.values() if v.get('records'))} error categories "
                     f"(failure sources: {', '.join(f'{k} {v}' for k, v in (data_stats.get('failure_sources') or {}).items())}); "
                     f"policy `{data_stats.get('policy')}`, "
                     f"teacher `{data_stats.get('teacher')}`")  # fmt: skip
    if sft:
        held = sft.get("heldout") or {}
        held_text = ""
        if held.get("final_nll_per_token") is not None:  # the data stage's held-out split (dataset.held_out_tasks)
            before = f"{_num(held['base_nll_per_token'])} -> " if held.get("base_nll_per_token") is not None else ""
            held_text = f"; held-out NLL per recovery token {before}{_num(held['final_nll_per_token'])}"
        lines.append(f"- SFT: {sft.get('steps')} steps ({sft.get('finetuning')}), loss on the training batch "
                     f"{_num(sft.get('first_loss'))} (first step) -> {_num(sft.get('final_loss'))} (last step; other "
                     f"records each step){held_text}")  # fmt: skip
    for n, s in grpo.items():
        if s:
            lines.append(f"- {MODELS[n][0]}: {s.get('steps')} steps, reward {_num(s.get('first_reward'))} -> "
                         f"{_num(s.get('final_reward'))}; attempts {s.get('attempts')} (passed {s.get('passed_attempts')}, "
                         f"infrastructure faults {s.get('infra_fault_attempts')}), zero-variance groups "
                         f"{s.get('zero_variance_groups')}/{s.get('groups')}")  # fmt: skip
    # stages
    stages = []
    lines += ["", "## Stages: wall time and peak memory", "",
              "Peak memory: the largest resident memory of the stage's whole process tree (sandboxes included; "
              "private pages of every process plus the largest file-backed set), sampled once a second; max "
              "process RSS: the largest single process's peak (getrusage). The load average shows how busy the machine was (other work slows a stage down).", "",
              "| stage | wall time | peak memory | max process RSS | mean load | finished |", "|---|---|---|---|---|---|"]  # fmt: skip
    total = 0.0
    peak = 0.0
    for st in stage_order:
        rec = read_marker(run_dir, st)
        if rec is None:
            lines.append(f"| {st} | not run | - | - | - | - |")
            continue
        total += rec.get("wall_s") or 0
        peak = max(peak, rec.get("peak_mem_mb") or 0)
        stages.append(rec)
        lines.append(f"| {st} | {fmt_duration(rec.get('wall_s'))} | {fmt_mb(rec.get('peak_mem_mb'))} | "
                     f"{fmt_mb(rec.get('max_process_rss_mb'))} | {rec.get('load_avg_mean') if rec.get('load_avg_mean') is not None else '-'} | "
                     f"{rec.get('finished_at', '-')} |")  # fmt: skip
    lines.append(f"| **total** | **{fmt_duration(total)}** | **{fmt_mb(peak)}** (largest stage) | | | |")
    # artefacts
    lines += ["", "## Where everything is", "",
              f"- dataset (Hub layout): `{rel}/data` (`datasets.load_dataset(\"{rel}/data\")`), report `{rel}/data/report.md`"
              + (f"; its second round `{rel}/data-mined`" if (run_dir / "data-mined" / "stats.json").is_file() else ""),
              f"- checkpoints: `{rel}/sft/merged`, `{rel}/grpo-standard/merged`, `{rel}/grpo-reterm/merged` "
              f"(in the harness: `reterm run TASK --policy hf:{path_spec(run_dir / 'grpo-reterm' / 'merged')}`)",
              f"- evaluation: `{rel}/eval/results.json`, `{rel}/eval/report.md`, Harbor job folders `{rel}/eval/jobs/`",
              f"- cards and publishing dry-runs: `{rel}/cards/dataset`, `{rel}/cards/model`, `{rel}/cards/space`",
              f"- plots: `{rel}/plots/` ({', '.join(sorted(p.name for p in (run_dir / 'plots').glob('*.png'))) or 'none yet'})",
              f"- logs of every stage: `{rel}/logs/`; this summary: `{rel}/summary.md`",
              "", "## Open the Space", "",
              "Replay this run's records, evaluation trials and GRPO groups step by step (and run the agent live):", "",
              f"    .venv/bin/python space/app.py --source {rel}/data --source {rel}/eval/jobs/grpo-reterm "
              f"--source {rel}/grpo-reterm/rollouts", "",
              "then open http://127.0.0.1:7860 in a browser."]  # fmt: skip
    data = {"run_dir": rel, "models": table, "stages": stages, "total_wall_s": round(total, 1),
            "peak_mem_mb": round(peak, 1), "eval": {"dataset": ds, "harness": h}}  # fmt: skip
    return "\n".join(lines) + "\n", data


def _num(x: Any) -> str:
    return "-" if x is None else f"{x:.3g}" if isinstance(x, float) else str(x)


def write_plots(run_dir: Path, stage_order: list[str]) -> list[Path]:
    """``RUN/plots/``: the evaluation's and the dataset's PNGs (copied), each training run's curves, a
    comparison of the two GRPO runs' rewards, and the time per stage. Returns the PNGs written."""
    import csv

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    run_dir = Path(run_dir)
    plots = run_dir / "plots"
    plots.mkdir(parents=True, exist_ok=True)
    written = []
    copies = [
        (run_dir / "eval" / n, f"eval_{n}")
        for n in ("pass_rate.png", "recovery_rate.png", "recovery_from_states.png", "rates.png")
    ]
    copies += [(p, f"data_{p.name}") for p in sorted((run_dir / "data" / "plots").glob("*.png"))]
    grpo_runs = {n: label for n, label in drill_models(run_dir).items() if n.startswith("grpo")}  # every seed's
    copies += [(run_dir / n / "curves.png", f"{n}_curves.png") for n in ("sft", *grpo_runs)]
    for src, name in copies:
        if src.is_file():
            shutil.copyfile(src, plots / name)
            written.append(plots / name)
    curves = {}
    for n in grpo_runs:
        path = run_dir / n / "curves.csv"
        if path.is_file():
            with open(path) as fh:
                rows = [r for r in csv.DictReader(fh) if r.get("reward") not in (None, "", "nan")]
            curves[n] = ([int(float(r["step"])) for r in rows], [float(r["reward"]) for r in rows])
    if curves:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for n, (x, y) in curves.items():
            ax.plot(x, y, marker="o", label=grpo_runs[n])
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        ax.set_ylabel("mean reward of the step's attempts")
        ax.set_ylim(-0.05, 1.05)
        ax.set_title("GRPO training reward (same budget)")
        ax.legend()
        fig.tight_layout()
        fig.savefig(plots / "grpo_reward.png", dpi=120)
        plt.close(fig)
        written.append(plots / "grpo_reward.png")
    recs = [(name, read_marker(run_dir, name)) for name in stage_order]
    recs = [(n, r) for n, r in recs if r is not None]
    if recs:
        fig, ax1 = plt.subplots(figsize=(6, 3.5))
        minutes = [(r.get("wall_s") or 0) / 60 for _, r in recs]
        ax1.barh([n for n, _ in recs], minutes, color="tab:blue")
        ax1.set_xlabel("wall time (min)")
        ax1.set_xlim(0, max(minutes) * 1.25 or 1)
        ax1.invert_yaxis()
        for i, ((_, r), m) in enumerate(zip(recs, minutes)):
            label = f" {fmt_duration(r.get('wall_s'))}" + (
                f", {fmt_mb(r['peak_mem_mb'])}" if r.get("peak_mem_mb") else ""
            )
            ax1.text(m, i, label, va="center", fontsize=8)
        ax1.set_title(
            f"Time per stage (total {fmt_duration(sum(r.get('wall_s') or 0 for _, r in recs))}; "
            "labels: time, peak memory)",
            fontsize=10,
        )
        fig.tight_layout()
        fig.savefig(plots / "stages.png", dpi=120)
        plt.close(fig)
        written.append(plots / "stages.png")
    return written


DRILL_MODELS = {"base": "base (SmolLM2-135M-Instruct)", "sft": "SFT cold start", "grpo-standard": "standard GRPO",
                "grpo-reterm": "ReTerm-GRPO"}
"""The four models of the drills evaluation (``reterm.eval.drills``), in table order."""

SEED_RUN = re.compile(r"^(grpo-standard|grpo-reterm)-s(\d+)$")
"""A GRPO run at a further seed (``train/run_all.sh``'s stages ``grpo-sN``, ``grpo-standard-sN``): its folder and eval
name, e.g. ``grpo-reterm-s43``; groups: the arm, the seed."""

SEED_PAIRS = (("grpo-reterm", "grpo-standard"), ("grpo-reterm", "sft"), ("grpo-standard", "sft"))
"""The paired differences reported per GRPO seed (model, baseline)."""

SEED_KEYS = {"recovery_at_1/multistage_own": "Recovery@1 own chain states", "pass_at_1/multistage_start": "Pass@1 from the start"}
"""The metrics of the per-seed table in ``summary.md`` (``summary.json`` keeps every metric of each pair)."""


def drill_models(run_dir: Path, evaluated: Any = ()) -> dict[str, str]:
    """:data:`DRILL_MODELS`, then each further seed's two GRPO runs that the run has (evaluated, i.e. a name in
    ``evaluated``, or trained: ``RUN/NAME/training_summary.json``), seed by seed: ``{name: label}``."""
    names = set(evaluated) | {p.name for p in Path(run_dir).glob("grpo-*-s*") if (p / "training_summary.json").is_file()}
    found = sorted((int(m[2]), m[1] == "grpo-reterm", m[1], m[0]) for m in map(SEED_RUN.match, names) if m)
    return {**DRILL_MODELS, **{name: f"{DRILL_MODELS[arm]} (seed {seed})" for seed, _, arm, name in found}}


def _recipe_seed(run_dir: Path) -> str:
    """The seed the unsuffixed GRPO runs trained with (their ``training_summary.json``; ``"recipe"`` when
    neither says)."""
    for name in ("grpo-reterm", "grpo-standard"):
        seed = ((load_json(Path(run_dir) / name / "training_summary.json") or {}).get("hyperparameters") or {}).get("seed")
        if seed is not None:
            return str(seed)
    return "recipe"


def by_seed(run_dir: Path, models: dict[str, dict[str, Any]], differences: dict[str, Any]) -> dict[str, Any]:
    """``summary.json``'s ``seeds``: per GRPO seed that the run trained or evaluated, its two runs (``runs``: arm ->
    run name), the paired differences of :data:`SEED_PAIRS` named by arm (``"grpo-reterm - sft"``: every metric the
    evaluation paired, as ``differences`` holds it; a pair it did not evaluate is left out), and each arm's training
    diagnostics (``zero_variance_group_share``, ``kl_to_start``, ``grad_norm``: ``{"mean", "max", "n"}`` over the
    logged steps). ``models``: ``summary.json``'s ``models``."""
    suffixes = [""] + sorted({f"-s{m[2]}" for m in map(SEED_RUN.match, models) if m}, key=lambda x: int(x[2:]))
    out: dict[str, Any] = {}
    for sfx in suffixes:
        runs = {arm: arm + sfx for arm in ("grpo-reterm", "grpo-standard")}
        present = {arm: n for arm, n in runs.items()
                   if models.get(n, {}).get("pass_at_1") or models.get(n, {}).get("steps") is not None}  # fmt: skip
        if not present:
            continue
        name = {**runs, "sft": "sft"}
        pairs = {f"{a} - {b}": differences[f"{name[a]} - {name[b]}"] for a, b in SEED_PAIRS
                 if f"{name[a]} - {name[b]}" in differences}  # fmt: skip
        diag = {arm: {"zero_variance_group_share": models[n].get("zero_variance_group_share"),
                      "kl_to_start": models[n].get("kl_to_start"),
                      "grad_norm": (models[n].get("diagnostics") or {}).get("grad_norm")} for arm, n in present.items()}  # fmt: skip
        out[sfx[2:] or _recipe_seed(run_dir)] = {"runs": present, "differences": pairs, "diagnostics": diag}
    return out


def _diff_cell(d: dict[str, Any] | None) -> str:
    """A paired difference as a table cell: ``+0.053 [+0.020, +0.093] (n=150; MDE 0.061)``; ``-`` without one."""
    if not d or d.get("diff") is None:
        return "-"
    mde = d.get("min_detectable_80")
    return (f"{d['diff']:+.3f} [{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}] (n={d['n']}; "
            f"MDE {'-' if mde is None else f'{mde:.3f}'})")  # fmt: skip


def _seeds_md(seeds: dict[str, Any]) -> list[str]:
    """The per-seed tables of ``summary.md``: the paired differences of :data:`SEED_KEYS`, and the GRPO runs'
    training diagnostics; ``[]`` when the run has no GRPO run."""
    if not seeds:
        return []
    lines = ["", "## The GRPO arms seed by seed", "",
             "Paired differences (bootstrap 95% interval over the same items; MDE: the smallest difference detectable "
             "with 80% power):", "",
             "| seed | difference | " + " | ".join(SEED_KEYS.values()) + " |", "|---|---|" + "---|" * len(SEED_KEYS)]  # fmt: skip
    for seed, v in seeds.items():
        for pair, per in v["differences"].items():
            lines.append(f"| {seed} | {pair} | " + " | ".join(_diff_cell(per.get(k)) for k in SEED_KEYS) + " |")
    lines += ["", "Training diagnostics (KL to the start: k3 estimate per assistant token on the run's last attempts; "
              "gradient norm before clipping, mean (max) over the logged steps):", "",
              "| seed | arm | zero-variance groups | KL to start | gradient norm |", "|---|---|---|---|---|"]  # fmt: skip
    for seed, v in seeds.items():
        for arm, d in v["diagnostics"].items():
            zv, kl, gn = d["zero_variance_group_share"], d["kl_to_start"] or {}, d["grad_norm"] or {}
            grad = "-" if gn.get("mean") is None else f"{gn['mean']:.3g} ({gn['max']:.3g})"
            lines.append(f"| {seed} | {DRILL_MODELS[arm]} | {'-' if zv is None else f'{zv:.2f}'} | "
                         f"{_num(kl.get('kl_k3'))} | {grad} |")  # fmt: skip
    return lines


def _rate_md(r: dict[str, Any] | None) -> str:
    if not r or r.get("value") is None:
        return "-"
    return f"{r['value']:.2f} [{r['ci95'][0]:.2f}, {r['ci95'][1]:.2f}] (n={r['n']})"


def _stage_totals(run_dir: Path, stage_order: list[str]) -> tuple[float, float]:
    """(wall seconds summed over the stages' records, the largest peak RSS in GB)."""
    wall, peak = 0.0, 0.0
    for st in stage_order:
        rec = read_marker(run_dir, st) or {}
        wall += float(rec.get("wall_s") or 0.0)
        peak = max(peak, float(rec.get("peak_mem_mb") or 0.0) / 1024)
    return round(wall, 1), round(peak, 2)


def _completion_tokens(folder: Path, training_summary: dict[str, Any]) -> int | None:
    """Completion tokens a GRPO run generated (observations inside completions included): the sum over steps
    of ``completions/mean_length`` (``curves.csv``) times the attempts per step. ``None`` without curves."""
    import csv

    path = folder / "curves.csv"
    steps = training_summary.get("steps") or 0
    if not path.is_file() or not steps:
        return None
    per_step = (training_summary.get("attempts") or 0) / steps
    with path.open() as f:
        lengths = [float(r["completions/mean_length"]) for r in csv.DictReader(f) if r.get("completions/mean_length")]
    return int(round(sum(lengths) * per_step))


def build_drills_summary(run_dir: Path, stage_order: list[str]) -> tuple[str, dict[str, Any]]:
    """The summary of a run evaluated on the recovery drills (``RUN/eval/results.json`` of ``reterm.eval.drills``).

    ``summary.json`` holds, per model, ``pass_at_1`` and ``recovery_at_1`` (each ``{"drills_id",
    "drills_ood"}`` of ``{"value", "ci95": [lo, hi], "n"}``; ``recovery_at_1`` also ``multistage_own``, from the
    state model's own multi-stage failure states (two-stage drills or chains), whose origin is
    ``multistage_states``; on chains ``pass_at_1`` also ``multistage_start``), ``valid_tool_call_rate``,
    and for each GRPO run (the two arms at each seed: :func:`drill_models`) ``zero_variance_group_share``,
    ``signal_attempt_share`` (and by state source), ``steps``, ``kl_to_start`` and ``diagnostics``; the paired
    differences, each with ``min_detectable_80``; ``seeds`` (:func:`by_seed`: the GRPO arms' differences and
    diagnostics seed by seed); ``mechanism`` (``RUN/mechanism/mechanism.json`` of
    :mod:`reterm.eval.mechanism`) when that stage ran; ``wall_s`` and ``peak_rss_gb`` of the run.
    Returns ``(markdown, data)``.
    """
    run_dir = Path(run_dir)
    results = load_json(run_dir / "eval" / "results.json") or {}
    models = results.get("models") or {}
    data: dict[str, Any] = {"run": rel_path(run_dir), "models": {}, "differences": results.get("differences", {}),
                            "multistage_states": results.get("multistage_states")}
    lines = [f"# ReTerm run `{rel_path(run_dir)}` (recovery drills)", "",
             "Rates: value [Wilson 95% interval] (n items). Greedy decoding, the kit's one harness and prompt.", "",
             "| model | Pass@1 ID | Pass@1 OOD | Recovery@1 ID | Recovery@1 OOD | valid tool calls | "
             "Recovery@1 own multi-stage states | zero-variance groups | GRPO steps (attempts, completion tokens) |",
             "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    labels = drill_models(run_dir, models)
    for name, label in labels.items():
        m = models.get(name) or {}
        entry: dict[str, Any] = {"label": label, "pass_at_1": m.get("pass_at_1"), "recovery_at_1": m.get("recovery_at_1"),
                                 "valid_tool_call_rate": m.get("valid_tool_call_rate"),
                                 "recovery_own": m.get("recovery_own"),
                                 "recovery_at_1_by_category": m.get("recovery_at_1_by_category")}  # fmt: skip
        zv = steps = None
        if name.startswith("grpo"):
            ts = load_json(run_dir / name / "training_summary.json") or {}
            if ts.get("groups"):
                zv = round(ts.get("zero_variance_groups", 0) / ts["groups"], 3)
            steps = ts.get("steps")
            if (run_dir / name / "rollouts").is_dir():
                from reterm.training.grpo_outputs import signal_share_from_rollouts

                sig = signal_share_from_rollouts(run_dir / name / "rollouts")
                entry.update(signal_attempt_share=sig["all"], signal_attempt_share_by_source=sig["by_source"])
            entry.update(zero_variance_group_share=zv, steps=steps, attempts=ts.get("attempts"),
                         completion_tokens=_completion_tokens(run_dir / name, ts),
                         reward_first_last=[ts.get("first_reward"), ts.get("final_reward")],
                         kl_to_start=ts.get("kl_to_start"), diagnostics=ts.get("diagnostics"))  # fmt: skip
        data["models"][name] = entry
        budget = "-" if steps is None else f"{steps} ({entry.get('attempts')}, {entry.get('completion_tokens')})"
        p1, r1 = m.get("pass_at_1") or {}, m.get("recovery_at_1") or {}
        lines.append(f"| {label} | {_rate_md(p1.get('drills_id'))} | {_rate_md(p1.get('drills_ood'))} | "
                     f"{_rate_md(r1.get('drills_id'))} | {_rate_md(r1.get('drills_ood'))} | "
                     f"{_rate_md(m.get('valid_tool_call_rate'))} | {_rate_md(r1.get('multistage_own'))} | "
                     f"{'-' if zv is None else f'{zv:.2f}'} | "
                     f"{budget} |")  # fmt: skip
    if data["multistage_states"]:
        from reterm.eval.drills import multistage_states_line  # .venv only: stages.py runs before it exists

        lines += ["", multistage_states_line(data["multistage_states"], _rate_md)]
    lines += ["", "## Paired differences (bootstrap 95% interval over the same items)", ""]
    for pair, per in data["differences"].items():
        for key, d in per.items():
            if d.get("diff") is None:
                continue
            if d["excludes_zero"]:
                word = "better" if d["diff"] > 0 else "worse"
                verdict = f"{pair.split(' - ')[0]} is {word} than {pair.split(' - ')[1]}"
            else:
                verdict = "the interval includes 0: no difference shown"
            mde = d.get("min_detectable_80")
            lines.append(f"- {pair}, {key}: {d['diff']:+.3f} [{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}] "
                         f"(n={d['n']}; smallest difference detectable with 80% power: "
                         f"{'-' if mde is None else f'{mde:.3f}'}): {verdict}")  # fmt: skip
    data["seeds"] = by_seed(run_dir, data["models"], data["differences"])
    lines += _seeds_md(data["seeds"])
    sig_rows = [(labels[n], data["models"][n].get("signal_attempt_share")) for n in labels
                if data["models"].get(n, {}).get("signal_attempt_share")]  # fmt: skip
    if sig_rows:
        lines += ["", "## GRPO groups with a learning signal", "",
                  "Share of each run's attempts in groups whose rewards differ (the only ones with a gradient), "
                  "95% bootstrap interval over groups:", ""]  # fmt: skip
        lines += [f"- {label}: {_rate_md(r)}, {r['signal_groups']}/{r['groups']} groups" for label, r in sig_rows]
    mech = load_json(run_dir / "mechanism" / "mechanism.json")
    if mech:
        data["mechanism"] = {"signal_attempt_share": mech["signal_attempt_share"],
                             "difference": mech["difference"], "pass_rate": mech.get("pass_rate"),
                             "n_tasks": mech.get("n_tasks"), "no_failure_state": mech.get("no_failure_state"),
                             "settings": mech.get("settings"), "by_stages_done": mech.get("by_stages_done"),
                             "power_plan": mech.get("power_plan")}  # fmt: skip
        s_, d = mech["signal_attempt_share"], mech["difference"]["failure_state - task_start"]
        lines += ["", "## The mechanism (no training): groups from the SFT model's own failure states vs task starts",
                  "", f"{mech.get('n_tasks')} multi-stage drills, the same G and caps in both arms "
                  f"(`{rel_path(run_dir)}/mechanism/report.md`):", "",
                  f"- signal_attempt_share from the task start: {_rate_md(s_['task_start'])}",
                  f"- signal_attempt_share from the own failure state: {_rate_md(s_['failure_state'])}",
                  "- paired difference: " + ("-" if d.get("diff") is None else
                  f"{d['diff']:+.3f} [{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}] (n={d['n']} tasks; smallest "
                  f"difference detectable with 80% power: {d.get('min_detectable_80')})")]  # fmt: skip
        lines += _mechanism_detail_md(mech)
    wall, peak = _stage_totals(run_dir, stage_order)
    data.update(wall_s=wall, peak_rss_gb=peak)
    lines += ["", "## Time and memory per stage", "", "| stage | wall | peak RSS |", "|---|---|---|"]
    for st in stage_order:
        rec = read_marker(run_dir, st) or {}
        lines.append(f"| {st} | {fmt_duration(rec.get('wall_s'))} | {fmt_mb(rec.get('peak_mem_mb'))} |")
    lines += [f"| **total** | {fmt_duration(wall)} | {peak:.1f} GB |", "",
              f"Details: `{rel_path(run_dir)}/eval/report.md` (Recovery@k, Fatal Attempt Rate, per category), "
              f"`{rel_path(run_dir)}/data/stats.json`, the GRPO curves in `{rel_path(run_dir)}/grpo-*/curves.png`."]  # fmt: skip
    return "\n".join(lines) + "\n", data


def _mechanism_detail_md(mech: dict[str, Any]) -> list[str]:
    """Markdown lines for the mechanism's split by the failure state's stages done (chains only) and the power
    calculation stated before the run (``mechanism.json``'s ``by_stages_done`` and ``power_plan``); ``[]`` when
    the run has neither."""
    lines: list[str] = []
    for j, v in (mech.get("by_stages_done") or {}).items():
        s_, d = v["signal_attempt_share"], v["difference"]
        diff = "-" if d.get("diff") is None else f"{d['diff']:+.3f} [{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}] (n={d['n']})"
        lines.append(f"- failure state with {j} stages done ({v['tasks']} tasks): share from the task start "
                     f"{_rate_md(s_['task_start'])}, from the failure state {_rate_md(s_['failure_state'])}; "
                     f"paired difference {diff}")  # fmt: skip
    pp = mech.get("power_plan")
    if pp:
        lines.append(f"- planned before the run: assumed discordance {pp['psi_assumed']}, difference {pp['delta']}: "
                     f"{pp['n_needed']} paired tasks needed for 80% power at 95% (two-sided); {pp['n_planned']} "
                     f"planned (smallest detectable there: {pp['min_detectable_at_planned']})")  # fmt: skip
    return lines


def provenance(run_dir: Path, stage_order: list[str]) -> dict[str, Any]:
    """Where the run's figures come from (``summary.json`` ``provenance``; ``train/measured.py`` reads it): the
    commit(s) its stages ran at, when the last stage finished, the machine (:func:`run_records.machine`), and per
    stage the exact command, the digests of the config files it watched, wall time, peak memory and load.
    """
    stages: dict[str, Any] = {}
    for st in stage_order:
        rec = read_marker(run_dir, st)
        if rec is None:
            continue
        stages[st] = {k: rec.get(k) for k in ("command", "inputs", "wall_s", "peak_mem_mb", "load_avg_mean",
                                              "finished_at", "git", "speed_env")}  # fmt: skip
    commits = sorted({(s["git"] or {}).get("commit") for s in stages.values() if s.get("git")} - {None})
    finished = sorted(s["finished_at"] for s in stages.values() if s.get("finished_at"))
    return {"commits": commits, "dirty": any((s.get("git") or {}).get("dirty") for s in stages.values()),
            "summary_commit": git_commit(), "finished_at": finished[-1] if finished else None,
            "machine": machine(), "stages": stages}


def summary(run_dir: Path, stage_order: list[str]) -> int:
    """Write ``RUN/plots/``, ``RUN/summary.md`` and ``RUN/summary.json`` and print the summary."""
    run_dir = Path(run_dir)
    write_plots(run_dir, stage_order)
    results = load_json(run_dir / "eval" / "results.json") or {}
    if isinstance(results.get("models"), dict):  # the drills evaluation (reterm.eval.drills)
        md, data = build_drills_summary(run_dir, stage_order)
    else:
        md, data = build_summary(run_dir, stage_order)
    data["provenance"] = provenance(run_dir, stage_order)
    (run_dir / "summary.md").write_text(md)
    write_json_atomic(run_dir / "summary.json", data)
    print(md)
    return 0
