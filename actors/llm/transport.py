"""One chat-completions POST through an ``AsyncOpenAI`` client's own connection pool.

The SDK builds the request once per client (``AsyncOpenAI._build_request``: the auth,
default, platform and extra headers, the httpx2 client's own headers, the URL, the
timeouts); each request reuses those header bytes with the run id and the body's length
added, and goes to the ``httpcore2`` pool of the client's transport (proxies chosen by
httpx2 for the URL). Servers see the same request as through ``AsyncOpenAI.post``, and
failures come out as the SDK raises them: ``APITimeoutError`` or ``APIConnectionError``
(caused by the httpx2 error), or for a 4xx/5xx the SDK's own ``APIStatusError`` subclass
built from the read body. Why: ``docs/performance.md``.

What this path does not do itself goes through httpx2 and the SDK as before: a transport
that is not httpx2's own (a mock, ASGI), custom auth, event hooks, credentials in the URL or
cookies in the client's jar send the request with ``AsyncOpenAI.post``; a response that
sets a cookie, is compressed or redirects is handed over as an ``httpx2.Response``.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncGenerator
from typing import Any, Final, cast

import anyio
import httpcore2
import httpx2
import openai
from httpx2._transports.default import AsyncResponseStream, map_httpcore_exceptions
from openai._base_client import get_platform
from openai._models import FinalRequestOptions

__all__ = [
    "COMPLETIONS",
    "CORE_ERRORS",
    "RUN_ID_HEADER",
    "ChatTransport",
    "Headers",
    "Reply",
    "as_httpx_error",
]

RUN_ID_HEADER: Final = "X-Loopfuse-Run-Id"
"""Request header naming the run, for server logs and scripted simulators."""

COMPLETIONS: Final = "/chat/completions"
"""The path of the chat-completions endpoint, under the base URL."""

CORE_ERRORS: Final = (
    httpcore2.TimeoutException,
    httpcore2.NetworkError,
    httpcore2.ProtocolError,
    httpcore2.ProxyError,
    httpcore2.UnsupportedProtocol,
)
"""What the connection pool raises (httpx2's transport maps them to its own classes)."""

_PLACEHOLDER: Final = "-"
_MARK: Final = _PLACEHOLDER.encode()
_CONTENT_LENGTH: Final = b"Content-Length"
_UNUSUAL: Final = frozenset({b"content-encoding", b"set-cookie"})
_PLATFORM: list[Any] = []  # the SDK's platform, detected once per process (in a thread)

Headers = tuple[tuple[bytes, bytes], ...]
"""Request headers added to the client's own, as (name, value) bytes."""


def as_httpx_error(exc: Exception) -> Exception:
    """``exc`` as httpx2's transport raises it (``httpcore2.ReadError`` -> ``httpx2.ReadError``,
    the original as its cause); anything else unchanged."""
    try:
        with map_httpcore_exceptions():
            raise exc
    except httpx2.HTTPError as mapped:
        return mapped
    except Exception:  # not an httpcore2 error
        return exc


class Reply:
    """A 2xx response read straight from the pool: what :func:`actors.llm.stream.read_chunks`
    and the caller use of an ``httpx2.Response`` (``aiter_bytes``, ``aread``, ``aclose``,
    ``http_version``, ``request``), without building one."""

    __slots__ = ("_body", "_response", "_run_id", "_transport", "http_version", "status_code")

    def __init__(
        self, transport: ChatTransport, body: bytes, run_id: str, response: httpcore2.Response
    ) -> None:
        self._transport = transport
        self._body = body
        self._run_id = run_id
        self._response = response
        self.status_code = response.status
        version = response.extensions.get("http_version", b"HTTP/1.1")
        self.http_version = version.decode("ascii", "replace")

    def aiter_bytes(self) -> AsyncGenerator[bytes, None]:
        """The body, read by read (the pool's own iterator; it raises httpcore2 errors)."""
        return cast(AsyncGenerator[bytes, None], cast(Any, self._response.stream).__aiter__())

    @property
    def content(self) -> bytes:
        """The body, once :meth:`aread` has read it."""
        return self._response.content

    async def aread(self) -> bytes:
        try:
            return await self._response.aread()
        except CORE_ERRORS as exc:
            cause = as_httpx_error(exc)
            raise _sdk_error(cause, self.request) from cause

    async def aclose(self) -> None:
        await self._response.aclose()

    @property
    def request(self) -> httpx2.Request:
        """The request as httpx2 would have built it (made only when an error needs it)."""
        return self._transport.httpx_request(self._body, self._run_id)


class ChatTransport:
    """Sends POST requests to ``path`` of ``client``'s base URL; one per client."""

    def __init__(
        self, client: openai.AsyncOpenAI, path: str, run_id_header: str = RUN_ID_HEADER
    ) -> None:
        self._client = client
        self._path = path
        self._run_id_header = run_id_header
        self._ready = False
        self._pool: httpcore2.AsyncConnectionPool | None = None  # None: the SDK's own path
        self._url: httpx2.URL | None = None
        self._core_url: httpcore2.URL | None = None
        self._before: list[tuple[bytes, bytes]] = []  # template headers before the run id
        self._after: list[tuple[bytes, bytes]] = []  # and after it
        self._run_id_name = b""
        self._extensions: dict[str, Any] = {}

    @property
    def fast(self) -> bool:
        """Whether requests skip the SDK's per-request building (known after the first)."""
        return self._pool is not None

    async def post(
        self, body: bytes, run_id: str, *, stream: bool, headers: Headers = ()
    ) -> Reply | httpx2.Response:
        """Send ``body`` (JSON) with ``headers`` added (a ``traceparent``); the 2xx
        response, its body not read yet unless ``stream`` is false. Raises the SDK's
        exceptions."""
        if not self._ready:
            await self._prepare()
        pool = self._pool
        http = self._client._client
        if pool is None or http.cookies or http.is_closed:  # closed: httpx2 raises as before
            return await self._sdk_post(body, run_id, stream=stream, headers=headers)
        request = httpcore2.Request(
            b"POST",
            cast(httpcore2.URL, self._core_url),
            headers=[
                *self._before,
                (self._run_id_name, _header_value(run_id)),
                *self._after,
                *headers,
                (_CONTENT_LENGTH, b"%d" % len(body)),
            ],
            content=body,
            extensions=self._extensions,
        )
        try:
            response = await pool.handle_async_request(request)
        except CORE_ERRORS as exc:
            cause = as_httpx_error(exc)
            raise _sdk_error(cause, self.httpx_request(body, run_id)) from cause
        status = response.status
        if 200 <= status < 300 and not any(k.lower() in _UNUSUAL for k, _ in response.headers):
            reply = Reply(self, body, run_id, response)
            if not stream:  # read whole and closed, as httpx2 does: the connection is free
                try:
                    await reply.aread()
                finally:
                    await reply.aclose()
            return reply
        return await self._unusual(body, run_id, response, stream=stream)

    def httpx_request(self, body: bytes, run_id: str) -> httpx2.Request:
        """This request as an ``httpx2.Request`` (for errors and the httpx2 fallbacks)."""
        headers = [*self._before, (self._run_id_name, _header_value(run_id)), *self._after]
        return httpx2.Request(
            "POST",
            cast(httpx2.URL, self._url),
            headers=headers,
            content=body,
            extensions=self._extensions,
        )

    # ------------------------------------------------------------------ internals

    async def _prepare(self) -> None:
        """The template, from the SDK's own ``_build_request`` (once per client)."""
        client = self._client
        if client._platform is None:  # what AsyncOpenAI.request does first, once per process
            if not _PLATFORM:
                _PLATFORM.append(await anyio.to_thread.run_sync(get_platform))
            client._platform = _PLATFORM[0]
        options = FinalRequestOptions.construct(
            method="post",
            url=self._path,
            headers={self._run_id_header: _PLACEHOLDER},
            security={"bearer_auth": True},
            content=b"",
        )
        built = client._build_request(options)
        http = client._client
        transport = http._transport_for_url(built.url)
        if (
            isinstance(transport, httpx2.AsyncHTTPTransport)
            and isinstance(transport._pool, httpcore2.AsyncConnectionPool)
            and client._provider_runtime is None
            and client._api_key_provider is None
            and client._workload_identity_auth is None
            and client.custom_auth is None
            and http.auth is None
            and not built.url.userinfo
            and not any(http.event_hooks.values())
        ):
            self._pool = transport._pool
        raw = [(k, v) for k, v in built.headers.raw if k.lower() != b"content-length"]
        name = self._run_id_header.lower().encode("ascii")
        at = next(i for i, (k, v) in enumerate(raw) if k.lower() == name and v == _MARK)
        self._run_id_name = raw[at][0]
        self._before, self._after = raw[:at], raw[at + 1 :]
        url = self._url = built.url
        self._core_url = httpcore2.URL(
            scheme=url.raw_scheme, host=url.raw_host, port=url.port, target=url.raw_path
        )
        self._extensions = dict(built.extensions)
        self._ready = True

    async def _sdk_post(
        self, body: bytes, run_id: str, *, stream: bool, headers: Headers
    ) -> httpx2.Response:
        """The whole request through ``AsyncOpenAI.post`` (the general path)."""
        options: openai.RequestOptions = {
            "security": {"bearer_auth": True},
            "headers": {
                self._run_id_header: run_id,
                **{name.decode("latin-1"): value.decode("latin-1") for name, value in headers},
            },
        }
        if stream:
            return cast(
                httpx2.Response,
                await self._client.post(
                    self._path,
                    cast_to=httpx2.Response,
                    content=body,
                    options=options,
                    stream=True,
                ),
            )
        return await self._client.post(
            self._path, cast_to=httpx2.Response, content=body, options=options
        )

    async def _unusual(
        self, body: bytes, run_id: str, core: httpcore2.Response, *, stream: bool
    ) -> httpx2.Response:
        """A status error, a redirect, a cookie or a compressed body: the response as httpx2's
        client would have made it, then what the client and the SDK do with it."""
        http = self._client._client
        request = self.httpx_request(body, run_id)
        response = httpx2.Response(
            status_code=core.status,
            headers=core.headers,
            stream=AsyncResponseStream(cast(Any, core.stream)),
            extensions=core.extensions,
            request=request,
        )
        response.default_encoding = http._default_encoding
        http.cookies.extract_cookies(response)
        try:
            if response.has_redirect_location and http.follow_redirects:
                await response.aread()
                follow = http._build_redirect_request(request, response)
                await response.aclose()
                response = await http.send(follow, stream=True)
            if response.is_error:
                await response.aread()
                raise self._client._make_status_error_from_response(response)
            if not stream:
                await response.aread()
        except httpx2.TimeoutException as exc:
            await response.aclose()
            raise openai.APITimeoutError(request=request) from exc
        except (httpx2.RequestError, ssl.SSLError) as exc:
            await response.aclose()
            raise openai.APIConnectionError(request=request) from exc
        except BaseException:
            await response.aclose()
            raise
        return response


def _sdk_error(cause: Exception, request: httpx2.Request) -> openai.APIConnectionError:
    """What the SDK raises for a transport failure (raise it ``from cause``)."""
    if isinstance(cause, httpx2.TimeoutException):
        return openai.APITimeoutError(request=request)
    return openai.APIConnectionError(request=request)


def _header_value(value: str) -> bytes:
    try:
        return value.encode("ascii")
    except UnicodeEncodeError:
        return value.encode("utf-8")
