"""The ReTerm error taxonomy: stable category ids for failure states.

Every failure state found by :mod:`reterm.recovery.localise` carries one :class:`Category` id. The ids
are the values of the dataset column ``failure_category`` (:mod:`reterm.records`), of the eval reports'
per-category tables and of the classifier's labels, so they never change once published; add a new id
rather than renaming one. Definitions, examples and tie-breaking rules live in
``docs/ERROR_TAXONOMY.md``; the one-line definitions below are what the LLM judge is shown.

Two labels are not failure categories: ``none`` (a step that is not a failure, e.g. ``grep`` finding
nothing) and ``infra`` (an infrastructure fault: the sandbox, harness or verifier broke, not the agent).
Neither ever becomes a failure state.

Sources: the issue's list of categories (missing dependency or tool, wrong command/flags/syntax, path or
permission, faulty implementation, wrong environment state, timeout or hang, premature completion,
other) and the public-run shares in the project's field notes (missing dependency about 44% of failing
steps, faulty implementation about 18%, benign non-zero exits about 7%).
"""

from __future__ import annotations

from enum import Enum


class Category(str, Enum):
    """A label of one step: eight failure categories plus ``none`` and ``infra``.

    The string value is the stable id (``Category("wrong_command")`` parses one).
    """

    MISSING_DEPENDENCY = "missing_dependency"
    WRONG_COMMAND = "wrong_command"
    PATH_PERMISSION = "path_permission"
    FAULTY_IMPLEMENTATION = "faulty_implementation"
    WRONG_STATE = "wrong_state"
    TIMEOUT_HANG = "timeout_hang"
    PREMATURE_COMPLETION = "premature_completion"
    OTHER = "other"
    NONE = "none"  # not a failure
    INFRA = "infra"  # infrastructure fault, not the agent's

    @property
    def is_failure(self) -> bool:
        """True for the eight failure categories (those a failure state can carry)."""
        return self not in (Category.NONE, Category.INFRA)

    def __str__(self) -> str:  # so f"{cat}" gives the id
        return self.value


FAILURE_CATEGORIES: tuple[Category, ...] = tuple(c for c in Category if c.is_failure)
"""The eight failure categories, in report order."""

LABELS: tuple[Category, ...] = tuple(Category)
"""Every label the classifier can give (failure categories, then ``none`` and ``infra``)."""

DEFINITIONS: dict[Category, str] = {
    Category.MISSING_DEPENDENCY: (
        "a package, module, library, header or command-line tool the step needs is not installed or not "
        "installable as asked (command not found, No module named, Unable to locate package, missing "
        "header or shared library, no matching distribution)"
    ),
    Category.WRONG_COMMAND: (
        "the command itself is wrong: a typo, wrong flags or arguments, shell/SQL/jq/awk syntax error, "
        "wrong usage of a tool, or a tool that cannot work in this environment (systemctl without systemd)"
    ),
    Category.PATH_PERMISSION: (
        "a path that does not exist or is of the wrong kind, a permission or read-only error, or an error "
        "raised by git (not a repository, pathspec, unknown revision, conflicts, rejected push)"
    ),
    Category.FAULTY_IMPLEMENTATION: (
        "code or content the agent wrote or changed is wrong: tests fail, a compile error, a runtime "
        "exception or crash of the program being built, wrong output of the agent's own checks"
    ),
    Category.WRONG_STATE: (
        "the command is right but the environment is not in the state it assumes and the agent did not "
        "check: a service not running (connection refused), a lock or port held by another process, "
        "left-over files or objects (already exists), missing initialisation (no such table), nothing to commit"
    ),
    Category.TIMEOUT_HANG: (
        "the step did not return in time: the harness interrupted it, `timeout` killed it, or it waits "
        "for input / runs in the foreground forever (servers, REPLs, pagers, prompts)"
    ),
    Category.PREMATURE_COMPLETION: (
        "the agent declared the task done (submit) while the verifier shows it is not, with no visible "
        "unresolved error before"
    ),
    Category.OTHER: (
        "a real failure that fits none of the above (network unreachable outside installs, out of memory, "
        "disk full, an HTTP error from a remote service)"
    ),
    Category.NONE: (
        "not a failure: a successful step, or a benign non-zero exit such as grep/which/test/diff/pgrep "
        "answering no, or a read-only command showing error text that is file content"
    ),
    Category.INFRA: (
        "an infrastructure fault: the sandbox, container runtime, terminal multiplexer, harness or verifier "
        "broke; never the agent's failure"
    ),
}


def parse_category(value: str | Category) -> Category:
    """The :class:`Category` for an id, tolerant of case, spaces and hyphens.

    ``"Missing dependency"``, ``"missing-dependency"`` and ``"missing_dependency"`` all parse.
    Raises ``ValueError`` naming the value and the valid ids when it is not a label.
    """
    if isinstance(value, Category):
        return value
    key = str(value).strip().lower().replace("-", "_").replace(" ", "_")
    try:
        return Category(key)
    except ValueError:
        valid = ", ".join(c.value for c in LABELS)
        raise ValueError(f"unknown error category {value!r}; valid ids: {valid}") from None
