"""An MCP server (the SDK's MCPServer, formerly FastMCP) whose tools misbehave on purpose.

Run as ``python tests/mcp_fault_server.py`` (stdio) or with ``--http`` (streamable HTTP on
127.0.0.1, on an ephemeral port it prints, alone on the first line of its output, once
connections are accepted; ``--http-json`` answers with JSON bodies, not event streams).
tests/test_mcp_faults.py drives it through loopfuse.

Tools: ``echo`` (answers its text), ``hang`` (never answers), ``crash`` (the process exits
during the call), ``huge`` (a result of ``chars`` characters), ``fail`` (an ``isError``
result), ``calls`` (how many calls this process has answered, counting itself),
``header`` (over HTTP: the value of a request header the call came with), and
three tools loopfuse cannot offer: ``external_schema`` (a ``$ref`` to another document),
``recursive_schema`` (a ``$ref`` that refers to itself) and ``dotted.name`` (a name the
model's tool names do not allow).
"""

from __future__ import annotations

import os
import socket
import sys

import anyio
import mcp_types
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

HUGE_LINE = "0123456789" * 10


class FaultServer(MCPServer):
    """Lists three tools besides the real ones that loopfuse cannot offer."""

    async def list_tools(self) -> list[mcp_types.Tool]:
        tools = await super().list_tools()
        return [
            *tools,
            mcp_types.Tool(
                name="external_schema",
                description="Its parameters refer to a schema elsewhere.",
                input_schema={
                    "type": "object",
                    "properties": {"spec": {"$ref": "https://example.com/spec.json"}},
                },
            ),
            mcp_types.Tool(
                name="dotted.name",
                description="A name MCP allows and a model's tool name does not.",
                input_schema={"type": "object", "properties": {}},
            ),
            mcp_types.Tool(
                name="recursive_schema",
                description="Its parameters refer to themselves.",
                input_schema={
                    "type": "object",
                    "properties": {"node": {"$ref": "#/$defs/Node"}},
                    "$defs": {
                        "Node": {
                            "type": "object",
                            "properties": {"child": {"$ref": "#/$defs/Node"}},
                        }
                    },
                },
            ),
        ]


server = FaultServer("faults")
answered = 0


def count() -> int:
    global answered
    answered += 1
    return answered


@server.tool(description="Answer with the text given.")
def echo(text: str) -> str:
    count()
    return f"echo: {text}"


@server.tool(description="Never answer.")
async def hang() -> str:
    count()
    await anyio.sleep_forever()
    raise AssertionError("unreachable")


@server.tool(description="Exit the server process during the call.")
def crash() -> str:
    sys.stderr.write("fault server: crashing on purpose\n")
    sys.stderr.flush()
    os._exit(3)


@server.tool(description="Answer with a text of `chars` characters.")
def huge(chars: int) -> str:
    count()
    return (HUGE_LINE * (chars // len(HUGE_LINE) + 1))[:chars]


@server.tool(description="Fail with an error result.")
def fail(why: str) -> str:
    count()
    raise ToolError(f"failed on purpose: {why}")


@server.tool(description="How many calls this server process has answered (this one too).")
def calls() -> str:
    return f"calls answered by pid {os.getpid()}: {count()}"


@server.tool(description="The value of a header of the HTTP request that carried this call.")
def header(name: str, ctx: Context) -> str:
    count()
    request = ctx.request_context.request
    headers = getattr(request, "headers", None)
    if headers is None:
        raise ToolError("not called over HTTP")
    return f"{name}: {headers.get(name, '(absent)')}"


async def serve_http(json_response: bool = False) -> None:
    """Serve streamable HTTP on a socket listening before its port is printed; answers as
    JSON bodies rather than event streams with ``json_response``."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    app = server.streamable_http_app(json_response=json_response)
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    http = uvicorn.Server(config)
    sock.listen(128)  # connections queue from now on, before uvicorn accepts them
    print(sock.getsockname()[1], flush=True)
    await http.serve(sockets=[sock])


def main(argv: list[str]) -> None:
    if argv == ["--http"]:
        anyio.run(serve_http)
    elif argv == ["--http-json"]:
        anyio.run(serve_http, True)
    else:
        server.run()


if __name__ == "__main__":
    main(sys.argv[1:])
