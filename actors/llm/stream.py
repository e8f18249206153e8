"""A streamed chat completion read from the raw HTTP response, chunk batch by chunk batch
(its own SSE decoder and msgspec chunks, not the ``openai`` SDK's pydantic ``AsyncStream``).
Failures come out as the SDK's own stream would raise them::

    {"error": …} frame                 -> openai.APIError (message and body from the frame)
    timeout while reading              -> openai.APITimeoutError
    connection lost, TLS failure, …    -> openai.APIConnectionError
    a payload that is not JSON         -> msgspec.DecodeError

``data: [DONE]`` ends the stream (what is left of an HTTP/1.1 body is drained briefly, as
``docs/transport.md`` says), and so does the end of the body; a line longer than
:data:`actors.llm.sse.MAX_LINE_BYTES` fails it as a lost connection. :func:`stream_end`
tells the caller from a :class:`StreamTally` why a stream without a finish reason ended.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, Final, Protocol

import anyio
import httpx2
import msgspec
import openai

from actors.llm.chunks import Chunk, decode_chunk, error_frame
from actors.llm.errors import IncompleteStream
from actors.llm.sdk_errors import connection_error
from actors.llm.sse import LineTooLong, SSEDecoder
from actors.llm.transport import CORE_ERRORS, BrokenBody

__all__ = [
    "DRAIN_SECONDS",
    "ChunkReader",
    "EmptyStream",
    "StreamInterrupted",
    "StreamTally",
    "StreamedResponse",
    "read_chunks",
    "stream_end",
]

DRAIN_SECONDS: Final = 0.1
"""How long the body after ``[DONE]`` may take to drain before the response is closed."""

_DONE: Final = b"[DONE]"


class EmptyStream(Exception):
    """A 2xx stream that ended with no event and no ``[DONE]``: no answer at all
    (llama-cpp-python's streamed context overflow: ``docs/transport.md``)."""


class StreamInterrupted(Exception):
    """The stream ended with ``[DONE]`` before any ``finish_reason``: the server cut it
    (llama-cpp-python's ``--interrupt_requests``: ``docs/transport.md``)."""


@dataclasses.dataclass(slots=True, eq=False)
class StreamTally:
    """How a stream went: chunks read (error frames aside) and whether ``[DONE]`` came."""

    events: int = 0
    done: bool = False


def stream_end(tally: StreamTally) -> Exception:
    """Why a stream that gave no finish reason ended, as the exception to raise."""
    if tally.done:
        return StreamInterrupted(
            f"the server cut the stream: [DONE] after {tally.events} chunk(s) and no finish "
            "reason (llama-cpp-python does so when another request waits; start it with "
            "--interrupt_requests False)"
        )
    if not tally.events:
        return EmptyStream("the stream ended with no event and no [DONE]")
    return IncompleteStream("the stream ended without a finish reason")


class StreamedResponse(Protocol):
    """What is read of a response (:class:`~actors.llm.transport.Reply`)."""

    http_version: str

    @property
    def request(self) -> httpx2.Request: ...

    def aiter_bytes(self) -> AsyncIterator[bytes]: ...

    def drained_nowait(self) -> bool: ...


class ChunkReader:
    """The chunks of a streamed response's ``aiter_bytes``, batch by batch:
    :meth:`next_batch` until it returns ``None``, then :meth:`aclose` (and close the
    response). ``tally``, if given, counts what was read."""

    __slots__ = (
        "_done",
        "_ended",
        "_failure",
        "_iterator",
        "_read",
        "_response",
        "_sse",
        "_tally",
    )

    def __init__(self, response: StreamedResponse, tally: StreamTally | None = None) -> None:
        self._response = response
        self._tally = tally
        self._sse = SSEDecoder()
        self._iterator: AsyncIterator[bytes] | None = response.aiter_bytes()
        self._read = self._iterator.__anext__  # awaited directly: no frame of ours between
        self._failure: Exception | None = None  # raised at the next call (after a batch)
        self._done = False  # [DONE] came: the next call finishes the body and ends
        self._ended = False

    async def next_batch(self) -> list[Chunk | Any] | None:
        """The chunks of the next read that completed any; ``None`` at the end of the
        stream (``[DONE]`` or the end of the body). Raises the SDK's exceptions (and
        :class:`msgspec.DecodeError` for a payload that is not JSON) as the SDK's stream
        would, after the batch of what came before the failure in the same read."""
        if self._ended:
            return None
        failure = self._failure
        if failure is not None:
            self._ended = True
            raise failure
        try:
            if self._done:
                self._ended = True
                response = self._response
                if response.http_version == "HTTP/1.1" and not response.drained_nowait():
                    await self._drain()  # (HTTP/2 closes the stream)
                return None
            while True:
                try:
                    data = await self._read()  # (not closed: aclose ends the reader)
                except StopAsyncIteration:
                    self._ended = True
                    return None
                batch = self._decode(data)
                if batch:  # what came before a failure or the end counts, in order
                    return batch
                if self._failure is not None or self._done:
                    return await self.next_batch()
        except CORE_ERRORS as exc:
            self._ended = True
            raise connection_error(exc, self._response.request) from exc

    def _decode(self, data: bytes) -> list[Chunk | Any]:
        """The chunks ``data`` completes, up to ``[DONE]`` or a failure (kept for the next
        call)."""
        batch: list[Chunk | Any] = []
        try:
            payloads = self._sse.feed(data)
        except LineTooLong as exc:
            failure = BrokenBody(str(exc))
            self._failure = connection_error(failure, self._response.request)
            self._failure.__cause__ = failure
            return batch
        for payload in payloads:
            if payload.startswith(_DONE):
                self._done = True
                break
            try:
                chunk = decode_chunk(payload)
            except msgspec.DecodeError as exc:
                self._failure = exc
                break
            error = error_frame(chunk)
            if error is not None:
                request = self._response.request
                self._failure = openai.APIError(error[0], request, body=error[1])
                break
            batch.append(chunk)
        tally = self._tally
        if tally is not None:
            tally.events += len(batch)
            tally.done = self._done
        return batch

    async def _drain(self) -> None:
        with anyio.move_on_after(DRAIN_SECONDS):
            try:
                while self._iterator is not None:  # (None: closed)
                    await self._read()
            except (StopAsyncIteration, *CORE_ERRORS):
                pass  # the answer is complete: a failure after it is no failure of it

    async def aclose(self) -> None:
        """Done reading: close the body's iterator now, not when the garbage collector
        finds it (the response itself is closed by its owner)."""
        self._ended = True
        iterator, self._iterator = self._iterator, None
        close = getattr(iterator, "aclose", None)
        if close is not None:
            await close()


async def read_chunks(
    response: StreamedResponse, tally: StreamTally | None = None
) -> AsyncGenerator[list[Chunk | Any], None]:
    """The batches of a :class:`ChunkReader` over ``response`` and ``tally``, as an async
    generator: close it (``contextlib.aclosing``) and the response when done with them."""
    reader = ChunkReader(response, tally)
    try:
        while (batch := await reader.next_batch()) is not None:
            yield batch
    finally:
        await reader.aclose()
