"""One HTTP/1.1 client connection as an asyncio protocol: what arrives is appended to a
buffer by the event loop's callback, and a reader waits on one future only when the buffer
holds too little; no task step per socket read.

- **Timeouts without a timer per read.** A read waits at most the read timeout for more
  bytes. Each connection has one loop timer at most; a wait moves the connection's
  deadline and re-arms the timer only if it would fire too late. With a constant timeout
  the deadlines only grow, so the timer is made once per timeout period, not per read;
  when it fires early it re-arms itself at the current deadline.
- **Bounded buffering.** Reading from the socket is paused while more than
  :data:`HIGH_WATER` bytes wait to be consumed, and resumed below it.
- **Closes seen when they happen.** ``connection_lost``/``eof_received`` mark the
  connection unusable at once and tell its owner (the pool drops an idle one).
- **The end of a body read in the background** (:meth:`Connection.discard_rest`): once a
  reader has what it wants (a stream's ``[DONE]``), the rest of the body (the chunked
  terminator) is read and dropped by the protocol's callbacks, bounded in bytes and time,
  and the connection handed back then: no task, no waiting reader.

The connection's errors are ``httpcore2``'s exception classes (public), so the transport
maps them to the SDK's exceptions as before.
"""

# The connection's methods take the exchange's timeouts as arguments: ASYNC109 does not apply.
# ruff: noqa: ASYNC109

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, cast

import anyio
import httpcore2

from actors.llm.http1_parse import Body, Head, parse_head

__all__ = ["HIGH_WATER", "Connection", "connect", "event_loop"]

HIGH_WATER: Final = 256 * 1024
"""Bytes received and not consumed above which reading from the socket pauses."""

_EARLY: Final = 0.001  # a timer may run this much before its time and still count


@dataclass(slots=True)
class _Rest:
    """A body's rest being read and dropped: at most ``budget`` more bytes."""

    body: Body
    budget: int
    done: Callable[[bool], None]


def event_loop() -> asyncio.AbstractEventLoop:
    """The running asyncio loop. The client is an asyncio protocol on purpose (a read is a
    callback, not a task step: ``docs/transport.md``); anyio runs on asyncio here."""
    return asyncio.get_running_loop()  # noqa: TID251


class Connection(asyncio.Protocol):
    """A client connection: a receive buffer, one waiting reader at most, one timer."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.usable = True  # false once closed, half-closed or out of step
        self.failure: BaseException | None = None  # why the connection was lost
        self.eof = False
        self.idle = False  # parked in a pool
        self.counted = False  # against a pool's connection limit
        self.idle_since = 0.0
        self.on_close: Callable[[Connection], None] | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._deadline = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._paused = False
        self._drain: asyncio.Future[None] | None = None
        self._rest: _Rest | None = None

    # ------------------------------------------------------------- protocol callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer
        buffer += data
        if self.idle:  # nothing was asked: the connection is out of step
            self.close()
            return
        if self._rest is not None:
            self._discard()
            return
        if len(buffer) > HIGH_WATER and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def eof_received(self) -> bool:
        self.eof = True
        self._lost()
        return False  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is not None and self.failure is None:
            self.failure = exc
        self.eof = True
        self._lost()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        drain = self._drain
        if drain is not None and not drain.done():
            drain.set_result(None)

    def pause_writing(self) -> None:
        self._drain = self.loop.create_future()

    def resume_writing(self) -> None:
        drain = self._drain
        self._drain = None
        if drain is not None and not drain.done():
            drain.set_result(None)

    def _lost(self) -> None:
        self.usable = False
        if self._rest is not None:
            self._discard()
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)
        on_close = self.on_close
        if on_close is not None:
            self.on_close = None
            on_close(self)

    # ------------------------------------------------------------- sending

    def write(self, data: bytes) -> bool:
        """Hand ``data`` to the socket; true if the socket's buffer is full and the caller
        must wait for it to drain (:meth:`drained`) before the write counts as done."""
        transport = self.transport
        if transport is None or not self.usable:
            raise httpcore2.WriteError("the connection was closed")
        transport.write(data)
        if self._drain is not None:
            return True
        if self.failure is not None:
            raise httpcore2.WriteError(str(self.failure)) from self.failure
        return False

    async def drained(self, timeout: float | None) -> None:
        """Until what was written has left for the socket (``WriteTimeout`` after
        ``timeout`` seconds)."""
        drain = self._drain
        if drain is not None:
            try:
                with anyio.fail_after(timeout):
                    await drain
            except TimeoutError as exc:
                raise httpcore2.WriteTimeout("timed out writing the request") from exc
        if self.failure is not None:
            raise httpcore2.WriteError(str(self.failure)) from self.failure

    # ------------------------------------------------------------- receiving

    async def read_head(self, timeout: float | None) -> Head:
        """The next final response head (1xx informational heads are skipped)."""
        buffer = self.buffer
        while True:
            head = parse_head(buffer)
            if head is not None:
                if head.status >= 200:
                    return head
                if head.status == 101:
                    raise httpcore2.RemoteProtocolError("a protocol switch that was not asked")
                continue
            if self.eof:
                self._raise_closed(mid_head=bool(buffer))
            await self._wait(timeout)

    async def read_body(self, body: Body, timeout: float | None) -> list[bytes]:
        """What is there of ``body`` (waiting for more when nothing is); an empty list once
        the body is complete."""
        buffer = self.buffer
        out: list[bytes] = []
        while True:
            if buffer:
                body.feed(buffer, out)
                if self._paused and len(buffer) < HIGH_WATER and self.transport is not None:
                    self._paused = False
                    self.transport.resume_reading()
            if out or body.done:
                return out
            if self.eof:
                if self.failure is not None:
                    raise httpcore2.ReadError(str(self.failure)) from self.failure
                body.at_eof()  # raises unless the close ends the body
                return out
            await self._wait(timeout)

    def _raise_closed(self, *, mid_head: bool) -> None:
        if self.failure is not None:
            raise httpcore2.ReadError(str(self.failure)) from self.failure
        if mid_head:
            raise httpcore2.RemoteProtocolError("the server closed the connection mid-head")
        raise httpcore2.RemoteProtocolError("Server disconnected without sending a response.")

    async def _wait(self, timeout: float | None) -> None:
        """Until more bytes arrive or the connection closes; ``ReadTimeout`` after
        ``timeout`` seconds."""
        loop = self.loop
        waiter = loop.create_future()
        self._waiter = waiter
        if timeout is not None:
            deadline = loop.time() + timeout
            self._deadline = deadline
            if self._timer is None or self._timer_at > deadline:
                self._arm(deadline)
        else:
            self._deadline = 0.0
        try:
            await waiter
        finally:
            self._waiter = None

    def _arm(self, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = when
        self._timer = self.loop.call_at(when, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        waiter = self._waiter
        deadline = self._deadline
        waiting = waiter is not None and not waiter.done()
        if not deadline or not (waiting or self._rest is not None):
            return
        if self.loop.time() + _EARLY < deadline:
            self._arm(deadline)
        elif self._rest is not None:
            self._end_rest(complete=False)
        elif waiter is not None:
            self._waiter = None
            waiter.set_exception(httpcore2.ReadTimeout("timed out waiting for the server"))

    # ------------------------------------------------------------- the rest of a body

    def discard_rest(
        self, body: Body, budget: int, seconds: float, done: Callable[[bool], None]
    ) -> None:
        """Read and drop the rest of ``body`` from the protocol's callbacks; then
        ``done(True)``, or ``done(False)`` after more than ``budget`` bytes, ``seconds``, a
        malformed body or the connection's end (``done`` then closes it)."""
        self._rest = _Rest(body, budget, done)
        deadline = self.loop.time() + seconds
        self._deadline = deadline
        if self._timer is None or self._timer_at > deadline:
            self._arm(deadline)
        self._discard()

    def _discard(self) -> None:
        rest = self._rest
        assert rest is not None
        body = rest.body
        out: list[bytes] = []
        try:
            body.feed(self.buffer, out)
            if self.eof and not body.done:
                body.at_eof()
        except httpcore2.RemoteProtocolError:
            self._end_rest(complete=False)
            return
        rest.budget -= sum(map(len, out))
        if body.done or rest.budget < 0 or self.eof:
            self._end_rest(complete=body.done and rest.budget >= 0)
        elif self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()

    def _end_rest(self, *, complete: bool) -> None:
        rest = self._rest
        self._rest = None
        self._deadline = 0.0
        if rest is not None:
            rest.done(complete)

    # ------------------------------------------------------------- closing

    def close(self) -> None:
        """Close now (what is unsent is dropped): the connection is not reused."""
        self._shut(graceful=False)

    def close_gracefully(self) -> None:
        """Close after what is unsent has gone (a finished exchange not kept)."""
        self._shut(graceful=True)

    def _shut(self, *, graceful: bool) -> None:
        self.usable = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        transport = self.transport
        if transport is not None and not transport.is_closing():
            if graceful:
                transport.close()
            else:
                transport.abort()


async def connect(
    host: str,
    port: int,
    ssl_context: ssl.SSLContext | None,
    timeout: float | None,
) -> Connection:
    """A new connection to ``host``:``port`` (TLS when ``ssl_context`` is given, the host
    name checked); ``httpcore2.ConnectTimeout``/``ConnectError`` when that fails."""
    loop = event_loop()
    try:
        with anyio.fail_after(timeout):
            _, protocol = await loop.create_connection(
                lambda: Connection(loop),
                host,
                port,
                ssl=ssl_context,
                server_hostname=host if ssl_context is not None else None,
            )
    except TimeoutError as exc:
        raise httpcore2.ConnectTimeout(f"no connection to {host}:{port} in time") from exc
    except (OSError, ssl.SSLError) as exc:
        raise httpcore2.ConnectError(str(exc) or type(exc).__name__) from exc
    return protocol
