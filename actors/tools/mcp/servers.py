"""A runtime's MCP servers: all started at once, their tools offered, all stopped at the end.

::

    async with open_mcp_servers(specs) as servers:
        for tool in servers.tools:
            registry.add(tool)
        ...  # runs call them through the tool executor

Every server is started (and its tools listed) before :func:`open_mcp_servers` returns; the
first that fails raises :class:`~actors.tools.mcp.spec.McpStartError` and the others are
stopped. A listed tool that cannot be offered (a name that is not a valid tool name with
the prefix, an input schema that is not a usable object schema) is refused with a warning
in the log and kept in :attr:`McpServers.refused`; the server's other tools are offered.
A tool named in the server's ``tools`` that it does not list, or that is refused, fails
the start. Leaving the block stops every server (its connections' task group is
cancelled; the SDK closes each stdio server's input, then terminates it).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, NamedTuple

import anyio
import mcp_types
from anyio.abc import TaskGroup

from actors.tools.mcp.adapter import mcp_tool
from actors.tools.mcp.connection import McpConnection, start_error
from actors.tools.mcp.spec import McpServer, McpStartError
from actors.tools.registry import Tool

__all__ = ["McpServers", "RefusedTool", "open_mcp_servers"]

logger = logging.getLogger("loopfuse.mcp")


class RefusedTool(NamedTuple):
    """A tool a server listed that is not offered to the model, and why."""

    server: str
    tool: str
    reason: str


class McpServers(NamedTuple):
    """The running servers and what they offer."""

    connections: tuple[McpConnection, ...]
    tools: tuple[Tool[dict[str, Any]], ...]
    """Every server's offered tools, in config order."""
    refused: tuple[RefusedTool, ...]
    by_server: dict[str, tuple[Tool[dict[str, Any]], ...]]
    """The offered tools of each server, by its name."""

    def connection(self, name: str) -> McpConnection:
        """The connection of the server called ``name``.

        :raises KeyError: no such server.
        """
        return {c.spec.name: c for c in reversed(self.connections)}[name]  # the first of a name


@asynccontextmanager
async def open_mcp_servers(
    specs: Sequence[McpServer], *, environ: Mapping[str, str] | None = None
) -> AsyncIterator[McpServers]:
    """Start every server of ``specs`` and yield them with their tools (see the module
    docstring).

    :raises McpStartError: a server could not be started or listed, or a tool its
        ``tools`` names is not offered.
    """
    connections = tuple(McpConnection(spec, environ=environ) for spec in specs)
    error: BaseException | None = None
    try:
        async with anyio.create_task_group() as tg:
            servers = await _start_all(tg, connections)
            try:
                yield servers
            except BaseException as exc:  # re-raised below, outside the task group
                error = exc
            finally:
                tg.cancel_scope.cancel()
    except* McpStartError as group:  # only McpStartError leaves: raise the first one
        first: BaseException = group
        while isinstance(first, BaseExceptionGroup):
            first = first.exceptions[0]
        raise first from None
    if error is not None:
        raise error  # unwrapped: the body's exception, not an exception group


async def _start_all(tg: TaskGroup, connections: tuple[McpConnection, ...]) -> McpServers:
    """Start the servers side by side in ``tg`` and list their tools. On a failure, the
    first failing server in config order is the one reported."""
    listings: dict[int, list[mcp_types.Tool]] = {}
    failures: dict[int, McpStartError] = {}

    async def start(index: int, connection: McpConnection) -> None:
        try:
            listings[index] = await tg.start(connection.run)
        except Exception as exc:
            failures[index] = start_error(connection.spec, exc)

    async with anyio.create_task_group() as starting:
        for index, connection in enumerate(connections):
            starting.start_soon(start, index, connection)
    if failures:
        raise failures[min(failures)]
    by_server: dict[str, tuple[Tool[dict[str, Any]], ...]] = {}
    refused: list[RefusedTool] = []
    for index, connection in enumerate(connections):
        # The tools its ``tools`` setting wants, made into registry tools, and those refused;
        # a tool named in ``tools`` that is not listed or is refused fails the start.
        spec = connection.spec
        wanted = spec.tools
        listed = listings[index]
        names = {tool.name for tool in listed}
        if wanted is not None and (missing := [name for name in wanted if name not in names]):
            raise McpStartError(
                spec.name,
                "tools",
                f"the server lists no tool {', '.join(map(repr, missing))} "
                f"(it lists: {', '.join(sorted(names)) or 'none'})",
            )
        offered: list[Tool[dict[str, Any]]] = []
        for listed_tool in listed:
            if wanted is not None and listed_tool.name not in wanted:
                continue
            try:
                offered.append(mcp_tool(connection, listed_tool))
            except ValueError as exc:
                if wanted is not None:
                    raise McpStartError(
                        spec.name, "tools", f"tool {listed_tool.name!r} cannot be offered: {exc}"
                    ) from None
                logger.warning(
                    "MCP server %r: tool %r is not offered to the model: %s",
                    spec.name,
                    listed_tool.name,
                    exc,
                )
                refused.append(RefusedTool(spec.name, listed_tool.name, str(exc)))
        by_server[spec.name] = tuple(offered)
    tools = tuple(tool for offered in by_server.values() for tool in offered)
    return McpServers(connections, tools, tuple(refused), by_server)
