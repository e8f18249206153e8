"""Contract tests: what loopfuse relies on in ``openai``, ``httpx2`` and ``aiohttp`` (their
public API only; ``tests/test_no_private_access.py`` holds that). A release of one of them
that changes a signature, a class or the wire behaviour used here fails these tests,
loudly and by name, before it can break a run. ``docs/transport.md`` has the version policy.
"""

from __future__ import annotations

import importlib.metadata
import inspect
import ssl
import tomllib
from collections.abc import Callable
from contextlib import aclosing
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import httpx2
import openai
import pytest
from packaging.requirements import Requirement

from actors.llm.accumulator import ReplyAccumulator
from actors.llm.chunks import decode_completion
from actors.llm.clients import Clients
from actors.llm.settings import EndpointSettings
from actors.llm.stream import read_chunks
from orchestrator.sim import open_simulator, parse_scenario

ROOT = Path(__file__).resolve().parent.parent
BOUNDED = ("openai", "httpx2", "aiohttp")
WAIT = 10.0


def parameters(function: Callable[..., Any]) -> dict[str, inspect._ParameterKind]:
    return {
        name: parameter.kind
        for name, parameter in inspect.signature(function).parameters.items()
        if name != "self"
    }


POSITIONAL = inspect.Parameter.POSITIONAL_OR_KEYWORD
KEYWORD = inspect.Parameter.KEYWORD_ONLY


# --------------------------------------------------------------------------- versions


def test_each_package_has_an_upper_bound_and_the_installed_one_is_within_it() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    for section in (pyproject["project"]["dependencies"], pyproject["build-system"]["requires"]):
        requirements = {Requirement(text).name: Requirement(text) for text in section}
        for name in BOUNDED:
            specifier = requirements[name].specifier
            assert any(spec.operator == "<" for spec in specifier), f"{name}: no upper bound"
            installed = importlib.metadata.version(name)
            assert specifier.contains(installed), f"{name} {installed} is outside {specifier}"


# --------------------------------------------------------------------------- openai


def test_the_sdk_exceptions_are_built_as_the_transport_builds_them() -> None:
    assert parameters(openai.APIError.__init__) == {
        "message": POSITIONAL,
        "request": POSITIONAL,
        "body": KEYWORD,
    }
    assert parameters(openai.APIStatusError.__init__) == {
        "message": POSITIONAL,
        "response": KEYWORD,
        "body": KEYWORD,
    }
    assert parameters(openai.APIConnectionError.__init__) == {
        "message": KEYWORD,
        "request": KEYWORD,
    }
    assert parameters(openai.APITimeoutError.__init__) == {"request": POSITIONAL}
    statuses = (
        openai.BadRequestError,
        openai.AuthenticationError,
        openai.PermissionDeniedError,
        openai.NotFoundError,
        openai.ConflictError,
        openai.UnprocessableEntityError,
        openai.RateLimitError,
        openai.InternalServerError,
    )
    assert all(issubclass(kind, openai.APIStatusError) for kind in statuses)
    assert issubclass(openai.APITimeoutError, openai.APIConnectionError)
    assert issubclass(openai.APIConnectionError, openai.APIError)
    request = httpx2.Request("POST", "http://model.test/v1/chat/completions")
    response = httpx2.Response(429, headers=[(b"retry-after", b"3")], request=request)
    body = {"message": "slow", "type": "rate_limit", "code": 42, "param": None}
    error = openai.RateLimitError("Error code: 429 - slow", response=response, body=body)
    # What actors/llm/errors.py reads of an exception.
    assert (error.status_code, error.code, error.type, error.param) == (
        429,
        "42",
        "rate_limit",
        None,
    )
    assert (error.message, error.body, error.response.headers["retry-after"]) == (
        "Error code: 429 - slow",
        body,
        "3",
    )
    frame = openai.APIError("bad", request, body={"message": "bad", "code": "c"})
    assert (frame.code, frame.request) == ("c", request)


# --------------------------------------------------------------------------- httpx2, aiohttp


def test_aiohttp_as_the_transport_uses_it() -> None:
    session = parameters(aiohttp.ClientSession.__init__)
    for name in ("connector", "headers", "timeout", "auto_decompress", "cookie_jar"):
        assert session.get(name) is KEYWORD, name
    request = parameters(aiohttp.ClientSession._request)  # what post(**kwargs) takes
    for name in ("data", "headers", "allow_redirects", "proxy", "proxy_headers"):
        assert request.get(name) is KEYWORD, name
    assert inspect.iscoroutinefunction(aiohttp.ClientSession.close)
    connector = parameters(aiohttp.TCPConnector.__init__)
    for name in ("ssl", "limit", "keepalive_timeout", "force_close"):
        assert connector.get(name) is KEYWORD, name
    timeout = aiohttp.ClientTimeout(connect=1.0, sock_connect=2.0, sock_read=3.0)
    assert (timeout.total, timeout.connect, timeout.sock_connect, timeout.sock_read) == (
        None,
        1.0,
        2.0,
        3.0,
    )
    for attribute in ("status", "raw_headers", "headers", "version", "content"):
        assert hasattr(aiohttp.ClientResponse, attribute), attribute
    assert not inspect.iscoroutinefunction(aiohttp.ClientResponse.release)
    assert inspect.iscoroutinefunction(aiohttp.StreamReader.readany)
    for member in (
        aiohttp.ClientConnectorError,
        aiohttp.ClientConnectorCertificateError,
        aiohttp.ClientPayloadError,
        aiohttp.ClientResponseError,  # what llhttp refuses
        aiohttp.ServerDisconnectedError,
        aiohttp.ClientOSError,
    ):
        assert issubclass(member, aiohttp.ClientError), member
    for timeout_error in (aiohttp.ConnectionTimeoutError, aiohttp.SocketTimeoutError):
        assert issubclass(timeout_error, TimeoutError), timeout_error  # APITimeoutError


def test_httpx2_as_the_transport_uses_it() -> None:
    assert isinstance(httpx2.create_ssl_context(), ssl.SSLContext)
    request = httpx2.Request("POST", "http://model.test/v1", headers=[(b"Authorization", b"***")])
    assert request.headers["authorization"] == "***"
    response = httpx2.Response(
        400, headers=[(b"content-type", b"application/json")], content=b" {} ", request=request
    )
    assert (response.status_code, response.text, response.request) == (400, " {} ", request)


# --------------------------------------------------------------------------- on the wire


SCENARIO = parse_scenario(
    'task = "Say it."\n[[steps]]\ntext = "Contract holds, word for word."\nchunk_size = 5\n'
    'repeat = true\n[expect]\nexit_reason = "completed"\n',
    source="contract.toml",
    name="contract",
)


@pytest.mark.asyncio
@pytest.mark.parametrize("stream", [True, False])
async def test_a_real_request_to_the_simulator_reads_as_the_sdk_reads_it(stream: bool) -> None:
    """The transport and the stream reader against the project's simulator, beside the
    SDK's own ``chat.completions.create`` on the same server: the same answer."""
    body = (
        b'{"model":"contract","messages":[{"role":"user","content":"Say it."}],"stream":'
        + (b"true" if stream else b"false")
        + b"}"
    )
    async with open_simulator([SCENARIO]) as sim:
        clients = Clients(EndpointSettings(base_url=sim.base_url, api_key="k"))
        try:
            with anyio.fail_after(WAIT):
                reply = await clients.transport_for_run("r").post(body, "r", stream=stream)
                acc = ReplyAccumulator()
                if stream:
                    try:
                        async with aclosing(read_chunks(reply)) as batches:
                            async for batch in batches:
                                for chunk in batch:
                                    acc.feed_chunk(chunk)
                    finally:
                        await reply.aclose()
                else:
                    acc.feed_completion(decode_completion(reply.content))
        finally:
            await clients.aclose()
        async with openai.AsyncOpenAI(base_url=sim.base_url, api_key="k", max_retries=0) as client:
            messages: Any = [{"role": "user", "content": "Say it."}]
            with anyio.fail_after(WAIT):
                if stream:
                    chunks = await client.chat.completions.create(
                        model="contract", messages=messages, stream=True
                    )
                    parts = [c.choices[0].delta.content or "" async for c in chunks if c.choices]
                    sdk_text = "".join(parts)
                else:
                    completion = await client.chat.completions.create(
                        model="contract", messages=messages
                    )
                    sdk_text = completion.choices[0].message.content or ""
    assert acc.text == sdk_text == "Contract holds, word for word."
    assert acc.finish_reason == "stop"


@pytest.mark.asyncio
async def test_a_simulator_error_is_the_same_exception_both_ways() -> None:
    async with open_simulator([SCENARIO]) as sim:
        clients = Clients(EndpointSettings(base_url=sim.base_url, api_key="k"))
        try:
            body = b'{"model":"no-such-model","messages":[],"stream":true}'
            with anyio.fail_after(WAIT), pytest.raises(openai.NotFoundError) as ours:
                await clients.transport_for_run("r").post(body, "r", stream=True)
        finally:
            await clients.aclose()
        async with openai.AsyncOpenAI(base_url=sim.base_url, api_key="k", max_retries=0) as sdk:
            with anyio.fail_after(WAIT), pytest.raises(openai.NotFoundError) as theirs:
                await sdk.chat.completions.create(model="no-such-model", messages=[], stream=True)
    assert (ours.value.message, ours.value.body, ours.value.code) == (
        theirs.value.message,
        theirs.value.body,
        theirs.value.code,
    )
