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


def _fake_module(monkeypatch: pytest.MonkeyPatch, name: str, path: Path) -> None:
    module = types.ModuleType(name)
    module.__file__ = str(path)
    monkeypatch.setitem(sys.modules, name, module)


def test_a_compiled_module_is_listed_and_a_python_one_is_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    extension = tmp_path / "fast.cpython-311-x86_64-linux-gnu.so"
    extension.write_bytes(b"")
    source = tmp_path / "slow.py"
    source.write_text("")
    _fake_module(monkeypatch, "bus.fast_example", extension)
    _fake_module(monkeypatch, "bus.slow_example", source)
    _fake_module(monkeypatch, "elsewhere.fast_example", extension)  # not loopfuse's
    listed = compiled_modules()
    assert "bus.fast_example" in listed
    assert "bus.slow_example" not in listed
    assert "elsewhere.fast_example" not in listed


def test_a_source_edited_after_its_build_makes_the_module_stale(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    extension = tmp_path / "hot.cpython-311-x86_64-linux-gnu.so"
    extension.write_bytes(b"")
    source = tmp_path / "hot.py"
    source.write_text("")
    built = extension.stat().st_mtime
    os.utime(source, (built - 10, built - 10))
    _fake_module(monkeypatch, "actors.hot", extension)
    assert "actors.hot" not in stale_modules()
    os.utime(source, (built + 10, built + 10))  # edited after the build
    assert "actors.hot" in stale_modules()


def test_the_command_line_warns_when_it_runs_stale_compiled_code(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    extension = tmp_path / "hot.cpython-311-x86_64-linux-gnu.so"
    extension.write_bytes(b"")
    source = tmp_path / "hot.py"
    source.write_text("")
    built = extension.stat().st_mtime
    os.utime(source, (built + 10, built + 10))
    _fake_module(monkeypatch, "actors.hot", extension)
    with caplog.at_level(logging.WARNING, logger="loopfuse.cli"):
        assert cli.main(["scenarios"]) == 0
    assert "actors.hot" in caplog.text
    assert "pip install -e ." in caplog.text
    assert "completed" in capsys.readouterr().out  # the command itself still ran
