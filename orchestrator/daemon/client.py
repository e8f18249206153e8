"""A small client of the daemon's API: what ``loopfuse runs``, ``watch`` and ``demo`` use.

::

    async with DaemonClient("http://127.0.0.1:8470", token=...) as client:
        run_id = (await client.submit({"scenario": "max_turns"}))["id"]
        async for event in client.events(run_id):
            print(event.id, event.data)
        print((await client.run(run_id))["result"])

Refusals raise :class:`DaemonError` with the status and the error body's code and message.
Every submission carries an ``idempotency_key`` (a new one unless the request has its own),
and one whose answer was lost (a reset connection, a timeout) is sent again with that key:
a retry never creates a second run.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from types import TracebackType
from typing import Any, Final, NamedTuple, Self

import httpx
import msgspec

__all__ = ["DaemonClient", "DaemonError", "SseEvent"]

_json = msgspec.json.Decoder(dict[str, Any])

SUBMIT_ATTEMPTS: Final = 3
"""Tries of one submission whose answer was lost, all with the same idempotency key."""


class DaemonError(Exception):
    """The daemon refused a request."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message


class SseEvent(NamedTuple):
    """One server-sent event (``event`` is ``message`` for bus events, ``ping`` for a
    heartbeat comment when asked for)."""

    id: int | None
    event: str
    data: str


class DaemonClient:
    """An async client of one daemon; use it as ``async with``."""

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        timeout: float = 30.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        # The token's UTF-8 bytes: the daemon compares bytes (httpx would send str as ASCII).
        headers = {b"Authorization": b"Bearer " + token.encode()} if token else {}
        self._http = httpx.AsyncClient(
            base_url=base_url, headers=headers, timeout=timeout, transport=transport
        )

    async def __aenter__(self) -> Self:
        await self._http.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._http.__aexit__(exc_type, exc, tb)

    async def _call(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        response = await self._http.request(method, path, **kwargs)
        body = _json.decode(response.content) if response.content else {}
        _raise_for(response.status_code, body, "error")
        return body

    async def submit(self, request: dict[str, Any]) -> dict[str, Any]:
        """``POST /v1/runs``; returns ``{"id", "trace_id", "status"}``.

        The request is sent with its ``idempotency_key``, or a new one, and sent again with
        the same key when no answer came back (up to :data:`SUBMIT_ATTEMPTS` times).
        """
        if request.get("idempotency_key") is None:
            request = {**request, "idempotency_key": uuid.uuid4().hex}
        for _ in range(SUBMIT_ATTEMPTS - 1):
            try:
                return await self._call("POST", "/v1/runs", json=request)
            except httpx.TransportError:
                continue  # the answer was lost: the same key gets the same run
        return await self._call("POST", "/v1/runs", json=request)

    async def run(self, run_id: str) -> dict[str, Any]:
        return await self._call("GET", f"/v1/runs/{run_id}")

    async def runs(self, **query: str | int) -> dict[str, Any]:
        """``GET /v1/runs`` with filters (``status``, ``exit_reason``, ``limit``, ``cursor``)."""
        return await self._call("GET", "/v1/runs", params=query)

    async def abort(self, run_id: str) -> dict[str, Any]:
        return await self._call("POST", f"/v1/runs/{run_id}/abort")

    async def metrics(self) -> str:
        response = await self._http.get("/metrics")
        response.raise_for_status()
        return response.text

    async def events(
        self, run_id: str, *, after: int | None = None, pings: bool = False
    ) -> AsyncIterator[SseEvent]:
        """The run's events from the start (or after event ``after``) until ``end``; the
        ``end`` (or ``shutdown``) event itself is yielded last."""
        headers = {"Last-Event-ID": str(after)} if after is not None else {}
        async with self._http.stream(
            "GET", f"/v1/runs/{run_id}/events", headers=headers, timeout=None
        ) as response:
            if response.status_code >= 400:
                _raise_for(response.status_code, _json.decode(await response.aread()), "")
            async for event in parse_sse(response.aiter_lines(), pings=pings):
                yield event
                if event.event in ("end", "shutdown"):
                    return


def _raise_for(status: int, body: dict[str, Any], default_code: str) -> None:
    """Raise the :class:`DaemonError` an error ``body`` says, if ``status`` is one."""
    if status >= 400:
        error = body.get("error", {})
        raise DaemonError(status, error.get("code", default_code), error.get("message", ""))


async def parse_sse(lines: AsyncIterator[str], *, pings: bool = False) -> AsyncIterator[SseEvent]:
    """Server-sent events from text lines (the WHATWG rules this daemon needs)."""
    event_id: int | None = None
    kind = "message"
    data: list[str] = []
    async for line in lines:
        if not line:
            if data:
                yield SseEvent(event_id, kind, "\n".join(data))
            event_id, kind, data = None, "message", []
            continue
        if line.startswith(":"):
            if pings:
                yield SseEvent(None, "ping", line[1:].strip())
            continue
        field, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if field == "id":
            event_id = int(value) if value.isdigit() else None
        elif field == "event":
            kind = value
        elif field == "data":
            data.append(value)
