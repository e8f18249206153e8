"""An MCP server's tool as a registry :class:`~actors.tools.registry.Tool`.

The tool is made with :meth:`Tool.from_json_schema <actors.tools.registry.Tool.from_json_schema>`
from the input schema the server listed, so its schema is checked (an object schema, its
references inlined) and the model's arguments are checked against it as for any tool before
the call goes out. The result's content blocks become the text the model reads; an
``isError`` result is a tool error (kind ``mcp_error``). Timeouts, cancellation, the result
cap, the cache and hooks are the tool executor's and the conductor's, as for every tool.
"""

from __future__ import annotations

import json
from typing import Any

import mcp_types

from actors.tools.context import ToolContext
from actors.tools.errors import ToolError
from actors.tools.mcp.connection import PROTOCOL_ERROR, McpConnection
from actors.tools.registry import Tool

__all__ = ["mcp_tool", "result_text"]


def mcp_tool(connection: McpConnection, listed: mcp_types.Tool) -> Tool[dict[str, Any]]:
    """``listed`` (a tool of ``connection``'s server) as a tool the model may call, named
    with the server's prefix.

    :raises ValueError: the name is not a valid tool name with the prefix, or the input
        schema cannot be offered (not an object schema, a recursive or dangling ``$ref``).
    """
    spec = connection.spec
    server_name = listed.name

    async def call(arguments: dict[str, Any], ctx: ToolContext) -> str:
        result = await connection.call_tool(server_name, arguments)
        text = result_text(result)
        if result.is_error:
            raise ToolError(PROTOCOL_ERROR, text or f"{server_name} failed (no message)")
        return text

    return Tool.from_json_schema(
        spec.tool_prefix + server_name,
        listed.description or listed.title or "",
        listed.input_schema,  # a dict: the SDK validated the listing
        call,
        idempotent=server_name in spec.idempotent_tools,
        timeout_seconds=spec.timeout_seconds,
    )


def result_text(result: mcp_types.CallToolResult) -> str:
    """The text of ``result``'s content blocks, one after another; media and binary
    resources are described, not included. With no content, its structured content as
    JSON."""
    parts = [_block_text(block) for block in result.content]
    if not parts and result.structured_content is not None:
        return json.dumps(result.structured_content, ensure_ascii=False, sort_keys=True)
    return "\n".join(parts)


def _block_text(block: Any) -> str:
    match block:
        case mcp_types.TextContent():
            return block.text
        case mcp_types.ImageContent() | mcp_types.AudioContent():
            size = len(block.data) * 3 // 4  # base64
            return f"[{block.type} ({block.mime_type}), about {size} bytes: not shown]"
        case mcp_types.EmbeddedResource():
            resource = block.resource
            if isinstance(resource, mcp_types.TextResourceContents):
                return f"[resource {resource.uri}]\n{resource.text}"
            mime = resource.mime_type or "binary"
            return f"[resource {resource.uri} ({mime}): not shown]"
        case mcp_types.ResourceLink():
            return f"[resource link: {block.uri}]"
        case _:
            return f"[{getattr(block, 'type', type(block).__name__)} content: not shown]"
