"""A streamed chat completion read from the raw HTTP response, chunk batch by chunk batch.

The ``openai`` SDK still sends the request (auth, headers, timeouts, its status errors); the
body is read here instead of through its ``AsyncStream``, which builds a pydantic model per
chunk. Failures come out as the SDK's own stream would raise them::

    {"error": …} frame                 -> openai.APIError (message and body from the frame)
    timeout while reading              -> openai.APITimeoutError
    connection lost, TLS failure, …    -> openai.APIConnectionError
    a payload that is not JSON         -> msgspec.DecodeError

``data: [DONE]`` ends the stream; over HTTP/1.1 the rest of the body is then drained
briefly (so the connection can be reused, as the SDK does) and ignored. A body that ends without
``[DONE]`` simply ends: the caller decides from the finish reason.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, Final, Protocol

import anyio
import httpx2
import msgspec
import openai

from actors.llm.chunks import Chunk, decode_chunk, error_frame
from actors.llm.sse import SSEDecoder
from actors.llm.transport import CORE_ERRORS, as_httpx_error

__all__ = ["DRAIN_SECONDS", "StreamedResponse", "read_chunks"]

DRAIN_SECONDS: Final = 0.1
"""How long the body after ``[DONE]`` may take to drain before the response is closed."""

_DONE: Final = b"[DONE]"
_TRANSPORT_ERRORS: Final = (httpx2.RequestError, ssl.SSLError, anyio.EndOfStream, *CORE_ERRORS)


class StreamedResponse(Protocol):
    """What is read of a response: an ``httpx2.Response``, or a
    :class:`~actors.llm.transport.Reply` straight from the connection pool."""

    @property
    def http_version(self) -> str: ...

    @property
    def request(self) -> httpx2.Request: ...

    def aiter_bytes(self) -> AsyncGenerator[bytes, None]: ...


async def read_chunks(response: StreamedResponse) -> AsyncGenerator[list[Chunk | Any], None]:
    """The chunks of each network read that completed any (never an empty batch).

    Close the generator (``contextlib.aclosing``) and the response when done with them.
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
                yield batch
            if failure is not None:
                raise failure
            if done:
                if response.http_version == "HTTP/1.1":  # HTTP/2 just closes the stream
                    await _drain(reads)
                return
    except httpx2.TimeoutException as exc:
        raise openai.APITimeoutError(request=response.request) from exc
    except CORE_ERRORS as exc:  # from the pool's own iterator: as httpx2 would raise them
        cause = as_httpx_error(exc)
        if isinstance(cause, httpx2.TimeoutException):
            raise openai.APITimeoutError(request=response.request) from cause
        raise openai.APIConnectionError(request=response.request) from cause
    except _TRANSPORT_ERRORS as exc:
        raise openai.APIConnectionError(request=response.request) from exc
    finally:
        await reads.aclose()  # now, not when the garbage collector finds it


async def _drain(reads: AsyncIterator[bytes]) -> None:
    with anyio.move_on_after(DRAIN_SECONDS):
        try:
            async for _ in reads:
                pass
        except _TRANSPORT_ERRORS:
            pass  # the answer is complete: a failure after it is no failure of it
