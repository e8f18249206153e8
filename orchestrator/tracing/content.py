"""Message content as the GenAI conventions put it on spans (only with ``capture_content``).

``gen_ai.input.messages`` and ``gen_ai.output.messages`` are JSON arrays of
``{"role", "parts": [...]}``; a part is ``{"type": "text", "content"}``, ``{"type":
"tool_call", "id", "name", "arguments"}`` or ``{"type": "tool_call_response", "id",
"response"}``. Image data never goes on a span (a part says only that an image was there).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

import msgspec

from bus import ChatMessage, ToolCall, message_images

__all__ = ["input_messages", "output_messages"]

_encode: Final = msgspec.json.Encoder().encode
_IMAGE: Final = {"type": "uri", "modality": "image"}


def _parts(text: str, calls: Iterable[ToolCall]) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = [{"type": "text", "content": text}] if text else []
    for c in calls:
        try:  # a call's arguments as a JSON value (its raw text when it is not valid JSON)
            arguments = msgspec.json.decode(c.arguments)
        except msgspec.DecodeError:
            arguments = c.arguments
        parts.append({"type": "tool_call", "id": c.id, "name": c.name, "arguments": arguments})
    return parts


def _message(message: ChatMessage) -> dict[str, Any]:
    text, images = message_images(message)
    parts: list[dict[str, Any]]
    if message.role == "tool":
        parts = [{"type": "tool_call_response", "id": message.tool_call_id, "response": text}]
    else:
        parts = _parts(text, message.tool_calls)
    parts.extend(_IMAGE for _ in images)
    return {"role": message.role, "parts": parts}


def input_messages(messages: Iterable[ChatMessage]) -> str:
    """``gen_ai.input.messages`` of a request's prompt."""
    return _encode([_message(m) for m in messages]).decode()


def output_messages(text: str, calls: Iterable[ToolCall], finish_reason: str | None) -> str:
    """``gen_ai.output.messages`` of one reply."""
    message: dict[str, Any] = {"role": "assistant", "parts": _parts(text, calls)}
    if finish_reason is not None:
        message["finish_reason"] = finish_reason
    return _encode([message]).decode()
