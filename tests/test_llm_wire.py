"""The model transport on the wire against real servers on loopback: raw servers that
send odd or malformed answers, uvicorn, the project's simulator and a TLS server with a
certificate made for the test. (These ran against the own HTTP/1.1 client first, then
``httpcore2``'s pool; they now hold for ``aiohttp``'s client, which every endpoint goes
through.)
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import openai
import pytest
from anyio.abc import SocketAttribute, SocketStream
from anyio.streams.buffered import BufferedByteReceiveStream
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from actors.llm.accumulator import ReplyAccumulator
from actors.llm.settings import EndpointSettings
from actors.llm.transport import ChatTransport
from orchestrator.sim import open_simulator, parse_scenario
from tests.loopback import open_loopback
from tests.test_llm_transport import read_into

WAIT = 10.0


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


OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"

_ANSWER = b'data: {"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":"stop"}]}\n\n'
STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
)
DONE_CHUNK = b"%x\r\n%s\r\n" % (len(_ANSWER + b"data: [DONE]\n\n"), _ANSWER + b"data: [DONE]\n\n")


# --------------------------------------------------------------------------- through the transport


@pytest.mark.asyncio
async def test_a_body_that_never_ends_after_the_answer_is_closed_by_the_client() -> None:
    """``[DONE]``, then the body stays open: the answer is read whole, and the client
    closes the connection by itself (``DRAIN_SECONDS`` later), not the server."""

    async def handler(stream: SocketStream, reader: BufferedByteReceiveStream) -> None:
        await read_request(reader)
        await stream.send(STREAM_HEAD + DONE_CHUNK)
        assert await reader.receive() == b""  # the client closes; nothing else comes

    async with raw_server(handler) as server:
        transport = ChatTransport(EndpointSettings(base_url=f"http://127.0.0.1:{server.port}/v1"))
        try:
            with anyio.fail_after(WAIT):
                assert await _streamed_text(transport, b"{}") == "hi"
                await server.end.wait()
                assert await _streamed_text(transport, b"{}") == "hi"
        finally:
            await transport.aclose()
    assert server.connections == 2


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
    assert isinstance(caught.value.__cause__, aiohttp.ConnectionTimeoutError)


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nbroken header\r\n\r\nok",
        b"HTTP/1.1 200 OK\r\n" + b"X-Big: " + b"b" * (1 << 20) + b"\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n" + b"X: y\r\n" * (1 << 18) + b"\r\n",
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
    assert isinstance(caught.value.__cause__, aiohttp.ClientResponseError)  # llhttp refused it


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
    assert isinstance(caught.value.__cause__, ValueError)  # aiohttp refuses it unwritten
    assert "control character" in str(caught.value.__cause__)


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
    'task = "Say it."\n[[steps]]\ntext = "Over the pool, word for word."\nchunk_size = 4\n'
    'repeat = true\n[expect]\nexit_reason = "completed"\n',
    source="wire.toml",
    name="wire",
)


@pytest.mark.asyncio
async def test_the_simulator_streams_through_the_transport() -> None:
    body = b'{"model":"wire","messages":[{"role":"user","content":"Say it."}],"stream":true}'
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
    assert texts == ["Over the pool, word for word."] * 30


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
    assert isinstance(caught.value.__cause__, aiohttp.ClientConnectorCertificateError)
    assert server.connections == 2  # the good transport's connection was reused


@pytest.mark.asyncio
async def test_a_proxied_endpoint_goes_through_the_environments_proxy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An ``http`` endpoint behind ``HTTP_PROXY``: the request goes to the proxy in absolute
    form with the proxy's credentials; the endpoint's host is never resolved."""
    seen: list[bytes] = []

    async def proxy(stream: SocketStream, reader: BufferedByteReceiveStream) -> None:
        while True:
            seen.append(await read_request(reader))
            await stream.send(OK)

    for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    async with raw_server(proxy) as server:
        monkeypatch.setenv("HTTP_PROXY", f"http://u:pw@127.0.0.1:{server.port}")
        endpoint = EndpointSettings(base_url="http://model.invalid/v1", api_key="k")
        transport = ChatTransport(endpoint)
        try:
            with anyio.fail_after(WAIT):
                reply = await transport.post(b"{}", "r", stream=False)
        finally:
            await transport.aclose()
    assert reply.content == b"ok"
    (request,) = seen
    assert request.startswith(b"POST http://model.invalid/v1/chat/completions HTTP/1.1\r\n")
    assert b"\r\nProxy-Authorization: Basic dTpwdw==\r\n" in request  # u:pw, not the key
    assert b"\r\nAuthorization: Bearer k\r\n" in request


@pytest.mark.asyncio
async def test_an_https_endpoints_key_never_reaches_its_proxy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The ``CONNECT`` to the proxy carries the proxy's credentials and nothing of the
    endpoint's headers (aiohttp adds a session's default headers to it)."""
    seen: list[bytes] = []

    async def proxy(stream: SocketStream, reader: BufferedByteReceiveStream) -> None:
        seen.append(await read_request(reader))
        await stream.send(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")

    for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    async with raw_server(proxy) as server:
        monkeypatch.setenv("HTTPS_PROXY", f"http://u:pw@127.0.0.1:{server.port}")
        endpoint = EndpointSettings(
            base_url="https://model.invalid/v1", api_key="sk-key", extra_headers={"X-K": "sk-2"}
        )
        transport = ChatTransport(endpoint)
        try:
            with anyio.fail_after(WAIT), pytest.raises(openai.APIConnectionError) as caught:
                await transport.post(b"{}", "r", stream=False)
        finally:
            await transport.aclose()
    assert isinstance(caught.value.__cause__, aiohttp.ClientHttpProxyError)
    (connect,) = seen
    assert connect.startswith(b"CONNECT model.invalid:443 HTTP/1.1\r\n")
    assert b"\r\nProxy-Authorization: Basic dTpwdw==\r\n" in connect
    assert b"sk-key" not in connect
    assert b"sk-2" not in connect
