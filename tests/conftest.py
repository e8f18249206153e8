"""Refuse to test stale compiled modules (extensions left in the source tree by an older
build, which Python would import instead of the edited sources); the fleet tests' server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

import orchestrator.runtime  # noqa: F401  (imports the compiled hot path)
from orchestrator.runtime.compiled import STALE_FIX, stale_modules

if TYPE_CHECKING:
    from tests.nats_server import NatsServer


def pytest_sessionstart(session: pytest.Session) -> None:
    stale = stale_modules()
    if stale:
        pytest.exit(
            f"compiled modules older than their sources: {', '.join(stale)}; {STALE_FIX}",
            returncode=2,
        )


@pytest.fixture
def server(tmp_path: Path) -> Iterator[NatsServer]:
    """A nats-server with JetStream, its store in the test's directory (the fleet tests;
    they skip without it: ``tests/fleet_support.py``)."""
    from tests.nats_server import NatsServer

    store = tmp_path / "jetstream"
    store.mkdir()
    with NatsServer.running(store) as running:
        yield running
