"""One MCP server for a runtime's life: started, listed, called, restarted when it dies.

:meth:`McpConnection.run` owns the server's client session (the official ``mcp`` SDK, on
anyio) in the task that runs it: it starts the server (a child process over stdio, or a
streamable-HTTP connection), makes the MCP handshake, lists the tools, and hands the
listing to ``task_status.started``. A first start that fails raises
:class:`~actors.tools.mcp.spec.McpStartError` instead, naming the setting and the reason.

While the session is up, :meth:`McpConnection.call_tool` sends calls over it from any task.
When the connection ends (the process exited, a call found it closed, the server broke the
protocol: for stdio, a line over ``max_message_bytes``, not UTF-8 or not JSON-RPC, read
through :mod:`actors.tools.mcp.stdio`), calls in flight fail at once with that cause and
``run`` starts the server again under the restart policy (``docs/mcp.md``): backoff,
``max_restarts`` in a row, then given up. Calls made meanwhile wait for the new session
within their own deadline; when ``run`` ends, waiting calls get an error.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from types import TracebackType
from typing import IO, Any, Final, Literal, Self

import anyio
import httpx2
import mcp_types
from anyio.abc import TaskStatus
from mcp import ClientSession, MCPError, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.message import SessionMessage

from actors.tools.errors import ToolError
from actors.tools.mcp.http_bounds import IDENTITY, bounded_responses
from actors.tools.mcp.spec import McpServer, McpStartError
from actors.tools.mcp.stdio import open_stdio_transport

__all__ = [
    "BACKOFF_CAP_SECONDS",
    "LIST_PAGES_MAX",
    "McpConnection",
    "McpStatus",
    "start_error",
]

logger = logging.getLogger("loopfuse.mcp")

BACKOFF_CAP_SECONDS: Final = 30.0
LIST_PAGES_MAX: Final = 100
"""Pages of ``tools/list`` read at most (a server that paginates forever cannot hang a start)."""
STDERR_TAIL_BYTES: Final = 2_000
"""How much of the end of a stdio server's stderr an error quotes."""
HTTP_TIMEOUT: Final = httpx2.Timeout(30.0, read=300.0)
"""The SDK's own defaults: a response stream may stay open for long."""

McpStatus = Literal["starting", "up", "restarting", "down", "closed"]
UNAVAILABLE: Final = "mcp_unavailable"
"""The :class:`ToolError` kind of a call that could not reach its server."""
_SSE_FAILED: Final = "SSE stream failed"
"""How the SDK's streamable-HTTP transport begins the error it answers a request with when
that request's event stream broke (``httpx2.SSEError``), not the connection."""
PROTOCOL_ERROR: Final = "mcp_error"
"""The :class:`ToolError` kind of a call whose server broke the protocol or answered with an
error (a protocol error, an ``isError`` result)."""


@dataclass(slots=True, eq=False)
class _Attempt:
    """One start of the server: what broke the protocol in it ("" if nothing did)."""

    protocol_error: str = ""


class McpConnection:
    """The session with one MCP server (see the module docstring).

    :param spec: the operator's description of the server.
    :param environ: where ``pass_env`` and ``headers_env`` values are read.
    """

    def __init__(self, spec: McpServer, *, environ: Mapping[str, str] | None = None) -> None:
        self.spec = spec
        self._environ = os.environ if environ is None else environ
        self.status: McpStatus = "starting"
        self._session: ClientSession | None = None
        self._changed = anyio.Event()
        self._lost: anyio.Event | None = None
        self._errlog: IO[str] | None = None
        self._attempt = _Attempt()
        self.cause = ""
        """Why the server last went away ("" if it never did)."""
        self.restarts = 0
        """Restarts that brought the server back."""

    async def wait_changed(self) -> McpStatus:
        """Wait for the next change of :attr:`status` (a restart goes through
        ``restarting`` to ``up``); the status it changed to."""
        await self._changed.wait()
        return self.status

    # ------------------------------------------------------------------ lifecycle

    async def run(self, *, task_status: TaskStatus[list[mcp_types.Tool]]) -> None:
        """Keep the server running until cancelled (see the module docstring).

        :raises McpStartError: the first start failed.
        """
        spec = self.spec
        started = False
        in_a_row = 0  # restarts since a session last stayed up for min_uptime_seconds
        try:
            while True:
                lost = anyio.Event()
                was_up = False
                try:
                    async with self._open(lost) as (session, tools):
                        was_up = True
                        up_at = anyio.current_time()
                        if started:
                            self.restarts += 1
                            logger.info("MCP server %r: restarted", spec.name)
                        self._lost = lost
                        self._set("up", session)
                        if not started:
                            started = True
                            task_status.started(tools)
                        await lost.wait()
                        self._set("restarting")
                        self.cause = self._closed_cause()
                        uptime = anyio.current_time() - up_at
                        if uptime >= spec.min_uptime_seconds and not self._attempt.protocol_error:
                            in_a_row = 0
                except Exception as exc:  # through the SDK's task groups: maybe grouped
                    error = start_error(spec, exc)
                    if not started:
                        raise error from None
                    if not was_up:  # a failed restart (an error closing a lost one is not)
                        self.cause = error.reason
                if in_a_row >= spec.max_restarts:
                    logger.error(
                        "MCP server %r: given up after %d restart(s) in a row, none of which "
                        "stayed up for %g s: %s",
                        spec.name,
                        in_a_row,
                        spec.min_uptime_seconds,
                        self.cause,
                    )
                    self._set("down")
                    await anyio.sleep_forever()
                in_a_row += 1
                logger.warning(
                    "MCP server %r: restarting it (%d of at most %d in a row): %s",
                    spec.name,
                    in_a_row,
                    spec.max_restarts,
                    self.cause,
                )
                self._set("restarting")
                backoff = spec.restart_backoff_seconds * 2 ** (in_a_row - 1)
                await anyio.sleep(min(backoff, BACKOFF_CAP_SECONDS))
        finally:
            self._set("closed")
            if not self.cause:
                self.cause = "loopfuse stopped the server"

    def _set(self, status: McpStatus, session: ClientSession | None = None) -> None:
        self.status = status
        self._session = session
        self._changed.set()
        self._changed = anyio.Event()

    @asynccontextmanager
    async def _open(
        self, lost: anyio.Event
    ) -> AsyncIterator[tuple[ClientSession, list[mcp_types.Tool]]]:
        """A started, initialized session and the server's tools; ``lost`` is set when the
        connection ends."""
        spec = self.spec
        attempt = self._attempt = _Attempt()
        read: Any  # the two transports' stream types (the SDK names their protocol privately)
        write: Any
        async with AsyncExitStack() as stack:
            if spec.transport == "stdio":
                errlog = self._errlog = stack.enter_context(
                    tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace")  # noqa: SIM115
                )
                missing = [name for name in spec.pass_env if name not in self._environ]
                if missing:
                    raise McpStartError(
                        spec.name,
                        "pass_env",
                        f"environment variable(s) {', '.join(missing)} not set",
                    )
                env = {**{name: self._environ[name] for name in spec.pass_env}, **spec.env}
                params = StdioServerParameters(
                    command=spec.command, args=list(spec.args), env=env, cwd=spec.cwd
                )
                transport = open_stdio_transport(
                    params,
                    errlog,
                    max_message_bytes=spec.max_message_bytes,
                    on_protocol_error=lambda problem: self._broke_protocol(attempt, problem),
                )
                try:
                    read, write = await stack.enter_async_context(transport)
                except OSError as exc:
                    if spec.cwd is not None and not await anyio.Path(spec.cwd).is_dir():
                        # the spawn's ENOENT is the directory's, not the command's
                        raise McpStartError(
                            spec.name, "cwd", f"no such directory {spec.cwd!r}"
                        ) from None
                    why = exc.strerror or str(exc)
                    raise McpStartError(
                        spec.name, "command", f"cannot run {spec.command!r}: {why}"
                    ) from None
            else:
                headers = {}
                for header, variable in spec.headers_env.items():
                    value = self._environ.get(variable)
                    if value is None:
                        raise McpStartError(
                            spec.name,
                            "headers_env",
                            f"environment variable {variable} (header {header}) not set",
                        )
                    headers[header] = value
                client = await stack.enter_async_context(
                    httpx2.AsyncClient(
                        headers={**IDENTITY, **headers},
                        timeout=HTTP_TIMEOUT,
                        event_hooks={"response": [bounded_responses(spec.max_message_bytes)]},
                    )
                )
                read, write = await stack.enter_async_context(
                    streamable_http_client(
                        spec.url, http_client=client, max_sse_event_size=spec.max_message_bytes
                    )
                )
            session = await stack.enter_async_context(
                ClientSession(_WatchedStream(read, lost), write)
            )
            try:
                with anyio.fail_after(spec.start_timeout_seconds):
                    await session.initialize()
                    tools = await _list_tools(session, spec)
            except TimeoutError:
                raise McpStartError(
                    spec.name,
                    "start_timeout_seconds",
                    f"no answer to the MCP handshake and tool listing within "
                    f"{spec.start_timeout_seconds:g} s{self._stderr_tail()}",
                ) from None
            except MCPError as exc:
                if exc.code == mcp_types.CONNECTION_CLOSED:
                    why = f"it went away during start-up: {self._closed_cause()}"
                else:
                    why = f"{_mcp_error(exc)} during start-up{self._stderr_tail()}"
                raise McpStartError(spec.name, "", why) from None
            yield session, tools

    def _broke_protocol(self, attempt: _Attempt, problem: str) -> None:
        attempt.protocol_error = problem
        logger.error("MCP server %r broke the protocol: %s", self.spec.name, problem)

    # ------------------------------------------------------------------ calls

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> mcp_types.CallToolResult:
        """Call the server's tool ``name``; wait for the server while it (re)starts.

        :raises ToolError: kind ``mcp_unavailable`` when the server is down or went away
            during the call, ``mcp_error`` when it answered with a protocol error.
        """
        session = self._session
        while session is None:
            if self.status in ("down", "closed"):
                raise ToolError(
                    UNAVAILABLE,
                    f"MCP server {self.spec.name!r} is not running ({self.status}): {self.cause}",
                )
            await self._changed.wait()
            session = self._session
        attempt = self._attempt
        try:
            return await session.call_tool(name, arguments)
        except MCPError as exc:
            server = f"MCP server {self.spec.name!r}"
            if exc.code != mcp_types.CONNECTION_CLOSED:
                raise ToolError(PROTOCOL_ERROR, f"{server}: {_mcp_error(exc)}") from None
            if exc.message.startswith(_SSE_FAILED):
                # One response's event stream broke (an event over max_message_bytes, not
                # SSE): that call failed, the session did not.
                raise ToolError(PROTOCOL_ERROR, f"{server}: {exc.message}") from None
            self._connection_lost(session)
            if attempt.protocol_error:
                raise ToolError(
                    PROTOCOL_ERROR,
                    f"{server} broke the protocol ({attempt.protocol_error}); "
                    "loopfuse is restarting it",
                ) from None
            raise ToolError(
                UNAVAILABLE,
                f"{server} went away during the call ({self._closed_cause()}); "
                "loopfuse is restarting it",
            ) from None
        except (httpx2.TransportError, anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
            self._connection_lost(session)
            raise ToolError(
                UNAVAILABLE,
                f"MCP server {self.spec.name!r} could not be reached ({_describe(exc)}); "
                "loopfuse is reconnecting",
            ) from None

    def _connection_lost(self, session: ClientSession) -> None:
        if session is self._session and self._lost is not None:
            self._lost.set()

    def _closed_cause(self) -> str:
        if self._attempt.protocol_error:
            return f"it broke the protocol: {self._attempt.protocol_error}"
        if self.spec.transport == "http":
            return "the connection to the server ended"
        return "the server process closed its output or exited" + self._stderr_tail()

    def _stderr_tail(self) -> str:
        """The end of a stdio server's stderr, as ``; its stderr ended with: …``."""
        errlog = self._errlog
        if errlog is None or errlog.closed:
            return ""
        try:
            fd = errlog.fileno()
            offset = max(os.fstat(fd).st_size - STDERR_TAIL_BYTES, 0)
            tail = os.pread(fd, STDERR_TAIL_BYTES, offset).decode("utf-8", "replace")
            if offset:  # from the first whole line on
                tail = tail.partition("\n")[2]
            tail = tail.strip()
        except OSError:
            return ""
        return f"; its stderr ended with: {tail}" if tail else "; its stderr is empty"


async def _list_tools(session: ClientSession, spec: McpServer) -> list[mcp_types.Tool]:
    """Every page of the server's tool list, at most :data:`LIST_PAGES_MAX` pages and
    ``max_message_bytes`` in all (each page is bounded as it is read; their sum here).

    :raises McpStartError: the pages add up to more than ``max_message_bytes``.
    """
    tools: list[mcp_types.Tool] = []
    size, params = 0, None
    for page in range(1, LIST_PAGES_MAX + 1):
        listing = await session.list_tools(params=params)
        tools.extend(listing.tools)
        size += len(listing.model_dump_json(by_alias=True, exclude_unset=True))
        if page > 1 and size > spec.max_message_bytes:
            raise McpStartError(
                spec.name,
                "max_message_bytes",
                f"its tool list is longer than max_message_bytes ({spec.max_message_bytes} "
                f"bytes) after {page} pages",
            )
        if listing.next_cursor is None:
            break
        params = mcp_types.PaginatedRequestParams(cursor=listing.next_cursor)
    return tools


def _mcp_error(exc: MCPError) -> str:
    return f"error {exc.code}: {exc.message}"


def start_error(spec: McpServer, exc: Exception) -> McpStartError:
    """``exc`` (raised while starting ``spec``'s server, maybe inside exception groups of
    one) as the :class:`McpStartError` it is or stands for."""
    leaf: BaseException = exc
    while isinstance(leaf, BaseExceptionGroup) and len(leaf.exceptions) == 1:
        leaf = leaf.exceptions[0]
    if isinstance(leaf, McpStartError):
        return leaf
    return McpStartError(spec.name, "", _describe(leaf))


def _describe(exc: BaseException) -> str:
    if isinstance(exc, MCPError):
        return _mcp_error(exc)
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class _WatchedStream:
    """The transport's read stream, setting ``lost`` when it ends: the dispatcher of the
    SDK's session reads it until the server goes away, which nothing else reports."""

    __slots__ = ("_inner", "_lost")

    def __init__(self, inner: Any, lost: anyio.Event) -> None:
        self._inner = inner
        self._lost = lost

    @property
    def last_context(self) -> Any:  # the SDK reads it when the transport provides it
        return getattr(self._inner, "last_context", None)

    async def receive(self) -> SessionMessage | Exception:
        try:
            item: SessionMessage | Exception = await self._inner.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._lost.set()
            raise
        return item

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> SessionMessage | Exception:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        self._lost.set()
        await self._inner.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
