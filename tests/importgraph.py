"""The project's import graph, read from the source with :mod:`ast`, and the
layer contracts it must obey.

Why by hand rather than by importing: an import inside a function body runs
only when the function is called, yet it is as much a dependency as one at the
top of the file — a layer violation hidden in a function is still a violation.
Every ``import`` statement anywhere in a module counts, except those under
``if TYPE_CHECKING:`` (they never run).

Run as a script for the numbers the layering is judged by::

    python tests/importgraph.py [ROOT]
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass, field
from pathlib import Path

PACKAGES = ("mugraph", "search", "verify", "lower")

# The layers, lowest first, as the folders show them: the IR core (``mugraph.core``),
# the stages (``search``, ``verify``, ``lower``), the product (everything else in
# ``mugraph``: the roof ``mugraph/__init__``, pipeline, frontend, cli, demo). A module may
# import its own layer and the layers below it, never one above; ``search`` may use
# ``verify`` but the three stages are otherwise independent of each other.
CORE = "mugraph.core"
STAGES = ("search", "verify", "lower")
STAGE_USES = {"search": {"verify"}, "verify": set(), "lower": set()}


@dataclass(frozen=True)
class Import:
    """One ``import`` statement's target, where it is, and whether it runs at
    module load (``top``) or only when a function is called."""

    source: str
    target: str
    line: int
    top: bool


@dataclass
class ImportGraph:
    modules: dict[str, Path] = field(default_factory=dict)
    imports: list[Import] = field(default_factory=list)

    def edges(self) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {m: set() for m in self.modules}
        for imp in self.imports:
            if imp.target != imp.source:
                out[imp.source].add(imp.target)
        return out

    def function_level(self) -> list[Import]:
        return [imp for imp in self.imports if not imp.top]

    def function_level_statements(self) -> int:
        """Import statements inside functions (one statement may name several modules)."""
        return len({(imp.source, imp.line) for imp in self.function_level()})

    def cycles(self) -> list[list[str]]:
        """The strongly connected components of more than one module (or of a
        module importing itself), each sorted: one per import cycle."""
        return [sorted(c) for c in _sccs(self.edges()) if len(c) > 1]


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _walk(node: ast.AST, in_function: bool):
    """Yield (import node, in_function) for every import under ``node``,
    skipping ``if TYPE_CHECKING:`` bodies."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child, in_function
        elif isinstance(child, ast.If) and _is_type_checking(child.test):
            for sub in child.orelse:
                yield from _walk(sub, in_function)
        else:
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            yield from _walk(child, inner)


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    if node.level > 1:
        base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def build(root: Path, packages: tuple[str, ...] = PACKAGES) -> ImportGraph:
    """Parse every module of ``packages`` under ``root``; keep the imports
    that land inside those packages (third-party and standard ones are no
    part of the layering)."""
    graph = ImportGraph()
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            graph.modules[_module_name(root, path)] = path
    known = set(graph.modules)

    def owner(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    for module, path in graph.modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        is_package = path.name == "__init__.py"
        for node, in_function in _walk(tree, False):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = _resolve(module, is_package, node)
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    targets.append(sub if sub in known else base)
            for hit in dict.fromkeys(owner(t) for t in targets):
                if hit is not None:
                    graph.imports.append(Import(module, hit, node.lineno, not in_function))
    return graph


def _sccs(edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative (the graph is small, but recursion depth
    should not depend on it)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, it = work[-1]
            advanced = False
            for nxt in it:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(edges.get(nxt, ())))))
                    advanced = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    comp.append(top)
                    if top == node:
                        break
                out.append(comp)
    return out


def layer(module: str) -> str:
    """``core``, ``product`` or the stage's name."""
    top = module.split(".")[0]
    if top in STAGES:
        return top
    if module == CORE or module.startswith(CORE + "."):
        return "core"
    return "product"


def violations(graph: ImportGraph) -> list[str]:
    """Every import that breaks the layering, as ``source:line -> target (why)``."""
    out = []
    for imp in graph.imports:
        src, dst = layer(imp.source), layer(imp.target)
        why = None
        if src == "core" and dst != "core":
            why = f"the IR core imports the {dst}"
        elif src in STAGES and dst == "product":
            why = f"stage {src} imports the product"
        elif src in STAGES and dst in STAGES and dst != src and dst not in STAGE_USES[src]:
            why = f"stage {src} imports stage {dst}"
        if why:
            out.append(f"{imp.source}:{imp.line} -> {imp.target} ({why})")
    return out


def report(root: Path) -> str:
    graph = build(root)
    cycles = graph.cycles()
    lines = [f"modules: {len(graph.modules)}",
             f"imports inside the packages: {len(graph.imports)} "
             f"({graph.function_level_statements()} function-level statements)",
             f"import cycles (SCCs > 1 module): {len(cycles)}"]
    lines += [f"  {len(c)}: {' '.join(c)}" for c in cycles]
    bad = violations(graph)
    lines.append(f"layer violations: {len(bad)}")
    lines += [f"  {v}" for v in bad]
    lines.append("function-level imports:")
    lines += [f"  {i.source}:{i.line} -> {i.target}" for i in graph.function_level()]
    return "\n".join(lines)


if __name__ == "__main__":
    print(report(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1]))
