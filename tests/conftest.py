"""Refuse to test stale compiled modules: extensions left in the source tree by an older
build, which Python would import instead of the edited sources."""

from __future__ import annotations

import pytest

import orchestrator.runtime  # noqa: F401  (imports the compiled hot path)
from orchestrator.runtime.compiled import STALE_FIX, stale_modules


def pytest_sessionstart(session: pytest.Session) -> None:
    stale = stale_modules()
    if stale:
        pytest.exit(
            f"compiled modules older than their sources: {', '.join(stale)}; {STALE_FIX}",
            returncode=2,
        )
