"""MCP tools: the tools of Model Context Protocol servers, offered like any other tool.

This package's own names need no ``mcp`` SDK (the config reads them whether or not the
``mcp`` extra is installed); its modules that talk to servers import it and are imported
only when servers are configured:

- :mod:`actors.tools.mcp.spec`: :class:`McpServer` (an ``[[mcp.servers]]`` table) and
  :class:`McpStartError` (its exception tree);
- :mod:`actors.tools.mcp.connection`: one server's session, restarted when it dies;
- :mod:`actors.tools.mcp.adapter`: a listed MCP tool as a registry tool;
- :mod:`actors.tools.mcp.servers`: ``open_mcp_servers``, a runtime's servers and tools.
"""

from __future__ import annotations

import importlib.util

from actors.tools.mcp.spec import McpServer, McpStartError

__all__ = ["INSTALL_HINT", "McpServer", "McpStartError", "mcp_installed"]

INSTALL_HINT = "MCP servers need the mcp extra: pip install 'loopfuse[mcp]'"


def mcp_installed() -> bool:
    """Whether the ``mcp`` SDK can be imported (the ``loopfuse[mcp]`` extra)."""
    try:
        return importlib.util.find_spec("mcp") is not None
    except (ImportError, ValueError):
        return False
