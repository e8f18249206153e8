"""Bus transcript → chat-completions request JSON, and a prompt-size estimate.

Tool schemas travel on the bus as JSON text; each distinct schema is decoded once and cached.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final, assert_never

import msgspec

from actors.context.images import part_tokens
from bus import ChatMessage, ContentPart, ImagePart, TextPart, ToolSpec, Usage, message_images

__all__ = [
    "CHARS_PER_TOKEN",
    "ToolSchemaError",
    "WireTools",
    "estimate_usage",
    "prompt_chars",
    "wire_messages",
]

CHARS_PER_TOKEN: Final = 4
"""Characters per token when the endpoint reports no usage (an estimate)."""

SCHEMA_CACHE_SIZE: Final = 1024
"""Distinct tool specs whose wire form is kept (oldest evicted first)."""

_decode = msgspec.json.Decoder().decode


class ToolSchemaError(ValueError):
    """A :class:`bus.ToolSpec` whose ``parameters`` is not a JSON object."""


def _wire_message(msg: ChatMessage) -> dict[str, Any]:
    out: dict[str, Any] = {"role": msg.role}
    if msg.tool_calls:
        out["content"] = msg.content
        out["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
            for call in msg.tool_calls
        ]
    else:
        out["content"] = msg.content if msg.content is not None else ""
    if msg.tool_call_id is not None:
        out["tool_call_id"] = msg.tool_call_id
    if msg.name is not None:
        out["name"] = msg.name
    return out


def wire_messages(messages: Iterable[ChatMessage]) -> list[dict[str, Any]]:
    """The ``messages`` array of a chat-completions request (images: :func:`_with_images`)."""
    out: list[dict[str, Any]] = []
    held: list[dict[str, Any]] = []  # images of tool results, sent after the tool messages
    for msg in messages:
        if held and msg.role != "tool":
            out += held
            held.clear()
        text, parts = message_images(msg)
        out.append(_with_images(msg, text, parts, held) if parts else _wire_message(msg))
    return out + held


def _with_images(
    msg: ChatMessage, text: str, parts: tuple[ContentPart, ...], held: list[dict[str, Any]]
) -> dict[str, Any]:
    """A message with images as content parts: ``[{"type": "text"}, {"type": "image_url"}]``.

    Many servers take images only in user messages, so a tool result's images go out as a
    user message of their own; it is held in ``held`` until the tool messages answering the
    same assistant message are all out (a user message between them is refused).
    """
    encoded = [msgspec.to_builtins(part) for part in parts]
    if msg.role == "tool":
        note = f"The image(s) returned by tool call {msg.tool_call_id}:"
        held.append({"role": "user", "content": [{"type": "text", "text": note}, *encoded]})
        return _wire_message(msgspec.structs.replace(msg, content=text, parts=()))
    out = _wire_message(msg)
    out["content"] = [{"type": "text", "text": text}, *encoded] if text else encoded
    return out


class WireTools:
    """The ``tools`` array for a tuple of specs, each spec converted once."""

    def __init__(self, capacity: int = SCHEMA_CACHE_SIZE) -> None:
        self._capacity = capacity
        self._cache: dict[ToolSpec, dict[str, Any]] = {}

    def __call__(self, specs: Iterable[ToolSpec]) -> list[dict[str, Any]]:
        """Raises :class:`ToolSchemaError` naming the tool whose schema is not a JSON object."""
        return [self._one(spec) for spec in specs]

    def _one(self, spec: ToolSpec) -> dict[str, Any]:
        tool = self._cache.get(spec)
        if tool is None:
            try:
                schema = _decode(spec.parameters) if spec.parameters.strip() else {}
            except msgspec.DecodeError as exc:
                raise ToolSchemaError(f"tool {spec.name!r}: parameters: {exc}") from None
            if not isinstance(schema, dict):
                raise ToolSchemaError(f"tool {spec.name!r}: parameters must be a JSON object")
            schema.setdefault("type", "object")
            tool = {
                "type": "function",
                "function": {
                    "name": spec.name,
                    "description": spec.description,
                    "parameters": schema,
                },
            }
            if len(self._cache) >= self._capacity:
                del self._cache[next(iter(self._cache))]
            self._cache[spec] = tool
        return tool

    def __len__(self) -> int:
        return len(self._cache)


def prompt_chars(messages: Iterable[ChatMessage]) -> int:
    """Characters of a prompt: contents and tool-call names and arguments; an image counts
    as the characters of its token price, not of its data URL."""
    total = 0
    for msg in messages:
        text, parts = message_images(msg)
        total += len(text)
        for part in parts:
            match part:
                case TextPart():
                    total += len(part.text)
                case ImagePart():
                    total += part_tokens(part) * CHARS_PER_TOKEN
                case _:
                    assert_never(part)
        for call in msg.tool_calls:
            total += len(call.name) + len(call.arguments)
    return total


def estimate_usage(prompt: int, completion: int) -> Usage:
    """Usage estimated from character counts (about four characters per token)."""
    return Usage(
        prompt_tokens=-(-prompt // CHARS_PER_TOKEN),
        completion_tokens=-(-completion // CHARS_PER_TOKEN),
        estimated=True,
    )
