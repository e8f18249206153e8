"""A runtime's MCP servers (``[mcp]``): started with it, their tools in its registry.

The servers are the operator's (``docs/mcp.md``): nothing a run or a request sends can add
one. Their tools are registered under their prefixed names when the runtime starts, and a
run calls those its ``tools`` setting lists, as it does any tool. Without ``[[mcp.servers]]``
nothing here runs and the ``mcp`` SDK is never imported.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from actors.tools import ToolRegistry
from actors.tools.mcp import INSTALL_HINT, McpStartError, mcp_installed
from orchestrator.config import Config
from orchestrator.errors import ConfigError

if TYPE_CHECKING:
    from actors.tools.mcp.servers import McpServers

__all__ = ["open_mcp_tools"]


@asynccontextmanager
async def open_mcp_tools(
    config: Config, registry: ToolRegistry
) -> AsyncIterator[McpServers | None]:
    """Start ``config``'s MCP servers and add their tools to ``registry`` for the block;
    ``None`` when there are none.

    :raises ConfigError: the ``mcp`` extra is not installed, a server could not be started
        or listed (the key names the server's setting at fault), or one of its tools has the
        name of a tool already registered.
    """
    specs = config.mcp.servers
    if not specs:
        yield None
        return
    if not mcp_installed():
        raise ConfigError("mcp.servers", INSTALL_HINT)
    from actors.tools.mcp.servers import open_mcp_servers

    try:
        async with open_mcp_servers(specs) as servers:
            for index, spec in enumerate(specs):
                for tool in servers.by_server[spec.name]:
                    try:
                        registry.add(tool)
                    except ValueError:
                        raise ConfigError(
                            f"mcp.servers.{index}.prefix",
                            f"server {spec.name!r}: its tool {tool.name!r} has the name of a "
                            "tool already registered; give the server another prefix",
                        ) from None
            yield servers
    except McpStartError as exc:
        index = next(i for i, s in enumerate(specs) if s.name == exc.server)
        key = f"mcp.servers.{index}" + (f".{exc.key}" if exc.key else "")
        raise ConfigError(key, f"server {exc.server!r}: {exc.reason}") from None
