"""Refuse to test stale compiled modules (an editable install whose sources changed since
``pip install -e .`` compiled them would test the old code)."""

from __future__ import annotations

import pytest

import orchestrator.runtime  # noqa: F401  (imports the compiled hot path)
from orchestrator.build import stale_modules


def pytest_sessionstart(session: pytest.Session) -> None:
    stale = stale_modules()
    if stale:
        pytest.exit(
            f"compiled modules older than their sources: {', '.join(stale)}; rebuild them "
            "with `pip install -e .` (or `LOOPFUSE_PURE_PYTHON=1 pip install -e .` and delete "
            "the .so files to test pure Python)",
            returncode=2,
        )
