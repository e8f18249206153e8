"""Images in prompts: what an image file is (from its header bytes) and what it costs.

:func:`sniff_image` tells PNG, JPEG, GIF and WebP apart by their magic bytes (never by a
file name) and reads the pixel size from the header, with no imaging library.
:func:`image_tokens` is OpenAI's documented price of one image: ``low`` detail is a flat
85 tokens; ``high`` (and ``auto``, counted as ``high`` to stay on the safe side) scales the
image to fit 2048 × 2048, then its shortest side down to 768, and costs 85 plus 170 per
512-pixel tile. Images are never scaled up. :func:`part_tokens` prices an image part of a
message (a ``data:`` URL); a part whose size cannot be read is priced as the largest image
(``MAX_IMAGE_TOKENS``), never as the characters of its URL.
"""

from __future__ import annotations

import base64
import binascii
import functools
import math
import struct
from typing import Final, NamedTuple

from bus import ImageDetail, ImagePart

__all__ = [
    "BASE_TOKENS",
    "IMAGE_MEDIA_TYPES",
    "MAX_IMAGE_TOKENS",
    "TILE_TOKENS",
    "ImageInfo",
    "data_url_bytes",
    "image_tokens",
    "part_tokens",
    "sniff_image",
]

BASE_TOKENS: Final = 85
"""Tokens of any image (all of a ``low`` detail one)."""
TILE_TOKENS: Final = 170
"""Tokens of each 512-pixel tile of a ``high`` detail image."""
MAX_IMAGE_TOKENS: Final = BASE_TOKENS + TILE_TOKENS * 8
"""The most one ``high`` image costs: 768 × 2048 after scaling, 2 × 4 tiles."""

IMAGE_MEDIA_TYPES: Final = ("image/png", "image/jpeg", "image/gif", "image/webp")
"""The types vision endpoints take (and :func:`sniff_image` knows)."""

_HEAD_CHARS: Final = 4096
"""Base64 characters of a data URL decoded to find the size (a JPEG may need more)."""
_JPEG_SOF: Final = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7} | set(range(0xC9, 0xD0)))
"""Start-of-frame markers (not DHT ``C4``, JPG ``C8``, DAC ``CC``)."""


class ImageInfo(NamedTuple):
    """What an image's header says: its media type and its size in pixels (0 if unread)."""

    media_type: str
    width: int
    height: int


def sniff_image(data: bytes) -> ImageInfo | None:
    """The type and size of the image ``data`` starts with, or ``None`` if it is not a PNG,
    JPEG, GIF or WebP. A known type whose size cannot be read (a cut header) has size 0."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        if len(data) >= 24 and data[12:16] == b"IHDR":
            return ImageInfo("image/png", *struct.unpack(">II", data[16:24]))
        return ImageInfo("image/png", 0, 0)
    if data.startswith((b"GIF87a", b"GIF89a")):
        if len(data) >= 10:
            return ImageInfo("image/gif", *struct.unpack("<HH", data[6:10]))
        return ImageInfo("image/gif", 0, 0)
    if data.startswith(b"\xff\xd8\xff"):
        return ImageInfo("image/jpeg", *_jpeg_size(data))
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return ImageInfo("image/webp", *_webp_size(data))
    return None


def _jpeg_size(data: bytes) -> tuple[int, int]:
    """Width and height from the first start-of-frame segment (0, 0 if none is found)."""
    at = 2
    while at + 4 <= len(data):
        if data[at] != 0xFF:
            return 0, 0
        marker = data[at + 1]
        if marker == 0xFF:  # fill byte
            at += 1
            continue
        if marker == 0x01 or 0xD0 <= marker <= 0xD7:  # markers without a length
            at += 2
            continue
        (length,) = struct.unpack(">H", data[at + 2 : at + 4])
        if marker in _JPEG_SOF:
            if at + 9 > len(data):
                return 0, 0
            height, width = struct.unpack(">HH", data[at + 5 : at + 9])
            return width, height
        at += 2 + length
    return 0, 0


def _webp_size(data: bytes) -> tuple[int, int]:
    chunk = data[12:16]
    if chunk == b"VP8 " and len(data) >= 30:
        width, height = struct.unpack("<HH", data[26:30])
        return width & 0x3FFF, height & 0x3FFF
    if chunk == b"VP8L" and len(data) >= 25:
        (bits,) = struct.unpack("<I", data[21:25])
        return 1 + (bits & 0x3FFF), 1 + ((bits >> 14) & 0x3FFF)
    if chunk == b"VP8X" and len(data) >= 30:  # width and height: 24-bit, less one
        return int.from_bytes(data[24:27], "little") + 1, int.from_bytes(data[27:30], "little") + 1
    return 0, 0


def image_tokens(width: int, height: int, detail: ImageDetail = "auto") -> int:
    """OpenAI's token price of a ``width`` × ``height`` image at ``detail`` (module doc)."""
    if detail == "low":
        return BASE_TOKENS
    if width <= 0 or height <= 0:
        return MAX_IMAGE_TOKENS
    scale = min(1.0, 2048 / max(width, height))
    w, h = width * scale, height * scale
    scale = min(1.0, 768 / min(w, h))
    w, h = w * scale, h * scale
    return BASE_TOKENS + TILE_TOKENS * math.ceil(w / 512) * math.ceil(h / 512)


def data_url_bytes(url: str, *, head: int | None = None) -> bytes | None:
    """The bytes of a base64 ``data:`` URL (only about the first ``head`` if given), or
    ``None`` if ``url`` is not one or its base64 is malformed."""
    if not url.startswith("data:"):
        return None
    _, sep, payload = url.partition(";base64,")
    if not sep:
        return None
    if head is not None:
        payload = payload[: head - head % 4]
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        return None


@functools.lru_cache(maxsize=256)
def _url_size(url: str) -> tuple[int, int]:
    data = data_url_bytes(url, head=_HEAD_CHARS)
    info = sniff_image(data) if data is not None else None
    if info is not None and info.width == 0 and info.media_type == "image/jpeg":
        whole = data_url_bytes(url)  # the frame header lies past the first few KB
        info = sniff_image(whole) if whole is not None else None
    return (info.width, info.height) if info is not None else (0, 0)


def part_tokens(part: ImagePart) -> int:
    """The token price of an image part (the largest image's if its size is unknown)."""
    detail = part.image_url.detail
    if detail == "low":
        return BASE_TOKENS
    return image_tokens(*_url_size(part.image_url.url), detail)
