"""The conversation a run keeps: chat messages, tool calls and token usage.

These are plain data (frozen msgspec Structs) shaped like the chat-completions wire format,
so a transcript can be sent to any OpenAI-compatible endpoint and stored as JSON unchanged.
"""

from __future__ import annotations

from typing import Literal

import msgspec

__all__ = [
    "IMAGE_MARKER",
    "NUDGE_MARKER",
    "ChatMessage",
    "ContentPart",
    "ImageDetail",
    "ImagePart",
    "ImageURL",
    "Role",
    "TextPart",
    "ToolCall",
    "ToolSpec",
    "Usage",
    "image_attachment",
    "message_images",
    "message_text",
    "nudge_text",
]

Role = Literal["system", "user", "assistant", "tool"]

# Nudges reach the model as user messages that start with this marker, so a scripted model
# (the simulator) can tell which nudge it was given: ``[loopfuse:nudge kind=loop.warning] …``.
NUDGE_MARKER = "[loopfuse:nudge kind="


def nudge_text(kind: str, text: str) -> str:
    """The content of the user message that carries a nudge of ``kind``."""
    return f"{NUDGE_MARKER}{kind}] {text}"


class ToolCall(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, gc=False):
    """One tool call the model asked for; ``arguments`` is the raw JSON text it sent.

    ``id`` is unique within its reply; ``wire_id`` is set only when the server gave another
    call of the same reply the same id: the id it gave, sent back to it with the call and
    its result (:mod:`actors.llm.wire`).
    """

    id: str
    name: str
    arguments: str
    wire_id: str | None = None


class ToolSpec(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A tool as the model sees it: ``parameters`` is its JSON schema, as JSON text."""

    name: str
    description: str
    parameters: str


ImageDetail = Literal["auto", "low", "high"]
"""How closely a vision model looks at an image (chat-completions ``image_url.detail``)."""

# A tool result (plain text on the bus) carries images as its last lines, one each:
# ``[loopfuse:image detail=low]data:image/png;base64,…`` (see :func:`image_attachment`).
IMAGE_MARKER = "[loopfuse:image detail="


class ImageURL(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """Where an image is: a ``data:<media type>;base64,…`` URL (or an ``https`` URL)."""

    url: str
    detail: ImageDetail = "auto"


class TextPart(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", tag="text", gc=False):
    """A text content part: ``{"type": "text", "text": …}``."""

    text: str


class ImagePart(
    msgspec.Struct, frozen=True, kw_only=True, tag_field="type", tag="image_url", gc=False
):
    """An image content part: ``{"type": "image_url", "image_url": {"url", "detail"}}``."""

    image_url: ImageURL


ContentPart = TextPart | ImagePart
"""One element of a chat-completions content-parts array."""


class ChatMessage(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, gc=False):
    """One message of the transcript, in chat-completions shape.

    ``content`` is the message's text. ``parts`` are further content parts (images) that
    follow the text; a message with parts goes out as a content-parts array. Tool results
    cannot set ``parts`` (they are text on the bus): a tool attaches an image with
    :func:`image_attachment` lines, which :func:`message_images` reads back.
    """

    role: Role
    content: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None
    parts: tuple[ContentPart, ...] = ()


def image_attachment(url: str, detail: ImageDetail = "auto") -> str:
    """The line that attaches the image at ``url`` (a ``data:`` URL) to a tool result;
    attachment lines end the text (a line like it anywhere else is plain text)."""
    return f"{IMAGE_MARKER}{detail}]{url}"


_DETAILS: dict[str, ImageDetail] = {"auto": "auto", "low": "low", "high": "high"}


def _attachment(line: str) -> ImagePart | None:
    """The image a well-formed attachment line carries (``None`` for any other line)."""
    if not line.startswith(IMAGE_MARKER):
        return None
    detail, sep, url = line[len(IMAGE_MARKER) :].partition("]")
    if not sep or not url.startswith("data:image/") or ";base64," not in url:
        return None
    known = _DETAILS.get(detail)
    return None if known is None else ImagePart(image_url=ImageURL(url=url, detail=known))


def message_images(message: ChatMessage) -> tuple[str, tuple[ContentPart, ...]]:
    """The text of ``message`` and the parts that follow it: its ``parts``, or the images
    attached to its content by trailing :func:`image_attachment` lines (taken out of the
    text).

    Cheap for a message without images: only its last line is looked at.
    """
    content = message.content or ""
    if message.parts or not content.startswith(IMAGE_MARKER, content.rfind("\n") + 1):
        return content, message.parts
    lines = content.split("\n")
    images: list[ImagePart] = []
    while lines and (image := _attachment(lines[-1])) is not None:
        images.append(image)
        lines.pop()
    if not images:
        return content, ()
    return "\n".join(lines).rstrip("\n"), tuple(reversed(images))


def message_text(message: ChatMessage) -> str:
    """The text of ``message`` without any attached image data."""
    return message_images(message)[0]


class Usage(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """Token usage; ``estimated`` is true when the endpoint did not report it (or not all).

    ``partial_output_tokens``: the part of ``completion_tokens`` that attempts whose stream
    broke (connection lost, stream cut) had streamed, estimated from their text."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    estimated: bool = False
    partial_output_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
            estimated=self.estimated or other.estimated,
            partial_output_tokens=self.partial_output_tokens + other.partial_output_tokens,
        )
