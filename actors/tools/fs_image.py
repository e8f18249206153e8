"""``read_image``: an image file of the run's folder, shown to a vision model.

The path goes through the path guard (as ``read_file``'s does); the type is told by the
file's magic bytes (PNG, JPEG, GIF, WebP), never by its name; a file larger than
``limits.image_max_bytes`` is refused with a hint. The answer is one line of text about
the image followed by the image itself as an attachment line
(:func:`bus.image_attachment`, a base64 ``data:`` URL): tool results are text on the bus,
and the LLM caller sends the attachment as an image content part (``docs/pipelines.md``).

Offer the tool only to a vision-capable model: a text-only model gets the data URL as an
error or as noise.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Annotated, Any

import msgspec

from actors.context.images import IMAGE_MEDIA_TYPES, image_tokens, sniff_image
from actors.tools.context import ToolContext
from actors.tools.errors import ToolError
from actors.tools.limits import ToolLimits
from actors.tools.path_guard import open_regular_file
from actors.tools.registry import Tool
from actors.tools.threads import run_in_thread
from bus import ImageDetail, image_attachment

__all__ = ["DESCRIPTION", "ReadImage", "image_tool", "load_image", "read_image"]

DESCRIPTION = (
    "Look at an image file of the folder (PNG, JPEG, GIF or WebP): it is shown to you "
    "after the tool result. Use detail='low' for a quick look (fewest tokens) and "
    "detail='high' to read small print, axes or numbers."
)

_KINDS = {"image/png": "PNG", "image/jpeg": "JPEG", "image/gif": "GIF", "image/webp": "WebP"}
assert set(_KINDS) == set(IMAGE_MEDIA_TYPES)


class ReadImage(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Look at an image file in the folder."""

    path: Annotated[str, msgspec.Meta(description="Image path, relative to the folder.")]
    detail: Annotated[
        ImageDetail,
        msgspec.Meta(
            description="How closely to look: low (a quick look, fewest tokens), high "
            "(fine detail) or auto (the model decides). Default auto."
        ),
    ] = "auto"


async def read_image(params: ReadImage, ctx: ToolContext) -> str:
    """The ``read_image`` tool: :func:`load_image` in a worker thread."""
    return await run_in_thread(lambda: load_image(ctx.root, params.path, params.detail, ctx.limits))


def load_image(root: Path | None, path: str, detail: ImageDetail, limits: ToolLimits) -> str:
    """A line about the image at ``path`` inside ``root``, then its attachment line.

    :raises ToolError: kind ``path`` (missing, outside, not a regular file), ``too_large``
        (over ``limits.image_max_bytes``) or ``not_image`` (no PNG, JPEG, GIF or WebP
        magic bytes, whatever the file's name).
    """
    cap = limits.image_max_bytes
    file, info = open_regular_file(root, path)
    with file:
        if info.st_size > cap:
            raise _too_large(path, info.st_size, cap)
        data = file.read(cap + 1)  # the file may have grown since fstat
    if len(data) > cap:
        raise _too_large(path, len(data), cap)
    image = sniff_image(data)
    if image is None:
        raise ToolError(
            "not_image",
            f"{path} is not a PNG, JPEG, GIF or WebP image (its first bytes say so, whatever "
            "its name); read_file reads text files",
        )
    size = f"{image.width}×{image.height} px" if image.width else "size unknown"
    tokens = image_tokens(image.width, image.height, detail)
    url = f"data:{image.media_type};base64,{base64.b64encode(data).decode('ascii')}"
    return (
        f"read_image: {path} ({_KINDS[image.media_type]}, {size}, {len(data):,} bytes, "
        f"about {tokens} tokens at detail {detail}). The image is attached below.\n"
        f"{image_attachment(url, detail)}"
    )


def _too_large(path: str, size: int, cap: int) -> ToolError:
    return ToolError(
        "too_large",
        f"{path} is {size:,} bytes; read_image takes images up to {cap:,} bytes. Hint: look "
        "for the same information in the data files or a smaller image (the limit is the "
        "tool executor's limits.image_max_bytes).",
    )


def image_tool() -> Tool[Any]:
    """The ``read_image`` tool (idempotent: the same file gives the same answer)."""
    return Tool(
        "read_image", DESCRIPTION, ReadImage, read_image, idempotent=True, needs_folder=True
    )
