"""Bus transcript → chat-completions request JSON, and a prompt-size estimate.

Tool schemas travel on the bus as JSON text; each distinct schema is decoded once and cached.
An assistant turn with tool calls goes out with ``"content": ""`` when it has no text, never
``null`` (llama-cpp-python answers ``null`` with a 500). A tool call whose id loopfuse made
unique (two calls of one reply with the same id) goes out under the server's own id again,
and so do the tool results answering it. :class:`RequestShapes` adds what each model's
settings ask for: ``tool_choice`` (only beside tools) and whether to stream.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any, Final, assert_never

import msgspec

from actors.context.images import part_tokens
from actors.llm.settings import TOOL_CHOICE_MODES, EndpointSettings, RequestOptions
from bus import (
    ChatMessage,
    ContentPart,
    ImagePart,
    ModelRequest,
    TextPart,
    ToolSpec,
    Usage,
    message_images,
)

__all__ = [
    "CHARS_PER_TOKEN",
    "RequestShape",
    "RequestShapes",
    "ToolSchemaError",
    "WireTools",
    "estimate_usage",
    "prompt_chars",
    "wire_messages",
]

CHARS_PER_TOKEN: Final = 4
"""Characters per token when the endpoint reports no usage (an estimate)."""

SCHEMA_CACHE_SIZE: Final = 1024
"""Distinct tool specs whose wire form is kept (the least recently used evicted first)."""

_decode = msgspec.json.Decoder().decode


class ToolSchemaError(ValueError):
    """A :class:`bus.ToolSpec` whose ``parameters`` is not a JSON object."""


def _wire_message(msg: ChatMessage, renamed: dict[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {"role": msg.role, "content": msg.content or ""}
    if msg.tool_calls:
        out["tool_calls"] = [
            {
                "id": call.id if call.wire_id is None else call.wire_id,
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
            for call in msg.tool_calls
        ]
    call_id = msg.tool_call_id
    if call_id is not None:
        out["tool_call_id"] = renamed.get(call_id, call_id) if renamed else call_id
    if msg.name is not None:
        out["name"] = msg.name
    return out


def wire_messages(messages: Iterable[ChatMessage]) -> list[dict[str, Any]]:
    """The ``messages`` array of a chat-completions request (images: :func:`_with_images`)."""
    out: list[dict[str, Any]] = []
    held: list[dict[str, Any]] = []  # images of tool results, sent after the tool messages
    renamed: dict[str, str] = {}  # our unique call id -> the server's (see ToolCall.wire_id)
    for msg in messages:
        if held and msg.role != "tool":
            out += held
            held.clear()
        for call in msg.tool_calls:
            if call.wire_id is not None:
                renamed[call.id] = call.wire_id
        text, parts = message_images(msg)
        out.append(
            _with_images(msg, text, parts, held, renamed) if parts else _wire_message(msg, renamed)
        )
    return out + held


def _with_images(
    msg: ChatMessage,
    text: str,
    parts: tuple[ContentPart, ...],
    held: list[dict[str, Any]],
    renamed: dict[str, str],
) -> dict[str, Any]:
    """A message with images as content parts: ``[{"type": "text"}, {"type": "image_url"}]``.

    Many servers take images only in user messages, so a tool result's images go out as a
    user message of their own; it is held in ``held`` until the tool messages answering the
    same assistant message are all out (a user message between them is refused).
    """
    encoded = [msgspec.to_builtins(part) for part in parts]
    if msg.role == "tool":
        out = _wire_message(msgspec.structs.replace(msg, content=text, parts=()), renamed)
        note = f"The image(s) returned by tool call {out['tool_call_id']}:"
        held.append({"role": "user", "content": [{"type": "text", "text": note}, *encoded]})
        return out
    out = _wire_message(msg, renamed)
    out["content"] = [{"type": "text", "text": text}, *encoded] if text else encoded
    return out


class WireTools:
    """The ``tools`` array for a tuple of specs, each spec converted once."""

    def __init__(self) -> None:
        self._one = functools.lru_cache(maxsize=SCHEMA_CACHE_SIZE)(_wire_tool)

    def __call__(self, specs: Iterable[ToolSpec]) -> list[dict[str, Any]]:
        """Raises :class:`ToolSchemaError` naming the tool whose schema is not a JSON object."""
        return [self._one(spec) for spec in specs]


def _wire_tool(spec: ToolSpec) -> dict[str, Any]:
    try:
        schema = _decode(spec.parameters) if spec.parameters.strip() else {}
    except msgspec.DecodeError as exc:
        raise ToolSchemaError(f"tool {spec.name!r}: parameters: {exc}") from None
    if not isinstance(schema, dict):
        raise ToolSchemaError(f"tool {spec.name!r}: parameters must be a JSON object")
    schema.setdefault("type", "object")
    function = {"name": spec.name, "description": spec.description, "parameters": schema}
    return {"type": "function", "function": function}


_AUTO: Final = "auto"


class RequestShape:
    """What one model's settings add to its requests (:class:`RequestOptions`), worked
    out once: whether to stream, and the ``tool_choice`` sent beside tools."""

    __slots__ = ("_choice", "_reset", "_sampling", "stream")

    def __init__(self, options: RequestOptions) -> None:
        self.stream = options.stream
        sampling = {"temperature": options.temperature, "seed": options.seed}
        self._sampling = {key: value for key, value in sampling.items() if value is not None}
        choice = options.tool_choice
        self._choice: str | dict[str, Any] = choice  # a mode as is
        if choice not in TOOL_CHOICE_MODES:  # a tool's name: that function is forced
            self._choice = {"type": "function", "function": {"name": choice}}
        self._reset = choice not in (_AUTO, "none") and options.reset_tool_choice

    def params(self, request: ModelRequest, tools: WireTools) -> dict[str, Any]:
        """The body fields every attempt of ``request`` shares: ``model``, ``messages``,
        ``temperature`` and ``seed`` where the settings set them, and beside its tools (if
        any) ``tools`` and ``tool_choice``.

        :raises ToolSchemaError: a tool's schema is not a JSON object.
        """
        params: dict[str, Any] = {
            "model": request.model,
            "messages": wire_messages(request.messages),
            **self._sampling,
        }
        if request.tools:
            params["tools"] = tools(request.tools)
            # A forcing choice that is reset goes as "auto" once the model has called a tool.
            newest_first = reversed(request.messages)
            reset = self._reset and any(m.tool_calls for m in newest_first if m.role == "assistant")
            params["tool_choice"] = _AUTO if reset else self._choice
        return params


class RequestShapes:
    """The :class:`RequestShape` of each model of an endpoint (``[models."<id>"]``, else
    the endpoint's own), made once."""

    __slots__ = ("_default", "_models")

    def __init__(self, endpoint: EndpointSettings) -> None:
        own = RequestOptions(**{k: getattr(endpoint, k) for k in RequestOptions.__struct_fields__})
        self._default = RequestShape(own)
        self._models = {model: RequestShape(options) for model, options in endpoint.models.items()}

    def __call__(self, model: str) -> RequestShape:
        return self._models.get(model, self._default)


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
