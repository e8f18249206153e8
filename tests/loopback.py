"""A real HTTP server on loopback for one test: an ASGI app under uvicorn on a free port."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import anyio
import uvicorn

from orchestrator.web.serving import no_delay


class QuietServer(uvicorn.Server):
    """Leaves signal handling to pytest."""

    @contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@asynccontextmanager
async def open_loopback(app: Any) -> AsyncIterator[str]:
    """Serve ``app`` on 127.0.0.1 for the block; yields its base URL (``…/v1``)."""
    config = uvicorn.Config(app, log_config=None, log_level="warning", lifespan="off")
    server = QuietServer(config)
    with socket.create_server(("127.0.0.1", 0)) as sock:
        no_delay(sock)  # as the daemon's and the simulator's listeners
        async with anyio.create_task_group() as tg:
            tg.start_soon(server.serve, [sock])
            try:
                yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
            finally:
                server.should_exit = True
