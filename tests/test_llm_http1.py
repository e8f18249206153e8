"""The model transport's own HTTP/1.1 client (``actors/llm/http1_*.py``): the response
parser at every byte boundary, then the pool and its connections against real servers on
loopback: raw asyncio servers that send odd or malformed answers, uvicorn, the project's
simulator and a TLS server with a certificate made for the test.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import json
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpcore2
import openai
import pytest
from anyio.abc import SocketAttribute, SocketStream
from anyio.streams.buffered import BufferedByteReceiveStream
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from actors.llm import http1_response
from actors.llm.accumulator import ReplyAccumulator
from actors.llm.http1_parse import (
    MAX_HEAD_BYTES,
    MAX_HEADERS,
    Body,
    Chunked,
    Head,
    body_for,
    parse_head,
)
from actors.llm.http1_pool import Pool, Timeouts
from actors.llm.http1_response import REST_BYTES, Response
from actors.llm.settings import EndpointSettings
from actors.llm.stream import read_chunks
from actors.llm.transport import ChatTransport, Reply
from orchestrator.sim import open_simulator, parse_scenario
from tests.loopback import open_loopback
from tests.test_llm_transport import read_into

WAIT = 10.0
REQUEST = b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\n{}"

# --------------------------------------------------------------------------- the parser


Parsed = tuple[tuple[str, int, tuple[tuple[bytes, bytes], ...], bool], bytes, bytes]


def parse_pieces(pieces: list[bytes]) -> Parsed:
    """Head (version, status, headers, keep-alive), body and what followed, from
    ``pieces`` fed one after the other."""
    buffer = bytearray()
    head: Head | None = None
    body: Body | None = None
    out: list[bytes] = []
    for piece in pieces:
        buffer += piece
        if head is None:
            head = parse_head(buffer)
            if head is None:
                continue
            body = body_for(head)
        assert body is not None
        if not body.done:
            body.feed(buffer, out)
    assert head is not None
    assert body is not None
    assert body.done
    summary = (head.version, head.status, tuple(head.headers), head.keep_alive)
    return summary, b"".join(out), bytes(buffer)


CHUNKED = (
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nSet-Cookie: a=1\r\n"
    b"set-cookie: b=2\r\nContent-Type: text/event-stream\r\n\r\n"
    b'5;name="v"\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n'
    b"HTTP/1.1 204"  # the next response on the connection stays in the buffer
)


def test_a_chunked_response_parses_the_same_split_at_every_byte_boundary() -> None:
    whole = parse_pieces([CHUNKED])
    for cut in range(len(CHUNKED) + 1):
        assert parse_pieces([CHUNKED[:cut], CHUNKED[cut:]]) == whole, cut
    assert parse_pieces([CHUNKED[i : i + 1] for i in range(len(CHUNKED))]) == whole
    (version, status, _, keep_alive), body, rest = whole
    assert (version, status, body, rest) == ("HTTP/1.1", 200, b"hello world", b"HTTP/1.1 204")
    assert keep_alive
    head = parse_head(bytearray(CHUNKED))
    assert head is not None
    assert head.get(b"set-cookie") == [b"a=1", b"b=2"]  # repeated headers kept, any case


def test_content_length_bare_lf_and_http_1_0_framing() -> None:
    sized = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhelloEXTRA"
    for cut in range(len(sized) + 1):
        assert parse_pieces([sized[:cut], sized[cut:]])[1:] == (b"hello", b"EXTRA")
    (_, status, _, _), body, _ = parse_pieces([b"HTTP/1.1 200 OK\nContent-Length: 2\n\nok"])
    assert (status, body) == (200, b"ok")
    old = parse_head(bytearray(b"HTTP/1.0 200 OK\r\nServer: x\r\n\r\nall of it"))
    assert old is not None
    assert isinstance(body_for(old), Body)
    assert not old.keep_alive  # HTTP/1.0 without keep-alive: the close ends the body
    close = parse_head(
        bytearray(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")
    )
    assert close is not None
    assert not close.keep_alive
    chunked_then_length = parse_head(
        bytearray(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 9\r\n\r\n")
    )
    assert chunked_then_length is not None
    assert isinstance(body_for(chunked_then_length), Chunked)
    assert not chunked_then_length.keep_alive  # both framings: not reused


def test_the_head_picks_out_framing_cookies_and_coding_as_it_parses() -> None:
    crlf = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\nSET-COOKIE: a=1\r\n"
        b"Content-Encoding: gzip\r\nset-cookie: b=2\r\ncontent-encoding:  DEFLATE \r\n"
        b"transfer-encoding: chunked\r\nContent-Length: 3\r\nConnection: Keep-Alive\r\n\r\n"
    )
    mixed = crlf.replace(b"\r\nset-cookie", b"\nset-cookie").replace(b"\r\n\r\n", b"\n\n")
    for raw in (crlf, mixed):
        head = parse_head(bytearray(raw))
        assert head is not None
        assert head.transfer_encodings == [b"gzip", b"chunked"]
        assert head.content_lengths == [b"3"]
        assert head.cookies == [b"a=1", b"b=2"]
        assert head.content_encoding == b"deflate"  # the last one, lowered
        assert head.get(b"set-cookie") == head.cookies
        assert len(head.headers) == 8
        assert isinstance(body_for(head), Chunked)
        assert not head.keep_alive  # framed both ways: never reused


def test_the_chunks_of_one_read_come_out_as_one_piece() -> None:
    body = Chunked()
    buffer = bytearray(b"3\r\nabc\r\n2;ext=1\r\nde\n4\r\nfg")
    out: list[bytes] = []
    body.feed(buffer, out)
    assert (out, buffer, body.done) == ([b"abcdefg"], bytearray(), False)
    buffer += b"hi\r"
    body.feed(buffer, out)
    assert (out[1:], buffer) == ([b"hi"], bytearray(b"\r"))  # the CRLF is not all there
    buffer += b"\n0\r\n\r\nNEXT"
    body.feed(buffer, out)
    assert (len(out), body.done, buffer) == (2, True, bytearray(b"NEXT"))


@pytest.mark.parametrize(
    "response",
    [
        b"HTTP/2 200 OK\r\n\r\n",
        b"HTTP/1.1 20 OK\r\n\r\n",
        b"ICY 200 OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nNo colon here\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nSpace before : colon\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n folded: line\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n+5\r\nhello\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhello\r\n",
        b"HTTP/1.1 200 OK\r\nSet-Cookie: a=b\rX-Injected: 1\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX: a\0b\r\n\r\n",
    ],
)
def test_a_malformed_response_is_a_protocol_error(response: bytes) -> None:
    with pytest.raises(httpcore2.RemoteProtocolError):
        parse_pieces([response])


def test_what_a_server_can_make_the_parser_hold_is_bounded() -> None:
    endless = bytearray(b"HTTP/1.1 200 OK\r\nX: " + b"a" * MAX_HEAD_BYTES)
    with pytest.raises(httpcore2.RemoteProtocolError, match="longer than"):
        parse_head(endless)
    many = b"HTTP/1.1 200 OK\r\n" + b"X: 1\r\n" * (MAX_HEADERS + 1) + b"\r\n"
    with pytest.raises(httpcore2.RemoteProtocolError, match="header lines"):
        parse_head(bytearray(many))
    head = parse_head(bytearray(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"))
    assert head is not None
    body = body_for(head)
    with pytest.raises(httpcore2.RemoteProtocolError, match="chunk-size line"):
        body.feed(bytearray(b"5" + b";x" * 4096), [])
    trailers = Chunked()
    with pytest.raises(httpcore2.RemoteProtocolError, match="trailers"):
        trailers.feed(bytearray(b"0\r\n" + b"X: y\r\n" * (MAX_HEAD_BYTES // 4)), [])


# --------------------------------------------------------------------------- raw servers

Handler = Callable[[SocketStream, BufferedByteReceiveStream], Awaitable[None]]


class Raw:
    """A raw TCP server on loopback: ``handler`` serves each connection."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.ended = 0  # connections the client closed (seen by the server)
        self.port = 0
        self.end = anyio.Event()  # set when a connection ends

    async def serve(self, stream: SocketStream) -> None:
        self.connections += 1
        reader = BufferedByteReceiveStream(stream)
        try:
            await self.handler(stream, reader)
        except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.IncompleteRead):
            pass
        finally:
            self.ended += 1
            self.end.set()
            await stream.aclose()


@asynccontextmanager
async def raw_server(handler: Handler) -> AsyncIterator[Raw]:
    server = Raw(handler)
    async with await anyio.create_tcp_listener(local_host="127.0.0.1") as listener:
        server.port = listener.extra(SocketAttribute.local_port)
        async with anyio.create_task_group() as tg:
            tg.start_soon(listener.serve, server.serve)
            try:
                yield server
            finally:
                tg.cancel_scope.cancel()


async def read_request(reader: BufferedByteReceiveStream) -> bytes:
    head = await reader.receive_until(b"\r\n\r\n", 65536)
    length = 0
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.lower() == b"content-length":
            length = int(value)
    return head + b"\r\n\r\n" + await reader.receive_exactly(length)


def answering(*answers: bytes, close: bool = False) -> Handler:
    """Each request on a connection gets the next answer (the last repeats); ``close``:
    the connection is closed after each answer."""

    async def handler(stream: SocketStream, reader: BufferedByteReceiveStream) -> None:
        for index in range(1000):
            await read_request(reader)
            await stream.send(answers[min(index, len(answers) - 1)])
            if close:
                return

    return handler


def pool_for(
    port: int,
    *,
    timeouts: Timeouts | None = None,
    max_connections: int = 10,
    max_keepalive: int = 10,
    keepalive_expiry: float = 60.0,
) -> Pool:
    return Pool(
        "127.0.0.1",
        port,
        None,
        timeouts or Timeouts(WAIT, WAIT, WAIT, WAIT),
        max_connections=max_connections,
        max_keepalive=max_keepalive,
        keepalive_expiry=keepalive_expiry,
    )


async def exchange(pool: Pool, *, fresh: bool = False) -> tuple[Response, bytes]:
    response = await pool.request(REQUEST, fresh=fresh)
    try:
        return response, await response.aread()
    finally:
        await response.aclose()


async def until(condition: Callable[[], bool]) -> None:
    """Let the event loop run until ``condition`` holds (a close arriving on loopback)."""
    while not condition():
        await anyio.lowlevel.checkpoint()


OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


@pytest.mark.asyncio
async def test_a_kept_connection_is_reused_and_a_closed_one_is_not() -> None:
    async with raw_server(answering(OK)) as server:
        pool = pool_for(server.port)
        with anyio.fail_after(WAIT):
            for _ in range(3):
                assert (await exchange(pool))[1] == b"ok"
            assert server.connections == 1
            assert (pool.connections, pool.idle) == (1, 1)
            await pool.aclose()
            await server.end.wait()
        assert server.ended == 1


@pytest.mark.asyncio
async def test_an_idle_connection_the_server_closes_leaves_the_pool_and_is_never_reused() -> None:
    async with raw_server(answering(OK, close=True)) as server:
        pool = pool_for(server.port)
        with anyio.fail_after(WAIT):
            assert (await exchange(pool))[1] == b"ok"
            await server.end.wait()  # the server closed it after answering
            await until(lambda: pool.connections == 0)  # seen through connection_lost
            assert (await exchange(pool))[1] == b"ok"
        assert server.connections == 2
        await pool.aclose()


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok",
        b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok",
    ],
)
async def test_a_response_that_says_close_is_not_kept(answer: bytes) -> None:
    async with raw_server(answering(answer)) as server:
        pool = pool_for(server.port)
        with anyio.fail_after(WAIT):
            for _ in range(2):
                assert (await exchange(pool))[1] == b"ok"
        assert server.connections == 2
        assert pool.connections == 0
        await pool.aclose()


@pytest.mark.asyncio
async def test_an_http_1_0_body_ends_with_the_close() -> None:
    answer = b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nall of it, " + b"x" * 300_000
    async with raw_server(answering(answer, close=True)) as server:
        pool = pool_for(server.port)
        with anyio.fail_after(WAIT):
            response, body = await exchange(pool)
        assert (response.http_version, response.status) == ("HTTP/1.0", 200)
        assert body == answer.partition(b"\r\n\r\n")[2]
        assert pool.connections == 0
        await pool.aclose()


@pytest.mark.asyncio
async def test_100_continue_is_skipped_and_pieces_sent_byte_by_byte_arrive_whole() -> None:
    answer = (
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"3;ext=1\r\nabc\r\n4\r\ndefg\r\n0\r\nTrailer: x\r\n\r\n"
    )

    async def handler(stream: SocketStream, reader: BufferedByteReceiveStream) -> None:
        while True:
            await read_request(reader)
            for index in range(len(answer)):
                await stream.send(answer[index : index + 1])

    async with raw_server(handler) as server:
        pool = pool_for(server.port)
        with anyio.fail_after(WAIT):
            for _ in range(2):
                response, body = await exchange(pool)
                assert (response.status, body) == (200, b"abcdefg")
        assert server.connections == 1  # complete, so reused
        await pool.aclose()


@pytest.mark.asyncio
async def test_a_close_mid_body_is_a_protocol_error_and_the_connection_is_dropped() -> None:
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly ten b"
    async with raw_server(answering(answer, close=True)) as server:
        pool = pool_for(server.port)
        with anyio.fail_after(WAIT):
            response = await pool.request(REQUEST)
            assert await response.read_some() == b"only ten b"
            with pytest.raises(httpcore2.RemoteProtocolError, match="before the body"):
                await response.aread()
        assert pool.connections == 0
        await pool.aclose()


@pytest.mark.asyncio
async def test_a_slow_server_is_a_read_timeout_per_read() -> None:

    async def handler(stream: SocketStream, reader: BufferedByteReceiveStream) -> None:
        await read_request(reader)
        await stream.send(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nfive!")
        await reader.receive(1)  # the rest never comes; ends when the client closes

    async with raw_server(handler) as server:
        pool = pool_for(server.port, timeouts=Timeouts(WAIT, 0.2, WAIT, WAIT))
        try:
            with anyio.fail_after(WAIT):
                response = await pool.request(REQUEST)
                assert await response.read_some() == b"five!"
                with pytest.raises(httpcore2.ReadTimeout):
                    await response.read_some()
                assert pool.connections == 0
                await server.end.wait()  # the client closed it
        finally:
            await pool.aclose()


@pytest.mark.asyncio
async def test_a_cancelled_read_closes_the_connection_never_returns_it_half_read() -> None:

    async def handler(stream: SocketStream, reader: BufferedByteReceiveStream) -> None:
        while True:
            await read_request(reader)
            await stream.send(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n")
            if server.connections == 1:
                await reader.receive(1)  # the first answer never ends; the client closes
            else:
                await stream.send(b"0\r\n\r\n")

    async with raw_server(handler) as server:
        pool = pool_for(server.port)
        with anyio.fail_after(WAIT):
            response = await pool.request(REQUEST)
            assert await response.read_some() == b"hi"
            with anyio.CancelScope() as scope:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(response.read_some)
                    await anyio.lowlevel.checkpoint()
                    scope.cancel()
            await response.aclose()
            assert pool.connections == 0
            await server.end.wait()  # the half-read connection was closed
            assert (await exchange(pool))[1] == b"hi"
        assert server.connections == 2
        await pool.aclose()


@pytest.mark.asyncio
async def test_a_request_larger_than_the_socket_buffers_is_sent_whole() -> None:
    """The write waits for the socket to drain (``pause_writing``/``resume_writing``)."""
    body = bytes(range(256)) * 32 * 1024  # 8 MiB
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n"
    received: list[int] = []

    async def handler(stream: SocketStream, reader: BufferedByteReceiveStream) -> None:
        request = await read_request(reader)
        received.append(len(request.partition(b"\r\n\r\n")[2]))
        await stream.send(OK)

    async with raw_server(handler) as server:
        pool = pool_for(server.port)
        with anyio.fail_after(WAIT):
            response = await pool.request(head % len(body) + body)
            assert await response.aread() == b"ok"
        await pool.aclose()
    assert received == [len(body)]


@pytest.mark.asyncio
async def test_a_request_cancelled_before_its_answer_closes_the_connection() -> None:
    asked = anyio.Event()

    async def handler(stream: SocketStream, reader: BufferedByteReceiveStream) -> None:
        await read_request(reader)
        asked.set()
        await reader.receive(1)  # never answers; ends when the client closes

    async with raw_server(handler) as server:
        pool = pool_for(server.port)
        with anyio.fail_after(WAIT):
            async with anyio.create_task_group() as tg:
                tg.start_soon(pool.request, REQUEST)
                await asked.wait()
                tg.cancel_scope.cancel()
            assert pool.connections == 0
            await server.end.wait()
        await pool.aclose()


@pytest.mark.asyncio
async def test_a_server_that_does_not_read_is_a_write_timeout() -> None:
    """A listener that never accepts: the kernel's buffers fill up and the write waits."""
    body = b"x" * (32 * 1024 * 1024)
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n"
    with socket.create_server(("127.0.0.1", 0)) as listener:
        pool = pool_for(listener.getsockname()[1], timeouts=Timeouts(WAIT, WAIT, 0.2, WAIT))
        with anyio.fail_after(WAIT), pytest.raises(httpcore2.WriteTimeout):
            await pool.request(head % len(body) + body)
        assert pool.connections == 0
        await pool.aclose()


@pytest.mark.asyncio
async def test_a_response_closed_early_closes_its_connection() -> None:
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nabc"
    async with raw_server(answering(answer)) as server:
        pool = pool_for(server.port)
        with anyio.fail_after(WAIT):
            response = await pool.request(REQUEST)
            await response.aclose()
            await server.end.wait()
        assert pool.connections == 0
        await pool.aclose()


@pytest.mark.asyncio
async def test_unsolicited_bytes_on_an_idle_connection_drop_it() -> None:
    async def handler(stream: SocketStream, reader: BufferedByteReceiveStream) -> None:
        await read_request(reader)
        await stream.send(OK)
        await stream.send(b"HTTP/1.1 408 Request Timeout\r\n\r\n")  # nothing was asked
        await reader.receive(1)

    async with raw_server(handler) as server:
        pool = pool_for(server.port)
        with anyio.fail_after(WAIT):
            assert (await exchange(pool))[1] == b"ok"
            await server.end.wait()  # the client closed the out-of-step connection
            await until(lambda: pool.connections == 0)
        await pool.aclose()


@pytest.mark.asyncio
async def test_a_reply_of_the_own_client_is_read_and_closed_without_an_iterator() -> None:
    endpoint = EndpointSettings(base_url="http://127.0.0.1:9/v1", api_key="k")
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
    async with raw_server(answering(chunked)) as server:
        pool = pool_for(server.port)
        with anyio.fail_after(WAIT):
            response = await pool.request(REQUEST)
            reply = Reply(ChatTransport(endpoint), response, "r", None, response.http_version)
            read = reply.direct_reader()
            assert read is not None
            assert (await read(), await read()) == (b"abc", b"")
            assert reply.close_now()  # read to its end: the connection is kept
            assert (pool.connections, pool.idle) == (1, 1)
            response = await pool.request(REQUEST)
            reply = Reply(ChatTransport(endpoint), response, "r", None, response.http_version)
            assert reply.close_now()  # unread: the connection is closed, at once
            assert (pool.connections, pool.idle) == (0, 0)
            await server.end.wait()
            coded = Reply(ChatTransport(endpoint), response, "r", b"gzip", "HTTP/1.1")
            assert coded.direct_reader() is None  # a coded body is read through its decoder
        await pool.aclose()


# --------------------------------------------------------------------------- after [DONE]

DONE_CHUNK = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + (
    b"%x\r\n%s\r\n" % (len(b"data: [DONE]\n\n"), b"data: [DONE]\n\n")
)


async def read_to_done(pool: Pool) -> None:
    """A streamed request read as the LLM caller reads it: up to ``[DONE]``, then closed."""
    endpoint = EndpointSettings(base_url="http://127.0.0.1:9/v1", api_key="k")
    response = await pool.request(REQUEST)
    reply = Reply(ChatTransport(endpoint), response, "r", None, response.http_version)
    try:
        async with aclosing(read_chunks(reply)) as batches:
            async for _ in batches:
                pass
    finally:
        await reply.aclose()


@pytest.mark.asyncio
async def test_after_done_the_rest_is_read_in_the_background_and_the_connection_kept() -> None:
    release = anyio.Event()

    async def handler(stream: SocketStream, reader: BufferedByteReceiveStream) -> None:
        await read_request(reader)
        await stream.send(DONE_CHUNK)
        await release.wait()  # the terminator comes late, after the reader is gone
        await stream.send(b"0\r\n\r\n")
        await read_request(reader)
        await stream.send(OK)

    async with raw_server(handler) as server:
        pool = pool_for(server.port)
        with anyio.fail_after(WAIT):
            await read_to_done(pool)  # returns without waiting for the terminator
            assert (pool.connections, pool.idle) == (1, 0)  # still reading the rest
            release.set()
            await until(lambda: pool.idle == 1)
            assert (await exchange(pool))[1] == b"ok"
        assert server.connections == 1
        await pool.aclose()


@pytest.mark.asyncio
async def test_a_rest_past_its_byte_bound_closes_the_connection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(http1_response, "REST_SECONDS", 600.0)  # only the byte bound ends it

    async def handler(stream: SocketStream, reader: BufferedByteReceiveStream) -> None:
        await read_request(reader)
        await stream.send(DONE_CHUNK)
        more = b"x" * (REST_BYTES // 4)
        piece = b"%x\r\n%s\r\n" % (len(more), more)
        # Chunks without end: whatever the reader took before [DONE], the rest soon passes
        # its byte bound (the time bound would take REST_SECONDS).
        with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
            while True:
                await stream.send(piece)

    async with raw_server(handler) as server:
        pool = pool_for(server.port)
        with anyio.fail_after(WAIT):
            await read_to_done(pool)
            await server.end.wait()
        assert pool.connections == 0
        await pool.aclose()


@pytest.mark.asyncio
async def test_a_rest_that_never_ends_closes_the_connection_after_its_time_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(http1_response, "REST_SECONDS", 0.05)

    async def handler(stream: SocketStream, reader: BufferedByteReceiveStream) -> None:
        await read_request(reader)
        await stream.send(DONE_CHUNK)
        await reader.receive(1)  # no terminator; ends when the client closes

    async with raw_server(handler) as server:
        pool = pool_for(server.port)
        with anyio.fail_after(WAIT):
            await read_to_done(pool)
            await server.end.wait()
        assert pool.connections == 0
        await pool.aclose()


# --------------------------------------------------------------------------- pool limits


def hold_until(release: anyio.Event) -> Handler:
    """Answers each request with a chunked head and its first chunk; ends the body once
    ``release`` is set."""

    async def handler(stream: SocketStream, reader: BufferedByteReceiveStream) -> None:
        while True:
            await read_request(reader)
            await stream.send(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n")
            await release.wait()
            await stream.send(b"0\r\n\r\n")

    return handler


@pytest.mark.asyncio
async def test_past_max_connections_a_request_waits_for_one_then_times_out() -> None:
    release = anyio.Event()
    async with raw_server(hold_until(release)) as server:
        timeouts = Timeouts(WAIT, WAIT, WAIT, 0.2)
        pool = pool_for(server.port, max_connections=2, timeouts=timeouts)
        with anyio.fail_after(WAIT):
            first = await pool.request(REQUEST)
            second = await pool.request(REQUEST)
            with pytest.raises(httpcore2.PoolTimeout):
                await pool.request(REQUEST)
            assert pool.connections == 2
            got: list[bytes] = []

            async def third() -> None:
                got.append(await (await pool.request(REQUEST)).read_some())

            pool.timeouts.pool = WAIT
            async with anyio.create_task_group() as tg:
                tg.start_soon(third)
                await anyio.lowlevel.checkpoint()
                release.set()
                assert await first.aread() == b"a"  # its connection goes to the waiter
            assert await second.aread() == b"a"
        assert got == [b"a"]
        assert server.connections == 2
        await pool.aclose()


@pytest.mark.asyncio
async def test_a_failed_connection_hands_its_slot_to_a_waiter() -> None:
    release = anyio.Event()
    async with raw_server(hold_until(release)) as server:
        pool = pool_for(server.port, max_connections=1)
        with anyio.fail_after(WAIT):
            first = await pool.request(REQUEST)
            results: list[bytes] = []

            async def waiting() -> None:
                results.append((await exchange(pool))[1])

            async with anyio.create_task_group() as tg:
                tg.start_soon(waiting)
                await anyio.lowlevel.checkpoint()
                await first.aclose()  # half-read: closed, its slot handed on
                release.set()
        assert results == [b"a"]
        assert server.connections == 2
        await pool.aclose()


@pytest.mark.asyncio
async def test_idle_connections_are_reused_last_in_first_out_and_bounded() -> None:
    release = anyio.Event()
    release.set()
    async with raw_server(hold_until(release)) as server:
        pool = pool_for(server.port, max_keepalive=1)
        with anyio.fail_after(WAIT):
            first = await pool.request(REQUEST)
            second = await pool.request(REQUEST)
            assert await first.aread() == b"a"
            assert await second.aread() == b"a"  # the second idle one: the first is closed
            assert (pool.connections, pool.idle) == (1, 1)
            await server.end.wait()
            await exchange(pool)
        assert server.connections == 2
        await pool.aclose()


@pytest.mark.asyncio
async def test_an_expired_idle_connection_is_closed_not_reused() -> None:
    async with raw_server(answering(OK)) as server:
        pool = pool_for(server.port, keepalive_expiry=0.0)
        with anyio.fail_after(WAIT):
            await exchange(pool)
            await exchange(pool)
        assert server.connections == 2
        await pool.aclose()


@pytest.mark.asyncio
async def test_a_fresh_request_has_a_connection_of_its_own_closed_with_it() -> None:
    async with raw_server(answering(OK)) as server:
        pool = pool_for(server.port)
        with anyio.fail_after(WAIT):
            await exchange(pool)
            await exchange(pool, fresh=True)
            await server.end.wait()
            await exchange(pool)
        assert server.connections == 2
        assert (pool.connections, pool.idle) == (1, 1)
        await pool.aclose()


@pytest.mark.asyncio
async def test_a_refused_connection_is_a_connect_error_and_frees_its_slot() -> None:
    async with raw_server(answering(OK)) as server:
        port = server.port
    pool = pool_for(port, max_connections=1)
    with anyio.fail_after(WAIT):
        for _ in range(2):
            with pytest.raises(httpcore2.ConnectError):
                await pool.request(REQUEST)
    assert pool.connections == 0
    await pool.aclose()


# --------------------------------------------------------------------------- through the transport


@pytest.mark.asyncio
async def test_a_connection_not_made_in_time_is_the_sdks_timeout() -> None:
    """A listener whose accept queue is full drops further SYNs: connecting hangs."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        fillers = [socket.socket() for _ in range(3)]
        try:
            for filler in fillers:
                filler.setblocking(False)
                try:
                    filler.connect(("127.0.0.1", port))
                except BlockingIOError:
                    pass
            endpoint = EndpointSettings(
                base_url=f"http://127.0.0.1:{port}/v1", api_key="k", connect_timeout_seconds=0.2
            )
            transport = ChatTransport(endpoint)
            try:
                with anyio.fail_after(WAIT), pytest.raises(openai.APITimeoutError) as caught:
                    await transport.post(b"{}", "r", stream=False)
            finally:
                await transport.aclose()
        finally:
            for filler in fillers:
                filler.close()
    assert isinstance(caught.value.__cause__, httpcore2.ConnectTimeout)


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nbroken header\r\n\r\nok",
        b"HTTP/1.1 200 OK\r\n" + b"X-Big: " + b"b" * MAX_HEAD_BYTES + b"\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n" + b"X: y\r\n" * (MAX_HEADERS + 1) + b"\r\n",
        b"NOT HTTP AT ALL\r\n\r\n",
    ],
)
async def test_a_malformed_response_is_the_sdks_connection_error(answer: bytes) -> None:
    async with raw_server(answering(answer, close=True)) as server:
        endpoint = EndpointSettings(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="k")
        transport = ChatTransport(endpoint)
        try:
            with anyio.fail_after(WAIT), pytest.raises(openai.APIConnectionError) as caught:
                await transport.post(b"{}", "r", stream=False)
        finally:
            await transport.aclose()
    assert type(caught.value) is openai.APIConnectionError
    assert isinstance(caught.value.__cause__, httpcore2.RemoteProtocolError)


@pytest.mark.asyncio
async def test_a_header_value_with_a_line_break_is_refused_before_sending() -> None:
    async with raw_server(answering(OK)) as server:
        endpoint = EndpointSettings(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="k")
        transport = ChatTransport(endpoint)
        try:
            with anyio.fail_after(WAIT), pytest.raises(openai.APIConnectionError) as caught:
                await transport.post(b"{}", "run\r\nX-Injected: 1", stream=False)
        finally:
            await transport.aclose()
    assert isinstance(caught.value.__cause__, httpcore2.LocalProtocolError)
    assert server.connections == 0


@pytest.mark.asyncio
async def test_every_set_cookie_of_a_response_is_kept() -> None:
    answer = b"HTTP/1.1 200 OK\r\nSet-Cookie: a=1\r\nSet-Cookie: b=2\r\nContent-Length: 2\r\n\r\n{}"
    seen: list[bytes] = []

    async def handler(stream: SocketStream, reader: BufferedByteReceiveStream) -> None:
        while True:
            seen.append(await read_request(reader))
            await stream.send(answer)

    async with raw_server(handler) as server:
        endpoint = EndpointSettings(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="k")
        transport = ChatTransport(endpoint)
        try:
            with anyio.fail_after(WAIT):
                for _ in range(2):
                    await transport.post(b"{}", "r", stream=False)
        finally:
            await transport.aclose()
    assert b"\r\nCookie: a=1; b=2\r\n" in seen[1]


# --------------------------------------------------------------------------- real servers

SSE = [(b"content-type", b"text/event-stream")]


class Streaming:
    """An ASGI app streaming ``count`` SSE events per request, one body message each."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.clients: set[Any] = set()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        self.clients.add(scope["client"])
        await send({"type": "http.response.start", "status": 200, "headers": SSE})
        for index in range(self.count):
            delta = {"choices": [{"index": 0, "delta": {"content": f"{index},"}}]}
            frame = b"data: " + json.dumps(delta).encode() + b"\n\n"
            await send({"type": "http.response.body", "body": frame, "more_body": True})
        end = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
        last = b"data: " + json.dumps(end).encode() + b"\n\ndata: [DONE]\n\n"
        await send({"type": "http.response.body", "body": last})


@pytest.mark.asyncio
async def test_concurrent_streams_from_uvicorn_arrive_whole_and_connections_are_reused() -> None:
    app = Streaming(50)
    expected = "".join(f"{i}," for i in range(50))
    async with open_loopback(app) as url:
        transport = ChatTransport(EndpointSettings(base_url=url, api_key="k"))
        texts: list[str] = []

        async def one() -> None:
            texts.append(await _streamed_text(transport, b"{}"))

        try:
            with anyio.fail_after(WAIT * 3):
                for _ in range(3):
                    async with anyio.create_task_group() as tg:
                        for _ in range(20):
                            tg.start_soon(one)
        finally:
            await transport.aclose()
    assert texts == [expected] * 60
    assert len(app.clients) <= 20  # later waves reused the first wave's connections


async def _streamed_text(transport: ChatTransport, body: bytes) -> str:
    """One streamed request's text, read as the LLM caller reads it."""
    acc = ReplyAccumulator()
    await read_into(acc, await transport.post(body, "r", stream=True))
    return acc.text


SCENARIO = parse_scenario(
    'task = "Say it."\n[[steps]]\ntext = "Over the own client, word for word."\nchunk_size = 4\n'
    'repeat = true\n[expect]\nexit_reason = "completed"\n',
    source="http1.toml",
    name="http1",
)


@pytest.mark.asyncio
async def test_the_simulator_streams_through_the_own_client() -> None:
    body = b'{"model":"http1","messages":[{"role":"user","content":"Say it."}],"stream":true}'
    async with open_simulator([SCENARIO]) as sim:
        transport = ChatTransport(EndpointSettings(base_url=sim.base_url, api_key="k"))
        texts: list[str] = []

        async def one() -> None:
            texts.append(await _streamed_text(transport, body))

        try:
            with anyio.fail_after(WAIT * 3):
                async with anyio.create_task_group() as tg:
                    for _ in range(30):
                        tg.start_soon(one)
        finally:
            await transport.aclose()
    assert texts == ["Over the own client, word for word."] * 30


# --------------------------------------------------------------------------- TLS


def certificates(folder: Path) -> tuple[Path, Path, Path]:
    """A CA, and a certificate it signed for ``localhost`` and 127.0.0.1 (PEM files)."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "loopfuse test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    paths = folder / "ca.pem", folder / "cert.pem", folder / "key.pem"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return paths


@pytest.mark.asyncio
async def test_https_checks_the_servers_certificate_and_name(tmp_path: Path) -> None:
    ca, cert, key = certificates(tmp_path)
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_context.load_cert_chain(cert, key)

    async def handler(stream: SocketStream, reader: BufferedByteReceiveStream) -> None:
        tls = await anyio.streams.tls.TLSStream.wrap(
            stream, server_side=True, ssl_context=server_context
        )
        tls_reader = BufferedByteReceiveStream(tls)
        while True:
            await read_request(tls_reader)
            await tls.send(OK)

    trusting = ssl.create_default_context(cafile=str(ca))
    async with raw_server(handler) as server:
        port = server.port
        good = ChatTransport(
            EndpointSettings(base_url=f"https://localhost:{port}/v1", api_key="k"),
            ssl_context=trusting,
        )
        untrusting = ChatTransport(
            EndpointSettings(base_url=f"https://localhost:{port}/v1", api_key="k"),
            ssl_context=ssl.create_default_context(),
        )
        try:
            with anyio.fail_after(WAIT):
                for _ in range(2):
                    assert (await good.post(b"{}", "r", stream=False)).content == b"ok"
                with pytest.raises(openai.APIConnectionError) as caught:
                    await untrusting.post(b"{}", "r", stream=False)
        finally:
            await good.aclose()
            await untrusting.aclose()
    assert isinstance(caught.value.__cause__, httpcore2.ConnectError)
    assert server.connections == 2  # the good transport's connection was reused


# --------------------------------------------------------------------------- uvloop


def test_the_client_runs_on_uvloop_too() -> None:
    """The daemon may run on uvloop: its transports are not ``asyncio.Transport``
    subclasses, and its timers and pause/resume must serve the same way."""
    pytest.importorskip("uvloop")

    async def main() -> tuple[list[bytes], int, int]:
        async with raw_server(
            answering(OK, OK, b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n")
        ) as server:
            pool = pool_for(server.port, timeouts=Timeouts(WAIT, 0.2, WAIT, WAIT))
            try:
                with anyio.fail_after(WAIT):
                    bodies = [(await exchange(pool))[1] for _ in range(2)]
                    response = await pool.request(
                        REQUEST
                    )  # the 2nd answer: a body that never comes
                    with pytest.raises(httpcore2.ReadTimeout):
                        await response.read_some()
            finally:
                await pool.aclose()
            return bodies, server.connections, pool.connections

    bodies, connections, left = anyio.run(main, backend_options={"use_uvloop": True})
    assert bodies == [b"ok", b"ok"]
    assert (connections, left) == (1, 0)
