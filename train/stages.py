"""Helpers of ``train/run_all.sh``: the parts of running a stage that are awkward in bash.

``train/run_all.sh`` holds the stage list and each stage's command; this file only runs them and reports::

    python train/stages.py run --run-dir RUN --stage NAME [--outputs PATH]... [--later NAME]... [--force] -- CMD...
    python train/stages.py record --run-dir RUN --stage setup --wall-s 12.3        # a stage timed by the shell
    python train/stages.py eval-config --run-dir RUN --base eval/configs/local.yaml --out RUN/eval/config.yaml \\
        [--trials 2] [--max-tasks N] [--max-turns N] [--max-new-tokens N] [--max-states N] [--state-turns N]
    python train/stages.py recipe RUN/sft/command.json --out RUN/cards/recipes/sft.yaml   # recipe + CLI overrides
    python train/stages.py with-vllm --serve NAME=CHECKPOINT@PORT ... [--tensor-parallel 1] -- CMD...  # 9B recipe
    python train/stages.py summary --run-dir RUN

**Stages** (``run``): the command runs with its output shown and appended to ``RUN/logs/NAME.log``. While it
runs, its whole process tree (sandboxes included) is sampled once a second: the peak of its resident memory
(:func:`tree_memory_kb`: private pages of every process plus the largest file-backed set, so shared
libraries are not counted once per process) and the 1-minute load average. When it exits 0, ``RUN/stages/NAME.json`` records the
command, wall time, peak memory and load: that file means "this stage's outputs are complete", and the
same command is skipped on the next run. A stage that was killed has no such file and runs again (the
time and peak of the interrupted attempts, kept in ``RUN/stages/NAME.running.json`` every 5 s, are added
to its record: ``wall_s`` covers every attempt, ``last_attempt_wall_s`` the last one); each
stage's own tool then resumes from its journal or checkpoints (``reterm.data.build``'s journal, the trainers'
``checkpoint-*``, Harbor's job folders). A stage that runs invalidates the records of the stages after it
(``--later``), since their inputs changed, and marks them stale (:func:`stale_path`): their next run starts
afresh instead of resuming work made from the old inputs; ``--force`` deletes the stage's outputs first (a
fresh start).

``run`` and ``record`` use only the standard library, so the set-up stage can run before ``.venv`` exists.
Written for this kit: no library offers a resumable stage runner with per-stage memory accounting.

The run's records and formatting live in ``train/run_records.py``, the final report in ``train/run_summary.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from run_records import (
    ALIASES,
    MODELS,
    REPO,
    config_digest,
    fmt_duration,
    fmt_mb,
    git_commit,
    load_json,
    marker_path,
    now_iso,
    path_spec,
    raw_digest,
    read_marker,
    read_record,
    rel_path,
    write_json_atomic,
)
from run_summary import summary

PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024
#: Environment variables that change how fast a stage runs rather than what it is (a changed command line re-runs
#: a completed stage; these do not): each stage's record keeps the ones that were set, so stage walls of two runs
#: can be compared knowing the path each took. RETERM_FAST_DECODE: ``reterm.policies.kv_cache`` (greedy tokens
#: equal in float32, sampled draws differ); RETERM_GEN_WORKERS: ``reterm.workers``; RETERM_CPU_BF16:
#: ``reterm.precision`` (bf16 rounds differently).
SPEED_ENV = ("RETERM_FAST_DECODE", "RETERM_GEN_WORKERS", "RETERM_CPU_BF16", "OMP_NUM_THREADS")


# ------------------------------------------------------------------------------- memory sampling
def tree_pids(root: int) -> list[int]:
    """``root`` and all its descendants (from ``/proc/*/stat`` parent ids; Linux only)."""
    children: dict[int, list[int]] = defaultdict(list)
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as fh:
                data = fh.read()
            ppid = int(data[data.rfind(b")") + 2 :].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children[ppid].append(int(entry.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, ()))
    return out


def memory_kb(pid: int) -> tuple[int, int]:
    """``(private_kb, file_kb)`` of a process from ``/proc/PID/status``: its resident anonymous plus
    shared-memory pages (``RssAnon + RssShmem``) and its resident file-backed pages (``RssFile``: shared
    libraries, memory-mapped model files). ``(0, 0)`` when the process is gone or not readable.

    ``/proc/PID/status`` holds counters, so this costs microseconds; ``smaps_rollup`` (exact PSS) walks the
    page tables and took about a second per sample for a 6 GB training process, slowing it down.
    """
    anon = shmem = file = 0
    try:
        with open(f"/proc/{pid}/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"RssAnon:"):
                    anon = int(line.split()[1])
                elif line.startswith(b"RssShmem:"):
                    shmem = int(line.split()[1])
                elif line.startswith(b"RssFile:"):
                    file = int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return 0, 0
    return anon + shmem, file


def tree_memory_kb(root: int) -> int:
    """Resident memory of a process tree (KiB): the private (anonymous + shared-memory) pages of every
    process, plus the largest file-backed resident set among them: libraries and model files that several
    processes map are counted once, not once per process."""
    private, largest_file = 0, 0
    for pid in tree_pids(root):
        p, f = memory_kb(pid)
        private += p
        largest_file = max(largest_file, f)
    return private + largest_file


def loadavg() -> float | None:
    """The 1-minute load average, or ``None`` where ``/proc/loadavg`` is missing."""
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


class TreeSampler(threading.Thread):
    """Samples the resident memory of a process tree (:func:`tree_memory_kb`) and the load average every
    ``interval`` seconds.

    Attributes:
        peak_kb: the largest tree memory seen (KiB).
        loads: the load averages seen.
    """

    def __init__(
        self, root: int, interval: float = 1.0, progress: Path | None = None, progress_every: float = 5.0,
        progress_extra: dict[str, Any] | None = None,
    ) -> None:  # fmt: skip
        super().__init__(daemon=True)
        self.root, self.interval = root, interval
        self.peak_kb, self.loads = 0, []
        self.progress, self.progress_every, self.progress_extra = progress, progress_every, progress_extra or {}
        self._t0 = time.monotonic()
        self._stop_event = threading.Event()

    def sample(self) -> None:
        self.peak_kb = max(self.peak_kb, tree_memory_kb(self.root))
        load = loadavg()
        if load is not None:
            self.loads.append(load)

    def write_progress(self) -> None:
        """Write ``progress`` (when given): the elapsed seconds and peak so far, so that an attempt killed
        with ``kill -9`` still counts in the stage's time (see :func:`run_stage`)."""
        if self.progress is not None:
            write_json_atomic(self.progress, {**self.progress_extra, "elapsed_s": round(time.monotonic() - self._t0, 1),
                                               "peak_mem_mb": round(self.peak_kb / 1024, 1)})  # fmt: skip

    def run(self) -> None:
        last = 0.0
        while not self._stop_event.is_set():
            self.sample()
            if self.progress is not None and time.monotonic() - last >= self.progress_every:
                self.write_progress()
                last = time.monotonic()
            self._stop_event.wait(self.interval)

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=5)


# ------------------------------------------------------------------------------------- run a stage
def _digest(paths: list[Path]) -> dict[str, str | None]:
    """``{path: config_digest}`` of the watched files (comments of a YAML recipe left out)."""
    return {str(p): config_digest(p) for p in paths}


def _raw_digest(paths: list[Path]) -> dict[str, str | None]:
    """The same, as records made before comments were left out hold it (the file's bytes)."""
    return {str(p): raw_digest(p) for p in paths}


def run_stage(
    run_dir: Path,
    stage: str,
    command: list[str],
    outputs: list[Path],
    later: list[str],
    force: bool = False,
    label: str = "",
    watch: list[Path] | None = None,
    always: bool = False,
) -> int:
    """Run one stage (see the module docstring); returns the command's exit status (0 when skipped).

    Args:
        run_dir: the run's folder (``RUN``).
        stage: the stage's name (``data``, ``sft``...).
        command: the command and its arguments.
        outputs: files/folders the stage writes (deleted first with ``force``).
        later: the stages after this one; when this one runs, their completion records are removed and those
            that had run (completed, interrupted or failed) are marked stale (:func:`stale_path`).
        force: start the stage afresh even if it completed.
        label: a one-line description printed in the banner.
        watch: input files whose content is part of the stage's identity (a config the command names):
            a changed file makes a completed stage run again, like a changed command.
        always: run even when completed (the set-up: it checks what is missing itself); its record is
            replaced only when this run took longer than 10 s (installed something) or there was none.
    """
    run_dir = Path(run_dir)
    done = read_marker(run_dir, stage)
    inputs = _digest(list(watch or []))
    recorded = (done or {}).get("inputs", {})
    same = done is not None and done.get("command") == command and recorded in (inputs, _raw_digest(list(watch or [])))
    if same and not force and not always:
        print(
            f"==> {stage}: done already ({fmt_duration(done.get('wall_s'))}, finished {done.get('finished_at')}); "
            f"skipped (--force re-runs it)",
            flush=True,
        )
        return 0
    if done is not None and not same and not force:
        changed = [k for k in set(inputs) | set(done.get("inputs", {})) if inputs.get(k) != done.get("inputs", {}).get(k)]
        what = "its command" if done.get("command") != command else "its inputs (" + ", ".join(sorted(changed)) + ")"
        print(f"==> {stage}: {what} changed since it completed; running it again (if it refuses to resume "
              f"its earlier work with them, start it afresh: --force --only {stage})", flush=True)  # fmt: skip
    if not always:
        marker_path(run_dir, stage).unlink(missing_ok=True)
    for name in later:
        traces = [marker_path(run_dir, name)] + [run_dir / "stages" / f"{name}.{k}.json" for k in ("running", "failed")]
        if any(p.exists() for p in traces):
            marker_path(run_dir, name).unlink(missing_ok=True)
            # its outputs (complete or partial) come from this stage's old outputs: it must not resume them
            write_json_atomic(stale_path(run_dir, name), {"invalidated_by": stage, "at": now_iso()})
            print(f"    ({name} will run again, afresh: its inputs change)", flush=True)
    stale = stale_path(run_dir, stage)
    if stale.exists() and not force:
        why = (read_record(stale) or {}).get("invalidated_by", "an earlier stage")
        print(f"    ({stage}'s outputs were made from inputs that {why} has since replaced: starting it afresh)",
              flush=True)  # fmt: skip
        force = True
    if force:
        for out in outputs:
            if out.is_dir() and not out.is_symlink():
                shutil.rmtree(out)
            elif out.exists() or out.is_symlink():
                out.unlink()
        # from here on an interrupted attempt resumes its own (fresh) work
        stale.unlink(missing_ok=True)
    # Earlier attempts of this stage that did not complete (killed, crashed): their time and peak count in
    # the stage's record, since the stage resumes from their work. RUN/stages/NAME.running.json is rewritten
    # every 5 s while an attempt runs (so a kill -9 loses at most 5 s of accounting) and removed on success.
    running = run_dir / "stages" / f"{stage}.running.json"
    earlier = {"earlier_s": 0.0, "earlier_peak_mb": 0.0, "earlier_attempts": 0}
    if running.exists() and not force:
        prev = read_record(running) or {}  # numbers only: read_record drops mistyped fields
        earlier = {"earlier_s": float(prev.get("earlier_s") or 0) + float(prev.get("elapsed_s") or 0),
                   "earlier_peak_mb": max(float(prev.get("earlier_peak_mb") or 0), float(prev.get("peak_mem_mb") or 0)),
                   "earlier_attempts": int(prev.get("earlier_attempts") or 0) + 1}  # fmt: skip
        print(f"    (resuming after {earlier['earlier_attempts']} interrupted attempt(s), "
              f"{fmt_duration(earlier['earlier_s'])} so far)", flush=True)  # fmt: skip
    log_path = run_dir / "logs" / f"{stage}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    print(f"\n==> {stage}{': ' + label if label else ''}\n    $ {' '.join(command)}\n    log: {log_path}", flush=True)
    started, t0 = now_iso(), time.monotonic()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(log_path, "ab") as log:
        log.write(f"\n# {started} {' '.join(command)}\n".encode())
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
        sampler = TreeSampler(proc.pid, progress=running, progress_extra={"started_at": started, **earlier})
        sampler.start()
        assert proc.stdout is not None
        out = getattr(sys.stdout, "buffer", None)
        try:
            while True:
                chunk = os.read(proc.stdout.fileno(), 65536)
                if not chunk:
                    break
                log.write(chunk)
                log.flush()
                if out is not None:  # bytes as they come: progress bars' carriage returns pass through
                    out.write(chunk)
                    out.flush()
                else:
                    sys.stdout.write(chunk.decode(errors="replace"))
            code = proc.wait()
        except KeyboardInterrupt:  # Ctrl-C reached the stage too (same process group): let it finish dying
            proc.send_signal(signal.SIGINT)
            code = proc.wait()
        finally:
            sampler.stop()
            sampler.write_progress()
    wall = time.monotonic() - t0
    import resource

    max_rss_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    peak_mb = max(sampler.peak_kb / 1024, earlier["earlier_peak_mb"])
    loads = sampler.loads
    record = {
        "stage": stage,
        "command": command,
        "started_at": started,
        "finished_at": now_iso(),
        "wall_s": round(wall + earlier["earlier_s"], 1),  # interrupted attempts included
        "last_attempt_wall_s": round(wall, 1),
        "interrupted_attempts": earlier["earlier_attempts"],
        "peak_mem_mb": round(peak_mb, 1),
        "max_process_rss_mb": round(max_rss_mb, 1),
        "load_avg_mean": round(sum(loads) / len(loads), 2) if loads else None,
        "cpus": os.cpu_count(),
        "exit_code": code,
        "inputs": inputs,
        "git": git_commit(),  # the code that ran (a resumed run may span commits)
        "speed_env": {k: os.environ[k] for k in SPEED_ENV if k in os.environ},
    }
    if code == 0:
        running.unlink(missing_ok=True)
        (run_dir / "stages" / f"{stage}.failed.json").unlink(missing_ok=True)
        if not always or done is None or wall > 10 or force:
            write_json_atomic(marker_path(run_dir, stage), record)
        print(
            f"<== {stage}: done in {fmt_duration(wall)}"
            + (f" ({fmt_duration(record['wall_s'])} with the interrupted attempts)" if earlier["earlier_attempts"] else "")
            + f"; peak memory {fmt_mb(peak_mb)} (its whole process tree), "
            f"mean load {record['load_avg_mean']} on {record['cpus']} CPUs",
            flush=True,
        )
    else:
        write_json_atomic(run_dir / "stages" / f"{stage}.failed.json", record)
        print(f"<== {stage}: FAILED (exit {code}) after {fmt_duration(wall)}; see {log_path}. Fix the cause and run "
              f"the same command again: the stage resumes (or add `--only {stage} --force` to start it afresh).",
              flush=True)  # fmt: skip
    return code


def stale_path(run_dir: Path, stage: str) -> Path:
    """``RUN/stages/NAME.stale``: written when an earlier stage ran again after ``stage`` had completed. The
    outputs of ``stage`` then come from inputs that no longer exist, and its tool's own resume (journals keyed
    by task, a model's finished evaluation) would keep them; so the next run of ``stage`` starts afresh (as
    ``--force``: its outputs are deleted first), while an attempt interrupted after that resumes as usual."""
    return Path(run_dir) / "stages" / f"{stage}.stale"


def record_stage(run_dir: Path, stage: str, wall_s: float, command: list[str]) -> None:
    """Record a stage that the shell ran and timed itself (the set-up, before Python packages exist)."""
    write_json_atomic(marker_path(run_dir, stage), {
        "stage": stage, "command": command, "finished_at": now_iso(), "wall_s": round(wall_s, 1),
        "peak_mem_mb": None, "max_process_rss_mb": None, "load_avg_mean": loadavg(), "cpus": os.cpu_count(),
        "exit_code": 0,
    })  # fmt: skip


# ------------------------------------------------------------------------------------ eval config
def eval_config(
    run_dir: Path,
    base: Path,
    out: Path,
    trials: int | None = None,
    max_tasks: int | None = None,
    max_turns: int | None = None,
    max_new_tokens: int | None = None,
    max_states: int | None = None,
    state_turns: int | None = None,
    state_attempts: int | None = None,
) -> dict[str, Any]:
    """Write the eval config of a run: ``base``'s dataset, environment, timeouts and agent settings, with
    the four models of the run (:data:`MODELS`) instead of ``base``'s models.

    The agent settings (``kwargs``) of ``base``'s first ``reterm`` model with a ``smollm2``/``hf:`` policy
    are given to all four models, so they run with the same harness limits; the sizes given here replace
    ``base``'s. Paths in the written config are relative to the repository root (``reterm.eval.run`` runs there).

    Returns:
        The config written (a dict).

    Raises:
        ValueError: ``base`` is not a YAML mapping with a list of models, has no ``reterm`` model to take the
            agent settings from, or a checkpoint of the run is missing (the stage that makes it has not run).
    """
    import copy

    import yaml

    try:
        data = yaml.safe_load(Path(base).read_text())
    except yaml.YAMLError as exc:
        raise ValueError(f"{base}: not valid YAML ({exc})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{base}: expected an eval config (a mapping), got {type(data).__name__}")
    if not isinstance(data.get("models", []), list) or not all(isinstance(m, dict) for m in data.get("models", [])):
        raise ValueError(f"{base}: models must be a list of mappings (name, agent, policy, kwargs)")
    if not isinstance(data.get("recovery_from_states") or {}, dict):
        raise ValueError(f"{base}: recovery_from_states must be a mapping")
    template = next((m for m in data.get("models", []) if m.get("agent", "reterm") == "reterm"
                     and str(m.get("policy", "")).split(":")[0] in ("smollm2", "hf")), None)  # fmt: skip
    if template is None:
        raise ValueError(f"{base}: no model with agent reterm and a smollm2/hf: policy to copy the agent settings from")
    kwargs = copy.deepcopy(template.get("kwargs") or {})
    if max_turns is not None:
        kwargs["max_turns"] = max_turns
    if max_new_tokens is not None:
        kwargs.setdefault("policy_kwargs", {})["max_new_tokens"] = max_new_tokens
    run_dir = Path(run_dir)
    models = []
    for name, (_, sub) in MODELS.items():
        if sub is None:
            policy = template["policy"]
        else:
            ckpt = run_dir / sub / "merged"
            if not (ckpt / "config.json").is_file():
                ckpt = run_dir / sub
            if not (ckpt / "config.json").is_file():
                raise ValueError(f"{run_dir / sub}: no checkpoint (config.json); run the {sub} stage first")
            policy = f"hf:{path_spec(ckpt)}"
        models.append({"name": name, "agent": "reterm", "policy": policy, "kwargs": copy.deepcopy(kwargs)})
    data["models"] = models
    data["name"] = f"run_all-{run_dir.name}"
    data["output_dir"] = rel_path(run_dir / "eval")
    if trials is not None:
        data["trials"] = trials
    if max_tasks is not None:
        data.setdefault("dataset", {})["n_tasks"] = max_tasks
    rec = data.get("recovery_from_states")
    if rec is not None:
        rec["from_models"] = [m for m in rec.get("from_models", []) if m in MODELS] or ["base"]
        rec.pop("models", None)  # every model of the run
        if max_states is not None:
            rec["max_states"] = max_states
        if state_turns is not None:
            rec["max_turns"] = state_turns
        if state_attempts is not None:
            rec["attempts"] = state_attempts
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    header = (
        f"# Written by train/stages.py eval-config from {rel_path(Path(base))} for the run {rel_path(run_dir)};\n"
        "# regenerated by each run of the eval stage (edit the base config or run_all.sh's sizes instead).\n"
    )
    out.write_text(header + yaml.safe_dump(data, sort_keys=False))
    return data


# ---------------------------------------------------------------------------------- effective recipe
def _portable(value: Any, run_dir: Path | None) -> Any:
    """``value`` with this machine's absolute paths made portable: under ``run_dir`` -> ``RUN/<rel>``, under the
    checkout -> relative to it (a published recipe must not name this machine's folders; issue 26)."""
    if isinstance(value, list):
        return [_portable(v, run_dir) for v in value]
    if not isinstance(value, str) or not value.startswith("/") and not value.startswith("hf:/"):
        return value
    prefix, path = ("hf:", value[3:]) if value.startswith("hf:") else ("", value)
    p = Path(path)
    for root, label in ((run_dir.resolve() if run_dir else None, "RUN"), (REPO, None)):
        if root is not None and p.is_relative_to(root):
            rel = p.relative_to(root).as_posix()
            return prefix + (f"{label}/{rel}" if label else rel)
    return value


def effective_recipe(command_json: Path, out: Path, run_dir: Path | None = None) -> dict[str, Any]:
    """The recipe a training stage really ran with: its ``--config`` YAML plus the ``--key value``
    overrides of its command line (``command.json`` written by ``train/sft.py``/``train/grpo.py``), so the
    model card shows what was run. Values are parsed as YAML scalars (``10`` -> 10, ``false`` -> False).
    Paths inside ``run_dir`` are written as ``RUN/...`` and paths inside the checkout relative to it.

    Raises:
        ValueError: ``command.json`` has no ``--config``.
    """
    import yaml

    info = json.loads(Path(command_json).read_text())
    argv = [str(a) for a in (info["argv"] if isinstance(info, dict) else info)]
    if "--config" not in argv:
        raise ValueError(f"{command_json}: the command has no --config recipe")
    recipe_path = Path(argv[argv.index("--config") + 1])
    if not recipe_path.is_absolute():
        recipe_path = REPO / recipe_path
    data = yaml.safe_load(recipe_path.read_text()) or {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("--") and arg != "--config":
            key = arg[2:]
            values = []
            while i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                values.append(argv[i + 1])
                i += 1
            if "=" in key:
                key, v = key.split("=", 1)
                values = [v]
            parsed = [_portable(yaml.safe_load(v), run_dir) for v in values]
            data[key] = True if not parsed else parsed[0] if len(parsed) == 1 else parsed
        elif arg == "--config":
            i += 1
        i += 1
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        f"# {recipe_path.relative_to(REPO) if recipe_path.is_relative_to(REPO) else recipe_path} "
        "with the command-line overrides of this run (train/stages.py recipe; RUN = the run folder)\n"
        + yaml.safe_dump(data, sort_keys=False)
    )
    return data


# ----------------------------------------------------------------------------------- cards, publish
def cards(
    run_dir: Path, dataset_repo: str, model_repo: str, space_repo: str, base_model: str | None, publish: bool = False
) -> int:
    """The cards stage: the effective recipes of the ReTerm-GRPO model's training stages, then
    ``reterm publish dataset|model|space`` for the run's dataset (``RUN/data-mined`` where the run mined a second
    round, else ``RUN/data``), ReTerm-GRPO checkpoint and ``space/``:
    with ``--dry-run --stage-dir RUN/cards/KIND`` (the exact folders that would be uploaded, rendered cards
    included), or for real with ``publish`` (needs a Hub token). Returns 0, or the first failing command's
    exit status."""
    run_dir = Path(run_dir)
    out = run_dir / "cards"
    recipes = []
    for name, sub in (("sft", "sft"), ("grpo", "grpo-reterm")):
        dst = out / "recipes" / f"{name}.yaml"
        effective_recipe(run_dir / sub / "command.json", dst, run_dir)
        recipes.append(dst)
    ckpt = run_dir / "grpo-reterm" / "merged"
    if not (ckpt / "config.json").is_file():
        ckpt = run_dir / "grpo-reterm"
    reterm = [sys.executable, "-m", "reterm.cli", "publish"]
    model = ["model", "--repo-id", model_repo, "--folder", str(ckpt)]
    for r in recipes:
        model += ["--recipe", str(r)]
    results = run_dir / "eval" / "results.json"
    if results.is_file():
        model += ["--results", str(results), "--eval-name", _eval_name(results, "grpo-reterm")]
    model += ["--dataset", dataset_repo] + (["--base-model", base_model] if base_model else [])
    # the dataset version the published model saw last: the mined round (GRPO's seed states) where the run has
    # one, which extends data/ (SFT's); the card names both versions (stats.json config.round / extends)
    dataset = run_dir / "data-mined" if (run_dir / "data-mined" / "stats.json").is_file() else run_dir / "data"
    commands = {
        "dataset": ["dataset", "--repo-id", dataset_repo, "--folder", str(dataset)],
        "model": model,
        "space": ["space", "--repo-id", space_repo, "--folder", str(REPO / "space")],
    }
    for kind, args in commands.items():
        if not publish:
            stage_dir = out / kind
            if stage_dir.exists():
                shutil.rmtree(stage_dir)
            args = args + ["--dry-run", "--stage-dir", str(stage_dir)]
        print(f"[cards] $ reterm publish {' '.join(args)}", flush=True)
        code = subprocess.call(reterm + args)
        if code:
            return code
    where = "published to the Hub" if publish else f"staged under {out} (dry-run; nothing was uploaded)"
    print(
        f"[cards] dataset, model and Space {where}; cards: {out}/dataset/README.md, {out}/model/README.md", flush=True
    )
    return 0


def _eval_name(results: Path, name: str) -> str:
    """``name`` or its alias (:data:`ALIASES`) as found among ``results.json``'s models."""
    models = (load_json(results) or {}).get("models", [])
    names = set(models) if isinstance(models, dict) else {m.get("name") for m in models}  # reterm.eval.drills | reterm.eval.run
    return next((n for n in [name, *ALIASES.get(name, [])] if n in names), name)


# ------------------------------------------------------------------------------------- vLLM servers
def gpu_count() -> int:
    """GPUs visible to this process (``nvidia-smi -L``; 0 without NVIDIA tools)."""
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def parse_serve(spec: str) -> tuple[str, str, int]:
    """``NAME=CHECKPOINT@PORT`` -> ``(name, checkpoint, port)``. Raises ``ValueError`` naming the spec."""
    try:
        name, rest = spec.split("=", 1)
        ckpt, port = rest.rsplit("@", 1)
        return name, ckpt, int(port)
    except ValueError:
        raise ValueError(
            f"--serve {spec!r}: expected NAME=CHECKPOINT@PORT (e.g. reterm-9b-sft=runs/x/sft@8001)"
        ) from None


def vllm_binary() -> str:
    """The ``vllm`` of this Python's environment (``.venv/bin/vllm`` when run by run_all), as every other tool
    of the run comes from there.

    Raises:
        FileNotFoundError: vLLM is not installed in that environment (the GPU set, ``bash scripts/setup_gpu.sh``,
            installs it on the GPU machine).
    """
    path = Path(sys.executable).parent / "vllm"
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} not found: vLLM is not installed in this environment ({sys.prefix}); "
            "on the GPU machine: bash scripts/setup_gpu.sh (the GPU set, with vLLM; docs/REPRODUCING.md, GPU install)"
        )
    return str(path)


def vllm_commands(serves: list[tuple[str, str, int]], n_gpus: int, extra: list[str], tensor_parallel: int = 1,
                  binary: str | None = None) -> list[tuple[list[str], str]]:
    """The ``vllm serve`` command of each server and its ``CUDA_VISIBLE_DEVICES``.

    The GPUs are split evenly between the servers; each server runs ``tensor_parallel`` GPUs per replica and
    as many data-parallel replicas (``--data-parallel-size``) as its share holds: a 9B model fits one
    80 GB GPU, so 8 GPUs serve it as 8 replicas (8x the batch of tensor parallel 8, no all-reduce per layer).

    Args:
        serves: ``(name, checkpoint, port)`` per server.
        n_gpus: GPUs on the machine.
        extra: arguments added to every command.
        tensor_parallel: GPUs per replica (a power of two).
        binary: the ``vllm`` executable (default :func:`vllm_binary`).

    Raises:
        ValueError: fewer GPUs than servers x ``tensor_parallel``.
        FileNotFoundError: see :func:`vllm_binary`.
    """
    if tensor_parallel < 1 or tensor_parallel & (tensor_parallel - 1):
        raise ValueError(f"--tensor-parallel {tensor_parallel}: must be a power of two")
    if n_gpus < len(serves) * tensor_parallel:
        raise ValueError(
            f"{len(serves)} vLLM servers at tensor parallel {tensor_parallel} need at least "
            f"{len(serves) * tensor_parallel} GPUs, {n_gpus} visible"
        )
    binary = binary or vllm_binary()
    per = n_gpus // len(serves)
    replicas = per // tensor_parallel
    out = []
    for i, (name, ckpt, port) in enumerate(serves):
        devices = ",".join(str(g) for g in range(i * per, i * per + replicas * tensor_parallel))
        cmd = [binary, "serve", ckpt, "--served-model-name", name, "--port", str(port),
               "--tensor-parallel-size", str(tensor_parallel), "--data-parallel-size", str(replicas), *extra]  # fmt: skip
        out.append((cmd, devices))
    return out


def served_chat_template(checkpoint: str, enable_thinking: bool, out: Path) -> Path:
    """The checkpoint's chat template with ``enable_thinking`` pinned (:mod:`reterm.training.thinking`),
    written to ``out`` for ``vllm serve --chat-template``: every request then gets the recipe's setting,
    whatever the harness sends (Terminus-2 through LiteLLM sends none). ``checkpoint`` is a folder or a Hub
    id (read with transformers' ``AutoTokenizer``, so a Hub id needs the network or the local cache).

    Raises:
        ValueError: the checkpoint has no chat template, or one that does not read ``enable_thinking``.
    """
    from transformers import AutoTokenizer

    from reterm.training.thinking import pin_thinking

    template = AutoTokenizer.from_pretrained(checkpoint).chat_template
    if not isinstance(template, str):
        raise ValueError(f"{checkpoint}: no (single) chat template to pin enable_thinking in")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(pin_thinking(template, enable_thinking))
    return out


def with_vllm(serves: list[str], command: list[str], extra: list[str], log_dir: Path, timeout_s: float = 1800,
              tensor_parallel: int = 1, enable_thinking: bool | None = None) -> int:
    """Start one ``vllm serve`` per ``NAME=CHECKPOINT@PORT`` (logs in ``log_dir``), wait until each answers
    ``/v1/models``, run ``command``, then stop the servers. Returns the command's exit status (1 when a
    server fails to come up). ``enable_thinking`` (the recipe's setting) is pinned in each server's chat
    template (:func:`served_chat_template`); ``None`` leaves the checkpoints' templates as they are."""
    import urllib.request

    parsed = [parse_serve(s) for s in serves]
    procs = []
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    try:
        for (name, ckpt, _), (cmd, devices) in zip(parsed, vllm_commands(parsed, gpu_count(), extra, tensor_parallel)):
            if enable_thinking is not None:
                cmd += ["--chat-template", str(served_chat_template(ckpt, enable_thinking, log_dir / f"{name}.jinja"))]
            log = open(log_dir / f"{cmd[4]}.log", "ab")
            print(f"[vllm] CUDA_VISIBLE_DEVICES={devices} {' '.join(cmd)}  (log {log.name})", flush=True)
            procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                          env={**os.environ, "CUDA_VISIBLE_DEVICES": devices}))  # fmt: skip
        deadline = time.monotonic() + timeout_s
        for (name, _, port), proc in zip(parsed, procs):
            url = f"http://127.0.0.1:{port}/v1/models"
            while True:
                if proc.poll() is not None:
                    print(f"[vllm] the server of {name} exited with {proc.returncode}; see {log_dir}", flush=True)
                    return 1
                try:
                    with urllib.request.urlopen(url, timeout=5) as resp:
                        if resp.status == 200:
                            print(f"[vllm] {name} ready on port {port}", flush=True)
                            break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    print(f"[vllm] {name} not ready after {timeout_s:.0f} s; see {log_dir}", flush=True)
                    return 1
                time.sleep(5)
        return subprocess.call(command)
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


# ---------------------------------------------------------------------------------------------- CLI
def make_parser() -> argparse.ArgumentParser:
    """The command-line parser of every subcommand (the command after ``--`` is split off first)."""
    p = argparse.ArgumentParser(prog="train/stages.py", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run a stage: timing, peak memory, log, completion record (then `-- CMD...`)")
    r.add_argument("--run-dir", type=Path, required=True)
    r.add_argument("--stage", required=True)
    r.add_argument("--label", default="")
    r.add_argument("--outputs", type=Path, action="append", default=[])
    r.add_argument("--later", action="append", default=[])
    r.add_argument("--force", action="store_true")
    r.add_argument("--watch", type=Path, action="append", default=[])
    r.add_argument("--always", action="store_true")
    rec = sub.add_parser("record", help="record a stage the shell ran itself")
    rec.add_argument("--run-dir", type=Path, required=True)
    rec.add_argument("--stage", required=True)
    rec.add_argument("--wall-s", type=float, required=True)
    e = sub.add_parser("eval-config", help="the run's eval config (four models)")
    e.add_argument("--run-dir", type=Path, required=True)
    e.add_argument("--base", type=Path, required=True)
    e.add_argument("--out", type=Path, required=True)
    for flag in (
        "--trials",
        "--max-tasks",
        "--max-turns",
        "--max-new-tokens",
        "--max-states",
        "--state-turns",
        "--state-attempts",
    ):
        e.add_argument(flag, type=int)
    rc = sub.add_parser("recipe", help="a training stage's recipe with its command-line overrides")
    rc.add_argument("command_json", type=Path)
    rc.add_argument("--out", type=Path, required=True)
    c = sub.add_parser("cards", help="effective recipes + reterm publish dataset|model|space (dry-run by default)")
    c.add_argument("--run-dir", type=Path, required=True)
    c.add_argument("--dataset-repo", required=True)
    c.add_argument("--model-repo", required=True)
    c.add_argument("--space-repo", required=True)
    c.add_argument("--base-model")
    c.add_argument("--publish", action="store_true", help="upload for real (default: --dry-run)")
    v = sub.add_parser("with-vllm", help="run a command with vLLM servers up (then `-- CMD...`)")
    v.add_argument("--serve", action="append", required=True, metavar="NAME=CHECKPOINT@PORT")
    v.add_argument("--vllm-arg", action="append", default=[], help="extra argument of every `vllm serve`")
    v.add_argument("--log-dir", type=Path, default=Path("vllm-logs"), help="where the servers' logs go")
    v.add_argument("--timeout", type=float, default=1800, help="seconds to wait for the servers to answer")
    v.add_argument("--enable-thinking", choices=["true", "false"],
                   help="pin the chat template's enable_thinking of every server (the recipe's one setting)")
    v.add_argument("--tensor-parallel", type=int, default=1,
                   help="GPUs per model replica (default 1: a 9B fits one GPU; the rest are data-parallel replicas)")
    s = sub.add_parser("summary", help="the final table, plots and timings")
    s.add_argument("--run-dir", type=Path, required=True)
    s.add_argument(
        "--stages",
        default="setup data sft grpo grpo-standard eval cards",
        help="stage names in order (space-separated)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point (see the module docstring). Returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, command = argv[:i], argv[i + 1 :]
    p = make_parser()
    a = p.parse_args(argv)
    if a.cmd in ("run", "with-vllm") and not command:
        p.error(f"{a.cmd}: give the command after `--`")
    try:
        if a.cmd == "run":
            return run_stage(a.run_dir, a.stage, command, a.outputs, a.later, a.force, a.label, a.watch, a.always)
        if a.cmd == "record":
            record_stage(a.run_dir, a.stage, a.wall_s, command)
            return 0
        if a.cmd == "eval-config":
            eval_config(a.run_dir, a.base, a.out, a.trials, a.max_tasks, a.max_turns, a.max_new_tokens, a.max_states,
                        a.state_turns, a.state_attempts)  # fmt: skip
            print(f"[stages] eval config: {a.out}")
            return 0
        if a.cmd == "recipe":
            effective_recipe(a.command_json, a.out)
            print(f"[stages] recipe: {a.out}")
            return 0
        if a.cmd == "cards":
            return cards(a.run_dir, a.dataset_repo, a.model_repo, a.space_repo, a.base_model, a.publish)
        if a.cmd == "with-vllm":
            thinking = None if a.enable_thinking is None else a.enable_thinking == "true"
            return with_vllm(a.serve, command, a.vllm_arg, a.log_dir, a.timeout, a.tensor_parallel, thinking)
        return summary(a.run_dir, a.stages.split())
    except (ValueError, OSError) as exc:
        print(f"train/stages.py {a.cmd}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
