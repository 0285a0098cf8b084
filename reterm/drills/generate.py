"""Write drill instances as Harbor task folders, and the drills' ``splits.json``.

One instance is fully determined by ``(seed, family, index)``: :func:`make_drill` seeds a
``random.Random`` with the string ``reterm-drills/<seed>/<family>/<index>`` (string seeds are hashed
with SHA-512 by Python, so they give the same stream on every machine and run). Its folder::

    <out>/<family>-<index:03d>/
      task.toml            [task] name "drills/<family>-<index:03d>"; [metadata] tier, family, error_categories,
                           first_mistake, mistake_signal, recovery, drill_split, drill_seed, drill_index, ...
      instruction.md
      environment/Dockerfile, environment/files/...   FROM debian:bookworm-slim, COPY files/ /, RUN ...
      tests/test.sh        plain bash checks, writes /logs/verifier/reward.txt (1 or 0)
      solution/solve.sh    1 to 4 top-level commands

Splits (``<out>/splits.json``, the format of ``tasks/splits.json`` plus ``test_ood``): the families in
``ood_families`` go whole to ``test_ood``; in every other family instance ``k`` is a held-out ``test``
instance when ``floor((k + 1) * f) > floor(k * f)`` (``f`` = ``test_fraction``), else ``train``. That
rule puts ``floor(n * f)`` of the first ``n`` instances in ``test`` and keeps every instance's split the
same when ``per_family`` grows.

:func:`reterm.drills.multistage.add_train_instances` adds two-stage ``train`` instances to such a folder.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import tomllib
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reterm.agent.episode import load_task
from reterm.agent.protocol import STAGES_DONE_LINE, STAGES_LEFT_LINE
from reterm.drills.families import DEFAULT_OOD_FAMILIES, FAMILIES
from reterm.drills.model import Drill
from reterm.trajectory import write_json_atomic

SPLITS = ("train", "test", "test_ood")
TIER = "drills"
AGENT_TIMEOUT_SEC = 120.0
VERIFIER_TIMEOUT_SEC = 30.0


@dataclass(frozen=True)
class DrillInstance:
    """One written drill: its task name (folder name), family, error category, index, split and folder."""

    name: str
    family: str
    category: str
    index: int
    split: str
    path: Path
    seed: int


def instance_name(family: str, index: int) -> str:
    """The task's short name and folder name: ``<family>-<index:03d>``."""
    return f"{family}-{index:03d}"


def make_drill(family: str, seed: int, index: int) -> Drill:
    """The drill instance ``index`` of ``family`` for ``seed`` (deterministic; see the module doc).

    Raises:
        KeyError: unknown family (the message lists the known ones).
    """
    if family not in FAMILIES:
        raise KeyError(f"unknown drill family {family!r}; known: {', '.join(FAMILIES)}")
    return FAMILIES[family].make(random.Random(f"reterm-drills/{seed}/{family}/{index}"))


def split_of(family: str, index: int, *, ood_families: tuple[str, ...] | list[str], test_fraction: float) -> str:
    """``train``, ``test`` or ``test_ood`` for an instance (the rule of the module doc)."""
    if family in ood_families:
        return "test_ood"
    return "test" if math.floor((index + 1) * test_fraction) > math.floor(index * test_fraction) else "train"


def _toml_str(value: str) -> str:
    return json.dumps(value)  # a JSON string of ASCII text is a valid TOML basic string


def _toml_list(values: list[str]) -> str:
    return "[" + ", ".join(_toml_str(v) for v in values) + "]"


def task_toml(drill: Drill, *, name: str, split: str, seed: int, index: int) -> str:
    """The ``task.toml`` text of one instance (Harbor schema 1.4)."""
    summary = FAMILIES[drill.family].summary if drill.family in FAMILIES else drill.family
    lines = [
        'schema_version = "1.4"', "", "[task]", f"name = {_toml_str(f'{TIER}/{name}')}",
        f"description = {_toml_str(f'Recovery drill ({drill.category}): {summary}.')}",
        'authors = [{ name = "ReTerm kit authors" }]', f"keywords = {_toml_list(drill.tags)}", "",
        "[metadata]", f'tier = "{TIER}"', f"family = {_toml_str(drill.family)}", 'difficulty = "easy"',
        f"category = {_toml_str(drill.topic)}", f"error_categories = {_toml_list([drill.category])}",
        f"first_mistake = {_toml_str(drill.first_mistake)}", f"mistake_signal = {_toml_str(drill.mistake_signal)}",
        f"recovery = {_toml_list(drill.recovery_commands)}",
    ]  # fmt: skip
    if drill.mistake_timeout_s is not None:
        lines.append(f"mistake_timeout_sec = {float(drill.mistake_timeout_s)}")
    if drill.parts:  # a multi-stage drill: each stage's commands (reterm.drills.generate.stage_parts reads them)
        lines += [
            f"stage_families = {_toml_list([p['family'] for p in drill.parts])}",
            f"stage_mistakes = {_toml_list([p['first_mistake'] for p in drill.parts])}",
            "stage_solutions = [" + ", ".join(_toml_list(p["solution"]) for p in drill.parts) + "]",
            "stage_recoveries = [" + ", ".join(_toml_list(p["recovery"]) for p in drill.parts) + "]",
        ]  # fmt: skip
    lines += [
        f"drill_split = {_toml_str(split)}", f"drill_seed = {int(seed)}", f"drill_index = {int(index)}",
        f"tags = {_toml_list(drill.tags)}", 'license = "Apache-2.0"', "",
        "[verifier]", f"timeout_sec = {VERIFIER_TIMEOUT_SEC}", "", "[agent]", f"timeout_sec = {AGENT_TIMEOUT_SEC}", "",
        "[environment]", "build_timeout_sec = 120.0", "cpus = 1", "memory_mb = 1024", 'network_mode = "no-network"',
    ]  # fmt: skip
    return "\n".join(lines) + "\n"


def dockerfile(drill: Drill) -> str:
    """``environment/Dockerfile``: the Debian base, the files, the build commands."""
    lines = ["FROM debian:bookworm-slim"]
    if drill.files:
        lines.append("COPY files/ /")
    lines += [f"RUN {cmd}" for cmd in drill.run]
    return "\n".join(lines) + "\n"


def test_script(drill: Drill, name: str) -> str:
    """``tests/test.sh``: every check in turn (a failed one prints ``FAIL: ...``), then the reward file."""
    out = [
        "#!/bin/bash",
        f"# Verifier of drill {name}: plain bash checks; reward 1 when every check passes, else 0.",
        "mkdir -p /logs/verifier", "fail=0",
    ]  # fmt: skip
    if drill.stage_checks:  # a chain: which stages are done, which are left (reterm.drills.multistage.stages_done)
        out.append('stages_done=0; left=""')
        first = 0
        for i, (n, part) in enumerate(zip(drill.stage_checks, drill.parts), 1):
            out.append("s=0")
            for check in drill.checks[first : first + n]:
                msg = "FAIL: " + check.message
                out += [f"if {check.condition}", "then :", f"else echo {_sh_quote(msg)}; fail=1; s=1", "fi"]
            first += n
            out.append(f'if [ "$s" = 0 ]; then stages_done=$((stages_done + 1)); '
                       f'else left="$left, part {i} ({part["family"]})"; fi')  # fmt: skip
        out += [f'echo "{STAGES_DONE_LINE}$stages_done of {len(drill.stage_checks)}"',
                f'if [ -n "$left" ]; then echo "{STAGES_LEFT_LINE}${{left#, }}"; fi']  # fmt: skip
    for check in ([] if drill.stage_checks else drill.checks):
        msg = "FAIL: " + check.message
        out += [f"if {check.condition}", "then :", f"else echo {_sh_quote(msg)}; fail=1", "fi"]
    out += ['if [ "$fail" = 0 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi']
    return "\n".join(out) + "\n"


def solve_script(drill: Drill, name: str) -> str:
    """``solution/solve.sh``: the reference commands, one per line, replayable one at a time."""
    return f"#!/bin/bash\n# Reference solution of drill {name}: {len(drill.solution)} command(s).\n" + "".join(
        c + "\n" for c in drill.solution
    )


def recovery_commands(task_dir: Path) -> list[str]:
    """The commands that complete the drill from the state its first mistake leaves (``[metadata] recovery``,
    as :func:`task_toml` writes it and the drills check verifies); the reference solution when the task has none."""
    from reterm.tasks import solution_steps

    meta = load_task(Path(task_dir)).config.metadata or {}
    cmds = meta.get("recovery")
    if isinstance(cmds, list) and cmds and all(isinstance(c, str) for c in cmds):
        return list(cmds)
    return solution_steps(task_dir)


def stage_parts(task_dir: Path) -> list[dict[str, Any]]:
    """A multi-stage drill's stages in order, each ``{"family", "first_mistake", "solution", "recovery"}``, as
    :func:`task_toml` writes them (``[metadata] stage_*``); ``[]`` for a single-stage drill.

    Raises:
        ValueError: naming the task.toml when the ``stage_*`` lists disagree in length or hold a non-string.
    """
    meta = tomllib.loads((Path(task_dir) / "task.toml").read_text()).get("metadata") or {}
    fams = meta.get("stage_families")
    if not fams:
        return []
    lists = [meta.get(k) for k in ("stage_mistakes", "stage_solutions", "stage_recoveries")]
    if any(not isinstance(x, list) or len(x) != len(fams) for x in lists):
        raise ValueError(f"{Path(task_dir) / 'task.toml'}: [metadata] stage_* lists must all have {len(fams)} items")
    out = []
    for fam, mistake, sol, rec in zip(fams, *lists):
        if not (isinstance(mistake, str) and all(isinstance(c, str) for c in [*sol, *rec])):
            raise ValueError(f"{Path(task_dir) / 'task.toml'}: [metadata] stage {fam!r}: commands must be strings")
        out.append({"family": fam, "first_mistake": mistake, "solution": list(sol), "recovery": list(rec)})
    return out


def _sh_quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def task_files(drill: Drill, *, name: str, split: str, seed: int, index: int) -> dict[str, tuple[bytes, int]]:
    """Every file of the task folder: relative path -> (bytes, mode)."""
    files: dict[str, tuple[bytes, int]] = {
        "task.toml": (task_toml(drill, name=name, split=split, seed=seed, index=index).encode(), 0o644),
        "instruction.md": (drill.instruction.strip().encode() + b"\n", 0o644),
        "environment/Dockerfile": (dockerfile(drill).encode(), 0o644),
        "tests/test.sh": (test_script(drill, name).encode(), 0o755),
        "solution/solve.sh": (solve_script(drill, name).encode(), 0o755),
    }
    for path, f in drill.files.items():
        files["environment/files" + path] = (f.data, f.mode)
    for rel, text in drill.test_files.items():
        files[f"tests/{rel}"] = (text.encode(), 0o644)
    return files


def write_task(files: dict[str, tuple[bytes, int]], dest: Path) -> Path:
    """Write a task folder atomically (a temporary sibling renamed over ``dest``); modes set explicitly."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.parent / f".tmp-{dest.name}-{uuid.uuid4().hex[:6]}"
    try:
        for rel, (data, mode) in files.items():
            p = tmp / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)
            os.chmod(p, mode)
        for d in sorted({p for p in tmp.rglob("*") if p.is_dir()} | {tmp}):
            os.chmod(d, 0o755)
        old = None
        if dest.exists():
            old = dest.parent / f".old-{dest.name}-{uuid.uuid4().hex[:6]}"
            os.rename(dest, old)
        os.rename(tmp, dest)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def _is_drill_folder(path: Path) -> bool:
    try:
        return tomllib.loads((path / "task.toml").read_text()).get("metadata", {}).get("tier") == TIER
    except (OSError, tomllib.TOMLDecodeError):
        return False


def generate_drills(
    out: Path | str,
    seed: int,
    per_family: int,
    *,
    families: list[str] | None = None,
    ood_families: tuple[str, ...] | list[str] = DEFAULT_OOD_FAMILIES,
    test_fraction: float = 0.25,
) -> list[DrillInstance]:
    """Write ``per_family`` instances of each family under ``out`` and ``out/splits.json``.

    Drill folders already in ``out`` that this call does not write (from an earlier, larger run) are
    removed, so the folder and its ``splits.json`` agree; other folders are left alone.

    Args:
        out: the output folder (created).
        seed: the generation seed.
        per_family: instances per family (indices 0 .. per_family-1).
        families: the families to write (default: all of :data:`FAMILIES`).
        ood_families: families held out whole as ``test_ood``; each must be among ``families``.
        test_fraction: share of each in-distribution family's instances held out as ``test`` (0 to 1).

    Returns:
        The instances written, in family then index order.

    Raises:
        ValueError: an unknown family, an OOD family not generated, no in-distribution family left,
            ``per_family < 1``, a ``test_fraction`` outside [0, 1), or two instances of one family that
            came out identical (the family has too little variation; the message names both).
    """
    out = Path(out)
    names = list(families) if families else list(FAMILIES)
    unknown = [f for f in [*names, *ood_families] if f not in FAMILIES]
    if unknown:
        raise ValueError(f"unknown drill famil{'y' if len(unknown) == 1 else 'ies'} {unknown}; known: {', '.join(FAMILIES)}")
    if missing := [f for f in ood_families if f not in names]:
        raise ValueError(f"OOD families {missing} are not among the generated families {names}")
    if not [f for f in names if f not in ood_families]:
        raise ValueError("every family is held out as test_ood: no family is left for train/test")
    if per_family < 1:
        raise ValueError(f"per_family must be at least 1, not {per_family}")
    if not 0 <= test_fraction < 1:
        raise ValueError(f"test_fraction must be in [0, 1), not {test_fraction}")
    out.mkdir(parents=True, exist_ok=True)
    instances: list[DrillInstance] = []
    splits: dict = {s: [] for s in SPLITS}
    splits["tasks"] = {}
    for family in names:
        seen: dict[str, str] = {}
        for k in range(per_family):
            drill = make_drill(family, seed, k)
            name = instance_name(family, k)
            split = split_of(family, k, ood_families=ood_families, test_fraction=test_fraction)
            sig = repr((drill.instruction, sorted((p, f.data) for p, f in drill.files.items())))
            if sig in seen:
                raise ValueError(f"drill family {family}: instances {seen[sig]} and {name} are identical (seed {seed})")
            seen[sig] = name
            files = task_files(drill, name=name, split=split, seed=seed, index=k)
            path = write_task(files, out / name)
            instances.append(DrillInstance(name, family, drill.category, k, split, path, seed))
            splits[split].append(name)
            splits["tasks"][name] = {"categories": [drill.category], "difficulty": "easy", "family": family}
    written = {i.name for i in instances}
    for d in out.iterdir():
        if d.is_dir() and d.name not in written and _is_drill_folder(d):
            shutil.rmtree(d)
    splits["drills"] = {"seed": seed, "per_family": per_family, "families": names, "ood_families": list(ood_families),
                        "test_fraction": test_fraction, "multistage": 0}  # fmt: skip

    write_json_atomic(out / "splits.json", splits)
    return instances


def summary_table(instances: list[DrillInstance]) -> str:
    """A markdown table: family, error category, instances in train / test / test_ood, then the totals."""
    rows = ["| family | category | train | test | test_ood |", "|---|---|---|---|---|"]
    fams: dict[str, dict[str, int]] = {}
    cats: dict[str, str] = {}
    for i in instances:
        fam = "multi-stage" if i.family.startswith("multi:") else i.family  # one row for every stage pair
        fams.setdefault(fam, dict.fromkeys(SPLITS, 0))[i.split] += 1
        cats[fam] = "(its first stage's)" if fam == "multi-stage" else i.category
    for fam, n in fams.items():
        rows.append(f"| {fam} | {cats[fam]} | {n['train']} | {n['test']} | {n['test_ood']} |")
    tot = {s: sum(n[s] for n in fams.values()) for s in SPLITS}
    rows.append(f"| **{len(fams)} families** | {len({i.category for i in instances})} categories | {tot['train']} | {tot['test']} "
                f"| {tot['test_ood']} |")  # fmt: skip
    return "\n".join(rows) + "\n"
