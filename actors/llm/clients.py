"""The ``openai`` clients of one endpoint: a few, each with its own connection pool.

httpcore checks every idle connection of a pool (a socket probe each) whenever a request
starts and whenever a response is closed, so a single pool shared by hundreds of concurrent
runs costs O(runs) per request: measured, the largest part of the client CPU left once the
SDK's per-chunk models were gone. Runs are therefore spread over :data:`SHARDS` clients by
their id (a run keeps its client, so its connection is reused turn after turn); each pool
holds about ``runs / SHARDS`` connections. Clients are made on first use and share one TLS
context (loading the CA certificates is the costly part of making a client).

Every client has ``max_retries=0`` (the caller retries itself, so every attempt is seen),
the endpoint's timeouts, key and extra headers.
"""

from __future__ import annotations

import ssl
from typing import Final

import httpx2
import openai

from actors.llm.settings import NO_API_KEY, EndpointSettings

__all__ = ["SHARDS", "Clients"]

SHARDS: Final = 8
"""Clients (connection pools) per endpoint at most."""


class Clients:
    """Up to :data:`SHARDS` ``AsyncOpenAI`` clients for one endpoint, one per run id."""

    def __init__(self, endpoint: EndpointSettings, shards: int = SHARDS) -> None:
        self._endpoint = endpoint
        self._shards = shards
        self._clients: dict[int, openai.AsyncOpenAI] = {}
        self._tls: ssl.SSLContext | None = None

    def for_run(self, run_id: str) -> openai.AsyncOpenAI:
        """The client serving ``run_id`` (always the same one while this object lives)."""
        shard = hash(run_id) % self._shards
        client = self._clients.get(shard)
        if client is None:
            client = self._clients[shard] = self._new()
        return client

    def __len__(self) -> int:
        return len(self._clients)

    def _new(self) -> openai.AsyncOpenAI:
        endpoint = self._endpoint
        if self._tls is None:
            self._tls = httpx2.create_ssl_context()
        return openai.AsyncOpenAI(
            base_url=endpoint.base_url,
            api_key=endpoint.api_key or NO_API_KEY,
            max_retries=0,
            timeout=openai.Timeout(
                endpoint.request_timeout_seconds, connect=endpoint.connect_timeout_seconds
            ),
            default_headers=dict(endpoint.extra_headers) or None,
            http_client=openai.DefaultAsyncHttpxClient(verify=self._tls),
        )

    async def aclose(self) -> None:
        """Close every client made so far."""
        clients = list(self._clients.values())
        self._clients.clear()
        for client in clients:
            await client.close()
