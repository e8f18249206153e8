"""Message contents of a request: a string or a content-parts array, checked and priced.

A content-parts array is checked as strict OpenAI-compatible servers check it: every part
is ``{"type": "text", "text": str}`` or ``{"type": "image_url", "image_url": {"url": str,
"detail"?: "auto" | "low" | "high"}}``, and images are allowed in ``user`` messages only
(a tool result's image has to come as a user message after it). A bad part is a
:class:`ContentError` naming where it is; the app answers it with a 400.

Images are priced by their pixel size (:func:`actors.context.images.part_tokens`), so a
prompt estimate never counts a base64 data URL as text.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple, get_args

from actors.context.images import part_tokens
from bus import ImageDetail, ImagePart, ImageURL

__all__ = ["ContentError", "RequestImages", "content_text", "request_images"]

_DETAILS = get_args(ImageDetail)


def content_text(content: Any) -> str:
    """The text of a message's content (a string or a list of parts; anything else: "")."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


class ContentError(ValueError):
    """A message content that is neither a string nor a valid content-parts array."""


class RequestImages(NamedTuple):
    """The images of a request: how many, the characters of their URLs, their tokens."""

    images: int
    url_chars: int
    tokens: int


def request_images(messages: Iterable[tuple[str, Any]]) -> RequestImages:
    """Check each ``(role, content)`` and total the images.

    :raises ContentError: naming ``messages[i].content[j]`` and what is wrong with it.
    """
    count = url_chars = tokens = 0
    for i, (role, content) in enumerate(messages):
        if content is None or isinstance(content, str):
            continue
        where = f"messages[{i}].content"
        if not isinstance(content, list):
            raise ContentError(f"{where}: must be a string or an array of content parts")
        for j, raw in enumerate(content):
            image = _part(f"{where}[{j}]", raw)
            if image is None:
                continue
            if role != "user":
                raise ContentError(
                    f"{where}[{j}]: image content parts are only allowed in user messages "
                    f"(this is a {role!r} message)"
                )
            count += 1
            url_chars += len(image.image_url.url)
            tokens += part_tokens(image)
    return RequestImages(count, url_chars, tokens)


def _part(where: str, raw: Any) -> ImagePart | None:
    """The image a valid part is, ``None`` for a valid text part."""
    if not isinstance(raw, dict):
        raise ContentError(f"{where}: must be an object with a 'type'")
    match raw.get("type"):
        case "text":
            if not isinstance(raw.get("text"), str):
                raise ContentError(f"{where}.text: a text part needs a string 'text'")
            return None
        case "image_url":
            image_url = raw.get("image_url")
            if not isinstance(image_url, dict) or not isinstance(image_url.get("url"), str):
                raise ContentError(f"{where}.image_url: needs an object with a string 'url'")
            detail = image_url.get("detail", "auto")
            if detail not in _DETAILS:
                raise ContentError(
                    f"{where}.image_url.detail: {detail!r} is not one of {', '.join(_DETAILS)}"
                )
            url = image_url["url"]
            if not url.startswith(("data:image/", "https://", "http://")):
                raise ContentError(f"{where}.image_url.url: must be a data:image/ or http(s) URL")
            return ImagePart(image_url=ImageURL(url=url, detail=detail))
        case other:
            raise ContentError(f"{where}.type: {other!r} is not 'text' or 'image_url'")
