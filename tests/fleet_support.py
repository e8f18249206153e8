"""Shared by the fleet tests (no tests here): importing it skips the module without
nats-py, and ``pytestmark = NEEDS_NATS_SERVER`` skips it without nats-server, each saying
why. Their ``server`` fixture (a fresh nats-server with JetStream) is in conftest.py."""

from __future__ import annotations

import pytest

pytest.importorskip("nats", reason="nats-py is not installed (pip install loopfuse[nats])")

from tests.nats_server import nats_server_binary

NEEDS_NATS_SERVER = pytest.mark.skipif(
    nats_server_binary() is None,
    reason="nats-server is not installed (Debian: apt-get install nats-server; scripts/test does)",
)
