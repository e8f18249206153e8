"""A response read from a pooled HTTP/1.1 connection: its head, then its body read by read.

The connection goes back to its pool the moment the body is complete (kept for reuse if
the server allows it and nothing follows the body), or is closed when the response is
closed before that, a read fails or the reading task is cancelled: a connection is never
reused half-read.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from actors.llm.http1_connection import Connection
from actors.llm.http1_parse import Head, body_for

if TYPE_CHECKING:
    from actors.llm.http1_pool import Pool

__all__ = ["Response"]


class Response:
    """Status, headers (as sent, in order) and HTTP version; the body from
    :meth:`aiter_stream` or :meth:`aread`; :meth:`aclose` when done with it."""

    __slots__ = ("_body", "_connection", "_keep", "_pool", "headers", "http_version", "status")

    def __init__(self, pool: Pool, connection: Connection, head: Head) -> None:
        self.status = head.status
        self.headers = head.headers
        self.http_version = head.version
        self._pool = pool
        self._body = body_for(head)  # first: it may turn keep-alive off
        self._keep = head.keep_alive
        self._connection: Connection | None = connection
        if self._body.done:
            self._finish(connection)

    async def aiter_stream(self) -> AsyncIterator[bytes]:
        """The body, as it arrives (never an empty piece)."""
        while True:
            data = await self.read_some()
            if not data:
                return
            yield data

    async def read_some(self) -> bytes:
        """What has arrived of the body (waiting when nothing has); ``b""`` at its end."""
        connection = self._connection
        if connection is None:
            return b""
        body = self._body
        try:
            pieces = await connection.read_body(body, self._pool.timeouts.read)
        except BaseException:
            self._connection = None
            self._pool.release(connection, reuse=False)
            raise
        if body.done:
            self._finish(connection)
        if not pieces:
            return b""
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    async def aread(self) -> bytes:
        """The rest of the body, whole."""
        pieces = []
        while data := await self.read_some():
            pieces.append(data)
        return b"".join(pieces)

    async def aclose(self) -> None:
        """Done with the response: a body not read to its end closes the connection."""
        connection = self._connection
        if connection is not None:
            self._connection = None
            self._pool.release(connection, reuse=False)

    def _finish(self, connection: Connection) -> None:
        self._connection = None
        self._pool.release(connection, reuse=self._keep and not connection.buffer)
