"""The model endpoint's HTTP client: chat-completions POSTs through a connection pool the
transport owns, with the request head made once per transport.

The only module of the packages that imports ``aiohttp`` (ruff's banned-api): the headers,
proxies, cookies, redirects, content codings, bounds and timeouts it applies on the wire are
those ``docs/transport.md`` lists. Failures come out as the ``openai`` SDK raises them:
``APIStatusError`` subclasses for a 4xx/5xx (any redirect not followed included),
``APITimeoutError``/``APIConnectionError`` raised from the ``aiohttp`` error for a connection
that fails (:mod:`actors.llm.sdk_errors`).
"""

from __future__ import annotations

import base64
import contextlib
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
from typing import Final, NamedTuple
from urllib.parse import unquote, urljoin, urlsplit

import aiohttp
import anyio
import httpx2

from actors.llm.sdk_errors import connection_error, status_error
from actors.llm.settings import NO_API_KEY, EndpointSettings

__all__ = [
    "COMPLETIONS",
    "CORE_ERRORS",
    "MAX_BODY_BYTES",
    "MAX_REDIRECTS",
    "RUN_ID_HEADER",
    "BrokenBody",
    "ChatTransport",
    "Headers",
    "Proxy",
    "Reply",
    "environment_proxy",
]

RUN_ID_HEADER: Final = "X-Loopfuse-Run-Id"
"""Request header naming the run, for server logs and scripted simulators."""

COMPLETIONS: Final = "/chat/completions"
"""The path of the chat-completions endpoint, under the base URL."""

BrokenBody: Final = aiohttp.ClientPayloadError
"""Raised for a body past a bound, undecodable or of a coding not asked for (and by the
stream reader for an event-stream line past its bound): a broken connection's class."""

CORE_ERRORS: Final = (aiohttp.ClientError, TimeoutError, OSError)
"""What sending a request or reading a response may raise when the connection fails
(``ssl.SSLError`` is an ``OSError``; aiohttp's timeouts are ``TimeoutError``)."""

MAX_REDIRECTS: Final = 5
"""307/308 redirects to the same origin followed per request."""

ERROR_BODY_LIMIT: Final = 1 << 20
"""Bytes of a 4xx/5xx body read (the rest is dropped with the connection)."""

MAX_BODY_BYTES: Final = 64 << 20
"""Bytes of a 2xx body, after any content coding is undone, read at most; a longer body
raises :data:`BrokenBody` (a compressed body cannot inflate without bound)."""

MAX_CONNECTIONS: Final = 1000
KEEPALIVE_SECONDS: Final = 5.0
"""The pool's limits (the ``openai`` SDK's defaults)."""

Headers = tuple[tuple[bytes, bytes], ...]
"""Request headers added to the transport's own, as (name, value) bytes."""

_REDACTED: Final = b"***"
_REDIRECTS: Final = frozenset({307, 308})
_INFLATE_PIECE: Final = 1 << 20
_DECODERS: Final = {b"gzip": 16 + zlib.MAX_WBITS, b"x-gzip": 16 + zlib.MAX_WBITS, b"deflate": 0}


try:
    _USER_AGENT = f"loopfuse/{importlib.metadata.version('loopfuse')}".encode()
except importlib.metadata.PackageNotFoundError:  # run from a source tree
    _USER_AGENT = b"loopfuse/0"


class Proxy(NamedTuple):
    """A proxy the environment names: its URL (no credentials) and its credentials."""

    url: str
    auth: tuple[str, str] | None

    @property
    def headers(self) -> dict[str, str]:
        """``Proxy-Authorization: Basic`` for :attr:`auth` (none without credentials)."""
        if self.auth is None:
            return {}
        pair = base64.b64encode(":".join(self.auth).encode()).decode("ascii")
        return {"Proxy-Authorization": f"Basic {pair}"}


def environment_proxy(scheme: str, host: str) -> Proxy | None:
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
    return Proxy(f"{parts.scheme}://{address}{parts.path}", auth)


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    return (parts.scheme, parts.hostname or "", parts.port)


class ChatTransport:
    """Sends POST requests to :data:`COMPLETIONS` under an endpoint's base URL; one
    connection pool."""

    def __init__(
        self, endpoint: EndpointSettings, *, ssl_context: ssl.SSLContext | None = None
    ) -> None:
        parts = urlsplit(endpoint.base_url)
        address = parts.netloc.rpartition("@")[2]  # credentials become the Authorization
        query = f"?{parts.query}" if parts.query else ""
        self.url = f"{parts.scheme}://{address}{parts.path.rstrip('/')}{COMPLETIONS}{query}"
        """The URL requests go to (without credentials)."""
        self._timeout = aiohttp.ClientTimeout(
            connect=endpoint.timeout_seconds,  # waiting for the pool, and connecting
            sock_connect=endpoint.connect_timeout_seconds,
            sock_read=endpoint.timeout_seconds,
        )
        self._fixed = _fixed_headers(endpoint, parts.username, parts.password)
        extra = [name.lower().encode("latin-1") for name in endpoint.extra_headers]
        self._secrets = frozenset({b"authorization", b"cookie", *extra})
        self._cookies: dict[str, str] = {}
        self._cookie: tuple[tuple[str, str], ...] = ()  # the Cookie header, if any
        self._ssl_context = ssl_context or httpx2.create_ssl_context()
        proxy = environment_proxy(parts.scheme, parts.hostname or "")
        self._proxy = proxy.url if proxy else None
        # Proxy credentials: on the CONNECT for an https endpoint, on each request for http.
        secure = parts.scheme == "https"
        self._proxy_headers = proxy.headers if proxy and secure else None
        # Proxied, the fixed headers go with each request, not as the session's: aiohttp
        # adds a session's headers to a proxy's CONNECT too (the key would reach the proxy).
        fixed = [(k.decode("latin-1"), v.decode()) for k, v in self._fixed]
        if proxy and not secure:
            fixed.extend(proxy.headers.items())
        self._proxied = tuple(fixed) if proxy else ()
        self._defaults = None if proxy else fixed
        self._session: aiohttp.ClientSession | None = None  # made on the loop, at first use
        self.is_closed = False  # aclose was called

    def __repr__(self) -> str:
        return f"ChatTransport({self.url!r})"

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
        kept (for a retry: ``docs/transport.md``)."""
        if self.is_closed:
            raise RuntimeError("the model transport has been closed")
        if not fresh:
            session = self._session
            if session is None:
                session = self._session = self._new_session(MAX_CONNECTIONS)
            return await self._send(session, body, run_id, stream, headers)
        session = self._new_session(1)
        try:
            reply = await self._send(session, body, run_id, stream, headers)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await session.close()
            raise
        if stream:
            reply.session = session
        else:
            await session.close()
        return reply

    async def _send(
        self,
        session: aiohttp.ClientSession,
        body: bytes,
        run_id: str,
        stream: bool,
        headers: Headers,
    ) -> Reply:
        own = [*self._proxied, *self._cookie, (RUN_ID_HEADER, run_id)]
        own.extend([(k.decode("latin-1"), v.decode("latin-1")) for k, v in headers])
        url = self.url
        for _ in range(MAX_REDIRECTS + 1):
            try:
                response = await session.post(
                    url,
                    data=body,
                    headers=own,
                    allow_redirects=False,
                    proxy=self._proxy,
                    proxy_headers=self._proxy_headers,
                )
            except (*CORE_ERRORS, ValueError) as exc:  # ValueError: a header aiohttp refuses
                raise connection_error(exc, self.error_request(run_id)) from exc
            answer = await self._answer(response, run_id, stream, url)
            if isinstance(answer, Reply):
                return answer
            url = answer
        raise status_error(
            response.status,
            response.raw_headers,
            _message(f"more than {MAX_REDIRECTS} redirects"),
            self.error_request(run_id),
        )

    async def _answer(
        self, response: aiohttp.ClientResponse, run_id: str, stream: bool, url: str
    ) -> Reply | str:
        """A 2xx as a :class:`Reply` (read whole unless ``stream``); where a redirect to
        follow leads (its body read); any other status raised as the SDK's error."""
        status = response.status
        head = response.headers
        for value in head.getall("Set-Cookie", ()):
            self._keep_cookie(value)
        encoding = head.get("Content-Encoding")
        coding = encoding.strip().lower().encode("latin-1") if encoding else None
        reply = Reply(self, response, run_id, coding)
        if 200 <= status < 300:
            if not stream:  # read whole and closed: the connection is free again
                reply.content = await _read(reply)
            return reply
        location = head.get("Location")
        content = await _read(reply, ERROR_BODY_LIMIT)
        if status in _REDIRECTS and location is not None:
            following = urljoin(url, location)
            if _origin(following) == _origin(url):
                return following
        if 300 <= status < 400:
            content = _message(
                f"the endpoint redirected ({status}) to {location or ''!r}; only "
                "307/308 within the same origin are followed: set model.base_url to the "
                "new address"
            )
        raise status_error(status, response.raw_headers, content, self.error_request(run_id))

    def error_request(self, run_id: str) -> httpx2.Request:
        """This transport's request as an ``httpx2.Request`` for an SDK exception, its
        credentials (authorization, cookies, operator headers) replaced by ``***``."""
        secrets = self._secrets
        headers = [
            (name, _REDACTED if name.lower() in secrets else value) for name, value in self._fixed
        ]
        if self._cookie:
            headers.append((b"Cookie", _REDACTED))
        headers.append((RUN_ID_HEADER.encode(), run_id.encode()))
        return httpx2.Request("POST", self.url, headers=headers)

    async def aclose(self) -> None:
        """Close every connection; later requests raise ``RuntimeError``."""
        self.is_closed = True
        if self._session is not None:
            await self._session.close()

    # ------------------------------------------------------------------ internals

    def _new_session(self, connections: int) -> aiohttp.ClientSession:
        if connections == 1:  # a fresh request's own: closed with its reply
            connector = aiohttp.TCPConnector(ssl=self._ssl_context, limit=1, force_close=True)
        else:
            connector = aiohttp.TCPConnector(
                ssl=self._ssl_context, limit=connections, keepalive_timeout=KEEPALIVE_SECONDS
            )
        return aiohttp.ClientSession(
            connector=connector,
            headers=self._defaults,
            timeout=self._timeout,
            auto_decompress=False,  # decoded here, in bounded pieces
            cookie_jar=aiohttp.DummyCookieJar(),  # kept here: every request goes to one URL
        )

    def _keep_cookie(self, value: str) -> None:
        """Remember (or forget) a cookie the server set; sent on later requests."""
        jar: http.cookies.SimpleCookie = http.cookies.SimpleCookie()
        try:
            jar.load(value)
        except http.cookies.CookieError:
            return
        for name, morsel in jar.items():
            if _expired(morsel):
                self._cookies.pop(name, None)
            else:
                self._cookies[name] = morsel.value
        cookie = "; ".join(f"{k}={v}" for k, v in self._cookies.items())
        self._cookie = (("Cookie", cookie),) if cookie else ()


class Reply:
    """A 2xx response: what :func:`actors.llm.stream.read_chunks` and the caller read."""

    __slots__ = (
        "_encoding",
        "_response",
        "_run_id",
        "_transport",
        "content",
        "http_version",
        "session",
    )

    def __init__(
        self,
        transport: ChatTransport,
        response: aiohttp.ClientResponse,
        run_id: str,
        encoding: bytes | None = None,
    ) -> None:
        self._transport = transport
        self._response = response
        self._run_id = run_id
        self._encoding = encoding
        self.content = b""  # the body, once read (a reply that was not streamed)
        self.session: aiohttp.ClientSession | None = None  # its own connection, closed with it
        version = response.version or aiohttp.HttpVersion11
        self.http_version = f"HTTP/{version.major}.{version.minor}"

    def aiter_bytes(self) -> AsyncIterator[bytes]:
        """The body, read by read (raises :data:`CORE_ERRORS` when the connection fails)."""
        return _body(self._response.content, self._encoding)

    def drained_nowait(self) -> bool:
        """Drop what has arrived of the body without waiting; whether it has ended (the
        usual case after ``[DONE]``: the stream reader then waits for no rest)."""
        content = self._response.content
        try:
            while not content.at_eof() and content.read_nowait():
                pass
        except CORE_ERRORS:
            return True  # the answer is complete: a failure after it is no failure of it
        return content.at_eof()

    def close_now(self) -> bool:
        """:meth:`aclose` without waiting, if nothing is left to wait for (the reply has no
        connection of its own to close); whether it was."""
        if self.session is not None:
            return False
        self._response.release()
        return True

    async def aclose(self) -> None:
        """Done with the body: the connection goes back to the pool if it was read to its
        end, else it is closed."""
        self._response.release()
        if self.session is not None:
            await self.session.close()

    @property
    def request(self) -> httpx2.Request:
        """The request, for an SDK exception (credentials redacted; made when needed)."""
        return self._transport.error_request(self._run_id)


async def _read(reply: Reply, limit: int | None = None) -> bytes:
    """The body, whole or its first ``limit`` bytes (the rest is dropped with the
    connection); the reply closed."""
    content = bytearray()
    try:
        async for data in reply.aiter_bytes():
            content += data
            if limit is not None and len(content) >= limit:
                break
    except CORE_ERRORS as exc:
        raise connection_error(exc, reply.request) from exc
    finally:
        await reply.aclose()
    return bytes(content[:limit])


def _body(content: aiohttp.StreamReader, encoding: bytes | None) -> AsyncIterator[bytes]:
    """The body, read by read, a content coding undone; ended by :data:`BrokenBody` past
    :data:`MAX_BODY_BYTES`."""
    if encoding and encoding != b"identity":
        return _decoded(content, encoding)
    return _BodyReads(content)  # the usual body: no generator frame


class _BodyReads:
    """An identity body as a plain iterator: each read is one coroutine frame over
    ``readany``, not an async generator's (fewer frames resumed per wake-up)."""

    __slots__ = ("_content", "_size")

    def __init__(self, content: aiohttp.StreamReader) -> None:
        self._content = content
        self._size = 0

    def __aiter__(self) -> _BodyReads:
        return self

    async def __anext__(self) -> bytes:
        data = await self._content.readany()
        if not data:
            raise StopAsyncIteration
        self._size += len(data)
        if self._size > MAX_BODY_BYTES:
            raise BrokenBody(f"the response body is longer than {MAX_BODY_BYTES} bytes")
        return data


async def _decoded(content: aiohttp.StreamReader, encoding: bytes) -> AsyncIterator[bytes]:
    """The body with a gzip or deflate content coding undone (bounded as :func:`_body` says)."""
    too_long = f"the response body is longer than {MAX_BODY_BYTES} bytes (decoded)"
    wbits = _DECODERS.get(encoding)
    if wbits is None:
        raise BrokenBody(
            f"the response is encoded as {encoding.decode('latin-1')!r} (asked for identity)"
        )
    decoder = zlib.decompressobj(wbits) if wbits else None
    size = 0
    while data := await content.readany():
        if decoder is None:  # deflate: zlib-wrapped, or raw as some servers send it
            raw = data[:1] and (data[0] & 0x0F) != 8
            decoder = zlib.decompressobj(-zlib.MAX_WBITS if raw else zlib.MAX_WBITS)
        while data:  # in bounded pieces: a small read may inflate to a great deal
            try:
                out = decoder.decompress(data, _INFLATE_PIECE)
            except zlib.error as exc:
                raise BrokenBody(f"undecodable {encoding!r} body: {exc}") from exc
            data = decoder.unconsumed_tail
            size += len(out)
            if size > MAX_BODY_BYTES:
                raise BrokenBody(too_long)
            if out:
                yield out
    if decoder is not None and (rest := decoder.flush()):
        if size + len(rest) > MAX_BODY_BYTES:
            raise BrokenBody(too_long)
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
            headers[name.lower()] = (name.encode("ascii"), value.encode())
    for name, value in endpoint.extra_headers.items():
        headers[name.lower()] = (name.encode("latin-1"), value.encode())
    return list(headers.values())


def _expired(morsel: http.cookies.Morsel[str]) -> bool:
    max_age, expires = morsel["max-age"], morsel["expires"]
    with contextlib.suppress(TypeError, ValueError):  # an unreadable limit: kept, as if none
        if max_age:
            return int(max_age) <= 0
        if expires:
            return email.utils.parsedate_to_datetime(expires).timestamp() <= time.time()
    return False


def _message(text: str) -> bytes:
    """An error body in the OpenAI shape, for an error loopfuse itself reports."""
    return json.dumps({"error": {"message": text, "type": "loopfuse_transport"}}).encode()
