"""The ``openai`` clients of one endpoint: a few, each with its own connection pool.

Runs are spread over :data:`SHARDS` clients by their id, and a run keeps its client, so its
connection is reused turn after turn (why not one pool: ``docs/performance.md``). Clients
are made on first use, share one TLS context per process, and each comes with its
:class:`~actors.llm.transport.ChatTransport`. Every client has ``max_retries=0`` (the
caller retries itself, so every attempt is seen), the endpoint's timeouts, key and extra
headers.
"""

from __future__ import annotations

import ssl
from typing import Final

import httpx2
import openai

from actors.llm.settings import NO_API_KEY, EndpointSettings
from actors.llm.transport import COMPLETIONS, ChatTransport

__all__ = ["SHARDS", "Clients"]

SHARDS: Final = 8
"""Clients (connection pools) per endpoint at most."""

_TLS: list[ssl.SSLContext] = []  # one per process, made at the first client


def _tls_context() -> ssl.SSLContext:
    if not _TLS:
        _TLS.append(httpx2.create_ssl_context())
    return _TLS[0]


class Clients:
    """Up to :data:`SHARDS` ``AsyncOpenAI`` clients for one endpoint, one per run id."""

    def __init__(self, endpoint: EndpointSettings, shards: int = SHARDS) -> None:
        self._endpoint = endpoint
        self._shards = shards
        self._clients: dict[int, openai.AsyncOpenAI] = {}
        self._transports: dict[int, ChatTransport] = {}

    def for_run(self, run_id: str) -> openai.AsyncOpenAI:
        """The client serving ``run_id`` (always the same one while this object lives)."""
        shard = hash(run_id) % self._shards
        client = self._clients.get(shard)
        if client is None:
            client = self._clients[shard] = self._new()
        return client

    def transport_for_run(self, run_id: str) -> ChatTransport:
        """The chat-completions transport of :meth:`for_run`'s client."""
        shard = hash(run_id) % self._shards
        transport = self._transports.get(shard)
        if transport is None:
            transport = self._transports[shard] = ChatTransport(self.for_run(run_id), COMPLETIONS)
        return transport

    def __len__(self) -> int:
        return len(self._clients)

    def _new(self) -> openai.AsyncOpenAI:
        endpoint = self._endpoint
        return openai.AsyncOpenAI(
            base_url=endpoint.base_url,
            api_key=endpoint.api_key or NO_API_KEY,
            max_retries=0,
            timeout=openai.Timeout(
                endpoint.timeout_seconds, connect=endpoint.connect_timeout_seconds
            ),
            default_headers=dict(endpoint.extra_headers) or None,
            http_client=openai.DefaultAsyncHttpxClient(verify=_tls_context()),
        )

    async def aclose(self) -> None:
        """Close every client made so far."""
        clients = list(self._clients.values())
        self._clients.clear()
        self._transports.clear()
        for client in clients:
            await client.close()
