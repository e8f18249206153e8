"""The transports of one endpoint: a few, each with its own connection pool.

Runs are spread over :data:`SHARDS` transports by their id, and a run keeps its transport,
so its connection is reused turn after turn (why not one pool: ``docs/performance.md``).
Transports are made on first use and share one TLS context per process.
"""

from __future__ import annotations

import functools
import ssl
from typing import Final

import httpx2

from actors.llm.settings import EndpointSettings
from actors.llm.transport import ChatTransport

__all__ = ["SHARDS", "Clients", "tls_context"]

SHARDS: Final = 8
"""Transports (connection pools) per endpoint at most."""


@functools.cache
def tls_context() -> ssl.SSLContext:
    """The process's TLS context (certifi's CA store, loaded once, at the first transport)."""
    return httpx2.create_ssl_context()


class Clients:
    """Up to :data:`SHARDS` :class:`ChatTransport` for one endpoint, one per run id."""

    def __init__(self, endpoint: EndpointSettings) -> None:
        self._endpoint = endpoint
        self._transports: dict[int, ChatTransport] = {}

    def transport_for_run(self, run_id: str) -> ChatTransport:
        """The transport serving ``run_id`` (always the same one while this object lives)."""
        shard = hash(run_id) % SHARDS
        transport = self._transports.get(shard)
        if transport is None:
            transport = self._transports[shard] = ChatTransport(
                self._endpoint, ssl_context=tls_context()
            )
        return transport

    def __len__(self) -> int:
        return len(self._transports)

    async def aclose(self) -> None:
        """Close every transport made so far."""
        transports = list(self._transports.values())
        self._transports.clear()
        for transport in transports:
            await transport.aclose()
