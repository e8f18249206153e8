"""The model transport's network streams (``actors/llm/connection.py``): a request's head
and body leave in one send, a held request never outgrows its bound, and the pool's
readability check tells a live idle connection from one the server closed, on real
loopback sockets."""

from __future__ import annotations

import select
import socket
from typing import Any

import anyio
import httpcore2
import pytest

from actors.llm.connection import HOLD_BYTES, LeanBackend, LeanStream

WAIT = 10.0


class _Recording(httpcore2.AsyncNetworkStream):
    """A stream that records each send and answers reads from a script."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.closed = False

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:  # noqa: ASYNC109
        return b"HTTP/1.1 200 OK\r\n\r\n"

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:  # noqa: ASYNC109
        self.sent.append(buffer)

    async def aclose(self) -> None:
        self.closed = True

    def get_extra_info(self, info: str) -> Any:
        return None


@pytest.mark.asyncio
async def test_head_and_body_leave_in_one_send_before_the_response_is_read() -> None:
    inner = _Recording()
    stream = LeanStream(inner)
    await stream.write(b"POST / HTTP/1.1\r\nContent-Length: 2\r\n\r\n")
    await stream.write(b"{}")
    await stream.write(b"")  # h11's end of message with a Content-Length
    assert inner.sent == []
    assert await stream.read(65536) == b"HTTP/1.1 200 OK\r\n\r\n"
    assert inner.sent == [b"POST / HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}"]
    await stream.read(65536)  # nothing held: nothing sent
    assert len(inner.sent) == 1


@pytest.mark.asyncio
async def test_a_large_body_is_not_held() -> None:
    inner = _Recording()
    stream = LeanStream(inner)
    await stream.write(b"head\r\n\r\n")
    await stream.write(b"x" * HOLD_BYTES)
    assert inner.sent == [b"head\r\n\r\n" + b"x" * HOLD_BYTES]


@pytest.mark.asyncio
async def test_closing_drops_what_is_held() -> None:
    inner = _Recording()
    stream = LeanStream(inner)
    await stream.write(b"POST / HTTP/1.1\r\n\r\n")
    await stream.aclose()
    assert inner.closed
    assert inner.sent == []


@pytest.mark.asyncio
async def test_readability_tells_a_live_connection_from_a_closed_one() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        live = await LeanBackend().connect_tcp("127.0.0.1", port, timeout=WAIT)
        closed = await LeanBackend().connect_tcp("127.0.0.1", port, timeout=WAIT)
        live_end, _ = listener.accept()
        closed_end, _ = listener.accept()
        try:
            assert live.get_extra_info("is_readable") is False
            assert closed.get_extra_info("socket") is not None  # the rest is httpcore2's
            closed_end.close()
            sock = closed.get_extra_info("socket")  # waited on in a thread (the loop has a reader)
            ready, _, _ = await anyio.to_thread.run_sync(select.select, [sock], [], [], WAIT)
            assert ready
            assert closed.get_extra_info("is_readable") is True
            assert await closed.read(100) == b""  # the close it saw
            assert live.get_extra_info("is_readable") is False
        finally:
            live_end.close()
            closed_end.close()
            await live.aclose()
            await closed.aclose()


@pytest.mark.asyncio
async def test_a_request_through_the_pool_arrives_whole() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        received = bytearray()

        def serve() -> None:
            conn, _ = listener.accept()
            with conn:
                while b"\r\n\r\n" not in received or not received.endswith(b"hello"):
                    received.extend(conn.recv(65536))
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

        async with httpcore2.AsyncConnectionPool(network_backend=LeanBackend()) as pool:
            with anyio.fail_after(WAIT):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(anyio.to_thread.run_sync, serve)
                    response = await pool.request(
                        b"POST", f"http://127.0.0.1:{port}/x", content=b"hello"
                    )
        assert response.status == 200
        assert response.content == b"ok"
        assert received.startswith(b"POST /x HTTP/1.1\r\n")
        assert received.endswith(b"\r\n\r\nhello")
