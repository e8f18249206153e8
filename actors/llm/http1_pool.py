"""The connections to one origin, kept for reuse: placing a request and taking a response's
connection back cost O(1), however many connections the pool holds.

- Idle connections wait in a deque, most recently used last: a request takes the last one
  (a warm connection), the oldest ones at the front expire first. One idle longer than
  :attr:`Pool.keepalive_expiry` is closed instead of reused; past
  :attr:`Pool.max_keepalive` idle connections, the oldest is closed.
- A connection the server closes while idle leaves the pool when the close arrives (the
  protocol's ``connection_lost``), never reused and never polled for.
- At most :attr:`Pool.max_connections` at once; a request beyond waits in a FIFO queue
  for a connection someone returns (or the right to open one), at most the pool timeout
  (``httpcore2.PoolTimeout``).
- ``fresh``: a new connection outside the count, closed when its exchange ends.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque

import anyio
import httpcore2

from actors.llm.http1_connection import Connection, connect, event_loop
from actors.llm.http1_response import Response

__all__ = ["Pool", "Timeouts"]


class Timeouts:
    """Seconds (``None``: no limit): to connect, per read, to write, to wait for the pool."""

    __slots__ = ("connect", "pool", "read", "write")

    def __init__(
        self,
        connect: float | None,
        read: float | None,
        write: float | None,
        pool: float | None,
    ) -> None:
        self.connect = connect
        self.read = read
        self.write = write
        self.pool = pool


class Pool:
    """HTTP/1.1 connections to ``host``:``port`` (TLS with ``ssl_context``)."""

    def __init__(
        self,
        host: str,
        port: int,
        ssl_context: ssl.SSLContext | None,
        timeouts: Timeouts,
        *,
        max_connections: int,
        max_keepalive: int,
        keepalive_expiry: float,
    ) -> None:
        self.host = host
        self.port = port
        self.ssl_context = ssl_context
        self.timeouts = timeouts
        self.max_connections = max_connections
        self.max_keepalive = max_keepalive
        self.keepalive_expiry = keepalive_expiry
        self._idle: deque[Connection] = deque()
        self._waiters: deque[asyncio.Future[Connection | None]] = deque()
        self._counted = 0  # connections open or opening, idle ones included; fresh ones not
        self._open: set[Connection] = set()  # every connection, to close them all
        self._closed = False

    @property
    def connections(self) -> int:
        """Connections counted against :attr:`max_connections` (idle ones included)."""
        return self._counted

    @property
    def idle(self) -> int:
        """Idle connections kept for reuse (some may have just been found closed)."""
        return len(self._idle)

    async def request(self, data: bytes, *, fresh: bool = False) -> Response:
        """Send ``data`` (a whole request: head and body) and read the response's head;
        its body is read from the :class:`Response`, which returns the connection."""
        connection = None if fresh else self._reuse()
        if connection is None:
            connection = await (self._fresh() if fresh else self._acquire())
        timeouts = self.timeouts
        try:
            if connection.write(data):  # the socket's buffer is full: wait for it to drain
                await connection.drained(timeouts.write)
            head = await connection.read_head(timeouts.read)
        except BaseException:
            self.release(connection, reuse=False)
            raise
        return Response(self, connection, head)

    # ------------------------------------------------------------------ connections

    def _reuse(self) -> Connection | None:
        """The most recently used idle connection still usable, if any (without a wait)."""
        idle = self._idle
        if idle and not self._closed:
            expired = idle[-1].loop.time() - self.keepalive_expiry
            while idle:
                connection = idle.pop()
                connection.idle = False
                if connection.usable and connection.idle_since > expired:
                    return connection
                self._drop(connection)
        return None

    async def _acquire(self) -> Connection:
        if self._closed:
            raise httpcore2.ConnectError("the connection pool is closed")
        connection = self._reuse()
        if connection is not None:
            return connection
        if self._counted < self.max_connections:
            self._counted += 1
            return await self._open_counted()
        return await self._wait_for_one()

    async def _open_counted(self) -> Connection:
        """A new connection for a slot already counted (given back if this fails)."""
        try:
            connection = await connect(
                self.host, self.port, self.ssl_context, self.timeouts.connect
            )
        except BaseException:
            self._counted -= 1
            self._hand_slot()
            raise
        if self._closed:
            connection.close()
            self._counted -= 1
            raise httpcore2.ConnectError("the connection pool is closed")
        self._open.add(connection)
        connection.counted = True
        connection.on_close = self._closed_by_peer
        return connection

    async def _fresh(self) -> Connection:
        connection = await connect(self.host, self.port, self.ssl_context, self.timeouts.connect)
        self._open.add(connection)
        return connection

    async def _wait_for_one(self) -> Connection:
        waiter: asyncio.Future[Connection | None] = event_loop().create_future()
        self._waiters.append(waiter)
        try:
            with anyio.fail_after(self.timeouts.pool):
                given = await waiter
        except BaseException as exc:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                self._give_back(waiter.result())  # handed over just as we gave up
            else:
                waiter.cancel()
                try:
                    self._waiters.remove(waiter)
                except ValueError:
                    pass
            if isinstance(exc, TimeoutError):
                raise httpcore2.PoolTimeout("no connection free in time") from exc
            raise
        if given is not None:
            return given
        return await self._open_counted()  # a slot was handed over

    def _give_back(self, given: Connection | None) -> None:
        if given is None:
            self._counted -= 1
            self._hand_slot()
        else:
            self.release(given, reuse=True)

    def release(self, connection: Connection, *, reuse: bool) -> None:
        """Take back ``connection`` after an exchange: kept if ``reuse`` and still usable,
        otherwise closed."""
        if connection not in self._open:  # forgotten already (the pool was closed)
            connection.close()
            return
        if not (reuse and connection.usable and connection.counted) or self._closed:
            if reuse and connection.usable:  # a fresh connection, its exchange complete
                connection.close_gracefully()
            self._drop(connection)
            return
        waiters = self._waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(connection)
                return
        now = connection.loop.time()
        connection.idle = True
        connection.idle_since = now
        idle = self._idle
        idle.append(connection)
        if len(idle) > self.max_keepalive:
            self._drop(idle.popleft())
        expired = now - self.keepalive_expiry
        while idle and idle[0].idle_since <= expired:
            self._drop(idle.popleft())

    def _drop(self, connection: Connection) -> None:
        """Close ``connection`` and forget it."""
        connection.idle = False
        connection.close()
        self._forget(connection)

    def _forget(self, connection: Connection) -> None:
        """Stop tracking ``connection``; its slot goes to a waiter (once per connection)."""
        if connection in self._open:
            self._open.discard(connection)
            if connection.counted:
                self._counted -= 1
                self._hand_slot()

    def _closed_by_peer(self, connection: Connection) -> None:
        if connection.idle:  # still in the deque: skipped when a request reaches it
            self._forget(connection)

    def _hand_slot(self) -> None:
        """Let the first waiter open a connection, if the count allows one more."""
        waiters = self._waiters
        while waiters and self._counted < self.max_connections and not self._closed:
            waiter = waiters.popleft()
            if not waiter.done():
                self._counted += 1
                waiter.set_result(None)
                return

    async def aclose(self) -> None:
        """Close every connection (those in use too); later requests fail."""
        self._closed = True
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(httpcore2.ConnectError("the connection pool is closed"))
        self._idle.clear()
        connections = list(self._open)
        self._open.clear()
        for connection in connections:
            connection.close()
        self._counted = 0
