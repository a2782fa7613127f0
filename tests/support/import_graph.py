"""The import graph of ``python/statestore``, read from the source with ``ast`` (nothing is imported).

Used by the layering test: the package is grouped in layers, and a module may
import only from its own layer or the ones below it.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "python" / "statestore"

#: The package's layers, lowest first: a module imports only from its own layer or a lower one.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("statestore.errors", "statestore.ids", "statestore._native", "statestore._testing"),
    ("statestore.changelog",),
    ("statestore.state",),
    ("statestore.restore",),
    ("statestore.ops",),
    ("statestore.processing",),
    ("statestore.app",),
    ("statestore.cli",),
    # the public face: the package itself and the modules of the optional extras
    ("statestore", "statestore.kafka", "statestore.spark", "statestore.metrics_prometheus"),
)


@dataclass(frozen=True)
class Import:
    """One import of a statestore module by another."""

    importer: str
    imported: str
    line: int
    #: Made at module level (not inside a function, not under ``TYPE_CHECKING``).
    eager: bool


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def modules() -> dict[str, Path]:
    """Every module of the package by its dotted name."""
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def layer(module: str) -> int:
    """Index in :data:`LAYERS` of the most specific prefix naming ``module``."""
    best, best_len = -1, -1
    for i, names in enumerate(LAYERS):
        for name in names:
            if (module == name or module.startswith(name + ".")) and len(name) > best_len:
                best, best_len = i, len(name)
    if best < 0:
        raise LookupError(f"{module} belongs to no layer: add it to LAYERS in {__file__}")
    return best


def _resolve(target: str, known: dict[str, Path | None]) -> str:
    """The module ``target`` names: itself if it is a module, else its package (``from pkg import name``)."""
    while target and target not in known:
        target = target.rpartition(".")[0]
    return target


def imports() -> list[Import]:
    """Every import of one statestore module by another."""
    known: dict[str, Path | None] = {**modules(), "statestore._native": None}
    found: list[Import] = []
    for name, path in known.items():
        if path is None:
            continue
        tree = ast.parse(path.read_text(), str(path))
        lazy_nodes: set[int] = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or (
                isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            ):
                for inner in ast.walk(node):
                    if inner is not node:
                        lazy_nodes.add(id(inner))
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = package.split(".")
                    parent = parent[: len(parent) - (node.level - 1)]
                    base = ".".join([*parent, base] if base else parent)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
            for t in targets:
                if t == "statestore" or t.startswith("statestore."):
                    found.append(Import(name, _resolve(t, known), node.lineno, id(node) not in lazy_nodes))
    return found


def cycles(edges: list[Import]) -> list[list[str]]:
    """Cycles among eager imports (strongly connected components of more than one module)."""
    graph: dict[str, set[str]] = {}
    for e in edges:
        if e.eager and e.importer != e.imported:
            graph.setdefault(e.importer, set()).add(e.imported)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out
