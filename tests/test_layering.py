"""Imports point down only: bus ← actors ← orchestrator (DESIGN.md), checked on the AST."""

from __future__ import annotations

import ast
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


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_point_down_only(package: str) -> None:
    offenders = {
        str(path.relative_to(ROOT)): sorted(_imports(path) & FORBIDDEN[package])
        for path in sorted((ROOT / package).rglob("*.py"))
    }
    assert {path: bad for path, bad in offenders.items() if bad} == {}


def test_the_check_sees_real_imports() -> None:
    assert "bus" in _imports(ROOT / "orchestrator" / "conductor" / "state.py")
    assert "anyio" in _imports(ROOT / "bus" / "bus.py")
