"""The path guard: the one function every path a model names goes through.

A path is joined to the run's folder, resolved (symlinks included) and accepted only if the
result is the folder or inside it. Missing, outside and malformed paths all get the same
answer, :data:`~actors.tools.errors.PATH_ERROR`, so probing reveals nothing about what
lies outside the folder.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO

from actors.tools.errors import PATH_ERROR, ToolError

__all__ = ["guard_path", "open_regular_file"]


def guard_path(root: Path | None, path: str, *, must_exist: bool = True) -> Path:
    """The resolved form of ``path`` inside ``root``.

    Relative paths are joined to ``root``; absolute ones are taken as they are (and so are
    accepted only when they point inside ``root``). Symlinks are followed before the check.

    :param must_exist: also reject a path that does not exist (the default). When false, a
        missing path is resolved as far as it exists and still has to land inside ``root``.
    :raises ToolError: kind ``path`` when there is no folder, or when ``path`` contains a
        NUL byte, does not exist, resolves outside ``root``, loops, or is too long.
    """
    if root is None:
        raise ToolError("path", "this run has no folder, so there are no files to read")
    if "\x00" in path:
        raise ToolError("path", PATH_ERROR)
    try:
        base = root.resolve(strict=True)
        resolved = (base / path).resolve(strict=must_exist)
    except (OSError, RuntimeError, ValueError):
        # FileNotFoundError, ENAMETOOLONG, ELOOP / "Symlink loop", embedded NUL.
        raise ToolError("path", PATH_ERROR) from None
    if not resolved.is_relative_to(base):
        raise ToolError("path", PATH_ERROR)
    return resolved


# Read only; never follow a symlink swapped in at the last step; never block on a FIFO.
_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)


def open_regular_file(root: Path | None, path: str) -> tuple[BinaryIO, os.stat_result]:
    """``path`` inside ``root`` opened for reading, with its ``fstat``: a regular file, or
    a :class:`ToolError` of kind ``path`` (outside, missing, a directory, anything else)."""
    resolved = guard_path(root, path)
    if resolved.is_dir():
        raise ToolError("path", f"{path} is a directory; use list_dir to see what it holds")
    try:
        fd = os.open(resolved, _OPEN_FLAGS)
    except OSError:
        raise ToolError("path", f"{path} cannot be opened") from None
    file = open(fd, "rb")  # noqa: SIM115  # the caller closes it (with ...)
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        file.close()
        raise ToolError("path", f"{path} is not a regular file")
    return file, info
