"""A response read from a pooled HTTP/1.1 connection: its head, then its body read by read.

The connection goes back to its pool the moment the body is complete (kept for reuse if
the server allows it and nothing follows the body), or is closed when the response is
closed before that, a read fails or the reading task is cancelled: a connection is never
reused half-read.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Final

from actors.llm.http1_connection import Connection
from actors.llm.http1_parse import Head, body_for

if TYPE_CHECKING:
    from actors.llm.http1_pool import Pool

__all__ = ["REST_BYTES", "REST_SECONDS", "Response"]

REST_BYTES: Final = 64 * 1024
REST_SECONDS: Final = 5.0
"""What :meth:`Response.finish_in_background` reads at most before it closes the
connection instead: bytes of the body's rest, and seconds."""


class Response:
    """Status, headers (as sent, in order) and HTTP version; the body from
    :meth:`aiter_stream` or :meth:`aread`; :meth:`aclose` when done with it."""

    __slots__ = (
        "_body",
        "_connection",
        "_keep",
        "_pool",
        "content_encoding",
        "cookies",
        "headers",
        "http_version",
        "status",
    )

    def __init__(self, pool: Pool, connection: Connection, head: Head) -> None:
        self.status = head.status
        self.headers = head.headers
        self.http_version = head.version
        self.cookies = head.cookies  # every Set-Cookie value, in order
        self.content_encoding = head.content_encoding  # the last one, lowered
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

    def finish_in_background(self) -> None:
        """The reader has what it wants: the rest of the body (a stream's chunked
        terminator after ``[DONE]``) is read and dropped by the connection's callbacks,
        which give the connection back once the body is complete, or close it past
        :data:`REST_BYTES` or :data:`REST_SECONDS`. Not for a reader that gives up (a
        cancelled run: :meth:`aclose` closes the connection, so the server stops)."""
        connection = self._connection
        if connection is None:
            return
        self._connection = None
        pool = self._pool
        keep = self._keep

        def done(complete: bool) -> None:
            pool.release(connection, reuse=complete and keep and not connection.buffer)

        connection.discard_rest(self._body, REST_BYTES, REST_SECONDS, done)

    async def aclose(self) -> None:
        """Done with the response: a body not read to its end closes the connection."""
        self.close()

    def close(self) -> None:
        """:meth:`aclose`, which never waits."""
        connection = self._connection
        if connection is not None:
            self._connection = None
            self._pool.release(connection, reuse=False)

    def _finish(self, connection: Connection) -> None:
        self._connection = None
        self._pool.release(connection, reuse=self._keep and not connection.buffer)
