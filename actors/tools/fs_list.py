"""``list_dir``: the entries of a directory in the run's folder.

Entries are sorted by name, directories end with ``/``, files show their size in bytes.
A symlink is shown as what it points to when that lies inside the folder, and as
``(unavailable link)`` otherwise. At most ``list_entries`` are shown, with a note counting
the rest.
"""

from __future__ import annotations

import itertools
import os
import stat
from pathlib import Path
from typing import Annotated

import msgspec

from actors.tools.context import ToolContext
from actors.tools.errors import ToolError
from actors.tools.folder import Folder, PathRefused
from actors.tools.limits import ToolLimits
from actors.tools.path_guard import open_directory, open_folder
from actors.tools.threads import run_in_thread

__all__ = ["ListDir", "list_dir", "list_text"]


class ListDir(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """List the files and directories in a directory of the folder."""

    path: Annotated[
        str, msgspec.Meta(description="Directory path, relative to the folder. Default '.'.")
    ] = "."


async def list_dir(params: ListDir, ctx: ToolContext) -> str:
    """The ``list_dir`` tool: :func:`list_text` in a worker thread."""
    return await run_in_thread(lambda: list_text(ctx.root, params.path, ctx.limits))


def list_text(root: Path | None, path: str, limits: ToolLimits) -> str:
    """One line per entry of directory ``path`` inside ``root``.

    :raises ToolError: kind ``path`` when ``path`` is missing, outside or not a directory.
    """
    with open_folder(root) as folder:
        fd = open_directory(folder, path)
        try:
            with os.scandir(fd) as scan:
                read = list(itertools.islice(scan, limits.list_scan_entries + 1))
            more = len(read) > limits.list_scan_entries
            entries = sorted(read[: limits.list_scan_entries], key=lambda entry: entry.name)
            if not entries:
                return "[list_dir: the directory is empty.]"
            lines = [_describe(folder, path, entry) for entry in entries[: limits.list_entries]]
        except OSError:
            raise ToolError("path", f"{path} cannot be listed") from None
        finally:
            os.close(fd)
    left_out = len(entries) - len(lines)
    if more:
        lines.append(
            f"[list_dir: the directory holds more than {limits.list_scan_entries} entries; "
            f"{len(lines)} of the first {limits.list_scan_entries} read (in the directory's "
            "own order) are shown, by name. List a subdirectory or read a file by name.]"
        )
    elif left_out:
        lines.append(
            f"[list_dir: {left_out} more entries not shown ({len(entries)} in all); "
            "list a subdirectory or read a file by name.]"
        )
    return "\n".join(lines)


def _describe(folder: Folder, path: str, entry: os.DirEntry[str]) -> str:
    """``entry`` (of a scan of a directory descriptor: it looks beneath that, never
    follows a link) as a line; a link is looked up again through the folder."""
    try:
        if entry.is_symlink():
            info = folder.stat(f"{path}/{entry.name}" if path else entry.name)
            is_dir, size = stat.S_ISDIR(info.st_mode), info.st_size
        else:
            is_dir = entry.is_dir(follow_symlinks=False)
            size = entry.stat(follow_symlinks=False).st_size
    except (PathRefused, OSError):
        return f"{entry.name}  (unavailable link)"
    return f"{entry.name}/" if is_dir else f"{entry.name}  ({size} bytes)"
