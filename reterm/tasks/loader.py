"""Load terminal tasks into Harbor's own task model, from the dialects seen in public collections.

Dialects (detected from the files present):

- ``harbor``: Harbor's layout (``task.toml``, ``instruction.md``, ``environment/``, ``tests/test.sh``,
  optional ``solution/solve.sh``). Terminal-Bench 2.x tasks are this dialect (their ``task.toml`` says
  ``version = "1.0"`` or ``schema_version = ...``; Harbor's ``TaskConfig`` reads both).
- ``termigen``: generated collections (TermiGen / Terminal-Corpus style): ``instruction.md``,
  ``environment/``, ``tests/test.sh`` and often no ``task.toml`` and no ``solution/``. Without
  ``task.toml`` a copy with a default one is made in the conversion cache.
- ``terminal-bench-1``: ``task.yaml`` + ``Dockerfile`` (+ ``docker-compose.yaml``) + ``run-tests.sh`` +
  ``solution.sh``/``solution.yaml`` + ``tests/``. Converted with Harbor's own mapper
  (:mod:`reterm.tasks.tb1`) into the conversion cache.

The conversion cache is ``${RETERM_CACHE:-~/.cache/reterm}/tasks/<dialect>/<content hash>/<name>``:
converting the same source twice reuses the folder; an edited source gets a new one.

Every problem raises :class:`TaskLoadError` whose message starts with the offending file, e.g.
``tasks/foo/task.toml: invalid TOML: Expected '=' after a key ... (at line 3, column 7)``.
"""

from __future__ import annotations

import re
import shutil
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harbor.models.task.config import TaskConfig
from harbor.models.task.task import Task
from pydantic import ValidationError

from reterm.sandbox import dockerfile as df
from reterm.tasks.cache import build_once, cache_root, content_hash
from reterm.tasks.errors import TaskLoadError
from reterm.tasks.tb1 import convert_tb1

DIALECTS = ("harbor", "termigen", "terminal-bench-1")
REWARD_FILES = ("reward.txt", "reward.json")
_REWARD_RE = re.compile(r"reward\.(txt|json)")


@dataclass
class LoadedTask:
    """A task loaded into Harbor's model.

    Attributes:
        task: Harbor's :class:`~harbor.models.task.task.Task` (``task.task_dir`` is the folder Harbor
            runs: the source for the ``harbor`` dialect, the converted copy otherwise).
        dialect: one of :data:`DIALECTS`.
        source_dir: the folder that was loaded (absolute).
        notes: what the conversion did or what looks odd (strings for reports).
    """

    task: Task
    dialect: str
    source_dir: Path
    notes: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        """The task's short name (``[task].name`` without the org, else the folder name)."""
        return self.task.short_name

    @property
    def instruction(self) -> str:
        """The instruction the agent is given (Harbor's reading of instruction.md)."""
        return self.task.instruction

    @property
    def task_dir(self) -> Path:
        """The folder to give Harbor (``TaskConfig(path=...)``)."""
        return self.task.task_dir

    @property
    def converted(self) -> bool:
        """True when :attr:`task_dir` is a converted copy in the cache."""
        return self.task_dir != self.source_dir

    @property
    def metadata(self) -> dict[str, Any]:
        """``[metadata]`` of task.toml (free-form in Harbor)."""
        return dict(self.task.config.metadata)

    @property
    def has_solution(self) -> bool:
        """True when the task has a reference solution (``solution/solve.sh``)."""
        return self.task.paths.discovered_solve_path is not None

    @property
    def difficulty(self) -> str:
        """``[metadata].difficulty`` (``unknown`` when absent)."""
        return str(self.metadata.get("difficulty") or "unknown")

    @property
    def topic(self) -> str | None:
        """``[metadata].category``: the task's topic as Terminal-Bench names it (``software-engineering``...)."""
        topic = self.metadata.get("category")
        return str(topic) if topic else None

    @property
    def error_categories(self) -> list[str]:
        """The error categories the task is designed to expose (``[metadata].error_categories``)."""
        cats = self.metadata.get("error_categories") or []
        return [str(c) for c in cats] if isinstance(cats, list) else [str(cats)]


def detect_dialect(folder: Path) -> str:
    """Return the dialect of a task folder (see the module doc).

    Raises:
        TaskLoadError: the folder is missing or holds none of task.toml, task.yaml, instruction.md.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise TaskLoadError(folder, "not a directory")
    if (folder / "task.toml").is_file():
        return "harbor"
    if (folder / "task.yaml").is_file():
        return "terminal-bench-1"
    if (folder / "instruction.md").is_file() and (folder / "tests").is_dir():
        return "termigen"
    raise TaskLoadError(folder, "not a task folder: no task.toml (Harbor / Terminal-Bench 2), no task.yaml "
                                "(Terminal-Bench 1), and no instruction.md + tests/ (generated tasks)")


def is_task_dir(folder: Path) -> bool:
    """True when :func:`detect_dialect` recognises ``folder``."""
    try:
        detect_dialect(folder)
        return True
    except TaskLoadError:
        return False


def find_task_dirs(root: Path) -> list[Path]:
    """``root`` itself when it is a task folder, else its task sub-folders (one level, sorted by name)."""
    root = Path(root)
    if is_task_dir(root):
        return [root.resolve()]
    if not root.is_dir():
        raise TaskLoadError(root, "not a directory")
    return [p.resolve() for p in sorted(root.iterdir()) if p.is_dir() and is_task_dir(p)]


def read_config(toml_path: Path) -> TaskConfig:
    """Parse and validate a ``task.toml`` with Harbor's ``TaskConfig``.

    Raises:
        TaskLoadError: bad TOML (line and column given) or a field Harbor rejects (field path given).
    """
    try:
        data = tomllib.loads(toml_path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise TaskLoadError(toml_path, f"invalid TOML: {exc}") from None
    except UnicodeDecodeError as exc:
        raise TaskLoadError(toml_path, f"not UTF-8 text: {exc}") from None
    try:
        return TaskConfig.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"[{'.'.join(str(p) for p in err['loc']) or 'root'}] {err['msg']}" for err in exc.errors()
        )
        raise TaskLoadError(toml_path, f"invalid task configuration: {problems}") from None


def check_reward_written(tests_dir: Path) -> None:
    """Require that the verifier writes a reward file: ``tests/test.sh`` (or a script next to it) names
    ``reward.txt`` or ``reward.json``. Harbor counts a missing reward file as a verifier error, not a 0.

    Raises:
        TaskLoadError: no ``tests/test.sh``, or no script in ``tests/`` mentions a reward file.
    """
    test_sh = tests_dir / "test.sh"
    if not test_sh.is_file():
        raise TaskLoadError(test_sh, "missing: the verifier script Harbor runs (it must write "
                                     "/logs/verifier/reward.txt or reward.json)")
    for path in [test_sh, *sorted(p for p in tests_dir.rglob("*") if p.is_file() and p != test_sh)]:
        if path.suffix not in ("", ".sh", ".py", ".bash") and path != test_sh:
            continue
        try:
            if _REWARD_RE.search(path.read_text(errors="replace")):
                return
        except OSError:
            continue
    raise TaskLoadError(test_sh, "never writes /logs/verifier/reward.txt or reward.json: Harbor would report "
                                 "every trial of this task as a verifier error")


def check_local_build(task_dir: Path, config: TaskConfig) -> None:
    """Check statically that the local sandbox can build the task (no build is run).

    Uses the sandbox's own Dockerfile parser and checks (``reterm.sandbox.dockerfile``,
    ``reterm.sandbox.build``), so the messages are the ones a build would give.

    Raises:
        TaskLoadError: no Dockerfile (and no ``docker_image``), a multi-container compose file, or a
            Dockerfile instruction / base image the local sandbox cannot handle (file and line named).
    """
    from reterm.sandbox.build import _check as check_instructions

    env_dir = task_dir / "environment"
    compose = env_dir / "docker-compose.yaml"
    if compose.exists():
        raise TaskLoadError(compose, "multi-container tasks (docker-compose) are not supported by the local "
                                     "sandbox; run this task with a container engine (harbor -e docker)")
    dockerfile = env_dir / "Dockerfile"
    if not dockerfile.is_file():
        if config.environment.docker_image:
            try:
                df.map_base_image(config.environment.docker_image, f"{task_dir / 'task.toml'}: docker_image")
            except df.DockerfileError as exc:
                raise TaskLoadError(task_dir / "task.toml", str(exc).split(": ", 1)[-1]) from None
            return
        raise TaskLoadError(dockerfile, "missing (and task.toml sets no [environment] docker_image)")
    try:
        instructions = df.parse(dockerfile)
        check_instructions(instructions, dockerfile)
        for ins in instructions:
            if ins.keyword == "FROM":
                words = [w for w in df.split_words(ins.args) if not w.startswith("--")]
                df.map_base_image(words[0] if words else "", f"{dockerfile}:{ins.line}")
    except df.DockerfileError as exc:
        where, _, problem = str(exc).partition(": ")
        raise TaskLoadError(where, problem) from None


#: Checksum files that name the file beside them (``X.sha256`` is the digest of ``X``).
CHECKSUM_SUFFIXES = (".sha256", ".sha256sum", ".sha512", ".md5")
#: The first line of a Git LFS pointer file (https://github.com/git-lfs/git-lfs/blob/main/docs/spec.md).
LFS_POINTER = b"version https://git-lfs.github.com/spec/v1"


def check_copy_complete(task_dir: Path, origin: Path | None = None) -> None:
    """Refuse a copy of a task that lacks one of its files: a checksum file ``X.sha256`` (or ``.sha256sum``,
    ``.sha512``, ``.md5``) that names ``X`` (``sha256sum``'s ``DIGEST  X``) while ``X`` is absent, or a Git LFS
    pointer (a file of at most 1 KiB that starts with :data:`LFS_POINTER`) in place of its content. Public copies of benchmarks drop large binaries this way
    (Terminal-Bench 2.0's ``sqlite-with-gcov`` in one copy keeps ``vendor/sqlite-fossil-release.tar.gz.sha256``
    without the archive, and its reference solution then fails at ``tar``): such a task cannot score what Docker
    would on a complete copy, so it is refused before anything is built.

    Raises:
        TaskLoadError: naming the absent file (or the pointer) relative to ``origin`` (default ``task_dir``).
    """
    origin = origin or task_dir
    for path in sorted(task_dir.rglob("*")):
        if path.is_symlink() or not path.is_file():
            continue
        where = origin / path.relative_to(task_dir)
        target = path.with_suffix("")
        size = path.stat().st_size
        if path.suffix in CHECKSUM_SUFFIXES and not target.exists() and size <= 4096 \
                and target.name in path.read_text(errors="replace"):
            raise TaskLoadError(where.with_suffix(""), f"missing: its checksum file {path.name} is here, the file "
                                "is not (an incomplete copy of the task: fetch the file, e.g. with git lfs pull)")
        if size <= 1024:
            with path.open("rb") as fh:
                if fh.read(len(LFS_POINTER)) == LFS_POINTER:
                    raise TaskLoadError(where, "a Git LFS pointer, not the file's content (an incomplete copy of "
                                        "the task: run git lfs pull in its repository)")


def _validate_folder(task_dir: Path, config: TaskConfig, *, origin: Path | None = None) -> None:
    """Checks Harbor's Task constructor does not make (or makes with less helpful messages).

    Raises:
        TaskLoadError: no or an empty instruction, a verifier that writes no reward, a file the copy lacks
            (:func:`check_copy_complete`), or a timeout or resource size in ``task.toml`` that is zero or negative.
    """
    origin = origin or task_dir
    if not config.steps:
        instruction = task_dir / "instruction.md"
        if not instruction.is_file():
            raise TaskLoadError(origin / "instruction.md", "missing: the task has no instruction for the agent")
        if not instruction.read_text(errors="replace").strip():
            raise TaskLoadError(origin / "instruction.md", "is empty: the task has no instruction for the agent")
    check_reward_written(task_dir / "tests")
    check_copy_complete(task_dir, origin)
    # Harbor accepts these at any value; zero or less makes every trial stop at once (counted as an agent
    # failure) or a sandbox that cannot start (new-user case: `timeout_sec = -5` passed `tasks check`)
    for section, name in (("agent", "timeout_sec"), ("verifier", "timeout_sec"), ("environment", "build_timeout_sec"),
                           ("environment", "cpus"), ("environment", "memory_mb"), ("environment", "storage_mb")):  # fmt: skip
        value = getattr(getattr(config, section), name, None)
        if value is not None and not isinstance(value, bool) and isinstance(value, (int, float)) and value <= 0:
            raise TaskLoadError(origin / "task.toml", f"[{section}] {name} = {value}: must be greater than 0")


def _harbor_task(task_dir: Path, *, origin: Path | None = None) -> Task:
    try:
        return Task(task_dir)
    except (FileNotFoundError, ValueError, OSError) as exc:
        raise TaskLoadError(origin or task_dir, f"Harbor cannot load the task: {exc}") from None


DEFAULT_GENERATED_TOML = """\
# Written by reterm.tasks for a generated task that came without task.toml.
schema_version = "1.4"

[metadata]
source_dialect = "termigen"
difficulty = "unknown"

[verifier]
timeout_sec = 600.0

[agent]
timeout_sec = 900.0
"""


def _load_termigen(source: Path) -> tuple[Path, list[str]]:
    notes = []
    if (source / "task.toml").is_file():
        return source, notes
    if not (source / "environment").is_dir():
        raise TaskLoadError(source / "environment", "missing: the task defines no environment")

    def build(tmp: Path) -> None:
        shutil.copytree(source, tmp, symlinks=True)
        (tmp / "task.toml").write_text(DEFAULT_GENERATED_TOML)

    dest = cache_root() / "termigen" / content_hash(source) / source.name
    notes.append(f"no task.toml: copied to {dest} with default timeouts (agent 900 s, verifier 600 s)")
    return build_once(build, dest), notes


def load_task(path: Path | str, *, check_local: bool = True) -> LoadedTask:
    """Load one task folder of any supported dialect into Harbor's ``Task``.

    Args:
        path: the task folder.
        check_local: also check statically that the local sandbox can build it (Dockerfile
            instructions, base image, single container).

    Returns:
        :class:`LoadedTask`. Converted dialects point Harbor at a copy in the conversion cache.

    Raises:
        TaskLoadError: the message starts with the offending file: missing or empty instruction, bad
            TOML / YAML, invalid fields, no verifier or a verifier that writes no reward file, a
            Dockerfile the local sandbox cannot build (when ``check_local``).
    """
    source = Path(path).resolve()
    dialect = detect_dialect(source)
    notes: list[str] = []
    if dialect == "terminal-bench-1":
        task_dir, notes = convert_tb1(source)
        origin = source
    elif dialect == "termigen" and not (source / "task.toml").is_file():
        task_dir, notes = _load_termigen(source)
        origin = source
    else:
        task_dir, origin = source, source
    config = read_config(task_dir / "task.toml")
    if dialect == "harbor" and not (source / "solution").is_dir():
        dialect = "termigen"  # a Harbor-layout task without reference solution, as generated collections ship
    if dialect == "harbor":
        notes.append(f"task.toml schema {config.schema_version}")
    _validate_folder(task_dir, config, origin=origin)
    if check_local:
        try:
            check_local_build(task_dir, config)
        except TaskLoadError as exc:
            # name the source file, not the cache copy
            p = str(exc.path)
            if task_dir != source and p.startswith(str(task_dir)):
                exc = TaskLoadError(source / Path(p).relative_to(task_dir), exc.problem)
            raise exc from None
    task = _harbor_task(task_dir, origin=origin)
    return LoadedTask(task=task, dialect=dialect, source_dir=source, notes=notes)


def load_tasks(root: Path | str, *, check_local: bool = True) -> tuple[list[LoadedTask], list[TaskLoadError]]:
    """Load every task under ``root`` (a task folder, or a folder of task folders).

    Returns:
        ``(loaded, errors)``: the tasks that loaded, and one :class:`TaskLoadError` per folder that did
        not. A folder with task files but none recognised is not listed (see :func:`find_task_dirs`).
    """
    loaded, errors = [], []
    for d in find_task_dirs(Path(root)):
        try:
            loaded.append(load_task(d, check_local=check_local))
        except TaskLoadError as exc:
            errors.append(exc)
    return loaded, errors
