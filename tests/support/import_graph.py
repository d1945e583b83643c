"""The project's import graph, read from the source with :mod:`ast` (nothing is imported).

Every ``import`` statement counts: at module level, inside a function, under
``if TYPE_CHECKING:``. A deferred import hides a dependency from Python's import
machinery but not from a reader, so it is an edge like any other.

A *unit* is a package or module one level below a top-level package
(``verltool_jax.train``, ``verltool_jax.run_config``, ``tool_server.kit``); the top-level
``__init__`` is the unit ``verltool_jax`` itself. :func:`check` reports

* every cycle between units (a strongly connected component of the unit graph with more
  than one unit), with the import lines that close it, and
* every edge that goes up the layering written in ``docs/architecture.md`` (section
  ``## Layers``: a numbered list, top layer first, each item starting with its units in
  backticks; a unit may import its own layer and the layers below it), and every unit
  that no layer names.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

PACKAGES = ("verltool_jax", "tool_server")


@dataclass(frozen=True)
class Edge:
    """``src`` (a module) imports ``dst`` (a module or package) at ``path:line``."""

    src: str
    dst: str
    path: str
    line: int


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def modules(root: Path, packages: Sequence[str] = PACKAGES) -> dict[str, Path]:
    """Dotted module name -> source file, for every ``.py`` file under ``packages``."""
    return {
        module_name(root, p): p
        for top in packages
        for p in sorted((root / top).rglob("*.py"))
        if "__pycache__" not in p.parts
    }


def imports_of(name: str, path: Path, known: Iterable[str] = ()) -> list[Edge]:
    """Every import in the file ``path`` of module ``name`` (relative imports resolved;
    ``from pkg import mod`` points at ``pkg.mod`` when that is a module in ``known``)."""
    known = set(known)
    tree = ast.parse(path.read_text(), filename=str(path))
    is_pkg = path.name == "__init__.py"
    edges = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            edges += [Edge(name, a.name, str(path), node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_pkg else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for a in node.names:
                sub = f"{target}.{a.name}"
                edges.append(Edge(name, sub if sub in known else target, str(path), node.lineno))
    return edges


def unit_of(module: str, packages: Sequence[str] = PACKAGES) -> str | None:
    """The unit of ``module`` (see the module doc); None outside ``packages``."""
    parts = module.split(".")
    if parts[0] not in packages:
        return None
    return ".".join(parts[:2])


def project_edges(root: Path, packages: Sequence[str] = PACKAGES) -> list[Edge]:
    """Every import of a project module by a project module."""
    mods = modules(root, packages)
    return [
        e
        for name, path in mods.items()
        for e in imports_of(name, path, mods)
        if unit_of(e.dst, packages) is not None
    ]


def unit_graph(edges: Iterable[Edge]) -> dict[str, dict[str, list[Edge]]]:
    """unit -> imported unit -> the edges behind it (imports inside a unit left out)."""
    g: dict[str, dict[str, list[Edge]]] = defaultdict(lambda: defaultdict(list))
    for e in edges:
        u, v = unit_of(e.src), unit_of(e.dst)
        if u is None or v is None:
            continue
        g[u]  # every importing unit is a node, even with no edge out
        if u != v:
            g[u][v].append(e)
    return g


def strongly_connected(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected components of ``graph`` with more than one node, each
    sorted (Tarjan's algorithm, iterative)."""
    nodes = set(graph) | {v for vs in graph.values() for v in vs}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for start in sorted(nodes):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == node:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return sorted(out)


def _where(edges: list[Edge], root: Path | None) -> str:
    def rel(p: str) -> str:
        return str(Path(p).relative_to(root)) if root is not None else p

    places = sorted({(rel(e.path), e.line) for e in edges})
    return ", ".join(f"{p}:{n}" for p, n in places[:3]) + (
        f" (+{len(places) - 3} more)" if len(places) > 3 else ""
    )


def cycle_problems(
    graph: Mapping[str, Mapping[str, list[Edge]]], root: Path | None = None
) -> list[str]:
    """One line per edge inside each cycle between units, naming the import lines."""
    problems = []
    for comp in strongly_connected({u: list(vs) for u, vs in graph.items()}):
        members = set(comp)
        lines = [
            f"  {u} -> {v}: {_where(es, root)}"
            for u in comp
            for v, es in sorted(graph.get(u, {}).items())
            if v in members
        ]
        problems.append(f"import cycle between {', '.join(comp)}:\n" + "\n".join(lines))
    return problems


def read_layers(doc: Path) -> list[list[str]]:
    """The layers of the ``## Layers`` section of ``doc``: its numbered items in order,
    each the units it names in backticks."""
    text = doc.read_text()
    m = re.search(r"^## Layers\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    if m is None:
        raise ValueError(f"{doc}: no '## Layers' section")
    layers: list[list[str]] = []
    for item in re.split(r"^\d+\. ", m.group(1), flags=re.M)[1:]:
        head = re.match(r"(?:\s*`[A-Za-z_][\w.]*`,?)+", item)  # the names it starts with
        layers.append(re.findall(r"`([\w.]+)`", head.group(0)) if head else [])
    if not layers:
        raise ValueError(f"{doc}: the '## Layers' section has no numbered list")
    return layers


def layer_problems(
    graph: Mapping[str, Mapping[str, list[Edge]]],
    layers: Sequence[Sequence[str]],
    root: Path | None = None,
) -> list[str]:
    """Edges from a unit to a unit in a layer above it, and units no layer names."""
    level = {u: i for i, names in enumerate(layers) for u in names}
    units = set(graph) | {v for vs in graph.values() for v in vs}
    problems = [
        f"{u} is in no layer of docs/architecture.md (## Layers): add it"
        for u in sorted(units - set(level))
    ]
    for u, vs in sorted(graph.items()):
        for v, es in sorted(vs.items()):
            if u in level and v in level and level[v] < level[u]:
                problems.append(
                    f"{u} (layer {level[u] + 1}) imports {v} (layer {level[v] + 1}, above "
                    f"it): {_where(es, root)}"
                )
    return problems


def check(root: Path, doc: Path | None = None) -> list[str]:
    """Every cycle and every layering problem of the source tree at ``root``."""
    graph = unit_graph(project_edges(root))
    layers = read_layers(doc or root / "docs" / "architecture.md")
    return cycle_problems(graph, root) + layer_problems(graph, layers, root)
