"""Helpers for the make_figure sandbox tests (no tests here)."""

from __future__ import annotations

import importlib.util
import shutil

import pytest

from actors.tools.sandbox.bubblewrap import bubblewrap_problem

HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None


def bubblewrap_or_skip() -> str:
    """``bwrap``'s path when it can start the sandbox here; otherwise skip, saying why."""
    bwrap = shutil.which("bwrap")
    problem = bubblewrap_problem(bwrap)
    if problem is not None or bwrap is None:
        pytest.skip(f"no bubblewrap sandbox on this machine: {problem}")
    return bwrap
