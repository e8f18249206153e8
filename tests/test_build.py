"""orchestrator.build: which modules are compiled, and which compiled ones are stale."""

from __future__ import annotations

import logging
import os
import sys
import types
from pathlib import Path

import pytest

from orchestrator import cli
from orchestrator.build import compiled_modules, stale_modules

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
    assert "pip install -e ." in caplog.text
    assert "completed" in capsys.readouterr().out  # the command itself still ran
