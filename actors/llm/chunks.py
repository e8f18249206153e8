"""Chat-completions JSON → light objects for the accumulator, decoded by msgspec.

Only the fields the :class:`~actors.llm.accumulator.ReplyAccumulator` reads are declared;
unknown ones (``logprobs``, ``obfuscation``, ``reasoning_content``, …) are skipped
by the decoder without building anything. A payload whose declared fields have unexpected
types (``"usage": {"prompt_tokens": "many"}``, ``"choices": null`` is fine) is still read,
through a lenient attribute view of the plain JSON, so odd servers are tolerated exactly as
the ``openai`` SDK's unvalidated models tolerate them; only text that is not JSON raises
:class:`msgspec.DecodeError`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import msgspec

__all__ = [
    "Chunk",
    "decode_chunk",
    "decode_completion",
    "error_frame",
]


class FunctionDelta(msgspec.Struct, frozen=True, gc=False):
    name: str | None = None
    arguments: str | None = None


class ToolCallDelta(msgspec.Struct, frozen=True, gc=False):
    index: int | None = None
    id: str | None = None
    function: FunctionDelta | None = None


class Delta(msgspec.Struct, frozen=True, gc=False):
    """A chunk's ``delta``, or a whole completion's ``message``."""

    content: str | None = None
    refusal: str | None = None
    tool_calls: tuple[ToolCallDelta, ...] | None = None


class Choice(msgspec.Struct, frozen=True, gc=False):
    index: int | None = 0
    delta: Delta | None = None
    message: Delta | None = None
    finish_reason: str | None = None


class UsageFields(msgspec.Struct, frozen=True, gc=False):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


class Chunk(msgspec.Struct, frozen=True, gc=False):
    """One ``chat.completion.chunk`` (or an error frame: ``error`` set), or one whole
    ``chat.completion`` (non-streamed: its choices have a ``message``)."""

    id: str | None = None
    model: str | None = None
    choices: tuple[Choice, ...] | None = None
    usage: UsageFields | None = None
    error: Any = None


class _Loose:
    """Attribute access over plain JSON: missing keys read as ``None``, like the SDK's
    unvalidated models; objects inside are wrapped on access."""

    __slots__ = ("fields",)

    def __init__(self, fields: dict[str, Any]) -> None:
        self.fields = fields

    def __getattr__(self, name: str) -> Any:
        return _loose(self.fields.get(name))


def _loose(value: Any) -> Any:
    if isinstance(value, dict):
        return _Loose(value)
    if isinstance(value, list):
        return [_loose(item) for item in value]
    return value


_CHUNK: Final = msgspec.json.Decoder(Chunk)
_ANY: Final = msgspec.json.Decoder()


def decode_chunk(payload: bytes) -> Chunk | Any:
    """A :class:`Chunk`, or a lenient view of JSON that does not fit one.

    :raises msgspec.DecodeError: ``payload`` is not JSON.
    """
    try:
        return _CHUNK.decode(payload)
    except msgspec.ValidationError:
        return _loose(_ANY.decode(payload))


decode_completion: Final = decode_chunk
"""A whole ``chat.completion`` (non-streamed), read as :func:`decode_chunk` reads a chunk."""


def error_frame(chunk: Chunk | Any) -> tuple[str, object] | None:
    """The message and body of an ``{"error": …}`` frame, as the SDK's stream reads one.

    The message is the error's own, or "An error occurred during streaming".
    """
    if isinstance(chunk, Chunk):
        error = chunk.error
    else:
        error = chunk.fields.get("error") if isinstance(chunk, _Loose) else None
    if not error:
        return None
    message = error.get("message") if isinstance(error, Mapping) else None
    if not message or not isinstance(message, str):
        message = "An error occurred during streaming"
    return message, error
