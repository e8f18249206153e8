"""Server-Sent Events for one run: every stored event in order, live, resumable
(``docs/daemon.md``, "Event streams").

Each bus message is a default (``message``) event whose ``id`` is the run's sequence number
and whose ``data`` is the message as JSON. A stream starts with ``retry: 3000``, sends a
``: ping`` comment after every ``heartbeat`` seconds without events, and ends with ``event:
end`` after the run's ``RunFinished``, once its result is stored (data: id, status, exit
reason, last event id, dropped-event count); ``event: shutdown`` if the daemon shuts down
first. ``Last-Event-ID`` or ``?after=N`` resumes after event N: no gaps, no duplicates.

Streams read committed events, never the bus: the store's memory tail
(:mod:`~orchestrator.daemon.tail`), and SQLite only for what has left it.
:class:`EventStreamResponse` sends the frames, one write per frame (why not sse-starlette's
``EventSourceResponse``: docs/daemon.md, "How it is built").
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from typing import Final

import anyio
import msgspec
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from orchestrator.daemon.store import Store

__all__ = ["RETRY_MILLISECONDS", "EventStreamResponse", "Last", "event_stream", "frame"]

RETRY_MILLISECONDS: Final = 3000
READ_BATCH: Final = 500
PING: Final = b": ping\n\n"
_START: Final = {
    "type": "http.response.start",
    "status": 200,
    "headers": [
        (b"content-type", b"text/event-stream; charset=utf-8"),
        (b"cache-control", b"no-store"),
        (b"x-accel-buffering", b"no"),
        (b"connection", b"keep-alive"),
    ],
}
_LAST: Final = {"type": "http.response.body", "body": b"", "more_body": False}


def frame(data: bytes, *, event: str | None = None, id: int | None = None) -> bytes:
    """One SSE frame; ``data`` is JSON without newlines."""
    head = b""
    if id is not None:
        head += b"id: %d\n" % id
    if event is not None:
        head += b"event: " + event.encode() + b"\n"
    return head + b"data: " + data + b"\n\n"


async def event_stream(
    store: Store,
    run_id: str,
    *,
    after: int,
    closing: anyio.Event,
) -> AsyncIterator[bytes]:
    """The frames of ``run_id``'s events after ``after``, until its ``RunFinished``
    (heartbeats are :class:`EventStreamResponse`'s)."""
    # Sent with the first events when they are at hand, else alone before the first wait.
    head = b"retry: %d\n\n" % RETRY_MILLISECONDS
    tail = store.memory
    last = after
    while True:
        committed = store.watch(run_id)  # before reading: a commit after the read wakes us
        events = tail.after(run_id, last)
        in_memory = events is not None
        if events is None:  # left memory (or never was there): replay from the store
            events = await store.events(run_id, after=last, limit=READ_BATCH)
        if events:
            # One write per wake-up, however many events it brings.
            frames = [head] if head else []
            head = b""
            for event in events:
                frames.append(frame(event.data, id=event.seq))
                last = event.seq
                if event.type == "RunFinished":
                    known = tail.ended(run_id)
                    if known is not None:  # the end is known too: the same write
                        frames.append(_end_frame(run_id, "end", "ended", *known))
                        yield Last(b"".join(frames))
                        return
                    yield b"".join(frames)
                    yield Last(await _end(store, run_id, "end", closing))
                    return
            yield b"".join(frames)
            continue
        if head:
            yield head
            head = b""
        if in_memory:
            # Memory holds the run up to its newest committed event: nothing new yet.
            end = tail.ended(run_id)
            if end is not None and last >= end.last_event:
                yield Last(await _end(store, run_id, "end", closing))  # resumed past the end
                return
        else:
            row = await store.get_run(run_id)
            if row is None or (row.status == "ended" and last >= row.last_event):
                # Resumed past the end, or pruned. (An ended row's events are all
                # committed: if it has more than we read, the next read gets them.)
                yield Last(await _end(store, run_id, "end", closing))
                return
            if row.status == "ended":
                continue
        if closing.is_set():
            yield Last(await _end(store, run_id, "shutdown", closing))
            return
        await committed.wait()  # set by the next commit for the run, or on closing


class Last(bytes):
    """A stream's last write (its ``end`` or ``shutdown`` frame): it completes the body."""

    __slots__ = ()


class EventStreamResponse(Response):
    """An ASGI ``text/event-stream`` response: each of ``frames`` in one write, a ``: ping``
    after ``heartbeat`` seconds without a write, and the stream stopped when the client
    goes away (not only at its end). ``opened(+1)`` and ``opened(-1)`` bracket it. (A
    :class:`~starlette.responses.Response` for the routes' types: only its call is used.)"""

    __slots__ = ("_frames", "_heartbeat", "_last_write", "_opened", "_started")

    def __init__(
        self, frames: AsyncIterator[bytes], *, heartbeat: float, opened: Callable[[int], None]
    ) -> None:
        self._frames = frames
        self._heartbeat = heartbeat
        self._opened = opened
        self._started = False
        self._last_write = 0.0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self._opened(1)
        try:
            await send(_START)
            self._last_write = time.monotonic()
            ended = complete = False
            async with anyio.create_task_group() as group:
                group.start_soon(self._watch_client, receive, send, group.cancel_scope)
                async for chunk in self._frames:
                    self._started = True
                    # The last frames end the body in the same write.
                    complete = type(chunk) is Last
                    body = {"type": "http.response.body", "body": chunk, "more_body": not complete}
                    await send(body)
                    self._last_write = time.monotonic()
                ended = True
                group.cancel_scope.cancel()
            if ended and not complete:  # else the body is complete, or the client left
                await send(_LAST)
        finally:
            self._opened(-1)

    async def _watch_client(self, receive: Receive, send: Send, stream: anyio.CancelScope) -> None:
        """Ping after ``heartbeat`` seconds without a write; stop ``stream`` on the
        client's ``http.disconnect``."""
        while True:
            with anyio.move_on_after(self._last_write + self._heartbeat - time.monotonic()):
                while (await receive())["type"] != "http.disconnect":
                    pass
                stream.cancel()
                return
            if not self._started:  # the first frame (``retry:``) goes first: wait again
                self._last_write = time.monotonic()
            elif time.monotonic() - self._last_write >= self._heartbeat:
                await send({"type": "http.response.body", "body": PING, "more_body": True})
                self._last_write = time.monotonic()


async def _wait(committed: anyio.Event, closing: anyio.Event, seconds: float) -> bool:
    """Wait for ``committed``; ``False`` if ``seconds`` passed first. (Closing the daemon
    sets every watcher: :meth:`Store.wake_all`.)"""
    if closing.is_set():
        return True
    with anyio.move_on_after(seconds):
        await committed.wait()
        return True
    return False


async def _end(store: Store, run_id: str, event: str, closing: anyio.Event) -> bytes:
    """The last frame. After ``RunFinished``, ``end`` waits until the run's row says
    ``ended`` (its result is then readable with ``GET /v1/runs/{id}``)."""
    look = event != "end"
    while True:
        committed = store.watch(run_id)
        known = store.memory.ended(run_id)
        if known is not None:  # the commit that said so is in memory: no read needed
            return _end_frame(run_id, event, "ended", *known)
        if not look and store.memory.knows(run_id) and not closing.is_set():
            # Memory holds the run, so the commit that ends its row will be in memory
            # too: wait for it without reading the row (a timeout reads it).
            look = not await _wait(committed, closing, 60.0)
            continue
        row = await store.get_run(run_id)
        if row is None or row.status == "ended" or event != "end" or closing.is_set():
            break
        await _wait(committed, closing, 60.0)
    if row is None:
        return _end_frame(run_id, event, "deleted", None, 0, 0)
    return _end_frame(
        run_id, event, row.status, row.exit_reason, row.last_event, row.events_dropped
    )


def _end_frame(
    run_id: str,
    event: str,
    status: str,
    exit_reason: str | None,
    last_event: int,
    events_dropped: int,
) -> bytes:
    body = {
        "id": run_id,
        "status": status,
        "exit_reason": exit_reason,
        "last_event_id": last_event,
        "events_dropped": events_dropped,
    }
    return frame(msgspec.json.encode(body), event=event)
