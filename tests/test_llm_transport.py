"""The LLM caller's transport (``actors/llm/transport.py``): the chat-completions request sent
through the ``openai`` client's own connection pool, checked against ``AsyncOpenAI.post`` on
a real loopback server: the same request on the wire, the same SDK exceptions for status
errors and transport failures, and httpx2's handling of cookies, compression and redirects.
"""

from __future__ import annotations

import gzip
import json
import socket
from collections.abc import AsyncIterator
from contextlib import aclosing, asynccontextmanager
from typing import Any, cast

import anyio
import httpx2
import openai
import pytest

from actors.llm.accumulator import ReplyAccumulator
from actors.llm.caller import LLMCaller
from actors.llm.clients import Clients
from actors.llm.errors import classify
from actors.llm.settings import EndpointSettings
from actors.llm.stream import read_chunks
from actors.llm.transport import COMPLETIONS, RUN_ID_HEADER, ChatTransport, Reply
from bus import Bus, ChatMessage, ModelError, ModelReply, ModelRequest
from tests.loopback import open_loopback

WAIT = 10.0
OK_STREAM = (
    b'data: {"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":"stop"}]}\n\n'
    b"data: [DONE]\n\n"
)

Answer = tuple[int, list[tuple[bytes, bytes]], bytes]  # status, headers, body


class Server:
    """A raw ASGI app: each request gets the next answer (the last one repeats) and is
    recorded with its path, headers (in order, as received) and body."""

    def __init__(self, *answers: Answer) -> None:
        self.answers = list(answers)
        self.seen: list[tuple[str, list[tuple[str, str]], bytes]] = []
        self.clients: list[Any] = []  # the client's address of each request

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        assert scope["type"] == "http"
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]]
        self.seen.append((scope["path"], headers, body))
        self.clients.append(scope["client"])
        status, extra, content = self.answers[min(len(self.seen), len(self.answers)) - 1]
        await send({"type": "http.response.start", "status": status, "headers": extra})
        await send({"type": "http.response.body", "body": content})


@asynccontextmanager
async def open_clients(url: str, **settings: Any) -> AsyncIterator[Clients]:
    clients = Clients(EndpointSettings(base_url=url, api_key="sk-secret", **settings))
    try:
        yield clients
    finally:
        await clients.aclose()


SSE = [(b"content-type", b"text/event-stream")]


async def read_text(response: Any) -> str:
    acc = ReplyAccumulator()
    await read_into(acc, response)
    return acc.text


async def read_into(acc: ReplyAccumulator, response: Any) -> None:
    try:
        async with aclosing(read_chunks(response)) as batches:
            async for batch in batches:
                for chunk in batch:
                    acc.feed_chunk(chunk)
    finally:
        await response.aclose()


async def sdk_post(client: openai.AsyncOpenAI, body: bytes, run_id: str) -> httpx2.Response:
    """The request as the caller sent it before the transport: ``AsyncOpenAI.post``."""
    response: httpx2.Response = await client.post(
        COMPLETIONS,
        cast_to=httpx2.Response,
        content=body,
        options={"security": {"bearer_auth": True}, "headers": {RUN_ID_HEADER: run_id}},
        stream=True,
    )
    return response


@pytest.mark.asyncio
async def test_the_same_request_on_the_wire_as_the_sdk_post() -> None:
    app = Server((200, SSE, OK_STREAM))
    body = b'{"model":"m","messages":[],"stream":true}'
    async with open_loopback(app) as url, open_clients(url, extra_headers={"X-Team": "a"}) as pool:
        with anyio.fail_after(WAIT):
            transport = pool.transport_for_run("run-1")
            assert await read_text(await transport.post(body, "run-1", stream=True)) == "hi"
            assert transport.fast
            sdk = await sdk_post(pool.for_run("run-1"), body, "run-1")
            assert await read_text(sdk) == "hi"
    (path, fast, sent), (sdk_path, by_sdk, sdk_sent) = app.seen
    assert (path, sent) == (sdk_path, sdk_sent) == ("/v1/chat/completions", body)
    assert fast == by_sdk  # every header, same values, same order
    headers = dict(fast)
    assert headers["authorization"] == "Bearer sk-secret"
    assert headers["x-team"] == "a"
    assert headers["x-loopfuse-run-id"] == "run-1"
    assert headers["content-length"] == str(len(body))
    assert headers["x-stainless-retry-count"] == "0"


STATUS_ERRORS = [
    (401, {"error": {"message": "bad key sk-secret", "type": "invalid_request_error"}}, "auth"),
    (429, {"error": {"message": "slow down", "type": "rate_limit"}}, "rate_limited"),
    (500, {"error": {"message": "boom"}}, "server_error"),
    (400, {"error": {"message": "maximum context length is 8"}}, "context_length"),
    (404, "not json at all", "bad_request"),
]


@pytest.mark.asyncio
@pytest.mark.parametrize(("status", "payload", "kind"), STATUS_ERRORS)
async def test_status_errors_are_the_sdks_own(status: int, payload: Any, kind: str) -> None:
    content = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
    headers = [(b"content-type", b"application/json"), (b"retry-after", b"7")]
    app = Server((status, headers, content))
    async with open_loopback(app) as url, open_clients(url) as pool:
        with anyio.fail_after(WAIT):
            with pytest.raises(openai.APIStatusError) as fast:
                await pool.transport_for_run("r").post(b"{}", "r", stream=True)
            with pytest.raises(openai.APIStatusError) as sdk:
                await sdk_post(pool.for_run("r"), b"{}", "r")
    assert type(fast.value) is type(sdk.value)
    assert (fast.value.status_code, fast.value.message, fast.value.body) == (
        sdk.value.status_code,
        sdk.value.message,
        sdk.value.body,
    )
    assert fast.value.response.headers["retry-after"] == "7"
    assert fast.value.request.url == sdk.value.request.url
    assert classify(fast.value, streaming=False) == classify(sdk.value, streaming=False)
    assert classify(fast.value, streaming=False).kind == kind


@pytest.mark.asyncio
async def test_connection_refused_is_a_connection_error_not_a_timeout() -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    async with open_clients(url) as pool:
        with anyio.fail_after(WAIT), pytest.raises(openai.APIConnectionError) as caught:
            await pool.transport_for_run("r").post(b"{}", "r", stream=True)
    assert type(caught.value) is openai.APIConnectionError
    assert isinstance(caught.value.__cause__, httpx2.ConnectError)
    assert classify(caught.value, streaming=False).kind == "connection"


@pytest.mark.asyncio
async def test_no_answer_in_time_is_a_timeout() -> None:
    with socket.create_server(("127.0.0.1", 0)) as sock:  # accepts, never answers
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
        async with open_clients(url, timeout_seconds=0.2) as pool:
            with anyio.fail_after(WAIT), pytest.raises(openai.APITimeoutError) as caught:
                await pool.transport_for_run("r").post(b"{}", "r", stream=True)
    assert isinstance(caught.value.__cause__, httpx2.ReadTimeout)
    assert classify(caught.value, streaming=False).kind == "timeout"


@pytest.mark.asyncio
async def test_a_cookie_set_by_the_server_is_sent_back_as_httpx2_does() -> None:
    app = Server(
        (200, [*SSE, (b"set-cookie", b"lb=node-2; Path=/")], OK_STREAM), (200, SSE, OK_STREAM)
    )
    async with open_loopback(app) as url, open_clients(url) as pool:
        transport = pool.transport_for_run("r")
        with anyio.fail_after(WAIT):
            first = await transport.post(b"{}", "r", stream=True)
            assert isinstance(first, httpx2.Response)  # handed over to httpx2 for the jar
            assert await read_text(first) == "hi"
            assert await read_text(await transport.post(b"{}", "r", stream=True)) == "hi"
    assert "cookie" not in dict(app.seen[0][1])
    assert dict(app.seen[1][1])["cookie"] == "lb=node-2"


@pytest.mark.asyncio
async def test_a_compressed_body_is_decoded() -> None:
    headers = [*SSE, (b"content-encoding", b"gzip")]
    app = Server((200, headers, gzip.compress(OK_STREAM)))
    async with open_loopback(app) as url, open_clients(url) as pool:
        with anyio.fail_after(WAIT):
            response = await pool.transport_for_run("r").post(b"{}", "r", stream=True)
            assert await read_text(response) == "hi"
    assert dict(app.seen[0][1])["accept-encoding"] == "gzip, deflate"


@pytest.mark.asyncio
async def test_a_redirect_is_followed_as_the_sdks_client_follows_it() -> None:
    app = Server((307, [(b"location", b"/v2/chat/completions")], b""), (200, SSE, OK_STREAM))
    async with open_loopback(app) as url, open_clients(url) as pool:
        with anyio.fail_after(WAIT):
            response = await pool.transport_for_run("r").post(b'{"a":1}', "r", stream=True)
            assert await read_text(response) == "hi"
    assert [(path, body) for path, _, body in app.seen] == [
        ("/v1/chat/completions", b'{"a":1}'),
        ("/v2/chat/completions", b'{"a":1}'),
    ]


@pytest.mark.asyncio
async def test_a_client_on_another_transport_goes_through_the_sdk() -> None:
    seen: list[httpx2.Request] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        seen.append(request)
        return httpx2.Response(200, headers=dict(SSE), content=OK_STREAM)

    async with (
        httpx2.AsyncClient(transport=httpx2.MockTransport(handler)) as http,
        openai.AsyncOpenAI(
            base_url="http://model.test/v1", api_key="k", max_retries=0, http_client=http
        ) as client,
    ):
        transport = ChatTransport(client, COMPLETIONS)
        with anyio.fail_after(WAIT):
            response = await transport.post(b"{}", "r9", stream=True)
            assert not transport.fast
            assert not isinstance(response, Reply)
            assert await read_text(response) == "hi"
    assert seen[0].headers[RUN_ID_HEADER] == "r9"


@pytest.mark.asyncio
async def test_a_non_streamed_reply_is_read_whole() -> None:
    completion = {"choices": [{"message": {"content": "whole"}, "finish_reason": "stop"}]}
    app = Server((200, [(b"content-type", b"application/json")], json.dumps(completion).encode()))
    async with open_loopback(app) as url, open_clients(url) as pool:
        with anyio.fail_after(WAIT):
            for _ in range(2):
                response = await pool.transport_for_run("r").post(b"{}", "r", stream=False)
                assert json.loads(response.content) == completion
    first, second = app.clients
    assert first == second  # read whole and closed: the connection went back to the pool


@pytest.mark.asyncio
async def test_the_caller_reports_a_status_error_as_before_and_scrubs_the_key() -> None:
    error = {"error": {"message": "Incorrect API key provided: sk-secret", "type": "auth"}}
    app = Server((401, [(b"content-type", b"application/json")], json.dumps(error).encode()))
    bus = Bus()
    request = ModelRequest(
        run_id="r1", turn=1, model="m", messages=(ChatMessage(role="user", content="Go"),)
    )
    async with open_loopback(app) as url:
        caller = LLMCaller(bus, EndpointSettings(base_url=url, api_key="sk-secret"))
        with anyio.fail_after(WAIT):
            async with anyio.create_task_group() as tg:
                await tg.start(caller.run)
                with bus.open_inbox("r1") as inbox:
                    await bus.publish(request)
                    final = await inbox.receive()
                bus.close()
    assert isinstance(final, ModelError)
    assert not isinstance(final, ModelReply)
    assert (final.kind, final.status, final.final) == ("auth", 401, True)
    assert "sk-secret" not in final.message
    assert final.message == "Incorrect API key provided: ***"
    assert dict(app.seen[0][1])["x-loopfuse-run-id"] == "r1"


@pytest.mark.asyncio
async def test_a_closed_client_refuses_as_httpx2_does() -> None:
    app = Server((200, SSE, OK_STREAM))
    async with open_loopback(app) as url:
        pool = Clients(EndpointSettings(base_url=url, api_key="k"))
        transport = pool.transport_for_run("r")
        with anyio.fail_after(WAIT):
            assert await read_text(await transport.post(b"{}", "r", stream=True)) == "hi"
            await pool.aclose()
            with pytest.raises(RuntimeError, match="closed"):
                await transport.post(b"{}", "r", stream=True)
    assert len(app.seen) == 1


class BreaksMidStream:
    """Sends one event, then fails: uvicorn drops the connection mid-body."""

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": SSE})
        first = b'data: {"choices":[{"index":0,"delta":{"content":"par"}}]}\n\n'
        await send({"type": "http.response.body", "body": first, "more_body": True})
        raise RuntimeError("the server fell over")


@pytest.mark.asyncio
async def test_a_connection_lost_mid_stream_is_the_sdks_connection_error() -> None:
    async with open_loopback(cast(Server, BreaksMidStream())) as url, open_clients(url) as pool:
        acc = ReplyAccumulator()
        with anyio.fail_after(WAIT):
            response = await pool.transport_for_run("r7").post(b"{}", "r7", stream=True)
            assert isinstance(response, Reply)
            with pytest.raises(openai.APIConnectionError) as caught:
                await read_into(acc, response)
    assert type(caught.value) is openai.APIConnectionError
    assert isinstance(caught.value.__cause__, httpx2.RemoteProtocolError)
    assert caught.value.request.headers[RUN_ID_HEADER] == "r7"
    assert acc.text == "par"
    assert classify(caught.value, streaming=True).kind == "stream"
