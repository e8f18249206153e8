"""Responses of a streamable-HTTP MCP server, bounded while they are read.

The SDK's ``streamable_http_client`` bounds each server-sent event (its
``max_sse_event_size``) but reads a JSON response whole (``response.aread()``). The
response hook of :func:`bounded_responses`, on the httpx client loopfuse hands the SDK,
wraps every response body that is not an event stream in a counter that raises
:class:`httpx2.StreamError` once more than ``max_bytes`` came: the SDK answers the request
that response was for with a parse error naming it, and nothing more of it is read. The
client asks for uncompressed bodies (``Accept-Encoding: identity``) and a compressed body
is refused, so the bytes counted are the bytes parsed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Final

import httpx2

__all__ = ["IDENTITY", "bounded_responses"]

IDENTITY: Final = {"Accept-Encoding": "identity"}
"""The request header that keeps response bodies uncompressed."""


def bounded_responses(max_bytes: int) -> Callable[[httpx2.Response], Awaitable[None]]:
    """A response hook: bodies other than event streams cut off past ``max_bytes``."""

    async def hook(response: httpx2.Response) -> None:
        content_type = response.headers.get("content-type", "")
        if content_type.startswith("text/event-stream"):
            return  # each event is bounded by the SDK (max_sse_event_size)
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        stream = response.stream
        if isinstance(stream, httpx2.AsyncByteStream):
            response.stream = _Bounded(stream, max_bytes, encoding)

    return hook


class _Bounded(httpx2.AsyncByteStream):
    def __init__(self, inner: httpx2.AsyncByteStream, max_bytes: int, encoding: str) -> None:
        self._inner = inner
        self._max_bytes = max_bytes
        self._encoding = encoding

    async def __aiter__(self) -> AsyncIterator[bytes]:
        if self._encoding not in ("", "identity"):
            raise httpx2.StreamError(
                f"a response compressed with {self._encoding!r} (loopfuse asked for none: its "
                "size could not be bounded)"
            )
        seen = 0
        async for chunk in self._inner:
            seen += len(chunk)
            if seen > self._max_bytes:
                raise httpx2.StreamError(
                    f"a response longer than max_message_bytes ({self._max_bytes} bytes); "
                    "it was not read on"
                )
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()
