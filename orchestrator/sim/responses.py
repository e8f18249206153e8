"""ASGI responses the simulator needs beyond Starlette's: a stream that can be dropped.

:class:`EventStream` sends SSE frames as they come, stops as soon as the client goes away,
and ends *without* finishing the body when its frames raise :class:`DropConnection`, so the
server closes the connection mid-response. :class:`TruncatedResponse` does the same to a
plain JSON body.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

__all__ = ["DropConnection", "EventStream", "TruncatedResponse"]


class DropConnection(Exception):
    """Raised by a frame iterator to end the response without completing it."""


class EventStream(StreamingResponse):
    """A ``text/event-stream`` response fed by an async iterator of ready frames."""

    media_type = "text/event-stream"

    def __init__(self, frames: AsyncIterator[bytes], headers: dict[str, str]) -> None:
        super().__init__(frames, headers={"cache-control": "no-cache", **headers})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        complete = True
        async with anyio.create_task_group() as tg:

            async def cancel_on_disconnect() -> None:
                nonlocal complete
                while (await receive())["type"] != "http.disconnect":
                    pass
                complete = False
                tg.cancel_scope.cancel()

            tg.start_soon(cancel_on_disconnect)
            try:
                async for frame in self.body_iterator:
                    await send({"type": "http.response.body", "body": frame, "more_body": True})
            except (DropConnection, OSError):  # OSError: the client went away as we wrote
                complete = False
            tg.cancel_scope.cancel()
        if complete:
            await send({"type": "http.response.body", "body": b"", "more_body": False})


class TruncatedResponse(Response):
    """A JSON response that announces its full length, sends half of it and stops."""

    media_type = "application/json"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        half = bytes(self.body[: len(self.body) // 2])
        await send({"type": "http.response.body", "body": half, "more_body": True})
