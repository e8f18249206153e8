"""The LLM caller's transport (``actors/llm/transport.py``): the chat-completions request sent
through the transport's own ``httpcore2`` pool, checked on a real loopback server: what goes
on the wire, the ``openai`` SDK's exceptions for status errors and transport failures (the
same as ``AsyncOpenAI.post`` raises on the same answers), credentials never in an
exception, cookies, compression, redirects and proxies.
"""

from __future__ import annotations

import gzip
import json
import socket
import zlib
from collections.abc import AsyncIterator
from contextlib import aclosing, asynccontextmanager
from typing import Any, cast

import aiohttp
import anyio
import httpx2
import openai
import pytest

from actors.llm.accumulator import ReplyAccumulator
from actors.llm.caller import LLMCaller
from actors.llm.clients import SHARDS, Clients
from actors.llm.errors import classify
from actors.llm.settings import EndpointSettings
from actors.llm.stream import read_chunks
from actors.llm.transport import (
    COMPLETIONS,
    MAX_BODY_BYTES,
    MAX_REDIRECTS,
    RUN_ID_HEADER,
    ChatTransport,
    Reply,
    environment_proxy,
)
from bus import Bus, ChatMessage, ModelError, ModelReply, ModelRequest
from tests.loopback import open_loopback

WAIT = 10.0
OK_STREAM = (
    b'data: {"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":"stop"}]}\n\n'
    b"data: [DONE]\n\n"
)
SSE = [(b"content-type", b"text/event-stream")]

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
        path = scope["path"] + (
            f"?{scope['query_string'].decode()}" if scope["query_string"] else ""
        )
        self.seen.append((path, headers, body))
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


async def read_text(response: Reply) -> str:
    acc = ReplyAccumulator()
    await read_into(acc, response)
    return acc.text


async def read_into(acc: ReplyAccumulator, response: Reply) -> None:
    try:
        async with aclosing(read_chunks(response)) as batches:
            async for batch in batches:
                for chunk in batch:
                    acc.feed_chunk(chunk)
    finally:
        await response.aclose()


async def sdk_post(url: str, body: bytes, run_id: str) -> httpx2.Response:
    """The same request through ``AsyncOpenAI.post`` (the SDK's public request method)."""
    async with openai.AsyncOpenAI(base_url=url, api_key="sk-secret", max_retries=0) as client:
        response: httpx2.Response = await client.post(
            COMPLETIONS,
            cast_to=httpx2.Response,
            content=body,
            options={"headers": {RUN_ID_HEADER: run_id}},
        )
        return response


# --------------------------------------------------------------------------- the request


@pytest.mark.asyncio
async def test_the_request_on_the_wire() -> None:
    app = Server((200, SSE, OK_STREAM))
    body = b'{"model":"m","messages":[],"stream":true}'
    async with open_loopback(app) as url, open_clients(url, extra_headers={"X-Team": "a"}) as pool:
        with anyio.fail_after(WAIT):
            transport = pool.transport_for_run("run-1")
            tp = ((b"traceparent", b"00-" + b"1" * 32 + b"-" + b"2" * 16 + b"-01"),)
            reply = await transport.post(body, "run-1", stream=True, headers=tp)
            assert await read_text(reply) == "hi"
    ((path, headers, sent),) = app.seen
    assert (path, sent) == ("/v1/chat/completions", body)
    names = [name for name, _ in headers]
    assert names == [
        "host",
        "accept",
        "content-type",
        "accept-encoding",
        "user-agent",
        "authorization",
        "x-team",
        "x-loopfuse-run-id",
        "traceparent",
        "content-length",
    ]
    sent_headers = dict(headers)
    assert sent_headers["host"] == url.split("/")[2]
    assert sent_headers["authorization"] == "Bearer sk-secret"
    assert sent_headers["content-type"] == "application/json"
    assert sent_headers["accept-encoding"] == "identity"
    assert sent_headers["user-agent"].startswith("loopfuse/")
    assert sent_headers["content-length"] == str(len(body))
    assert sent_headers["x-loopfuse-run-id"] == "run-1"


@pytest.mark.asyncio
async def test_the_sdk_sends_the_same_request_where_it_matters() -> None:
    """Path, body, key, content type, run id: as ``AsyncOpenAI.post`` sends them."""
    app = Server((200, SSE, OK_STREAM))
    body = b'{"model":"m"}'
    async with open_loopback(app) as url, open_clients(url) as pool:
        with anyio.fail_after(WAIT):
            await (await pool.transport_for_run("r").post(body, "r", stream=False)).aclose()
            await sdk_post(url, body, "r")
    ours, theirs = ((path, dict(headers), sent) for path, headers, sent in app.seen)
    assert (ours[0], ours[2]) == (theirs[0], theirs[2])
    for name in ("authorization", "content-type", "accept", "x-loopfuse-run-id", "host"):
        assert ours[1][name] == theirs[1][name], name


@pytest.mark.asyncio
async def test_operator_headers_replace_the_defaults_and_url_credentials_are_basic_auth(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_ORG_ID", "org-1")
    monkeypatch.delenv("OPENAI_PROJECT_ID", raising=False)
    app = Server((200, SSE, OK_STREAM))
    async with open_loopback(app) as url:
        with_user = url.replace("http://", "http://ann:p%40ss@") + "?api-version=2"
        headers = {"User-Agent": "mine", "api-key": "k2"}
        async with open_clients(with_user, extra_headers=headers) as pool:
            with anyio.fail_after(WAIT):
                transport = pool.transport_for_run("r")
                assert "ann" not in repr(transport)
                assert "ann" not in transport.url
                await (await transport.post(b"{}", "r", stream=False)).aclose()
    ((path, sent, _),) = app.seen
    assert path == "/v1/chat/completions?api-version=2"
    got = dict(sent)
    assert got["authorization"] == "Basic YW5uOnBAc3M="  # ann:p@ss
    assert (got["user-agent"], got["api-key"], got["openai-organization"]) == (
        "mine",
        "k2",
        "org-1",
    )
    assert "openai-project" not in got
    assert [name for name, _ in sent].count("user-agent") == 1


# --------------------------------------------------------------------------- failures


STATUS_ERRORS = [
    (400, {"error": {"message": "maximum context length is 8"}}, "context_length"),
    (401, {"error": {"message": "bad key sk-secret", "type": "invalid_request_error"}}, "auth"),
    (403, {"error": {"message": "no"}}, "auth"),
    (404, "not json at all", "bad_request"),
    (409, {"error": {"message": "conflict"}}, "server_error"),
    (418, {"message": "teapot"}, "bad_request"),
    (422, {"detail": [{"msg": "field required"}]}, "bad_request"),
    (429, {"error": {"message": "slow down", "type": "rate_limit"}}, "rate_limited"),
    (500, {"error": {"message": "boom"}}, "server_error"),
    (503, b"", "server_error"),
]


@pytest.mark.asyncio
@pytest.mark.parametrize(("status", "payload", "kind"), STATUS_ERRORS)
async def test_status_errors_are_the_sdks_own(status: int, payload: Any, kind: str) -> None:
    if isinstance(payload, bytes | str):
        content = payload if isinstance(payload, bytes) else payload.encode()
    else:
        content = json.dumps(payload).encode()
    headers = [(b"content-type", b"application/json"), (b"retry-after", b"7")]
    app = Server((status, headers, content))
    async with open_loopback(app) as url, open_clients(url) as pool:
        with anyio.fail_after(WAIT):
            with pytest.raises(openai.APIStatusError) as ours:
                await pool.transport_for_run("r").post(b"{}", "r", stream=True)
            with pytest.raises(openai.APIStatusError) as sdk:
                await sdk_post(url, b"{}", "r")
    assert type(ours.value) is type(sdk.value)
    mine, theirs = ours.value, sdk.value
    assert (mine.status_code, mine.message, mine.body, mine.code, mine.type) == (
        theirs.status_code,
        theirs.message,
        theirs.body,
        theirs.code,
        theirs.type,
    )
    assert mine.response.headers["retry-after"] == "7"
    assert mine.request.url == theirs.request.url
    assert classify(mine, streaming=False) == classify(theirs, streaming=False)
    assert classify(mine, streaming=False).kind == kind


@pytest.mark.asyncio
async def test_no_exception_carries_a_credential() -> None:
    error = {"error": {"message": "denied"}}
    app = Server((403, [(b"content-type", b"application/json")], json.dumps(error).encode()))
    async with (
        open_loopback(app) as url,
        open_clients(url, extra_headers={"X-Api-Key": "sk-other"}) as pool,
    ):
        with anyio.fail_after(WAIT), pytest.raises(openai.PermissionDeniedError) as caught:
            await pool.transport_for_run("r").post(b"{}", "r", stream=True)
    request = caught.value.request
    # ours are "***"; openai >= 3.60 also drops the headers it deems sensitive itself
    assert request.headers.get("authorization", "***") == "***"
    assert request.headers["x-api-key"] == "***"
    assert request.headers[RUN_ID_HEADER] == "r"
    text = repr(caught.value) + str(request.headers) + str(caught.value.response.request.headers)
    assert "sk-secret" not in text
    assert "sk-other" not in text
    assert dict(app.seen[0][1])["x-api-key"] == "sk-other"  # sent, only on the wire


@pytest.mark.asyncio
async def test_connection_refused_is_a_connection_error_not_a_timeout() -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    async with open_clients(url) as pool:
        with anyio.fail_after(WAIT), pytest.raises(openai.APIConnectionError) as caught:
            await pool.transport_for_run("r").post(b"{}", "r", stream=True)
    assert type(caught.value) is openai.APIConnectionError
    assert isinstance(caught.value.__cause__, aiohttp.ClientConnectorError)
    assert classify(caught.value, streaming=False).kind == "connection"


@pytest.mark.asyncio
async def test_no_answer_in_time_is_a_timeout() -> None:
    with socket.create_server(("127.0.0.1", 0)) as sock:  # accepts, never answers
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
        async with open_clients(url, timeout_seconds=0.2) as pool:
            with anyio.fail_after(WAIT), pytest.raises(openai.APITimeoutError) as caught:
                await pool.transport_for_run("r").post(b"{}", "r", stream=True)
    assert isinstance(caught.value.__cause__, aiohttp.SocketTimeoutError)
    assert classify(caught.value, streaming=False).kind == "timeout"


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
            with pytest.raises(openai.APIConnectionError) as caught:
                await read_into(acc, response)
    assert type(caught.value) is openai.APIConnectionError
    assert isinstance(caught.value.__cause__, aiohttp.ClientPayloadError)
    assert caught.value.request.headers[RUN_ID_HEADER] == "r7"
    assert acc.text == "par"
    assert classify(caught.value, streaming=True).kind == "stream"


@pytest.mark.asyncio
async def test_the_caller_reports_a_status_error_and_scrubs_the_key() -> None:
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
    assert final.message == "Incorrect API key provided: ***"
    assert dict(app.seen[0][1])["x-loopfuse-run-id"] == "r1"


# --------------------------------------------------------------------------- HTTP details


@pytest.mark.asyncio
async def test_a_cookie_set_by_the_server_is_sent_back_until_it_expires() -> None:
    app = Server(
        (200, [*SSE, (b"set-cookie", b"lb=node-2; Path=/")], OK_STREAM),
        (200, [*SSE, (b"set-cookie", b"lb=; Max-Age=0")], OK_STREAM),
        (200, SSE, OK_STREAM),
    )
    async with open_loopback(app) as url, open_clients(url) as pool:
        transport = pool.transport_for_run("r")
        with anyio.fail_after(WAIT):
            for _ in range(3):
                assert await read_text(await transport.post(b"{}", "r", stream=True)) == "hi"
    cookies = [dict(headers).get("cookie") for _, headers, _ in app.seen]
    assert cookies == [None, "lb=node-2", None]


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("encoding", "encode"),
    [
        (b"gzip", gzip.compress),
        (b"deflate", zlib.compress),
        (b"deflate", lambda data: zlib.compress(data)[2:-4]),  # raw deflate, as some send it
    ],
)
async def test_a_body_compressed_anyway_is_decoded(encoding: bytes, encode: Any) -> None:
    headers = [*SSE, (b"content-encoding", encoding)]
    completion = {"choices": [{"message": {"content": "whole"}, "finish_reason": "stop"}]}
    app = Server(
        (200, headers, encode(OK_STREAM)),
        (200, [(b"content-encoding", encoding)], encode(json.dumps(completion).encode())),
    )
    async with open_loopback(app) as url, open_clients(url) as pool:
        with anyio.fail_after(WAIT):
            transport = pool.transport_for_run("r")
            assert await read_text(await transport.post(b"{}", "r", stream=True)) == "hi"
            whole = await transport.post(b"{}", "r", stream=False)
    assert json.loads(whole.content) == completion


@pytest.mark.asyncio
async def test_a_body_that_inflates_past_the_bound_is_cut_not_buffered() -> None:
    bomb = gzip.compress(b"\0" * (MAX_BODY_BYTES + 1))  # ~64 KiB on the wire
    assert len(bomb) < MAX_BODY_BYTES // 100
    app = Server((200, [(b"content-encoding", b"gzip")], bomb))
    async with open_loopback(app) as url, open_clients(url) as pool:
        with anyio.fail_after(WAIT), pytest.raises(openai.APIConnectionError) as caught:
            await pool.transport_for_run("r").post(b"{}", "r", stream=False)
    assert "longer than" in str(caught.value.__cause__)


@pytest.mark.asyncio
async def test_an_unknown_content_coding_is_a_broken_stream() -> None:
    app = Server((200, [*SSE, (b"content-encoding", b"br")], b"\x0b\x02\x80"))
    async with open_loopback(app) as url, open_clients(url) as pool:
        with anyio.fail_after(WAIT):
            response = await pool.transport_for_run("r").post(b"{}", "r", stream=True)
            with pytest.raises(openai.APIConnectionError, match="Connection error"):
                await read_text(response)


@pytest.mark.asyncio
async def test_a_same_origin_307_is_followed_with_the_body() -> None:
    app = Server((307, [(b"location", b"/v2/chat/completions")], b""), (200, SSE, OK_STREAM))
    async with open_loopback(app) as url, open_clients(url) as pool:
        with anyio.fail_after(WAIT):
            response = await pool.transport_for_run("r").post(b'{"a":1}', "r", stream=True)
            assert await read_text(response) == "hi"
    assert [(path, body) for path, _, body in app.seen] == [
        ("/v1/chat/completions", b'{"a":1}'),
        ("/v2/chat/completions", b'{"a":1}'),
    ]
    assert dict(app.seen[1][1])["authorization"] == "Bearer sk-secret"


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "answer",
    [
        (302, [(b"location", b"/v2/chat/completions")], b""),  # a POST would become a GET
        (307, [(b"location", b"http://elsewhere.test/v1/chat/completions")], b""),
    ],
)
async def test_other_redirects_are_errors_that_say_what_to_do(answer: Answer) -> None:
    app = Server(answer)
    async with open_loopback(app) as url, open_clients(url) as pool:
        with anyio.fail_after(WAIT), pytest.raises(openai.APIStatusError) as caught:
            await pool.transport_for_run("r").post(b"{}", "r", stream=True)
    assert len(app.seen) == 1  # the key never went to the other origin
    failure = classify(caught.value, streaming=False)
    assert failure.kind == "bad_request"
    assert "set model.base_url to the new address" in failure.message


@pytest.mark.asyncio
async def test_a_redirect_loop_ends() -> None:
    app = Server((308, [(b"location", b"/v1/chat/completions")], b""))
    async with open_loopback(app) as url, open_clients(url) as pool:
        with anyio.fail_after(WAIT), pytest.raises(openai.APIStatusError, match="redirects"):
            await pool.transport_for_run("r").post(b"{}", "r", stream=True)
    assert len(app.seen) == MAX_REDIRECTS + 1


@pytest.mark.asyncio
async def test_a_non_streamed_reply_is_read_whole_and_frees_the_connection() -> None:
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
async def test_a_closed_transport_refuses() -> None:
    app = Server((200, SSE, OK_STREAM))
    async with open_loopback(app) as url:
        pool = Clients(EndpointSettings(base_url=url, api_key="k"))
        transport = pool.transport_for_run("r")
        with anyio.fail_after(WAIT):
            assert await read_text(await transport.post(b"{}", "r", stream=True)) == "hi"
            await pool.aclose()
            assert transport.is_closed
            with pytest.raises(RuntimeError, match="closed"):
                await transport.post(b"{}", "r", stream=True)
    assert len(app.seen) == 1


def test_runs_are_spread_over_a_few_transports_and_keep_theirs() -> None:
    clients = Clients(EndpointSettings(base_url="https://model.test/v1", api_key="sk-1"))
    chosen = {f"run-{i}": clients.transport_for_run(f"run-{i}") for i in range(200)}
    assert all(clients.transport_for_run(run) is one for run, one in chosen.items())
    assert len({id(one) for one in chosen.values()}) == len(clients) == SHARDS
    assert next(iter(chosen.values())).url == "https://model.test/v1/chat/completions"


def test_proxies_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    assert environment_proxy("https", "api.example.com") is None
    monkeypatch.setenv("HTTPS_PROXY", "http://u%201:pw@proxy.local:3128")
    monkeypatch.setenv("NO_PROXY", "localhost,.internal")
    proxy = environment_proxy("https", "api.example.com")
    assert proxy is not None
    assert proxy.url == "http://proxy.local:3128"
    assert proxy.auth == ("u 1", "pw")
    assert proxy.headers == {"Proxy-Authorization": "Basic dSAxOnB3"}  # u 1:pw
    assert environment_proxy("http", "api.example.com") is None  # only HTTPS_PROXY is set
    assert environment_proxy("https", "model.internal") is None
    assert environment_proxy("https", "localhost") is None
    transport = ChatTransport(EndpointSettings(base_url="https://api.example.com/v1"))
    assert transport.url == "https://api.example.com/v1/chat/completions"


@pytest.mark.asyncio
async def test_a_fresh_request_goes_on_a_new_connection_of_its_own() -> None:
    app = Server((200, SSE, OK_STREAM))
    async with open_loopback(app) as url, open_clients(url) as pool:
        transport = pool.transport_for_run("r")
        with anyio.fail_after(WAIT):
            for fresh, stream in ((False, True), (False, True), (True, True), (True, False)):
                reply = await transport.post(b"{}", "r", stream=stream, fresh=fresh)
                if stream:
                    assert await read_text(reply) == "hi"
    pooled, reused, own, own_whole = app.clients
    assert pooled == reused  # the pool keeps its connection
    assert len({pooled, own, own_whole}) == 3  # each fresh request had one of its own
