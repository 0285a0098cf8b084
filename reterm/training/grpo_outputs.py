"""What a ReTerm-GRPO run leaves next to its checkpoint: learning curves (CSV + PNG) and the summary.

- ``curves.csv``: one row per logged step: TRL's ``loss``, ``reward``, ``reward_std``, ``grad_norm``,
  ``entropy``, ``learning_rate``, ``completions/mean_length``, and every ``reterm/...`` metric of
  :class:`reterm.training.grpo_trainer.ReTermGRPOTrainer` (recovery rate per category included).
- ``curves.png``: reward, recovery rate per error category, zero-variance / infrastructure-fault /
  dropped-group shares, turns per attempt, fork and rollout time, generated tokens per second.
- ``training_summary.json``: the model card's inputs (written by ``train/grpo.py`` with
  :func:`reterm.training.outputs.write_training_summary`).

Every file is written atomically (temporary file, then rename).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

from reterm.recovery import localise
from reterm.stats import signal_attempt_share
from reterm.training.outputs import save_figure_atomic, write_bytes_atomic, write_csv_atomic
from reterm.trajectory import Trajectory

BASE_COLUMNS = ("step", "loss", "reward", "reward_std", "grad_norm", "entropy", "learning_rate",
                "completions/mean_length", "frac_reward_zero_std")  # fmt: skip


def curve_rows(log_history: list[dict[str, Any]]) -> tuple[list[str], list[dict[str, Any]]]:
    """``(columns, rows)``: one row per step that logged a ``reward`` (the end-of-training entry is left out)."""
    entries = [e for e in log_history if "step" in e and "reward" in e]
    extra = sorted({k for e in entries for k in e if k.startswith("reterm/")})
    columns = list(BASE_COLUMNS) + extra
    rows = [{c: e.get(c) for c in columns} for e in entries]
    return columns, rows


def _series(rows: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    pts = [(r["step"], r[key]) for r in rows if r.get(key) is not None and not math.isnan(float(r[key]))]
    return ([p[0] for p in pts], [float(p[1]) for p in pts]) if pts else ([], [])


def write_grpo_curves(log_history: list[dict[str, Any]], out_dir: str | Path, title: str = "ReTerm-GRPO") -> dict[str, Path]:
    """Write ``curves.csv`` and ``curves.png`` to ``out_dir`` (see the module docstring).

    Returns:
        ``{"csv": path, "png": path}``.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    columns, rows = curve_rows(log_history)
    csv_path = write_csv_atomic(out / "curves.csv", columns, rows)

    fig, axes = plt.subplots(2, 3, figsize=(14, 7))
    panels = [
        (axes[0][0], "reward", [("reward", "reward (trained)"), ("reterm/reward_mean", "reward, scored attempts"),
                                 ("reterm/pass_rate", "verifier passes, scored attempts")]),
        (axes[0][1], "recovery rate", [(c, c.split("/")[-1]) for c in columns if c.startswith("reterm/recovery_rate/")]),
        (axes[0][2], "share", [("reterm/zero_variance_group_share", "zero-variance groups"),
                               ("reterm/submitted_share", "attempts that submitted"),
                               ("reterm/infra_fault_share", "infrastructure faults"),
                               ("reterm/dropped_group_share", "dropped groups"),
                               ("reterm/skipped_microbatch_share", "skipped micro-batches (zero gradient)")]),
        (axes[1][0], "turns per attempt", [("reterm/turns_per_attempt", "turns")]),
        (axes[1][1], "seconds", [("reterm/fork_s", "fork per group"), ("reterm/rollout_s", "rollout")]),
        (axes[1][2], "generated tokens / s", [("reterm/tokens_per_s", "tokens/s")]),
    ]  # fmt: skip
    for ax, ylabel, series in panels:
        drawn = False
        for key, label in series:
            xs, ys = _series(rows, key)
            if xs:
                ax.plot(xs, ys, marker=".", label=label)
                drawn = True
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if drawn:
            ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    png_path = save_figure_atomic(fig, out / "curves.png", dpi=100)
    return {"csv": csv_path, "png": png_path}


def recovery_table(totals: dict[str, float]) -> str:
    """Markdown table of recovery rate per error category over the whole run (from the trainer's ``totals``)."""
    cats = sorted(k.split("/", 1)[1] for k in totals if k.startswith("cat_attempts/"))
    lines = ["| category | attempts | recovered | recovery rate |", "|---|---:|---:|---:|"]
    for c in cats:
        n, ok = totals[f"cat_attempts/{c}"], totals.get(f"cat_passed/{c}", 0)
        lines.append(f"| {c} | {int(n)} | {int(ok)} | {ok / n:.2f} |" if n else f"| {c} | 0 | 0 | - |")
    return "\n".join(lines)


ROLLOUT_FILES = "round-*-step-*-rank*.jsonl"  # what ReTermGRPOTrainer writes to output_dir/rollouts/


def rollout_file_name(generation_round: int, step: int, rank: int) -> str:
    """The rollouts file of one generation round of one process (matches :data:`ROLLOUT_FILES`)."""
    return f"round-{generation_round:05d}-step-{step:05d}-rank{rank}.jsonl"


def write_rollout_file(path: Path, rows: list[dict[str, Any]]) -> Path:
    """Write :func:`rollout_rows` as one JSON object per line, atomically; returns ``path``."""
    return write_bytes_atomic(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode())


def rollout_rows(results: list[Any], step: int, generation_round: int) -> list[dict[str, Any]]:
    """One JSON-ready row per attempt of ``results`` (a step's ``GroupRollout`` list), the format of the
    rollouts files (:func:`read_rollout_file` lists the keys)."""
    rows = []
    for gr in results:
        for a in gr.attempts:
            rows.append({
                "step": step, "round": generation_round, "group": gr.group, "attempt": a.index,
                "state_id": gr.state.state_id, "task_id": gr.state.task_id, "category": gr.state.category,
                "state_source": gr.state.state_source.value, "pool_origin": gr.state.source, "dropped": gr.dropped, "reward": a.reward,
                "verifier_reward": None if a.trajectory is None else a.trajectory.reward,
                "outcome": a.outcome, "mask_reason": a.mask_reason, "environment_id": a.environment_id,
                "tokens": None if a.tokens is None else {
                    "prompt": len(a.tokens.prompt_ids), "completion": len(a.tokens.completion_ids),
                    "generated": a.tokens.generated_tokens, "exact": a.tokens.exact},
                "trajectory": None if a.trajectory is None else a.trajectory.model_dump(mode="json"),
            })  # fmt: skip
    return rows


def read_rollout_file(path: str | Path) -> list[dict[str, Any]]:
    """The attempt rows of one rollouts file (one JSON object per line, as ``ReTermGRPOTrainer`` writes
    them: ``step``, ``round``, ``group``, ``attempt``, ``state_id``, ``task_id``, ``category``, ``reward`` (the
    trained reward, :func:`reterm.rewards.training_reward`), ``verifier_reward`` (the verifier's; absent in files
    written before it existed), ``outcome``, ``mask_reason``, ``dropped``, ``tokens``, ``trajectory`` (a ``Trajectory`` dump or None)).

    Raises:
        ValueError: naming the file and line of a line that is not a JSON object with an integer ``group``
            and a numeric or null ``reward``.
    """
    rows = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{n}: not JSON ({exc.msg})") from None
        if not isinstance(row, dict) or "group" not in row or "reward" not in row:
            raise ValueError(f"{path}:{n}: not a GRPO rollout row (needs 'group' and 'reward')")
        if isinstance(row["group"], bool) or not isinstance(row["group"], int):
            raise ValueError(f"{path}:{n}: group = {row['group']!r} is not an integer")
        if row["reward"] is not None and (isinstance(row["reward"], bool) or not isinstance(row["reward"], (int, float))):
            raise ValueError(f"{path}:{n}: reward = {row['reward']!r} is not a number or null")
        rows.append(row)
    return rows


def totals_from_rollouts(folder: str | Path, mode: str = "reterm") -> Counter:
    """Whole-run counts recomputed from the attempts written to ``output_dir/rollouts/`` (a resumed run's
    rounds before the resume included), with the keys of ``ReTermGRPOTrainer.totals``: ``groups``,
    ``attempts``, ``scored``, ``passed``, ``submitted`` (scored attempts that ended with the agent's submit), ``infra``, ``zero_variance_groups``, ``dropped_<kind>``,
    ``signal_attempts`` (scored attempts in groups whose rewards differ: the ones with a gradient; also
    ``signal_attempts/<state source>`` beside ``scored/<state source>``),
    ``cat_attempts/<category>`` and ``cat_passed/<category>`` (ReTerm mode: the state's category; standard
    mode: the categories localised in each scored attempt). Files of one round are read once (the latest
    write of a round wins).
    """

    totals: Counter = Counter()
    for path in sorted(Path(folder).glob(ROLLOUT_FILES)):
        rows = read_rollout_file(path)
        groups: dict[int, list[dict]] = {}
        for r in rows:
            groups.setdefault(r["group"], []).append(r)
        for members in groups.values():
            totals["groups"] += 1
            dropped = members[0].get("dropped")
            if dropped:
                totals[f"dropped_{dropped.split(':', 1)[0]}"] += 1
            scored = [m for m in members if m["reward"] is not None]
            if scored and len({m["reward"] for m in scored}) == 1 and not dropped:
                totals["zero_variance_groups"] += 1
            source = members[0].get("state_source") or "unknown"
            signal = len(scored) if not dropped and len({m["reward"] for m in scored}) > 1 else 0
            totals["signal_attempts"] += signal
            totals[f"signal_attempts/{source}"] += signal
            totals[f"scored/{source}"] += 0 if dropped else len(scored)
            for m in members:
                totals["attempts"] += 1
                totals["infra"] += m.get("mask_reason") == "infra_fault"
                if m["reward"] is None:
                    continue
                passed = m["outcome"] == "success"
                totals["scored"] += 1
                totals["passed"] += passed
                totals["submitted"] += (m.get("trajectory") or {}).get("stop_reason") == "submitted"
                if mode == "standard" and m.get("trajectory"):
                    traj = Trajectory.model_validate(m["trajectory"])
                    cats = sorted({fs.category for fs in localise(traj, include_history=True).states})
                else:
                    cats = [m.get("category") or "unknown"]
                for c in cats:
                    totals[f"cat_attempts/{c}"] += 1
                    totals[f"cat_passed/{c}"] += passed
    return totals


def signal_share_from_rollouts(folder: str | Path) -> dict[str, Any]:
    """``signal_attempt_share`` of a GRPO run from its ``rollouts/`` (:func:`reterm.stats.signal_attempt_share`):
    ``{"all": {...}, "by_source": {source: {...}}}``, each ``{"value", "ci95", "n", "groups", "signal_groups"}``.
    Dropped groups are left out (they were never trained on); a resumed run's rounds count once."""

    groups: list[list[float | None]] = []
    by_source: dict[str, list[list[float | None]]] = {}
    for path in sorted(Path(folder).glob(ROLLOUT_FILES)):
        members: dict[int, list[dict]] = {}
        for r in read_rollout_file(path):
            members.setdefault(r["group"], []).append(r)
        for rows in members.values():
            if rows[0].get("dropped"):
                continue
            rewards = [m["reward"] for m in rows]
            groups.append(rewards)
            by_source.setdefault(rows[0].get("state_source") or "unknown", []).append(rewards)
    return {"all": signal_attempt_share(groups),
            "by_source": {s: signal_attempt_share(g) for s, g in sorted(by_source.items())}}
