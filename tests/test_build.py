"""orchestrator.runtime.compiled: which modules are compiled, and which compiled ones are stale."""

from __future__ import annotations

import ast
import logging
import os
import sys
import tomllib
import types
from pathlib import Path

import pytest

from orchestrator import cli
from orchestrator.runtime.compiled import compiled_modules, stale_modules

_EXTENSION = "cpython-311-x86_64-linux-gnu.so"


def _fake_module(monkeypatch: pytest.MonkeyPatch, name: str, path: Path) -> None:
    module = types.ModuleType(name)
    module.__file__ = str(path)
    monkeypatch.setitem(sys.modules, name, module)


def _built_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, *, edited_since: bool
) -> None:
    """A compiled module ``name`` whose source beside it is older or newer than it."""
    stem = name.rsplit(".", 1)[-1]
    extension = tmp_path / f"{stem}.{_EXTENSION}"
    extension.write_bytes(b"")
    source = tmp_path / f"{stem}.py"
    source.write_text("")
    built = extension.stat().st_mtime
    edited = built + 10 if edited_since else built - 10
    os.utime(source, (edited, edited))
    _fake_module(monkeypatch, name, extension)


def test_a_compiled_module_is_listed_and_a_python_one_is_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _built_module(tmp_path, monkeypatch, "bus.fast_example", edited_since=False)
    source = tmp_path / "slow.py"
    source.write_text("")
    _fake_module(monkeypatch, "bus.slow_example", source)
    _fake_module(monkeypatch, "elsewhere.fast_example", tmp_path / f"fast.{_EXTENSION}")
    listed = compiled_modules()
    assert "bus.fast_example" in listed
    assert "bus.slow_example" not in listed
    assert "elsewhere.fast_example" not in listed  # not loopfuse's


def test_a_source_edited_after_its_build_makes_the_module_stale(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _built_module(tmp_path, monkeypatch, "actors.cold", edited_since=False)
    _built_module(tmp_path, monkeypatch, "actors.hot", edited_since=True)
    stale = stale_modules()
    assert "actors.hot" in stale
    assert "actors.cold" not in stale


def test_the_command_line_warns_when_it_runs_stale_compiled_code(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _built_module(tmp_path, monkeypatch, "actors.hot", edited_since=True)
    with caplog.at_level(logging.WARNING, logger="loopfuse.cli"):
        assert cli.main(["scenarios"]) == 0
    assert "actors.hot" in caplog.text
    assert "-name '*.so' -delete" in caplog.text
    assert "completed" in capsys.readouterr().out  # the command itself still ran


# --------------------------------------------------------------------------- setup.py

ROOT = Path(__file__).resolve().parent.parent


def _compiled_sources() -> list[str]:
    """setup.py's COMPILED list, read without running setup.py."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "COMPILED" for target in node.targets
        ):
            return list(ast.literal_eval(node.value))
    raise AssertionError("setup.py has no COMPILED list")


def _base_names(node: ast.ClassDef) -> set[str]:
    return {ast.unparse(base).rsplit(".", 1)[-1] for base in node.bases}


@pytest.mark.skipif(
    not (ROOT / "bus").is_dir(), reason="reads the sources (scripts/check-compiled has none)"
)
def test_compiled_modules_define_no_struct_and_no_async_generator() -> None:
    """mypyc builds a msgspec Struct without its options (a frozen message would turn
    mutable) and cannot compile an async generator (the whole build would fall back to
    pure Python, silently halving the speed)."""
    sources = _compiled_sources()
    assert len(sources) == len(set(sources))
    for source in sources:
        tree = ast.parse((ROOT / source).read_text(), filename=source)
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                assert "Struct" not in _base_names(node), f"{source}: Struct {node.name}"
            if isinstance(node, ast.AsyncFunctionDef):
                own = [
                    inner
                    for inner in ast.walk(node)
                    if isinstance(inner, ast.Yield | ast.YieldFrom)
                ]
                assert not own, f"{source}: async generator {node.name}"


def test_the_build_has_every_runtime_dependency_mypyc_type_checks_against() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    extras = project["project"]["optional-dependencies"]
    # The runtime imports tracing and MCP modules (lazily, but mypy follows them): without
    # their packages mypyc refuses the whole build and it falls back to pure Python.
    needed = {*project["project"]["dependencies"], *extras["otel"], *extras["mcp"]}
    assert needed <= set(project["build-system"]["requires"])


@pytest.mark.skipif(
    os.environ.get("TEST_COMPILED_WHEEL") != "1",
    reason="only scripts/check-compiled runs against a compiled wheel",
)
def test_every_listed_module_runs_compiled_in_a_wheel() -> None:
    """A wheel must compile the whole list: one module left as Python (a build that fell
    back, a renamed file) would silently run the hot path at the pure-Python speed."""
    import importlib

    for source in _compiled_sources():
        importlib.import_module(source.removesuffix(".py").replace("/", "."))
    expected = {source.removesuffix(".py").replace("/", ".") for source in _compiled_sources()}
    assert expected <= set(compiled_modules())
