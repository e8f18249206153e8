"""The model endpoint's HTTP client: chat-completions POSTs through a connection pool the
transport owns, with the request head made once per transport.

Every endpoint, proxied (the environment names a proxy) or not, goes through one
``httpcore2`` pool (its ``h11`` HTTP/1.1 parser; HTTP/2 when negotiated). A 2xx body is read
decoded up to :data:`MAX_BODY_BYTES`.

Only the public API of ``httpcore2`` (the pool, its request and response, its exceptions),
of ``httpx2`` (its TLS context; the request and response an SDK exception carries) and of
``openai`` (its exception classes, :mod:`actors.llm.sdk_errors`) is used;
``tests/test_llm_contract.py`` pins what is relied on, and ``tests/test_no_private_access.py``
that nothing private is. Why not ``AsyncOpenAI``: it builds every request anew, and its
stream builds a pydantic object per chunk (``docs/transport.md``, ``docs/performance.md``).

On the wire: ``POST <base_url>/chat/completions`` with ``Host``, ``Accept`` and
``Content-Type: application/json``, ``Accept-Encoding: identity``, ``User-Agent:
loopfuse/<version>``, ``Authorization: Bearer <api_key>`` (``Basic`` from credentials in
the URL), ``OpenAI-Organization``/``OpenAI-Project`` from ``OPENAI_ORG_ID``/
``OPENAI_PROJECT_ID`` when set, the operator's extra headers (which replace any of
those), cookies the server set, then per request the run id, a ``traceparent`` and the
body's length. Proxies come from the environment (``HTTPS_PROXY``, ``NO_PROXY``, …), once.
A 307/308 to the same origin is followed (five times at most); a body a server compressed
anyway (gzip, deflate) is decoded, to :data:`MAX_BODY_BYTES` at most (more is a
protocol error: a connection failure to the caller).

Failures come out as the ``openai`` SDK raises them: ``APIStatusError`` subclasses for a
4xx/5xx (any other redirect included), ``APITimeoutError``/``APIConnectionError`` from the
``httpcore2`` error for a connection that fails.
"""

from __future__ import annotations

import base64
import email.utils
import http.cookies
import importlib.metadata
import json
import os
import ssl
import time
import urllib.request
import zlib
from collections.abc import AsyncIterator
from typing import Any, Final
from urllib.parse import unquote, urljoin, urlsplit

import anyio
import httpcore2
import httpx2
import openai

from actors.llm.sdk_errors import connection_error, status_error
from actors.llm.settings import NO_API_KEY, EndpointSettings

__all__ = [
    "COMPLETIONS",
    "CORE_ERRORS",
    "MAX_BODY_BYTES",
    "MAX_REDIRECTS",
    "RUN_ID_HEADER",
    "ChatTransport",
    "Headers",
    "Reply",
    "environment_proxy",
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
    ssl.SSLError,
    anyio.EndOfStream,
    anyio.BrokenResourceError,
    OSError,
)
"""What sending a request or reading a response may raise when the connection fails."""

MAX_REDIRECTS: Final = 5
"""307/308 redirects to the same origin followed per request."""

ERROR_BODY_LIMIT: Final = 1 << 20
"""Bytes of a 4xx/5xx body read (the rest is dropped with the connection)."""

MAX_BODY_BYTES: Final = 64 << 20
"""Bytes of a 2xx body, after any content coding is undone, read at most; a longer body
raises ``httpcore2.RemoteProtocolError`` (a compressed body cannot inflate without bound)."""

MAX_CONNECTIONS: Final = 1000
MAX_KEEPALIVE_CONNECTIONS: Final = 100
KEEPALIVE_SECONDS: Final = 5.0
"""The pool's limits (the ``openai`` SDK's defaults)."""

Headers = tuple[tuple[bytes, bytes], ...]
"""Request headers added to the transport's own, as (name, value) bytes."""

_Response = httpcore2.Response

_REDACTED: Final = b"***"
_CONTENT_LENGTH: Final = b"Content-Length"
_SET_COOKIE: Final = b"set-cookie"
_CONTENT_ENCODING: Final = b"content-encoding"
_UNUSUAL: Final = frozenset({_SET_COOKIE, _CONTENT_ENCODING})
_REDIRECTS: Final = frozenset({307, 308})
_INFLATE_PIECE: Final = 1 << 20
_DECODERS: Final = {b"gzip": 16 + zlib.MAX_WBITS, b"x-gzip": 16 + zlib.MAX_WBITS, b"deflate": 0}


def _user_agent() -> bytes:
    try:
        version = importlib.metadata.version("loopfuse")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree
        version = "0"
    return f"loopfuse/{version}".encode("ascii")


_USER_AGENT: Final = _user_agent()


def environment_proxy(scheme: str, host: str) -> httpcore2.Proxy | None:
    """The proxy the environment names for ``scheme``://``host`` (``HTTPS_PROXY``,
    ``HTTP_PROXY``, ``ALL_PROXY``, lower case too; ``NO_PROXY`` exempts), or ``None``."""
    proxies = urllib.request.getproxies()
    if not proxies or urllib.request.proxy_bypass(host):
        return None
    url = proxies.get(scheme) or proxies.get("all")
    if not url:
        return None
    if "://" not in url:
        url = f"http://{url}"
    parts = urlsplit(url)
    auth = None
    if parts.username is not None:
        auth = (unquote(parts.username), unquote(parts.password or ""))
    address = parts.netloc.rpartition("@")[2]
    return httpcore2.Proxy(f"{parts.scheme}://{address}{parts.path}", auth=auth)


class _Origin:
    """Where requests go: the URL as the pool takes it, and its origin."""

    __slots__ = ("authority", "origin", "url")

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        host = parts.hostname or ""
        self.authority = parts.netloc.rpartition("@")[2].encode("idna")
        self.origin = (parts.scheme, host, parts.port)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self.url = httpcore2.URL(
            scheme=parts.scheme, host=host.encode("idna"), port=parts.port, target=target
        )


class ChatTransport:
    """Sends POST requests to ``path`` under an endpoint's base URL; one connection pool."""

    def __init__(
        self,
        endpoint: EndpointSettings,
        *,
        path: str = COMPLETIONS,
        run_id_header: str = RUN_ID_HEADER,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        parts = urlsplit(endpoint.base_url)
        address = parts.netloc.rpartition("@")[2]  # credentials become the Authorization
        query = f"?{parts.query}" if parts.query else ""
        self._url_text = f"{parts.scheme}://{address}{parts.path.rstrip('/')}{path}{query}"
        self._target = _Origin(self._url_text)
        self._run_id_name = run_id_header.encode("ascii")
        timeout = endpoint.timeout_seconds
        self._extensions: dict[str, Any] = {
            "timeout": {
                "connect": endpoint.connect_timeout_seconds,
                "read": timeout,
                "write": timeout,
                "pool": timeout,
            }
        }
        self._fixed = _fixed_headers(endpoint, parts.username, parts.password)
        self._secrets = frozenset(
            {
                b"authorization",
                b"cookie",
                *(k.lower().encode("latin-1") for k in endpoint.extra_headers),
            }
        )
        self._cookies: dict[str, str] = {}
        self._template = self._make_template()
        self._ssl_context = ssl_context or httpx2.create_ssl_context()
        self._proxy = environment_proxy(parts.scheme, parts.hostname or "")
        self._pool = self._new_pool(MAX_CONNECTIONS)
        self._closed = False

    def __repr__(self) -> str:
        return f"ChatTransport({self._url_text!r})"

    @property
    def url(self) -> str:
        """The URL requests go to (without credentials)."""
        return self._url_text

    @property
    def is_closed(self) -> bool:
        return self._closed

    async def post(
        self,
        body: bytes,
        run_id: str,
        *,
        stream: bool,
        headers: Headers = (),
        fresh: bool = False,
    ) -> Reply:
        """Send ``body`` (JSON) with ``headers`` added (a ``traceparent``); the 2xx
        response, its body not read yet unless ``stream`` is false. Raises the SDK's
        exceptions (:mod:`actors.llm.sdk_errors`); ``RuntimeError`` once closed.

        ``fresh``: on a new connection of its own (closed with the reply), not one the pool
        kept: for a retry, since a server that failed an attempt may have closed the
        connection it used, and the pool learns that only when the close arrives."""
        if self._closed:
            raise RuntimeError("the model transport has been closed")
        if not fresh:
            return await self._send(self._pool, body, run_id, stream, headers)
        pool = self._new_pool(1)
        try:
            reply = await self._send(pool, body, run_id, stream, headers)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await pool.aclose()
            raise
        if stream:
            reply.own(pool)
        else:
            await pool.aclose()
        return reply

    async def _send(
        self,
        pool: httpcore2.AsyncConnectionPool,
        body: bytes,
        run_id: str,
        stream: bool,
        headers: Headers,
    ) -> Reply:
        own = [(self._run_id_name, _header_value(run_id)), *headers]
        own.append((_CONTENT_LENGTH, b"%d" % len(body)))
        target = self._target
        for _ in range(MAX_REDIRECTS + 1):
            request = httpcore2.Request(
                b"POST",
                target.url,
                headers=[*self._template, *own],
                content=body,
                extensions=self._extensions,
            )
            try:
                response = await pool.handle_async_request(request)
            except CORE_ERRORS as exc:
                raise connection_error(exc, self.error_request(run_id)) from exc
            version = response.extensions.get("http_version", b"HTTP/1.1")
            answer = await self._answer(
                response, version.decode("ascii", "replace"), run_id, stream, target
            )
            if isinstance(answer, Reply):
                return answer
            target = answer
        raise status_error(
            response.status,
            response.headers,
            _message(f"more than {MAX_REDIRECTS} redirects"),
            self.error_request(run_id),
        )

    async def _answer(
        self, response: _Response, http_version: str, run_id: str, stream: bool, target: _Origin
    ) -> Reply | _Origin:
        """A 2xx as a :class:`Reply` (read whole unless ``stream``); where a redirect to
        follow leads (its body read); any other status raised as the SDK's error."""
        status = response.status
        encoding = None
        for name, value in response.headers:
            lowered = name.lower()
            if lowered in _UNUSUAL:
                if lowered == _SET_COOKIE:
                    self._keep_cookie(value)
                else:
                    encoding = value.strip().lower()
        if 200 <= status < 300:
            reply = Reply(self, response, run_id, encoding, http_version)
            if not stream:  # read whole and closed: the connection is free again
                try:
                    await reply.aread()
                finally:
                    await reply.aclose()
            return reply
        following = self._redirect(response, target) if status in _REDIRECTS else None
        content = await self._error_body(response, run_id, encoding)
        if following is None:
            raise self._status_error(response, content, run_id)
        return following

    def error_request(self, run_id: str) -> httpx2.Request:
        """This transport's request as an ``httpx2.Request`` for an SDK exception, its
        credentials (authorization, cookies, operator headers) replaced by ``***``."""
        secrets = self._secrets
        headers = [
            (name, _REDACTED if name.lower() in secrets else value)
            for name, value in self._template
        ]
        headers.append((self._run_id_name, _header_value(run_id)))
        return httpx2.Request("POST", self._url_text, headers=headers)

    async def aclose(self) -> None:
        """Close every connection; later requests raise ``RuntimeError``."""
        self._closed = True
        await self._pool.aclose()

    # ------------------------------------------------------------------ internals

    def _new_pool(self, connections: int) -> httpcore2.AsyncConnectionPool:
        return httpcore2.AsyncConnectionPool(
            ssl_context=self._ssl_context,
            proxy=self._proxy,
            max_connections=connections,
            max_keepalive_connections=min(connections, MAX_KEEPALIVE_CONNECTIONS),
            keepalive_expiry=KEEPALIVE_SECONDS,
        )

    def _make_template(self) -> list[tuple[bytes, bytes]]:
        template = [(b"Host", self._target.authority), *self._fixed]
        if self._cookies:
            cookie = "; ".join(f"{k}={v}" for k, v in self._cookies.items())
            template.append((b"Cookie", cookie.encode("latin-1")))
        return template

    def _keep_cookie(self, value: bytes) -> None:
        """Remember (or forget) a cookie the server set; sent on later requests."""
        jar: http.cookies.SimpleCookie = http.cookies.SimpleCookie()
        try:
            jar.load(value.decode("latin-1"))
        except http.cookies.CookieError:
            return
        for name, morsel in jar.items():
            if _expired(morsel):
                self._cookies.pop(name, None)
            else:
                self._cookies[name] = morsel.value
        self._template = self._make_template()

    def _redirect(self, response: _Response, current: _Origin) -> _Origin | None:
        """Where a 307/308 leads, if it stays on this origin."""
        location = next((v for k, v in response.headers if k.lower() == b"location"), None)
        if location is None:
            return None
        base = f"{current.origin[0]}://{current.authority.decode('ascii')}"
        following = _Origin(urljoin(base + current.url.target.decode("ascii"), location.decode()))
        return following if following.origin == current.origin else None

    async def _error_body(self, response: _Response, run_id: str, encoding: bytes | None) -> bytes:
        """Up to :data:`ERROR_BODY_LIMIT` bytes of a response that is not a 2xx."""
        pieces: list[bytes] = []
        size = 0
        try:
            async for data in _decoded(response.aiter_stream(), encoding):
                pieces.append(data)
                size += len(data)
                if size >= ERROR_BODY_LIMIT:
                    break
        except CORE_ERRORS as exc:
            raise connection_error(exc, self.error_request(run_id)) from exc
        finally:
            await response.aclose()
        return b"".join(pieces)[:ERROR_BODY_LIMIT]

    def _status_error(
        self, response: _Response, content: bytes, run_id: str
    ) -> openai.APIStatusError:
        status = response.status
        if 300 <= status < 400:
            location = next((v for k, v in response.headers if k.lower() == b"location"), b"")
            content = _message(
                f"the endpoint redirected ({status}) to {location.decode('latin-1')!r}; only "
                "307/308 within the same origin are followed: set model.base_url to the "
                "new address"
            )
        return status_error(status, response.headers, content, self.error_request(run_id))


class Reply:
    """A 2xx response: what :func:`actors.llm.stream.read_chunks` and the caller read."""

    __slots__ = (
        "_content",
        "_encoding",
        "_pool",
        "_response",
        "_run_id",
        "_transport",
        "http_version",
        "status_code",
    )

    def __init__(
        self,
        transport: ChatTransport,
        response: _Response,
        run_id: str,
        encoding: bytes | None = None,
        http_version: str = "HTTP/1.1",
    ) -> None:
        self._transport = transport
        self._response = response
        self._run_id = run_id
        self._encoding = encoding
        self._content = b""
        self._pool: httpcore2.AsyncConnectionPool | None = None
        self.status_code = response.status
        self.http_version = http_version

    def aiter_bytes(self) -> AsyncIterator[bytes]:
        """The body, read by read (raises :data:`CORE_ERRORS` when the connection fails)."""
        reads: AsyncIterator[bytes] = self._response.aiter_stream()
        encoding = self._encoding
        if encoding and encoding != b"identity":  # one generator less per read otherwise
            reads = _decoded(reads, encoding)
        return _bounded(reads)

    @property
    def content(self) -> bytes:
        """The body, once :meth:`aread` has read it."""
        return self._content

    async def aread(self) -> bytes:
        """The whole body (the SDK's connection exceptions when the connection fails)."""
        try:
            self._content = b"".join([data async for data in self.aiter_bytes()])
        except CORE_ERRORS as exc:
            raise connection_error(exc, self.request) from exc
        return self._content

    def own(self, pool: httpcore2.AsyncConnectionPool) -> None:
        """Close ``pool`` (the reply's own connection) with the reply."""
        self._pool = pool

    async def aclose(self) -> None:
        try:
            await self._response.aclose()
        finally:
            if self._pool is not None:
                await self._pool.aclose()

    @property
    def request(self) -> httpx2.Request:
        """The request, for an SDK exception (credentials redacted; made when needed)."""
        return self._transport.error_request(self._run_id)


async def _bounded(reads: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """``reads``, ended by ``httpcore2.RemoteProtocolError`` past :data:`MAX_BODY_BYTES`."""
    size = 0
    async for data in reads:
        size += len(data)
        if size > MAX_BODY_BYTES:
            raise httpcore2.RemoteProtocolError(
                f"the response body is longer than {MAX_BODY_BYTES} bytes (decoded)"
            )
        yield data


async def _decoded(reads: AsyncIterator[bytes], encoding: bytes | None) -> AsyncIterator[bytes]:
    """``reads`` with a gzip or deflate content coding undone."""
    if not encoding or encoding == b"identity":
        async for data in reads:
            yield data
        return
    wbits = _DECODERS.get(encoding)
    if wbits is None:
        raise httpcore2.RemoteProtocolError(
            f"the response is encoded as {encoding.decode('latin-1')!r} (asked for identity)"
        )
    decoder = zlib.decompressobj(wbits) if wbits else None
    async for data in reads:
        if decoder is None:  # deflate: zlib-wrapped, or raw as some servers send it
            raw = data[:1] and (data[0] & 0x0F) != 8
            decoder = zlib.decompressobj(-zlib.MAX_WBITS if raw else zlib.MAX_WBITS)
        while data:  # in bounded pieces: a small read may inflate to a great deal
            try:
                out = decoder.decompress(data, _INFLATE_PIECE)
            except zlib.error as exc:
                message = f"undecodable {encoding!r} body: {exc}"
                raise httpcore2.RemoteProtocolError(message) from exc
            data = decoder.unconsumed_tail
            if out:
                yield out
    if decoder is not None and (rest := decoder.flush()):
        yield rest


def _fixed_headers(
    endpoint: EndpointSettings, user: str | None, password: str | None
) -> list[tuple[bytes, bytes]]:
    """The headers every request carries (but ``Host`` and cookies), in order."""
    if user is not None:
        pair = f"{unquote(user)}:{unquote(password or '')}".encode()
        auth = b"Basic " + base64.b64encode(pair)
    else:
        auth = f"Bearer {endpoint.api_key or NO_API_KEY}".encode()
    headers: dict[str, tuple[bytes, bytes]] = {
        "accept": (b"Accept", b"application/json"),
        "content-type": (b"Content-Type", b"application/json"),
        "accept-encoding": (b"Accept-Encoding", b"identity"),
        "user-agent": (b"User-Agent", _USER_AGENT),
        "authorization": (b"Authorization", auth),
    }
    for name, variable in (
        ("OpenAI-Organization", "OPENAI_ORG_ID"),
        ("OpenAI-Project", "OPENAI_PROJECT_ID"),
    ):
        value = os.environ.get(variable)
        if value:
            headers[name.lower()] = (name.encode("ascii"), _header_value(value))
    for name, value in endpoint.extra_headers.items():
        headers[name.lower()] = (name.encode("latin-1"), _header_value(value))
    return list(headers.values())


def _expired(morsel: http.cookies.Morsel[str]) -> bool:
    max_age = morsel["max-age"]
    if max_age:
        try:
            return int(max_age) <= 0
        except ValueError:
            return False
    expires = morsel["expires"]
    if expires:
        try:
            return email.utils.parsedate_to_datetime(expires).timestamp() <= time.time()
        except (TypeError, ValueError):
            return False
    return False


def _message(text: str) -> bytes:
    """An error body in the OpenAI shape, for an error loopfuse itself reports."""
    return json.dumps({"error": {"message": text, "type": "loopfuse_transport"}}).encode()


def _header_value(value: str) -> bytes:
    try:
        return value.encode("ascii")
    except UnicodeEncodeError:
        return value.encode("utf-8")
