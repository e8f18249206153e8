"""Scripted tools for tests: fake tools defined by data (the simulator's scenario files
script theirs with ``orchestrator.sim.tools``).

A scripted tool has a raw JSON schema and a script of results. Each run counts its own
calls: call *n* gets result *n*, and the last result repeats. Results may instead be keyed
by arguments (JSON text, compared in canonical form, so key order and ``1.0`` vs ``1`` do
not matter); each key then has its own list and count, and the key ``"*"`` answers any
arguments no other key matches.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

import msgspec

from actors.fingerprint import canonical_arguments
from actors.tools.context import ToolContext
from actors.tools.errors import ToolError
from actors.tools.registry import Tool

__all__ = ["ANY_ARGUMENTS", "ScriptedResults", "scripted_tool"]

ANY_ARGUMENTS: Final = "*"
"""The results key that answers arguments no other key matches."""

ScriptedResults = Sequence[str] | Mapping[str, str | Sequence[str]]
_encode = msgspec.json.Encoder().encode


def scripted_tool(
    name: str,
    description: str,
    parameters_schema: Mapping[str, Any],
    results: ScriptedResults,
    *,
    idempotent: bool = False,
) -> Tool[dict[str, Any]]:
    """A tool that answers from ``results`` (see the module docstring).

    :raises ValueError: on an empty script, a key that is not JSON, or a bad schema.
    """
    script = _compile(name, results)

    async def answer(params: dict[str, Any], ctx: ToolContext) -> str:
        key = canonical_arguments(_encode(params).decode())
        if key not in script:
            key = _ANY
        replies = script.get(key)
        if replies is None:
            raise ToolError("scripted", f"{name} has no scripted result for these arguments")
        counts: dict[bytes, int] = ctx.state.setdefault(f"scripted:{name}", {})
        index = counts.get(key, 0)
        counts[key] = index + 1
        return replies[min(index, len(replies) - 1)]

    return Tool.from_json_schema(
        name, description, parameters_schema, answer, idempotent=idempotent
    )


_ANY = b"\x00any"


def _compile(name: str, results: ScriptedResults) -> dict[bytes, tuple[str, ...]]:
    if isinstance(results, str):
        raise ValueError(f"scripted tool {name!r}: results must be a list or a mapping")
    if not isinstance(results, Mapping):
        return {_ANY: _replies(name, "results", results)}
    script: dict[bytes, tuple[str, ...]] = {}
    for raw_key, value in results.items():
        if raw_key == ANY_ARGUMENTS:
            key = _ANY
        else:
            key = canonical_arguments(raw_key)
            if key.startswith(b"raw:"):
                raise ValueError(f"scripted tool {name!r}: key {raw_key!r} is not JSON")
        script[key] = _replies(name, raw_key, [value] if isinstance(value, str) else value)
    return script


def _replies(name: str, where: str, replies: Sequence[str]) -> tuple[str, ...]:
    if not replies or not all(isinstance(reply, str) for reply in replies):
        raise ValueError(f"scripted tool {name!r}: {where} needs one or more result strings")
    return tuple(replies)
