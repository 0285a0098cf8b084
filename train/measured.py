"""Write the "Measured" section of docs/RESULTS.md from a run's ``summary.json``, so that the numbers in the docs are
the numbers of a run and say which run::

    python train/measured.py runs/smollm2-135m/summary.json                 # rewrites docs/RESULTS.md's section
    python train/measured.py runs/smollm2-135m/summary.json --print         # prints it instead
    python train/measured.py RUN/summary.json --doc docs/RESULTS.md --size default

The README's results table is a summary of this section (tests/test_docs_defaults.py checks that its figures are
the section's). The section lies between the document's marker comments ``<!-- measured:begin -->`` and ``<!-- measured:end -->``;
everything outside them is left as it is. It holds, all read from ``summary.json`` (``train/stages.py summary``
writes it; its ``provenance`` block comes from the stage records):

- the run: its folder, size and recipe, the commit(s) its stages ran at (and whether the checkout had
  uncommitted changes), when it finished, the machine (CPUs, memory, CPU model, bf16 units);
- **which defaults differ from today's code**: each stage's recorded command compared with the command
  ``bash train/run_all.sh --dry-run`` composes now for the same run folder and size, flag by flag, and each
  config file the stage watched (its recipe) compared by content digest; stages one side has and the other
  lacks are named;
- every figure with its n and interval: Pass@1 and Recovery@1 (in and out of distribution), valid tool calls,
  the GRPO runs' learning-signal share (attempts in groups with differing rewards), steps and attempts (each GRPO
  arm at each seed the run trained), the paired differences with their power (each seed's among them), the GRPO
  runs' training diagnostics seed by seed (zero-variance groups, KL to the start, gradient norm), the mechanism
  stage's two arms and their difference, and time and peak memory per stage.

Raises (as a clear error on stderr, exit status 2): a ``summary.json`` without ``models`` or ``provenance`` (a run
summarised before this script existed: run ``train/stages.py summary --run-dir RUN`` again), a document without the
markers.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run_records, check_recipe: this folder's modules

from check_recipe import parse_dry_run  # noqa: E402

from reterm.eval.drills import multistage_states_line  # noqa: E402

from run_records import REPO, config_digest, fmt_duration, fmt_mb, raw_digest  # noqa: E402

BEGIN, END = "<!-- measured:begin -->", "<!-- measured:end -->"
MODEL_LABELS = {"base": "base (SmolLM2-135M-Instruct)", "sft": "SFT cold start", "grpo-standard": "standard GRPO",
                "grpo-reterm": "ReTerm-GRPO"}  # fmt: skip


def rate(r: dict[str, Any] | None, digits: int = 2) -> str:
    """``{"value", "ci95", "n"}`` -> ``"0.16 [0.07, 0.32] (n=32)"``; ``"-"`` when there is no value."""
    if not r or r.get("value") is None:
        return "-"
    lo, hi = r["ci95"]
    return f"{r['value']:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}] (n={r['n']})"


def flags(argv: list[str]) -> dict[str, list[tuple[str, ...]]]:
    """A command's ``--flag value...`` arguments: flag -> the value tuples of each occurrence (in order), and
    ``""`` -> the words before the first flag (the program and script)."""
    out: dict[str, list[tuple[str, ...]]] = {}
    key, values = "", []
    for word in [*argv, "--"]:
        if word.startswith("--"):
            out.setdefault(key, []).append(tuple(values))
            key, values = word.split("=", 1)[0], ([word.split("=", 1)[1]] if "=" in word else [])
        else:
            values.append(word)
    return out


def _show(occurrences: list[tuple[str, ...]] | None) -> str:
    if not occurrences:
        return "absent"
    return "; ".join(" ".join(v) if v else "(set)" for v in occurrences)


def command_differences(run: list[str], today: list[str]) -> list[str]:
    """What differs between a stage's recorded command and today's, flag by flag (markdown fragments)."""
    a, b = flags(run), flags(today)
    out = []
    for key in list(dict.fromkeys([*a, *b])):
        if a.get(key) != b.get(key):
            name = "the program" if key == "" else f"`{key}`"
            out.append(f"{name}: run `{_show(a.get(key))}`, today `{_show(b.get(key))}`")
    return out


def digest(path: Path) -> str | None:
    """The stage runner's digest of a watched file (``train/stages.py`` ``_digest``: :func:`config_digest`, a
    YAML recipe's settings without its comments)."""
    return config_digest(path)


def todays_commands(run_dir: str, size: str, recipe: str) -> dict[str, list[str]]:
    """The stage commands ``bash train/run_all.sh --dry-run`` composes now for ``run_dir`` (as the run named it).

    Raises:
        RuntimeError: run_all.sh exited non-zero (its stderr in the message).
    """
    cmd = ["bash", "train/run_all.sh", "--recipe", recipe, "--size", size, "--run-dir", run_dir, "--dry-run"]
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd)}` exited {r.returncode}: {r.stderr.strip()[-500:]}")
    return parse_dry_run(r.stdout)


def portable(argv: list[str], run: str) -> list[str]:
    """``argv`` with the run folder written as ``RUN``, wherever the checkout was: run_all passes checkpoints as
    absolute paths (``hf:/CHECKOUT/runs/x/sft/merged``), which differ between checkouts of the same run."""
    rel = run.rstrip("/")
    absolute = re.compile(r"(?<![\w.])/[^\s:=]*?/" + re.escape(rel.lstrip("/")) + r"(?=/|$)")
    relative = re.compile(r"(?<![\w./-])" + re.escape(rel) + r"(?=/|$)")
    return [relative.sub("RUN", absolute.sub("RUN", w)) if rel else w for w in argv]


def differences(prov: dict[str, Any], today: dict[str, list[str]], run: str = "") -> list[str]:
    """Which defaults of the run differ from today's code (markdown bullet lines; empty when none do). ``run``:
    the run folder as both commands name it (see :func:`portable`)."""
    lines = []
    run_stages = prov.get("stages") or {}
    for stage in list(dict.fromkeys([*today, *run_stages])):
        if stage in ("setup", "summary"):  # setup: always `bash scripts/setup.sh`; summary: keeps no record
            continue
        rec = run_stages.get(stage)
        if rec is None:
            lines.append(f"- `{stage}`: not run in this run (today's chain has it)")
            continue
        if stage not in today:
            lines.append(f"- `{stage}`: ran in this run; today's chain has no such stage")
            continue
        diffs = command_differences(portable([str(w) for w in rec.get("command") or []], run),
                                    portable(today[stage], run))  # fmt: skip
        for path, old in sorted((rec.get("inputs") or {}).items()):
            new = digest(REPO / path)
            if old not in (new, raw_digest(REPO / path)):  # a record made before comments were left out: bytes
                diffs.append(f"`{path}` {'changed' if new else 'is gone'} since the run (digest {old} -> {new})")
        lines += [f"- `{stage}`: {d}" for d in diffs]
    return lines


def _size_and_recipe(summary: dict[str, Any]) -> tuple[str, str]:
    """The run's size (``ci`` for a run folder named ``*-ci``, else ``default``) and recipe (from the SFT
    command's ``--config train/recipes/NAME/sft.yaml``; default ``smollm2-135m``)."""
    run = str(summary.get("run") or summary.get("run_dir") or "")
    size = "ci" if run.rstrip("/").endswith("-ci") else "default"
    sft = ((summary.get("provenance") or {}).get("stages") or {}).get("sft") or {}
    argv = [str(w) for w in sft.get("command") or []]
    recipe = "smollm2-135m"
    if "--config" in argv:
        parts = Path(argv[argv.index("--config") + 1]).parts
        if "recipes" in parts and parts.index("recipes") + 1 < len(parts):
            recipe = parts[parts.index("recipes") + 1]
    return size, recipe


def section(summary: dict[str, Any], today: dict[str, list[str]] | None, size: str, recipe: str,
            source: str) -> str:  # fmt: skip
    """The Measured section (without the markers) for ``summary`` (see the module docstring). ``today``: the stage
    commands of today's code (:func:`todays_commands`), or ``None`` when they could not be composed."""
    prov = summary["provenance"]
    m = prov.get("machine") or {}
    commits = prov.get("commits") or []
    code = ", ".join(f"`{c[:7]}`" for c in commits) or "unknown (no git record)"
    if prov.get("dirty"):
        code += " with uncommitted changes"
    unrecorded = [st for st, rec in (prov.get("stages") or {}).items() if not rec.get("git")]
    if commits and unrecorded:
        code += f" (stages without a commit record: {', '.join(unrecorded)})"
    run = str(summary.get("run") or summary.get("run_dir"))
    # a run outside the checkout: its folder's name only (no path of this machine in the docs)
    run_label = f"`{Path(run).name}` (outside the checkout)" if Path(run).is_absolute() else f"`{run}`"
    units = ", ".join(m.get("bf16_units") or []) or "none"
    lines = [f"<!-- Written by `python train/measured.py {source}`: edit that run or this script, not the text. -->",
             "", f"**Run** {run_label} (recipe `{recipe}`, size `{size}`): code at commit{'s' if len(commits) > 1 else ''} "
             f"{code}, finished {prov.get('finished_at')}, on {m.get('cpus')} CPUs ({m.get('cpu_model') or 'model unknown'}; "
             f"bf16 matrix units: {units}) with {m.get('memory_gb')} GB of memory.", ""]  # fmt: skip
    if today is None:
        lines += ["**Defaults that differ from today's code:** not known (today's run_all.sh did not compose its "
                  "commands).", ""]
    else:
        diff = differences(prov, today, run)
        if diff:
            lines += ["**Defaults that differ from today's code** (the run's stage commands and watched configs "
                      "against `bash train/run_all.sh --dry-run` now): these numbers are not those of today's "
                      "defaults.", "", *diff, ""]
        else:
            lines += ["**Defaults that differ from today's code:** none (every stage's command and watched config "
                      "are today's).", ""]
    models = summary.get("models") or {}
    lines += ["Rates: value [Wilson 95% interval] (n items); the learning-signal share is the share of a GRPO run's "
              "attempts in groups whose rewards differ, with a bootstrap interval over groups.", "",
              "| model | Pass@1 ID | Pass@1 OOD | Recovery@1 ID | Recovery@1 OOD | valid tool calls | "
              "Recovery@1 own multi-stage states | GRPO learning-signal share | GRPO steps (attempts) |",
              "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    # the four models, then each further seed's GRPO runs the run has (their labels name the seed)
    labels = {**MODEL_LABELS, **{n: e.get("label") or n for n, e in models.items() if n not in MODEL_LABELS}}
    for name, label in labels.items():
        e = models.get(name) or {}
        p1, r1 = e.get("pass_at_1") or {}, e.get("recovery_at_1") or {}
        sig = e.get("signal_attempt_share")
        sig_s = "-" if not sig else f"{rate(sig)}; {sig.get('signal_groups')}/{sig.get('groups')} groups"
        steps = "-" if e.get("steps") is None else f"{e['steps']} ({e.get('attempts')})"
        lines.append(f"| {label} | {rate(p1.get('drills_id'))} | {rate(p1.get('drills_ood'))} | "
                     f"{rate(r1.get('drills_id'))} | {rate(r1.get('drills_ood'))} | "
                     f"{rate(e.get('valid_tool_call_rate'))} | {rate(r1.get('multistage_own'))} | {sig_s} | "
                     f"{steps} |")  # fmt: skip
    if summary.get("multistage_states"):
        lines += ["", multistage_states_line(summary["multistage_states"], rate)]
    diffs = [(pair, key, d) for pair, per in (summary.get("differences") or {}).items() for key, d in per.items()
             if d.get("diff") is not None]  # fmt: skip
    if diffs:
        lines += ["", "Paired differences (bootstrap 95% interval over the same items; the smallest difference "
                  "detectable with 80% power):", ""]
        for pair, key, d in diffs:
            mde = d.get("min_detectable_80")
            verdict = "no difference shown" if not d.get("excludes_zero") else ("better" if d["diff"] > 0 else "worse")
            lines.append(f"- {pair}, {key}: {d['diff']:+.3f} [{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}] (n={d['n']}; "
                         f"{'-' if mde is None else f'{mde:.3f}'}): {verdict}")  # fmt: skip
    diag = [(seed, arm, d) for seed, v in (summary.get("seeds") or {}).items()
            for arm, d in (v.get("diagnostics") or {}).items()]  # fmt: skip
    if diag:
        lines += ["", "GRPO training diagnostics, seed by seed (KL to the start: k3 estimate per assistant token on the "
                  "run's last attempts; gradient norm before clipping, mean (max) over the logged steps):", ""]
        for seed, arm, d in diag:
            zv, kl, gn = d.get("zero_variance_group_share"), d.get("kl_to_start") or {}, d.get("grad_norm") or {}
            kl_s = "-" if kl.get("kl_k3") is None else f"{kl['kl_k3']:.3g} ({kl.get('tokens')} tokens)"
            gn_s = "-" if gn.get("mean") is None else f"{gn['mean']:.3g} ({gn['max']:.3g}; {gn['n']} steps)"
            lines.append(f"- seed {seed}, {MODEL_LABELS[arm]}: zero-variance group share "
                         f"{'-' if zv is None else f'{zv:.2f}'}, KL to start {kl_s}, gradient norm {gn_s}")  # fmt: skip
    mech = summary.get("mechanism")
    if mech:
        s = mech.get("signal_attempt_share") or {}
        d = (mech.get("difference") or {}).get("failure_state - task_start") or {}
        diff_s = "-" if d.get("diff") is None else (f"{d['diff']:+.3f} [{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}] "
                                                    f"(n={d['n']} tasks)")  # fmt: skip
        lines += ["", f"The mechanism stage ({mech.get('n_tasks')} multi-stage drills, no training): learning-signal "
                  f"share from the task start {rate(s.get('task_start'))}, from the SFT model's own failure state "
                  f"{rate(s.get('failure_state'))}; paired difference {diff_s}."]  # fmt: skip
        extra = []
        for j, v in (mech.get("by_stages_done") or {}).items():
            sj, dj = v.get("signal_attempt_share") or {}, v.get("difference") or {}
            dj_s = "-" if dj.get("diff") is None else (f"{dj['diff']:+.3f} [{dj['ci95'][0]:+.3f}, "
                                                      f"{dj['ci95'][1]:+.3f}] (n={dj['n']} tasks)")  # fmt: skip
            extra.append(f"- failure state with {j} stages done ({v.get('tasks')} tasks): share from the task start "
                         f"{rate(sj.get('task_start'))}, from the failure state {rate(sj.get('failure_state'))}; "
                         f"paired difference {dj_s}.")  # fmt: skip
        pp = mech.get("power_plan")
        if pp:
            extra.append(f"- Planned before the run: {pp['n_needed']} paired tasks for 80% power at 95% to detect a "
                         f"difference of {pp['delta']} at assumed discordance {pp['psi_assumed']}; {pp['n_planned']} "
                         f"planned (smallest detectable there: {pp['min_detectable_at_planned']}).")  # fmt: skip
        lines += [""] + extra if extra else []
    lines += ["", "| stage | wall | peak memory (process tree) | mean load | commit |", "|---|---|---|---|---|"]
    for stage, rec in (prov.get("stages") or {}).items():
        git = (rec.get("git") or {}).get("commit")
        load = rec.get("load_avg_mean")
        lines.append(f"| {stage} | {fmt_duration(rec.get('wall_s'))} | {fmt_mb(rec.get('peak_mem_mb'))} | "
                     f"{'-' if load is None else load} | {'-' if not git else f'`{git[:7]}`'} |")  # fmt: skip
    lines.append(f"| **total** | {fmt_duration(summary.get('wall_s'))} | {summary.get('peak_rss_gb')} GB (largest "
                 "stage) | | |")
    return "\n".join(lines) + "\n"


def replace_section(readme: str, body: str, where: str = "docs/RESULTS.md") -> str:
    """``readme`` (a document's text) with the text between the markers replaced by ``body``.

    Raises:
        ValueError: the markers are missing, repeated or out of order (naming ``where``).
    """
    if readme.count(BEGIN) != 1 or readme.count(END) != 1 or readme.index(BEGIN) > readme.index(END):
        raise ValueError(f"{where}: needs exactly one {BEGIN} followed by one {END} around the Measured section")
    head, rest = readme.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{body}{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python train/measured.py", description=__doc__.split("\n\n")[0])
    p.add_argument("summary", type=Path, help="a run's summary.json (train/stages.py summary)")
    p.add_argument("--doc", "--readme", dest="doc", type=Path, default=REPO / "docs" / "RESULTS.md",
                   help="the document whose Measured section is rewritten (default: docs/RESULTS.md)")
    p.add_argument("--size", choices=["default", "ci"], help="the run's size (default: ci for a *-ci run folder)")
    p.add_argument("--print", action="store_true", help="print the section instead of writing the document")
    a = p.parse_args(argv)
    try:
        summary = json.loads(a.summary.read_text())
        if not isinstance(summary, dict) or not isinstance(summary.get("models"), dict) or "provenance" not in summary:
            raise ValueError(f"{a.summary}: no 'models' mapping or no 'provenance' (summarise the run again: "
                             "python train/stages.py summary --run-dir RUN)")  # fmt: skip
        size, recipe = _size_and_recipe(summary)
        size = a.size or size
        try:
            today = todays_commands(str(summary.get("run") or summary.get("run_dir")), size, recipe)
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
            print(f"train/measured.py: warning: {exc}", file=sys.stderr)
            today = None
        source = a.summary.resolve()
        source_s = str(source.relative_to(REPO)) if source.is_relative_to(REPO) else a.summary.name
        body = section(summary, today, size, recipe, source_s)
        if a.print:
            print(body, end="")
            return 0
        a.doc.write_text(replace_section(a.doc.read_text(), body, str(a.doc)))
        print(f"[measured] {a.doc}: the Measured section now shows {summary.get('run') or summary.get('run_dir')}")
        return 0
    except (OSError, ValueError, KeyError) as exc:
        print(f"train/measured.py: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
