"""Scenario folders written once per runtime and shared, read-only, by every run of a scenario.

A scenario's ``[folder]`` is the same text for each of its runs, and what a run does to its
folder is read it: the file tools open files read-only through a directory descriptor,
``make_figure``'s sandbox sees the folder read-only and saves its figures elsewhere, and the
scripted tools touch no disk. So the first run of a scenario writes its files (in a worker
thread, off the event loop), makes them read-only (files 0444, directories 0555), and every
later run gets the same path. Runs that start together wait for the one write. The folders
live under one temporary directory that :meth:`SharedFolders.close` removes when the
runtime stops. (A pipeline writes its report into its folder: it keeps a folder per run.)
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Mapping
from pathlib import Path

import anyio

__all__ = ["SharedFolders", "write_folder"]

_READ_ONLY_FILE = stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH
_READ_ONLY_DIR = _READ_ONLY_FILE | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH


def write_folder(root: Path, files: Mapping[str, str]) -> None:
    """Write ``files`` (relative path -> text) under ``root``.

    :raises ValueError: an entry points outside ``root``.
    """
    base = root.resolve()
    for relative, content in files.items():
        target = (root / relative).resolve()
        if not target.is_relative_to(base):
            raise ValueError(f"scenario folder entry {relative!r} points outside the folder")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content, encoding="utf-8")


class SharedFolders:
    """The shared folders of one runtime, by scenario name."""

    def __init__(self) -> None:
        self._root: Path | None = None
        self._folders: dict[str, tuple[Mapping[str, str], str]] = {}
        self._writing: dict[str, anyio.Event] = {}

    async def folder(self, name: str, files: Mapping[str, str]) -> str:
        """The path of the read-only folder holding ``files`` for scenario ``name``.

        :raises ValueError: an entry points outside the folder.
        """
        while True:
            known = self._folders.get(name)
            if known is not None and (known[0] is files or known[0] == files):
                return known[1]
            writing = self._writing.get(name)
            if writing is None:
                break
            await writing.wait()  # another run of the scenario is writing it
        done = self._writing[name] = anyio.Event()
        try:
            if self._root is None:
                self._root = Path(tempfile.mkdtemp(prefix="loopfuse-scenarios-"))
            path = self._root / f"{name}-{len(self._folders)}"
            await anyio.to_thread.run_sync(_write_read_only, path, files)
            self._folders[name] = (files, str(path))
            return str(path)
        finally:
            del self._writing[name]
            done.set()

    def close(self) -> None:
        """Remove every folder (the runs that read them have ended)."""
        root, self._root = self._root, None
        self._folders.clear()
        if root is not None:
            for directory, _, _ in os.walk(root):
                os.chmod(directory, stat.S_IRWXU)
            shutil.rmtree(root, ignore_errors=True)


def _write_read_only(path: Path, files: Mapping[str, str]) -> None:
    path.mkdir()
    try:
        write_folder(path, files)
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise
    for directory, _, names in os.walk(path, topdown=False):
        for file in names:
            os.chmod(os.path.join(directory, file), _READ_ONLY_FILE)
        os.chmod(directory, _READ_ONLY_DIR)
