"""The daemon's, the simulator's and the fleet's listeners hand out connections without
Nagle's algorithm: a response written in parts never waits for the client's delayed ACK."""

from __future__ import annotations

import functools
import socket

import anyio
import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from orchestrator.web.serving import no_delay, serve_on


def _nodelay(sock: socket.socket) -> int:
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)


def test_a_listener_without_delay_hands_it_down_to_the_connections_it_accepts() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        assert _nodelay(listener) == 0  # what socket.create_server gives (asyncio then skips it)
        no_delay(listener)
        with socket.create_connection(listener.getsockname()) as client:
            accepted, _ = listener.accept()
            with accepted:
                assert _nodelay(accepted) != 0
                client.sendall(b"x")
                assert accepted.recv(1) == b"x"


async def _hello(request: Request) -> PlainTextResponse:
    return PlainTextResponse("hello")


@pytest.mark.asyncio
async def test_serve_on_turns_nagle_off_on_its_socket() -> None:
    app = Starlette(routes=[Route("/", _hello)])
    config = uvicorn.Config(app, log_config=None, log_level="warning", lifespan="off")
    with socket.create_server(("127.0.0.1", 0)) as sock:
        async with anyio.create_task_group() as tg:
            server = await tg.start(functools.partial(serve_on, name="test server"), config, sock)
            try:
                assert _nodelay(sock) != 0
                url = f"http://127.0.0.1:{sock.getsockname()[1]}/"
                with anyio.fail_after(10):
                    async with httpx.AsyncClient() as client:
                        for _ in range(3):  # one kept-alive connection
                            assert (await client.get(url)).text == "hello"
            finally:
                server.should_exit = True
