"""The Terminal-Bench 2.0 table of docs/SANDBOX.md from the outputs of ``reterm tasks verify``.

``python scripts/tb2_table.py TASKS --offline RUN [--host RUN]`` prints a markdown table, one row per task
folder of ``TASKS`` (task | FROM | build (s), of the run that built the layer | offline oracle / no-op | offline
s | offline status | host oracle / no-op | host status | reason), then the totals by status and the faults by cause: ``network_error``
by the host a solution or verifier could not reach (and the packages the offline shim could not install),
build faults by the host the step could not reach, the refused tasks with their reason, the scored ``FAIL``
tasks with the tests that failed.

``RUN`` is the ``--out`` folder of a ``reterm tasks verify`` run (or its ``verify.json`` or
``verify-progress.jsonl``). A run that is still going, or was stopped, has finished tasks only in
``verify-progress.jsonl``; both files are read and, for a task in both, the newer file's record wins. A task
without a record is ``not run``. Paths in the output are relative to ``TASKS`` (``task/environment/Dockerfile``)
or the run folder, never this machine's.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path

VERIFY = "verify.json"
PROGRESS = "verify-progress.jsonl"  # reterm.tasks.verify.PROGRESS
STATUSES = ("ok", "infra", "refused", "FAIL")
REACH = re.compile(r"\b(solution|verifier) could not reach: ([^;]+)")
SHIM = re.compile(r"verifier needs what the offline shim could not install: ([^;]+)")
BUILD_STEP = re.compile(r"Dockerfile:(\d+): (.*?) failed with exit code (\d+):", re.S)
BUILD_HOST = re.compile(r"this step could not reach (\S+?):")
URL_HOST = re.compile(r"\b(?:https?|ftp)://([\w.-]+)")


def read_run(path: Path) -> dict[str, dict]:
    """The task records of a verify run, by task folder name.

    Args:
        path: the run's ``--out`` folder, or its ``verify.json`` / ``verify-progress.jsonl``.

    Returns:
        ``{name: record}``, each record as ``reterm.tasks.verify`` writes it (``status``, ``cause``,
        ``build_s``, ``build_error``, ``load_error``, ``infra_reason``, ``trials``: ``{agent: {reward,
        wall_s, error, outcome, trial_dir}}``). Empty when the run has no output yet.

    Raises:
        FileNotFoundError: ``path`` does not exist.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(path)
    files = [path / VERIFY, path / PROGRESS] if path.is_dir() else [path]
    found = sorted((f for f in files if f.is_file()), key=lambda f: f.stat().st_mtime)  # newest last: it wins
    records: dict[str, dict] = {}
    for f in found:
        if f.suffix == ".json":
            rows = json.loads(f.read_text())["tasks"]
        else:  # one record a line; a line cut off by a killed run is skipped, as the resume does
            rows = []
            for line in f.read_text().splitlines():
                try:
                    rows.append(json.loads(line))
                except ValueError:
                    continue
        for rec in rows:
            records[Path(rec["task_dir"]).name] = rec
    return records


def from_line(task_dir: Path) -> str:
    """The image of the first ``FROM`` of the task's ``environment/Dockerfile`` (``--platform`` and ``AS``
    dropped; ``+N stages`` when there are more), or ``-`` without a Dockerfile."""
    dockerfile = task_dir / "environment" / "Dockerfile"
    if not dockerfile.is_file():
        return "-"
    images = []
    for line in dockerfile.read_text(errors="replace").splitlines():
        words = line.split()
        if words and words[0].upper() == "FROM":
            words = [w for w in words[1:] if not w.startswith("--")]
            images.append(words[0] if words else "?")
    if not images:
        return "-"
    more = f" +{len(images) - 1} stage{'s' * (len(images) > 2)}" if len(images) > 1 else ""
    return f"`{images[0]}`{more}"


def _relative(text: str, rec: dict) -> str:
    """``text`` with the task collection's and the run's folders of this machine removed."""
    root = str(Path(rec["task_dir"]).parent) + "/"
    text = text.replace(root, "")
    for trial in rec.get("trials", {}).values():
        if trial.get("trial_dir"):
            text = text.replace(str(Path(trial["trial_dir"]).parent.parent) + "/", "")
    return text


def _cell(text: str, limit: int = 260) -> str:
    text = " ".join(text.replace("|", "\\|").split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _pair(rec: dict | None) -> str:
    if rec is None:
        return "not run"
    if rec["status"] == "refused" or rec.get("build_error"):
        return "- / -"

    def one(agent: str) -> str:
        t = rec["trials"].get(agent)
        if t is None:
            return "-"
        return ("fault" if t.get("error") else "no solution") if t["reward"] is None else f"{t['reward']:.1f}"

    return f"{one('oracle')} / {one('nop')}"


def _build(rec: dict | None) -> str:
    if rec is None:
        return "not run"
    if rec["status"] == "refused":
        return "refused"
    if rec.get("build_s") is None:
        return "-"
    return f"{'FAIL' if rec.get('build_error') else 'ok'} {rec['build_s']:.0f}"


def _built(off: dict | None, hos: dict | None) -> dict | None:
    """The record whose run built the task's layer: the one with the longer build (a layer is shared by both
    policies, so the run that came second found it in the cache, in ~0 s)."""
    if off is None or hos is None or off["status"] == "refused":
        return off if off is not None else hos
    return hos if (hos.get("build_s") or 0) > (off.get("build_s") or 0) else off


def _wall(rec: dict | None) -> str:
    if rec is None or rec["status"] == "refused":
        return "-"
    return f"{(rec.get('build_s') or 0) + sum(t['wall_s'] for t in rec['trials'].values()):.0f}"


def failed_tests(rec: dict, run_dir: Path | None) -> str:
    """Why a scored task is ``FAIL``: per agent whose reward is wrong, its reward and the tests that failed
    (from the trial's ``verifier/ctrf.json`` under ``run_dir/trials``, when it is there)."""
    want = {"oracle": 1.0, "nop": 0.0}
    parts = []
    for agent, t in rec["trials"].items():
        if t["reward"] is None or t["reward"] == want.get(agent):
            continue
        text = f"{agent} {t['reward']:.1f}"
        ctrf = run_dir / "trials" / Path(t["trial_dir"]).name / "verifier" / "ctrf.json" if run_dir else None
        if ctrf and ctrf.is_file() and t.get("trial_dir"):
            res = json.loads(ctrf.read_text())["results"]
            bad = [x["name"].split("::")[-1] for x in res["tests"] if x["status"] not in ("passed", "skipped")]
            text += f" ({res['summary']['passed']} of {res['summary']['tests']} tests passed; failed: {', '.join(bad)})"
        parts.append(text)
    return "scored: " + "; ".join(parts) if parts else "scored"


def build_fault(err: str) -> tuple[str | None, str]:
    """``(host, text)`` of a build error: the host the failed step could not reach (None when the error names
    none) and a short text: the Dockerfile line, the step, its exit code and the host, else the step's last line
    of output (apt's ``E:`` line...), else the hosts its URLs name; an error that is not a failed step (a
    ``COPY`` source missing...) as it is."""
    step = BUILD_STEP.search(err)
    if not step:
        return None, _cell(err.split(": ", 1)[-1], 160)
    where = f"Dockerfile:{step.group(1)} `{_cell(step.group(2), 70)}` exit {step.group(3)}"
    if host := BUILD_HOST.search(err):
        return host.group(1), f"{where}: could not reach {host.group(1)}"
    # the sandbox's own notes (what the step needed, a cached failure's time) are in parentheses
    output = [ln.strip() for ln in err[step.end():].splitlines() if ln.strip() and not ln.startswith("(")]
    if output:
        return None, f"{where}: {_cell(output[-1], 110)}"
    urls = sorted(set(URL_HOST.findall(step.group(2))))
    return None, f"{where}: no output" + (f" (the step fetches from {', '.join(urls)})" if urls else "")


def reason(rec: dict | None, run_dir: Path | None) -> str:
    """A short reason for a record's status (empty for ``ok``): the loader's refusal, the build step that failed
    and the host it could not reach, each trial fault with the agents that hit it, or the failed tests."""
    if rec is None or rec["status"] == "ok":
        return ""
    if rec["status"] == "refused":
        return "refused: " + rec["load_error"].split(" Run this task")[0]
    if rec.get("build_error"):
        return "build: " + build_fault(_relative(rec["build_error"], rec))[1]
    if rec["status"] == "FAIL":
        return failed_tests(rec, run_dir)
    agents_of: dict[str, list[str]] = defaultdict(list)  # one fault text: the agents that hit it
    for agent, t in rec["trials"].items():
        if t.get("error"):
            for part in re.sub(r"^\w+Error: ", "", t["error"]).split("; "):
                agents_of[_relative(part, rec)].append(agent)
    return "; ".join(f"{text} ({', '.join(agents)})" for text, agents in agents_of.items())


def table(tasks_root: Path, offline: dict[str, dict], host: dict[str, dict] | None,
          offline_dir: Path | None = None, host_dir: Path | None = None) -> str:  # fmt: skip
    """The markdown table, one row per task folder of ``tasks_root`` (a folder with ``task.toml``), by name."""
    rows = ["| task | FROM | build (s) | offline: oracle / no-op | offline s | offline status | "
            "host network: oracle / no-op | host status | reason |", "|---|---|---|---|---|---|---|---|---|"]
    for task_dir in sorted(p for p in tasks_root.iterdir() if (p / "task.toml").is_file()):
        name = task_dir.name
        off = offline.get(name)
        hos = (host or {}).get(name)
        why = reason(off, offline_dir)
        if hos is not None and hos["status"] != "ok" and reason(hos, host_dir) != why:
            why = "; ".join(x for x in (why and f"offline: {why}", f"host network: {reason(hos, host_dir)}") if x)
        host_cells = f"{_pair(hos)} | {hos['status'] if hos else '-'}" if host is not None else "- | -"
        rows.append(f"| {name} | {from_line(task_dir)} | {_build(_built(off, hos))} | {_pair(off)} | {_wall(off)} | "
                    f"{off['status'] if off else 'not run'} | {host_cells} | {_cell(why)} |")
    return "\n".join(rows) + "\n"


def totals(records: dict[str, dict], n_tasks: int, label: str, run_dir: Path | None = None) -> str:
    """Totals by status and the faults by cause, as markdown lines."""
    by_status = Counter(r["status"] for r in records.values())
    causes = Counter(r["cause"] for r in records.values() if r["status"] == "infra")
    lines = [f"**{label}** ({len(records)} of {n_tasks} tasks run): "
             + ", ".join(f"{by_status[s]} {s}" for s in STATUSES)
             + (f" (infra by cause: {', '.join(f'`{c}` {k}' for c, k in sorted(causes.items()))})" if causes else "")
             + "."]
    reach: dict[str, Counter] = {"solution": Counter(), "verifier": Counter()}
    shim: Counter = Counter()
    net = sorted(n for n, r in records.items() if r["status"] == "infra" and "network_error" in (r["cause"] or ""))
    for n in net:
        text = "; ".join(t["error"] for t in records[n]["trials"].values() if t.get("error"))
        for who in reach:
            reach[who].update({h.strip() for m in REACH.finditer(text) if m.group(1) == who
                               for h in m.group(2).split(",")})  # fmt: skip
        shim.update({p.strip() for m in SHIM.finditer(text) for p in m.group(1).split(",")})

    def counts(c: Counter) -> str:
        return ", ".join(f"{k} {v}" for k, v in sorted(c.items(), key=lambda kv: (-kv[1], kv[0])))

    if net:
        parts = [f"the solution could not reach {counts(reach['solution'])}" if reach["solution"] else "",
                 f"the verifier could not reach {counts(reach['verifier'])}" if reach["verifier"] else "",
                 f"the verifier needs what the offline shim could not install: {counts(shim)}" if shim else ""]
        lines.append(f"- `network_error` in a trial ({len(net)} tasks; a task counts once per host): "
                     + "; ".join(x for x in parts if x) + ".")
    builds: dict[str, list[str]] = defaultdict(list)
    unnamed: list[str] = []
    for n, r in sorted(records.items()):
        if r.get("build_error") and r["status"] != "refused":
            host, text = build_fault(_relative(r["build_error"], r))
            if host:
                builds[host].append(n)
            else:
                unnamed.append(f"{n} ({text})")
    if builds or unnamed:
        n_builds = sum(map(len, builds.values())) + len(unnamed)
        lines.append(f"- build faults ({n_builds} task{'s' * (n_builds > 1)}), by the host the step could not reach: "
                     + "; ".join(f"{h} {len(v)} ({', '.join(v)})"
                                 for h, v in sorted(builds.items(), key=lambda kv: (-len(kv[1]), kv[0])))
                     + (f"; no host named: {'; '.join(unnamed)}" if unnamed else "") + ".")
    other = sorted(n for n, r in records.items() if r["status"] == "infra" and not r.get("build_error")
                   and "network_error" not in (r["cause"] or ""))  # fmt: skip
    for n in other:
        lines.append(f"- `{records[n]['cause']}`: {n}: {_cell(reason(records[n], run_dir), 200)}")
    for n in sorted(n for n, r in records.items() if r["status"] == "refused"):
        lines.append(f"- refused: {n}: {_cell(records[n]['load_error'].split(' Run this task')[0], 240)}")
    for n in sorted(n for n, r in records.items() if r["status"] == "FAIL"):
        lines.append(f"- `FAIL`: {n}: {_cell(reason(records[n], run_dir), 240)}")
    return "\n".join(lines) + "\n"


def _run_dir(path: Path) -> Path:
    return path if path.is_dir() else path.parent


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("tasks", type=Path, help="the folder of task folders (terminal-bench-2/)")
    p.add_argument("--offline", type=Path, required=True, help="the default-policy run (folder or file)")
    p.add_argument("--host", type=Path, help="the --ek public_network=host run (folder or file)")
    args = p.parse_args(argv)
    n_tasks = sum((d / "task.toml").is_file() for d in args.tasks.iterdir())
    offline = read_run(args.offline)
    host = read_run(args.host) if args.host else None
    out = table(args.tasks, offline, host, _run_dir(args.offline), _run_dir(args.host) if args.host else None)
    out += "\n" + totals(offline, n_tasks, "Offline (default policy)", _run_dir(args.offline))
    if host is not None:
        out += "\n" + totals(host, n_tasks, "Host network (`--ek public_network=host`)", _run_dir(args.host))
    print(out, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
