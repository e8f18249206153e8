"""Imports point down only: bus ← actors ← orchestrator (DESIGN.md), checked on the AST.

Every import counts, wherever it is: at module level, inside a function (a cycle hidden
in a function is still a cycle) or under ``if TYPE_CHECKING``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN = {
    "bus": {
        "actors",
        "orchestrator",
        "openai",
        "prometheus_client",
        "httpx",
        "httpx2",
        "starlette",
        "uvicorn",
    },
    "actors": {"orchestrator", "prometheus_client", "starlette", "uvicorn"},
    "orchestrator": set(),
}

SUBPACKAGE_FORBIDDEN: dict[str, dict[str, str]] = {
    "orchestrator.conductor": {
        "orchestrator.config": "the runtime hands it ConductorSettings, built from the config",
        "actors.context": "the runtime hands it the context functions (ContextFunctions)",
    },
    "orchestrator.daemon": {
        "orchestrator.cluster": "the fleet builds on the daemon (the CLI hands serve a fleet)",
    },
}
"""Sub-package → module → why it must not import it (nor anything below it)."""

KNOWN_CYCLE_EDGES: dict[tuple[str, str], str] = {}
"""Edges of the sub-package graph that close a cycle today, each with why; the graph
without them must be acyclic, so no new cycle can appear. Remove an entry once fixed."""


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(path: Path) -> Iterator[str]:
    """The dotted names ``path`` imports (``from a.b import c`` gives ``a.b`` and
    ``a.b.c``, since ``c`` may be a module), relative imports resolved."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = _module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                above = package[: len(package) - node.level + 1]
                base = ".".join([*above, base] if base else above)
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


def _imports(path: Path) -> set[str]:
    return {name.split(".")[0] for name in _imported(path)}


def _within(name: str, module: str) -> bool:
    return name == module or name.startswith(module + ".")


def _unit(name: str) -> str | None:
    """The sub-package or root module of ``actors`` or ``orchestrator`` that ``name`` is in
    (``orchestrator.daemon.app`` → ``orchestrator.daemon``); ``None`` for anything else."""
    parts = name.split(".")
    if parts[0] not in ("actors", "orchestrator") or len(parts) < 2:
        return None
    folder = ROOT / parts[0] / parts[1]
    if folder.is_dir() or folder.with_suffix(".py").is_file():
        return f"{parts[0]}.{parts[1]}"
    return None


def _package_graph() -> dict[str, set[str]]:
    """Sub-package → the other sub-packages (and root modules) of its package it imports."""
    graph: dict[str, set[str]] = {}
    for package in ("actors", "orchestrator"):
        for path in sorted((ROOT / package).rglob("*.py")):
            source = _unit(_module_name(path))
            if source is None:
                continue
            targets = {_unit(name) for name in _imported(path)}
            graph.setdefault(source, set()).update(
                t for t in targets if t is not None and t != source
            )
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_point_down_only(package: str) -> None:
    offenders = {
        str(path.relative_to(ROOT)): sorted(_imports(path) & FORBIDDEN[package])
        for path in sorted((ROOT / package).rglob("*.py"))
    }
    assert {path: bad for path, bad in offenders.items() if bad} == {}


@pytest.mark.parametrize("subpackage", sorted(SUBPACKAGE_FORBIDDEN))
def test_subpackage_rules(subpackage: str) -> None:
    forbidden = SUBPACKAGE_FORBIDDEN[subpackage]
    folder = ROOT.joinpath(*subpackage.split("."))
    offenders = {
        str(path.relative_to(ROOT)): sorted(
            {module for name in _imported(path) for module in forbidden if _within(name, module)}
        )
        for path in sorted(folder.rglob("*.py"))
    }
    assert {path: bad for path, bad in offenders.items() if bad} == {}, forbidden


def test_no_import_cycle_between_subpackages() -> None:
    graph = _package_graph()
    for source, target in KNOWN_CYCLE_EDGES:
        assert target in graph.get(source, set()), (
            f"{source} → {target} is gone: remove it from KNOWN_CYCLE_EDGES"
        )
        graph[source].discard(target)
    assert _cycles(graph) == []


def test_the_check_sees_real_imports() -> None:
    assert "bus" in _imports(ROOT / "orchestrator" / "conductor" / "state.py")
    assert "anyio" in _imports(ROOT / "bus" / "bus.py")
    # a function-level import; a cycle is found
    assert "orchestrator.report.scenario" in set(
        _imported(ROOT / "orchestrator" / "scenarios" / "runs.py")
    )
    assert "orchestrator.config_sections" in _package_graph()["orchestrator.config_load"]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
