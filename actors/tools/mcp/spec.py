"""How the operator describes one MCP server (``[[mcp.servers]]``), and the start error.

This module does not import the ``mcp`` SDK: the config loader reads these types whether or
not the ``mcp`` extra is installed.

Exceptions::

    Exception
     └── McpStartError(server, key, reason)   a server could not be started or listed
"""

from __future__ import annotations

from typing import Annotated, Final, Literal

import msgspec

__all__ = [
    "MCP_TOOL_SEPARATOR",
    "McpServer",
    "McpStartError",
    "McpTransport",
]

MCP_TOOL_SEPARATOR: Final = "__"
"""Between a server's name and its tool's name in the default prefix (``git__git_status``):
tool names the model sees allow only ``[A-Za-z0-9_-]``, so no dot."""

DAY: Final = 86_400.0
RESTARTS_MAX: Final = 100
MESSAGE_BYTES_MAX: Final = 1024 * 1024 * 1024

McpTransport = Literal["stdio", "http"]

_Name = Annotated[
    str, msgspec.Meta(pattern=r"^[A-Za-z0-9_-]{1,32}$", description="1–32 of `A-Z a-z 0-9 _ -`")
]
_Prefix = Annotated[
    str, msgspec.Meta(pattern=r"^[A-Za-z0-9_-]{0,40}$", description="0–40 of `A-Z a-z 0-9 _ -`")
]
_Seconds = Annotated[float, msgspec.Meta(gt=0, le=DAY)]
_Grace = Annotated[float, msgspec.Meta(ge=0, le=DAY)]
_EnvName = Annotated[
    str, msgspec.Meta(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", description="variable name")
]


class McpStartError(Exception):
    """Server ``server`` could not be started or listed; ``key`` is the setting at fault
    (``command``, ``url``, ``tools`` …, or ``""`` for the server as a whole)."""

    def __init__(self, server: str, key: str, reason: str) -> None:
        super().__init__(f"MCP server {server!r}: {reason}")
        self.server = server
        self.key = key
        self.reason = reason


class McpServer(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One MCP server whose tools a runtime offers (an ``[[mcp.servers]]`` table).

    ``transport = "stdio"`` runs ``command`` with ``args`` (in ``cwd``, with ``env`` and the
    variables named in ``pass_env``); ``transport = "http"`` connects to ``url`` (streamable
    HTTP), sending each header of ``headers_env`` with the value of the environment variable
    it names. Secrets stay in the environment, never in the file.
    """

    name: _Name
    """The server's name in logs and errors, and the default tool prefix (``name__``);
    unique."""
    transport: McpTransport = "stdio"
    """A child process (over stdio), or a streamable-HTTP endpoint."""
    command: str = ""
    """stdio, required: the program to run, without a shell (looked up on ``PATH``)."""
    args: tuple[str, ...] = ()
    """stdio: the program's arguments."""
    cwd: str | None = None
    """stdio: the server's working directory (default: loopfuse's)."""
    env: dict[_EnvName, str] = {}
    """stdio: variables set for the server. The server inherits only ``HOME``, ``LOGNAME``,
    ``PATH``, ``SHELL``, ``TERM`` and ``USER`` of loopfuse's environment besides these."""
    pass_env: tuple[_EnvName, ...] = ()
    """stdio: names of loopfuse's environment variables passed on to the server (a key
    belongs in the environment, not the file)."""
    url: Annotated[
        str, msgspec.Meta(pattern=r"^(https?://.+)?$", description="`http://` or `https://` URL")
    ] = ""
    """http, required: the server's MCP endpoint (``http://127.0.0.1:8000/mcp``)."""
    headers_env: dict[str, _EnvName] = {}
    """http: header name → the environment variable holding its value
    (``{ Authorization = "GIT_MCP_AUTH" }``)."""
    prefix: _Prefix | None = None
    """Put before each tool's name (default ``name__``; ``""`` for none)."""
    tools: tuple[str, ...] | None = None
    """The server's tools to offer, by the server's names; unset: every tool it lists."""
    idempotent_tools: tuple[str, ...] = ()
    """Tools (the server's names) whose results a run may cache and reuse. No other MCP
    tool is cached, whatever its annotations say (docs/mcp.md)."""
    timeout_seconds: _Seconds | None = None
    """Deadline of one call of its tools; unset: the run's ``tool_timeout_seconds``."""
    start_timeout_seconds: _Seconds = 30.0
    """Starting the server, the MCP handshake and the tool listing must fit in this."""
    max_restarts: Annotated[int, msgspec.Meta(ge=0, le=RESTARTS_MAX)] = 3
    """Restarts in a row, none of which stayed up for ``min_uptime_seconds``, before the
    server is given up (its tools then answer with an error naming the cause until
    loopfuse restarts)."""
    restart_backoff_seconds: _Grace = 1.0
    """Wait before a restart, doubled after each one in a row (at most 30 s)."""
    min_uptime_seconds: _Grace = 60.0
    """A session that ends sooner after its start (or breaks the protocol) counts as a
    failed start: the restarts in a row are counted on, not started again from zero."""
    max_message_bytes: Annotated[int, msgspec.Meta(ge=1024, le=MESSAGE_BYTES_MAX)] = 4 * 1024 * 1024
    """The largest message read from the server, refused before more than this is read:
    a line on stdio (a tool list, a result; longer is a protocol error), a JSON body or a
    server-sent event over HTTP (longer fails that call)."""

    def __post_init__(self) -> None:
        if self.transport == "stdio":
            if not self.command:
                raise ValueError("`command` is required for transport 'stdio'")
            if self.url or self.headers_env:
                raise ValueError("`url` and `headers_env` are for transport 'http'")
        elif not self.url:
            raise ValueError("`url` is required for transport 'http'")
        elif self.command or self.args or self.cwd or self.env or self.pass_env:
            raise ValueError("`command`, `args`, `cwd`, `env` and `pass_env` are for 'stdio'")
        if self.tools is not None:
            unknown = [name for name in self.idempotent_tools if name not in self.tools]
            if unknown:
                raise ValueError(f"`idempotent_tools` names tools not in `tools`: {unknown}")

    @property
    def tool_prefix(self) -> str:
        """What goes before each of its tools' names."""
        return self.prefix if self.prefix is not None else self.name + MCP_TOOL_SEPARATOR
