"""``list_dir``: the entries of a directory in the run's folder.

Entries are sorted by name, directories end with ``/``, files show their size in bytes.
A symlink is shown as what it points to when that lies inside the folder, and as
``(unavailable link)`` otherwise. At most ``list_entries`` are shown, with a note counting
the rest.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import anyio.to_thread
import msgspec

from actors.tools.context import ToolContext
from actors.tools.errors import ToolError
from actors.tools.limits import ToolLimits
from actors.tools.path_guard import guard_path

__all__ = ["ListDir", "list_dir", "list_text"]


class ListDir(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """List the files and directories in a directory of the folder."""

    path: Annotated[
        str, msgspec.Meta(description="Directory path, relative to the folder. Default '.'.")
    ] = "."


async def list_dir(params: ListDir, ctx: ToolContext) -> str:
    """The ``list_dir`` tool: :func:`list_text` in a worker thread."""
    return await anyio.to_thread.run_sync(lambda: list_text(ctx.root, params.path, ctx.limits))


def list_text(root: Path | None, path: str, limits: ToolLimits) -> str:
    """One line per entry of directory ``path`` inside ``root``.

    :raises ToolError: kind ``path`` when ``path`` is missing, outside or not a directory.
    """
    resolved = guard_path(root, path)
    if not resolved.is_dir():
        raise ToolError("path", f"{path} is a file, not a directory; use read_file to read it")
    try:
        with os.scandir(resolved) as scan:
            entries = sorted(scan, key=lambda entry: entry.name)
    except OSError:
        raise ToolError("path", f"{path} cannot be listed") from None
    if not entries:
        return "[list_dir: the directory is empty.]"
    assert root is not None  # guard_path accepted the path
    lines = [_describe(root, entry) for entry in entries[: limits.list_entries]]
    left_out = len(entries) - len(lines)
    if left_out:
        lines.append(
            f"[list_dir: {left_out} more entries not shown ({len(entries)} in all); "
            "list a subdirectory or read a file by name.]"
        )
    return "\n".join(lines)


def _describe(root: Path, entry: os.DirEntry[str]) -> str:
    try:
        if entry.is_symlink():
            target = guard_path(root, entry.path)
            is_dir, size = target.is_dir(), target.stat().st_size
        else:
            is_dir = entry.is_dir(follow_symlinks=False)
            size = entry.stat(follow_symlinks=False).st_size
    except (ToolError, OSError):
        return f"{entry.name}  (unavailable link)"
    return f"{entry.name}/" if is_dir else f"{entry.name}  ({size} bytes)"
