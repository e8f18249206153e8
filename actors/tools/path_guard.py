"""The path guard: the one way every path a model names is looked up and opened.

The run's folder is opened as a directory descriptor and a path is walked beneath it one
component at a time with no-follow opens (:mod:`actors.tools.folder`): a directory swapped
for a link while a tool runs leads nowhere outside. Links inside the folder are followed
as long as they stay inside it. Missing, outside and malformed paths all get the same
answer, :data:`~actors.tools.errors.PATH_ERROR`, so probing reveals nothing about what
lies outside the folder.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from actors.tools.errors import PATH_ERROR, ToolError
from actors.tools.folder import Entry, Folder, PathRefused

__all__ = ["guard_path", "open_directory", "open_folder", "open_regular_file", "path_entry"]

# Read only; never block on a FIFO (a regular file was asked for; a FIFO swapped in is
# refused by the fstat after the open). The entry adds O_NOFOLLOW and O_CLOEXEC.
_FILE_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_NONBLOCK", 0)


@contextmanager
def open_folder(root: Path | None) -> Iterator[Folder]:
    """The run's folder, open for lookups while the ``with`` block runs.

    :raises ToolError: kind ``path`` when there is no folder or it cannot be opened.
    """
    if root is None:
        raise ToolError("path", "this run has no folder, so there are no files to read")
    try:
        folder = Folder(root)
    except OSError:
        raise ToolError("path", PATH_ERROR) from None
    with folder:
        yield folder


def path_entry(folder: Folder, path: str) -> Entry:
    """What ``path`` names in ``folder`` (a context manager), or the one path error."""
    try:
        return folder.entry(path)
    except PathRefused:
        raise ToolError("path", PATH_ERROR) from None


def guard_path(root: Path | None, path: str, *, must_exist: bool = True) -> Path:
    """The resolved form of ``path`` inside ``root``, for display or a friendly early check.

    A name is not a capability: by the time it is opened it may lead elsewhere. To read,
    use :func:`open_regular_file` or :func:`open_directory`, which never leave the folder.

    :param must_exist: also reject a path that does not exist (the default). When false, a
        missing tail is accepted, joined as written, and still may not climb out of ``root``.
    :raises ToolError: kind ``path`` when there is no folder, or when ``path`` contains a
        NUL byte, does not exist, leads outside ``root``, loops, or is too long.
    """
    with open_folder(root) as folder:
        try:
            return folder.resolve(path, must_exist=must_exist)
        except PathRefused:
            raise ToolError("path", PATH_ERROR) from None


def open_regular_file(root: Path | None, path: str) -> tuple[BinaryIO, os.stat_result]:
    """``path`` inside ``root`` opened for reading, with its ``fstat``: a regular file, or
    a :class:`ToolError` of kind ``path`` (outside, missing, a directory, anything else)."""
    with open_folder(root) as folder, path_entry(folder, path) as entry:
        if stat.S_ISDIR(entry.info.st_mode):
            raise ToolError("path", f"{path} is a directory; use list_dir to see what it holds")
        if not stat.S_ISREG(entry.info.st_mode):
            raise ToolError("path", f"{path} is not a regular file")
        fd = _open(entry, _FILE_FLAGS, f"{path} cannot be opened")
    file = open(fd, "rb")  # noqa: SIM115  # the caller closes it (with ...)
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):  # swapped since the walk looked at it
        file.close()
        raise ToolError("path", f"{path} is not a regular file")
    return file, info


def open_directory(folder: Folder, path: str) -> int:
    """A descriptor of directory ``path`` in ``folder``, open for listing (``os.scandir``
    takes it); the caller closes it.

    :raises ToolError: kind ``path`` when ``path`` is missing, outside or not a directory.
    """
    with path_entry(folder, path) as entry:
        if not stat.S_ISDIR(entry.info.st_mode):
            raise ToolError("path", f"{path} is a file, not a directory; use read_file to read it")
        return _open(entry, _DIR_FLAGS, f"{path} cannot be listed")


def _open(entry: Entry, flags: int, cannot: str) -> int:
    try:
        return entry.open(flags)
    except PathRefused:
        raise ToolError("path", PATH_ERROR) from None
    except OSError:
        raise ToolError("path", cannot) from None
