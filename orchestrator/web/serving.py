"""uvicorn inside an anyio task group, for the daemon and the simulator alike.

The server reports its start (so ``await tg.start(serve_on, …)`` returns the running
server) and never installs signal handlers: the caller owns Ctrl-C, SIGTERM and
cancellation. Only ``server.should_exit`` stops it, so its shutdown always completes.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Generator

import anyio
import uvicorn
from anyio.abc import TaskStatus

__all__ = ["QuietServer", "no_delay", "serve_on"]


def no_delay(sock: socket.socket) -> None:
    """Turn Nagle's algorithm off on a listening TCP socket; the connections it accepts
    inherit that (asyncio would not set it on them: why and its cost, docs/daemon.md)."""
    if sock.family in (socket.AF_INET, socket.AF_INET6) and sock.type == socket.SOCK_STREAM:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class QuietServer(uvicorn.Server):
    """A uvicorn server that reports its start and leaves signal handling to the caller."""

    def __init__(self, config: uvicorn.Config, task_status: TaskStatus[QuietServer]) -> None:
        super().__init__(config)
        self._task_status = task_status

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            self._task_status.started(self)

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


async def serve_on(
    config: uvicorn.Config,
    sock: socket.socket,
    *,
    name: str,
    task_status: TaskStatus[QuietServer] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``config``'s app on ``sock`` until ``should_exit`` is set on the server that
    ``task_status`` receives; raises if it could not start (``name`` says what)."""
    server = QuietServer(config, task_status)
    no_delay(sock)
    with anyio.CancelScope(shield=True):
        await server.serve(sockets=[sock])
    if not server.started:
        raise RuntimeError(f"the {name} failed to start on {sock.getsockname()}")
