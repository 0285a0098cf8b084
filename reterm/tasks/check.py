"""``reterm tasks check``: per task, does it load, build on the local sandbox, have a solution, carry
categories, need the offline verifier shim; and is ``splits.json`` consistent with the tasks.

A task is *valid* when it loads into Harbor's model (see :mod:`reterm.tasks.loader`) and the local
sandbox can build it (statically checked, and really built unless ``build=False``). A missing solution
or missing categories are reported but do not make a task invalid (generated collections ship no
solution); they do for this project's own suite through :func:`check_splits`.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from reterm.sandbox.base_image import ensure_base
from reterm.tasks.loader import LoadedTask, TaskLoadError, check_local_build, find_task_dirs, load_task
from reterm.tasks.shim import shim_covered, shim_reasons


@dataclass
class TaskCheck:
    """The result of checking one task folder (all fields are plain data for JSON reports)."""

    path: str
    name: str
    dialect: str | None = None
    loads: bool = False
    load_error: str | None = None
    builds_locally: bool | None = None  # None: not checked (load failed)
    build_error: str | None = None
    build_s: float | None = None
    has_solution: bool = False
    difficulty: str | None = None
    topic: str | None = None
    categories: list[str] = field(default_factory=list)
    shim: list[str] = field(default_factory=list)
    shim_covered: bool = True
    notes: list[str] = field(default_factory=list)

    @property
    def valid(self) -> bool:
        """Loads and builds locally (a build not attempted counts when the static check passed)."""
        return self.loads and self.builds_locally is not False


def _build(loaded: LoadedTask) -> tuple[bool, str | None, float]:
    """Build (or find cached) the task's layer on the local sandbox. Returns (ok, error, build seconds)."""
    from reterm.sandbox.build import base_suite, ensure_layer

    t0 = time.monotonic()
    try:
        env = loaded.task.paths.environment_dir
        base = ensure_base(suite=base_suite(env, loaded.task.config.environment.docker_image))
        layer = asyncio.run(
            ensure_layer(loaded.task.paths.environment_dir, base,
                         docker_image=loaded.task.config.environment.docker_image)
        )  # fmt: skip
    except Exception as exc:  # DockerfileError, SandboxBuildFailedError, RuntimeError from debootstrap...
        return False, f"{type(exc).__name__}: {exc}", time.monotonic() - t0
    # the time the build took when it ran (a cached layer records it), not the cache lookup
    return True, None, float(layer.meta.get("build_s", time.monotonic() - t0))


def check_task(path: Path, *, build: bool = True) -> TaskCheck:
    """Check one task folder (see the module doc). Never raises for a bad task: problems are fields."""
    path = Path(path).resolve()
    result = TaskCheck(path=str(path), name=path.name)
    try:
        loaded = load_task(path, check_local=False)
    except TaskLoadError as exc:
        result.load_error = str(exc)
        return result
    result.loads = True
    result.name = loaded.name
    result.dialect = loaded.dialect
    result.has_solution = loaded.has_solution
    result.difficulty = loaded.difficulty
    result.topic = loaded.topic
    result.categories = loaded.error_categories
    result.notes = list(loaded.notes)
    result.shim = shim_reasons(loaded.task_dir)
    result.shim_covered = shim_covered(loaded.task_dir) if result.shim else True
    try:
        check_local_build(loaded.task_dir, loaded.task.config)
    except TaskLoadError as exc:
        result.builds_locally, result.build_error = False, str(exc)
        return result
    if build:
        result.builds_locally, result.build_error, result.build_s = _build(loaded)
    else:
        result.builds_locally = True
        result.notes.append("build not attempted (static check only)")
    return result


SPLIT_NAMES = ("train", "test", "test_ood")
"""The task lists a ``splits.json`` may hold: ``train``, ``test`` (held out) and ``test_ood`` (held-out
task families, as the recovery drills write)."""


def check_splits(root: Path, checks: list[TaskCheck]) -> list[str]:
    """Problems with ``root/splits.json`` (empty when consistent or absent).

    The file must name every task of ``root`` in exactly one of its task lists (:data:`SPLIT_NAMES`;
    ``test_ood`` is optional), and its ``tasks[name]`` entry must repeat the task's ``[metadata]``
    difficulty and error categories. Tasks listed in it must also have a solution and at least one category.
    """
    path = Path(root) / "splits.json"
    if not path.is_file():
        return []
    try:
        splits = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        return [f"{path}: invalid JSON: {exc}"]
    problems = []
    lists = {s: set(splits.get(s, [])) for s in SPLIT_NAMES}
    listed = set().union(*lists.values())
    meta = splits.get("tasks", {})
    names = {c.name for c in checks if c.loads}
    for i, a in enumerate(SPLIT_NAMES):
        for b in SPLIT_NAMES[i + 1:]:
            for both in sorted(lists[a] & lists[b]):
                problems.append(f"{path}: {both} is in both {a} and {b}")
    for missing in sorted(names - listed):
        problems.append(f"{path}: task {missing} is in no split ({', '.join(SPLIT_NAMES)})")
    for extra in sorted((listed | set(meta)) - names):
        problems.append(f"{path}: {extra} names no task folder that loads")
    for c in checks:
        if not c.loads or c.name not in names:
            continue
        m = meta.get(c.name)
        if m is None:
            problems.append(f"{path}: tasks.{c.name} is missing")
            continue
        if sorted(m.get("categories", [])) != sorted(c.categories):
            problems.append(f"{path}: tasks.{c.name}.categories {m.get('categories')} != task.toml {c.categories}")
        if m.get("difficulty") != c.difficulty:
            problems.append(f"{path}: tasks.{c.name}.difficulty {m.get('difficulty')!r} != task.toml {c.difficulty!r}")
        if not c.has_solution:
            problems.append(f"{c.path}: suite task without solution/solve.sh")
        if not c.categories:
            problems.append(f"{c.path}/task.toml: [metadata] error_categories is empty")
    return problems


def check_path(root: Path, *, build: bool = True, progress: bool = True) -> tuple[list[TaskCheck], list[str]]:
    """Check every task under ``root``; returns ``(checks, splits_problems)``."""
    from tqdm import tqdm

    dirs = find_task_dirs(Path(root))
    checks = [check_task(d, build=build) for d in tqdm(dirs, desc="check", unit="task", disable=not progress)]
    return checks, check_splits(Path(root), checks)


def checks_markdown(checks: list[TaskCheck], splits_problems: list[str]) -> str:
    """A markdown table of the checks, then the problems in words."""
    rows = ["| task | dialect | valid | builds locally | build s | solution | difficulty | topic | error categories "
            "| shim |", "|---|---|---|---|---|---|---|---|---|---|"]
    for c in checks:
        built = {True: "yes", False: "no", None: "-"}[c.builds_locally]
        shim = ", ".join(c.shim) + ("" if c.shim_covered else " (NOT covered: test.sh is not bash)") or "-"
        rows.append(
            f"| {c.name} | {c.dialect or '-'} | {'yes' if c.valid else 'NO'} | {built} | "
            f"{'' if c.build_s is None else f'{c.build_s:.1f}'} | {'yes' if c.has_solution else 'no'} | "
            f"{c.difficulty or '-'} | {c.topic or '-'} | {', '.join(c.categories) or '-'} | {shim} |"
        )
    problems = [c.load_error or c.build_error for c in checks if not c.valid] + splits_problems
    out = "\n".join(rows) + "\n"
    n_valid = sum(c.valid for c in checks)
    out += f"\n{n_valid}/{len(checks)} tasks valid; {sum(bool(c.shim) for c in checks)} need the offline shim.\n"
    if problems:
        out += "\nProblems:\n" + "".join(f"- {p}\n" for p in problems)
    return out


def checks_json(checks: list[TaskCheck], splits_problems: list[str]) -> dict:
    """JSON-ready form of the checks."""
    return {"tasks": [{**asdict(c), "valid": c.valid} for c in checks], "splits_problems": splits_problems}
