"""The network streams under the model transport's connection pool: ``httpcore2``'s own
(:class:`httpcore2.AnyIOBackend`), with two costs per request taken out.

- **One send per request.** ``httpcore2`` writes a request's head and its body with a
  socket send each. :class:`LeanStream` holds what is written until the next read (the
  response's head) and sends it joined: one syscall, one TCP segment on loopback, instead
  of two, each of which also runs the receiving side's TCP work in the sender's time. What
  is held is bounded (:data:`HOLD_BYTES`); a larger body goes out at once.
- **A cheap liveness check.** Before reusing an idle connection the pool asks whether it is
  readable (a server that closed it); ``AnyIOBackend`` answers from the socket's attribute
  map, which calls ``getpeername`` each time, for every idle connection of the pool on
  every request. Here the socket is registered once with a ``poll`` object and polled.

Only the public API of ``httpcore2`` is used (its network backend and stream interfaces).
"""

# httpcore2's stream and backend interfaces take a `timeout` argument: ASYNC109 does not apply.
# ruff: noqa: ASYNC109

from __future__ import annotations

import select
import ssl
import time
from collections.abc import Iterable
from typing import Any, Final

import httpcore2

__all__ = ["HOLD_BYTES", "QUIET_SECONDS", "LeanBackend", "LeanStream"]

HOLD_BYTES: Final = 256 * 1024
"""Bytes of a request held for the joined send; past this, what is held goes out."""

QUIET_SECONDS: Final = 0.005
"""A connection found not readable is not polled again for this long. The pool checks every
idle connection on every request it places (two scans per request): under load, one poll per
connection per interval instead of ~20 polls per request. A close the server sent in the
last few milliseconds is then seen by the request that reuses the connection, as one sent
just after a poll always was (a connection error, retried on a fresh connection)."""

_POLL: Final = getattr(select, "poll", None)


class LeanStream(httpcore2.AsyncNetworkStream):
    """A connection's stream: writes held until the next read, a cheap readability check."""

    __slots__ = ("_held", "_inner", "_poll", "_quiet_until", "_size", "_timeout")

    def __init__(self, inner: httpcore2.AsyncNetworkStream) -> None:
        self._inner = inner
        self._held: list[bytes] = []
        self._size = 0
        self._timeout: float | None = None
        self._poll: Any = None
        self._quiet_until = 0.0

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        if self._held:
            await self._flush()
        return await self._inner.read(max_bytes, timeout)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        self._held.append(buffer)
        self._size += len(buffer)
        self._timeout = timeout
        if self._size >= HOLD_BYTES:
            await self._flush()

    async def _flush(self) -> None:
        held = self._held
        data = held[0] if len(held) == 1 else b"".join(held)
        self._held = []
        self._size = 0
        await self._inner.write(data, self._timeout)

    async def aclose(self) -> None:
        self._held = []
        self._size = 0
        self._poll = None
        await self._inner.aclose()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        if self._held:
            await self._flush()
        inner = await self._inner.start_tls(ssl_context, server_hostname, timeout)
        return LeanStream(inner)

    def get_extra_info(self, info: str) -> Any:
        if info == "is_readable" and _POLL is not None:
            poll = self._poll
            if poll is None:
                sock = self._inner.get_extra_info("socket")
                if sock is None or sock.fileno() < 0:
                    return True  # as httpcore2 says: gone counts as readable (its end)
                poll = self._poll = _POLL()
                poll.register(sock.fileno(), select.POLLIN)
            now = time.monotonic()
            if now < self._quiet_until:
                return False
            if poll.poll(0):
                return True
            self._quiet_until = now + QUIET_SECONDS
            return False
        return self._inner.get_extra_info(info)


class LeanBackend(httpcore2.AsyncNetworkBackend):
    """``httpcore2.AnyIOBackend`` whose streams are :class:`LeanStream`."""

    __slots__ = ("_inner",)

    def __init__(self) -> None:
        self._inner = httpcore2.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        stream = await self._inner.connect_tcp(host, port, timeout, local_address, socket_options)
        return LeanStream(stream)

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        stream = await self._inner.connect_unix_socket(path, timeout, socket_options)
        return LeanStream(stream)

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)
