"""Scripted tools from scenario files: fake tools whose results the scenario gives.

Each run counts its own calls: call *n* of a tool (or of one of its argument ``cases``) gets
result *n*, and the last result repeats. A result given as ``{error = "…"}`` comes back to
the model as a tool error. A tool with ``delay_seconds`` takes that long to answer (it can be
cancelled meanwhile, like any tool).
"""

from __future__ import annotations

from typing import Any

import anyio

from actors.tools import Tool, ToolContext, ToolError
from orchestrator.sim import ToolDef

__all__ = ["scripted_tool_from"]


def scripted_tool_from(definition: ToolDef) -> Tool[dict[str, Any]]:
    """The tool ``definition`` describes."""

    async def answer(arguments: dict[str, Any], ctx: ToolContext) -> str:
        if definition.delay_seconds:
            await anyio.sleep(definition.delay_seconds)  # the scripted tool's own work
        counts: dict[int, int] = ctx.state.setdefault(f"scripted:{definition.name}", {})
        case = definition.match(arguments)
        nth = counts.get(case, 0)
        counts[case] = nth + 1
        reply = definition.reply(arguments, nth)
        if reply.error is not None:
            raise ToolError("scripted", reply.error)
        return reply.content()

    return Tool.from_json_schema(
        definition.name,
        definition.description or f"The {definition.name} tool.",
        definition.json_schema(),
        answer,
        idempotent=definition.idempotent,
    )
