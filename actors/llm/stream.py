"""A streamed chat completion read from the raw HTTP response, chunk batch by chunk batch.

The transport (:mod:`actors.llm.transport`) sends the request; the body is read here
instead of through the ``openai`` SDK's ``AsyncStream``, which builds a pydantic model per
chunk. Failures come out as the SDK's own stream would raise them::

    {"error": …} frame                 -> openai.APIError (message and body from the frame)
    timeout while reading              -> openai.APITimeoutError
    connection lost, TLS failure, …    -> openai.APIConnectionError
    a payload that is not JSON         -> msgspec.DecodeError

``data: [DONE]`` ends the stream; over HTTP/1.1 the rest of the body is then read and
ignored (so the connection can be reused, as the SDK does): by the transport's own client
in the background if the response offers it (``finish_in_background``), else here,
briefly. A body that ends without ``[DONE]`` simply ends. What ended it is counted in a
:class:`StreamTally`, from which :func:`stream_end` tells the caller why a stream without a
finish reason ended:
:class:`EmptyStream` (no event at all), :class:`StreamInterrupted` (``[DONE]`` before any
finish reason) or :class:`~actors.llm.errors.IncompleteStream` (the body just stopped).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, Final, Protocol

import anyio
import httpx2
import msgspec
import openai

from actors.llm.chunks import Chunk, decode_chunk, error_frame
from actors.llm.errors import IncompleteStream
from actors.llm.sdk_errors import connection_error
from actors.llm.sse import SSEDecoder
from actors.llm.transport import CORE_ERRORS

__all__ = [
    "DRAIN_SECONDS",
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
    """A 2xx stream that ended with no event and no ``[DONE]``: no answer at all.

    llama-cpp-python answers a streamed request this way when the prompt is over its
    context (the error only reaches its log); the same request not streamed gets the
    real error. The caller retries once without streaming."""


class StreamInterrupted(Exception):
    """The stream ended with ``[DONE]`` before any ``finish_reason``: the server cut it.

    llama-cpp-python does so when another request waits and ``--interrupt_requests`` is
    on (its default); it never cuts a reply that is not streamed."""


class StreamTally:
    """How a stream went: chunks read (error frames aside) and whether ``[DONE]`` came."""

    __slots__ = ("done", "events")

    def __init__(self) -> None:
        self.events = 0
        self.done = False


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

    @property
    def http_version(self) -> str: ...

    @property
    def request(self) -> httpx2.Request: ...

    def aiter_bytes(self) -> AsyncIterator[bytes]: ...


async def read_chunks(
    response: StreamedResponse, tally: StreamTally | None = None
) -> AsyncGenerator[list[Chunk | Any], None]:
    """The chunks of each network read that completed any (never an empty batch).

    Close the generator (``contextlib.aclosing``) and the response when done with them.
    ``tally``, if given, counts what was read.
    """
    sse = SSEDecoder()
    reads = response.aiter_bytes()
    try:
        async for data in reads:
            batch: list[Chunk | Any] = []
            failure: Exception | None = None
            done = False
            for payload in sse.feed(data):
                if payload.startswith(_DONE):
                    done = True
                    break
                try:
                    chunk = decode_chunk(payload)
                except msgspec.DecodeError as exc:
                    failure = exc
                    break
                error = error_frame(chunk)
                if error is not None:
                    failure = openai.APIError(error[0], response.request, body=error[1])
                    break
                batch.append(chunk)
            if batch:  # what came before a failure or the end counts, in order
                if tally is not None:
                    tally.events += len(batch)
                yield batch
            if failure is not None:
                raise failure
            if done:
                if tally is not None:
                    tally.done = True
                if response.http_version == "HTTP/1.1":  # HTTP/2 just closes the stream
                    await _drain(response, reads)
                return
    except CORE_ERRORS as exc:
        raise connection_error(exc, response.request) from exc
    finally:
        close = getattr(reads, "aclose", None)
        if close is not None:
            await close()  # now, not when the garbage collector finds it


async def _drain(response: StreamedResponse, reads: AsyncIterator[bytes]) -> None:
    hand_over = getattr(response, "finish_in_background", None)
    if hand_over is not None and hand_over():
        return  # the connection reads the rest itself, no task waiting on it
    with anyio.move_on_after(DRAIN_SECONDS):
        try:
            async for _ in reads:
                pass
        except CORE_ERRORS:
            pass  # the answer is complete: a failure after it is no failure of it
