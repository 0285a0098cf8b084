"""The library's import graph: no cycles, and no module imports a layer above its own.

The graph is read from the source with ``ast`` (nothing is imported): every ``import`` and ``from ... import``
of ``reterm/``, at module level and inside functions alike (a function-level import is still a dependency,
only a later one); imports under ``if TYPE_CHECKING:`` are left out (they never run). The layers, bottom
to top, are :data:`LAYERS` (docs/ARCHITECTURE.md draws them); a module may import its own layer and the
ones below it.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Bottom to top. A module belongs to the layer of the longest entry that names it or a package above it
# (``reterm`` itself names only the package's ``__init__``).
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    # shared types and helpers: the trajectory schema, dataset records (the light helpers, and apart the
    # ``datasets`` schema), the tool-call wire format (what every model and every harness writes and parses),
    # interval statistics, JSON and Hub-metadata helpers, generation defaults, CPU precision, the tiny model
    ("base", ("reterm", "reterm.trajectory", "reterm.records", "reterm.record_features", "reterm.tool_calls",
              "reterm.json_files", "reterm.stats", "reterm.hub_metadata", "reterm.tiny_qwen", "reterm.rewards",
              "reterm.io", "reterm.generation", "reterm.precision", "reterm.workers")),
    ("sandbox", ("reterm.sandbox",)),
    ("tasks", ("reterm.tasks",)),
    ("policies", ("reterm.policies",)),
    ("agent", ("reterm.agent",)),
    ("recovery", ("reterm.recovery", "reterm.drills")),
    ("data and training", ("reterm.data", "reterm.training")),
    ("eval", ("reterm.eval",)),
    ("cards", ("reterm.cards",)),
    # command lines that run whole pipelines of other layers: `reterm` itself, `reterm publish`,
    # `reterm tasks` (its `verify` runs whole Harbor trials and scores them with the agent layer's trial
    # rules; `drills` generates drills), `python -m reterm.recovery`
    ("entry points", ("reterm.publish", "reterm.cli", "reterm.tasks.cli", "reterm.tasks.verify",
                      "reterm.recovery.__main__")),
]
# Importable only in the checkout: the application folders keep thin scripts, the tests are not the product.
NOT_LIBRARY = ("eval", "pipeline", "dataset_card", "model_card", "tests", "train", "space", "bench")


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path, package: str = "reterm", module_level: bool = False
                 ) -> tuple[dict[str, dict[str, int]], dict[str, set[str]]]:  # fmt: skip
    """``(edges, foreign)``: ``edges[a][b]`` is the first line where module ``a`` imports module ``b`` (both
    of ``package``); ``foreign[a]`` the top-level names of other packages ``a`` imports. With ``module_level``,
    only the imports that run when the module is imported (none inside a function)."""
    modules = {module_name(p, root): p for p in (root / package).rglob("*.py") if "__pycache__" not in p.parts}
    edges: dict[str, dict[str, int]] = {}
    foreign: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        skip: set[int] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                skip.update(id(n) for stmt in node.body for n in ast.walk(stmt))
            if module_level and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                skip.update(id(n) for n in ast.walk(node))
        out: dict[str, int] = {}
        foreign[name] = set()
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the module's package, level - 1 packages up
                    pkg = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                    pkg = pkg[: len(pkg) - (node.level - 1)]
                    base = ".".join(pkg + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            for target in targets:
                if target.split(".")[0] != package:
                    foreign[name].add(target.split(".")[0])
                    continue
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    out.setdefault(target, node.lineno)
        edges[name] = out
    return edges, foreign


def cycles(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def layer_of(module: str) -> int | None:
    best: tuple[int, int] | None = None
    for i, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            inside = module.startswith(prefix + ".") and prefix != "reterm"
            if (module == prefix or inside) and (best is None or len(prefix) > best[1]):
                best = (i, len(prefix))
    return None if best is None else best[0]


@pytest.fixture(scope="module")
def graph() -> tuple[dict[str, dict[str, int]], dict[str, set[str]]]:
    return import_graph(ROOT)


def _where(a: str, b: str, edges: dict[str, dict[str, int]]) -> str:
    return f"{a.replace('.', '/')}.py:{edges[a][b]} imports {b}"


def test_the_graph_sees_function_level_imports_and_cycles(tmp_path):
    """The checker itself: a cycle hidden in a function is found, TYPE_CHECKING imports are not edges."""
    pkg = tmp_path / "reterm"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from reterm.sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from reterm import a\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from reterm import a\n")
    edges, _ = import_graph(tmp_path)
    assert edges["reterm.a"] == {"reterm.sub.b": 1} and edges["reterm.sub.b"] == {"reterm.a": 2}
    assert edges["reterm.c"] == {}
    assert cycles(edges) == [["reterm.a", "reterm.sub.b"]]


def test_no_import_cycles(graph):
    edges, _ = graph
    assert "reterm.agent.trial_outcome" in edges["reterm.agent.atif"]  # a function-level import is an edge
    found = cycles(edges)
    detail = [[_where(a, b, edges) for a in c for b in c if b in edges[a]] for c in found]
    assert not found, f"import cycles in reterm/: {detail}"


def test_every_module_has_a_layer(graph):
    edges, _ = graph
    assert not [m for m in edges if layer_of(m) is None], "add these modules to a layer of LAYERS"


def test_no_module_imports_a_layer_above_its_own(graph):
    edges, _ = graph
    upward = [
        f"{_where(a, b, edges)} ({LAYERS[layer_of(a)][0]} -> {LAYERS[layer_of(b)][0]})"
        for a in sorted(edges) for b in edges[a]
        if layer_of(a) is not None and layer_of(b) is not None and layer_of(b) > layer_of(a)
    ]  # fmt: skip
    assert not upward, "lower layers import higher ones:\n" + "\n".join(upward)


# What a function-level import of a ``reterm`` module may defer: a package that is slow to import or optional.
HEAVY = ("torch", "transformers", "trl", "datasets", "gradio", "harbor")
MAX_FUNCTION_LEVEL_IMPORTS = 40


def function_level_imports(root: Path, package: str = "reterm") -> list[tuple[str, int, str, str]]:
    """``(module, line, imported module, comment)`` for every import of a ``package`` module inside a function
    (``comment``: the text after ``#`` on the import's lines or the line above it)."""
    modules = {module_name(p, root): p for p in (root / package).rglob("*.py") if "__pycache__" not in p.parts}
    out = set()
    for name, path in modules.items():
        source = path.read_text(encoding="utf-8")
        lines = source.splitlines()
        for fn in ast.walk(ast.parse(source)):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.Import):
                    targets = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and not node.level:
                    base = node.module or ""
                    targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
                else:
                    continue
                for target in targets:
                    if target.split(".")[0] != package:
                        continue
                    while target and target not in modules:
                        target = target.rpartition(".")[0]
                    text = " ".join(lines[node.lineno - 2 : node.end_lineno])
                    out.add((name, node.lineno, target, text.partition("#")[2].strip()))
    return sorted(out)


def module_level_closure(edges_top: dict[str, set[str]], module: str) -> set[str]:
    seen: set[str] = set()
    todo = [module]
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            parts = m.split(".")
            todo += [*edges_top.get(m, ()), *(".".join(parts[:i]) for i in range(1, len(parts)))]
    return seen


def test_function_level_imports_only_defer_heavy_packages_or_break_a_named_cycle():
    """At most :data:`MAX_FUNCTION_LEVEL_IMPORTS` imports of ``reterm`` modules inside functions, each either
    deferring a heavy package (the imported module's module-level imports reach one of :data:`HEAVY`) or
    commented with the cycle it breaks; any other belongs at the top of its file."""
    (edges, foreign) = import_graph(ROOT, module_level=True)
    found = function_level_imports(ROOT)
    light = []
    for module, line, target, comment in found:
        reached = {p for m in module_level_closure(edges, target) for p in foreign.get(m, ())}
        if not reached & set(HEAVY) and "cycle" not in comment:
            light.append(f"{module.replace('.', '/')}.py:{line} imports {target} (light: move it to the top)")
    assert not light, "\n".join(light)
    assert len(found) <= MAX_FUNCTION_LEVEL_IMPORTS, f"{len(found)} function-level imports of reterm modules"
    assert any(t == "reterm.sandbox.local" for _, _, t, _ in found)  # the checker sees them (harbor is deferred)


def test_datasets_is_imported_only_where_a_hub_dataset_is_built_or_read(graph):
    _, foreign = graph
    users = sorted(m for m, names in foreign.items() if "datasets" in names)
    assert users == ["reterm.cards.dataset", "reterm.data.layout", "reterm.data.write", "reterm.eval.recovery",
                     "reterm.record_features", "reterm.training.failure_pool", "reterm.training.sft_data"]


def test_the_library_imports_no_application_folder(graph):
    _, foreign = graph
    bad = {m: sorted(set(names) & set(NOT_LIBRARY)) for m, names in foreign.items() if set(names) & set(NOT_LIBRARY)}
    assert not bad, f"reterm/ imports folders that are not installed: {bad}"


def test_only_reterm_is_installed():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert meta["tool"]["setuptools"]["packages"]["find"]["include"] == ["reterm*"]
    assert set(meta["tool"]["setuptools"].get("package-data", {})) <= {"reterm"}
    for folder in ("eval", "pipeline", "dataset_card", "model_card"):
        assert not (ROOT / folder / "__init__.py").exists(), f"{folder}/ holds scripts, not a package"


def test_ruff_finds_nothing():
    """``ruff check`` with the repository's own configuration (pyproject.toml: pyflakes, import order)."""
    ruff = Path(sys.executable).parent / "ruff"
    exe = str(ruff) if ruff.exists() else shutil.which("ruff")
    assert exe, "ruff is not installed (requirements.txt pins it; run scripts/setup.sh)"
    proc = subprocess.run([exe, "check", "--no-cache", str(ROOT)], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
