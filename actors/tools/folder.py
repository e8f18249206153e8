"""A run's folder as a directory file descriptor, and race-free lookups beneath it.

:class:`Folder` opens the operator's root once (following links: the root is trusted) and
walks every path a model names one component at a time, each directory opened with
``O_PATH | O_DIRECTORY | O_NOFOLLOW`` relative to its parent's descriptor. No step goes
through a name that was checked earlier, so swapping a directory for a link between a
check and an open reaches nothing outside the folder.

- ``..`` goes back to the parent's descriptor (kept on a stack, never ``openat("..")``)
  and is refused at the folder itself.
- A symbolic link is read (``readlinkat``) and its target walked the same way, relative to
  the directory holding it; an absolute target, like an absolute path, must spell the
  folder's own path and is walked from the folder's descriptor. At most
  :data:`MAX_LINKS` links per lookup, so loops end.
- The last component is looked at with ``lstat`` (a link there is followed as above) and
  opened by :meth:`Entry.open` with ``O_NOFOLLOW``: if a link is swapped in meanwhile, the
  open fails instead of following it.

Missing, outside, looping and malformed paths all raise :class:`PathRefused`, one kind on
purpose. Hard links are names for the same file; nothing here tells them apart, so an
operator's root must not hold hard links to files outside it.
"""

from __future__ import annotations

import errno
import functools
import os
import stat
from contextlib import AbstractContextManager
from pathlib import Path
from types import TracebackType
from typing import Final

__all__ = ["MAX_LINKS", "MAX_PATH_CHARS", "Entry", "Folder", "PathRefused"]

MAX_LINKS: Final = 40
"""Symbolic links one lookup may follow (Linux's own limit): more is a loop."""
MAX_PATH_CHARS: Final = 4096
"""The longest path a lookup takes (Linux's ``PATH_MAX``)."""

_O_PATH: Final = getattr(os, "O_PATH", os.O_RDONLY)  # a handle for lookups, not for reading
_STEP_FLAGS: Final = _O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# What opening a link with O_NOFOLLOW (and O_DIRECTORY) fails with: ELOOP, ENOTDIR, and
# EMLINK on FreeBSD. The name is a link only if readlinkat then succeeds.
_MAYBE_A_LINK: Final = frozenset({errno.ELOOP, errno.ENOTDIR, errno.EMLINK})
# An entry that went away or became a link or a file between its lstat and its open.
_SWAPPED: Final = frozenset({errno.ENOENT, *_MAYBE_A_LINK})


class PathRefused(Exception):
    """The path is missing, leads out of the folder, loops or is malformed (which one is
    deliberately not said: it would tell a prober about what lies outside)."""


def _split(path: str) -> list[str]:
    return [part for part in path.split("/") if part not in ("", ".")]


class Entry(AbstractContextManager["Entry"]):
    """What a path names beneath the folder: a directory descriptor and a name in it.

    ``info`` is the entry's ``lstat`` (never a link: links inside the folder were
    followed) and ``names`` its physical path from the folder. Use it as a context
    manager: the descriptors it holds are closed on exit.
    """

    def __init__(
        self, dir_fd: int, name: str, info: os.stat_result, names: tuple[str, ...], held: list[int]
    ) -> None:
        self.dir_fd = dir_fd
        self.name = name
        """``.`` when the path names a directory reached through ``..`` or the folder itself."""
        self.info = info
        self.names = names
        self._held = held

    def open(self, flags: int) -> int:
        """The entry opened with ``flags | O_NOFOLLOW | O_CLOEXEC``; the caller closes it.

        :raises PathRefused: the entry went away or was swapped for a link since the walk.
        :raises OSError: any other reason it cannot be opened (permissions, mostly).
        """
        try:
            return os.open(self.name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.dir_fd)
        except OSError as exc:
            if exc.errno in _SWAPPED:
                raise PathRefused(self.name) from None
            raise

    def close(self) -> None:
        while self._held:
            os.close(self._held.pop())

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class Folder(AbstractContextManager["Folder"]):
    """The operator's root, open as a directory descriptor; lookups stay beneath it.

    :raises OSError: ``root`` does not exist or is not a directory.
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self._given = os.path.abspath(root)
        self.fd = os.open(self._given, _O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        """The folder's own descriptor (an ``O_PATH`` handle: for lookups, not for reading)."""

    @functools.cached_property
    def real_path(self) -> str:
        """The folder's path with links resolved (computed once, on first use)."""
        return os.path.realpath(self._given)

    def entry(self, path: str) -> Entry:
        """What ``path`` names beneath the folder (use the result as a context manager).

        A relative ``path`` starts at the folder; an absolute one must spell the folder's
        path (as given or with links resolved) and goes on from there.

        :raises PathRefused: missing, outside, a link loop, a NUL byte, too long.
        """
        walk = _Walk(self, missing_ok=False)
        try:
            walk.run(path)
            return walk.entry()
        except BaseException:
            walk.close()
            raise

    def stat(self, path: str) -> os.stat_result:
        """The ``lstat`` of what ``path`` names, links inside the folder followed."""
        with self.entry(path) as entry:
            return entry.info

    def resolve(self, path: str, *, must_exist: bool = True) -> Path:
        """``path``'s physical path, for display: only a name, which can change under you.

        :param must_exist: when false, a missing tail is accepted and joined as written
            (``..`` in it still may not climb out of the folder).
        """
        walk = _Walk(self, missing_ok=not must_exist)
        try:
            walk.run(path)
            last = [walk.last[0]] if walk.last else []
            return Path(self.real_path, *walk.names, *last, *walk.missing)
        finally:
            walk.close()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def below(self, absolute: str) -> list[str]:
        """The components of ``absolute`` after the folder's own path, or PathRefused."""
        parts = _split(absolute)
        own = _split(self._given)
        if parts[: len(own)] != own:
            own = _split(self.real_path)  # resolved only when the path as given did not match
            if parts[: len(own)] != own:
                raise PathRefused(absolute)
        return parts[len(own) :]


class _Walk:
    """One lookup: a stack of directory descriptors below the folder's, and their names."""

    def __init__(self, folder: Folder, *, missing_ok: bool) -> None:
        self.folder = folder
        self.missing_ok = missing_ok
        self.held: list[int] = []
        self.names: list[str] = []
        self.missing: list[str] = []
        """Once a component is missing (``missing_ok`` only): it and the rest, as written."""
        self.gone = False
        self.last: tuple[str, os.stat_result] | None = None
        self.links = 0

    @property
    def top(self) -> int:
        return self.held[-1] if self.held else self.folder.fd

    def run(self, path: str) -> None:
        if "\x00" in path or len(path) > MAX_PATH_CHARS:
            raise PathRefused(path)
        parts = self.folder.below(path) if path.startswith("/") else _split(path)
        pending = parts[::-1]
        while pending:
            name = pending.pop()
            if name == "..":
                self._up()
            elif self.gone:
                self.missing.append(name)
            elif pending:
                self._step(name, pending)
            else:
                self._arrive(name, pending)

    def entry(self) -> Entry:
        if self.last is None:  # the path ends at a directory: the top of the stack
            return Entry(self.top, ".", os.fstat(self.top), tuple(self.names), self.held)
        name, info = self.last
        return Entry(self.top, name, info, (*self.names, name), self.held)

    def close(self) -> None:
        while self.held:
            os.close(self.held.pop())
        self.names.clear()

    def _up(self) -> None:
        if self.missing:
            self.missing.pop()
        elif self.held:
            os.close(self.held.pop())
            self.names.pop()
        else:
            raise PathRefused("..")  # would climb out of the folder

    def _step(self, name: str, pending: list[str]) -> None:
        """Into directory ``name`` (more components follow it)."""
        try:
            fd = os.open(name, _STEP_FLAGS, dir_fd=self.top)
        except OSError as exc:
            if exc.errno == errno.ENOENT and self.missing_ok:
                self._lost(name)
            elif exc.errno in _MAYBE_A_LINK:
                self._follow(name, pending)
            else:
                raise PathRefused(name) from None
            return
        self.held.append(fd)
        self.names.append(name)

    def _arrive(self, name: str, pending: list[str]) -> None:
        """At the last component: note it, or follow it if it is a link."""
        try:
            info = os.stat(name, dir_fd=self.top, follow_symlinks=False)
        except OSError as exc:
            if exc.errno == errno.ENOENT and self.missing_ok:
                self._lost(name)
                return
            raise PathRefused(name) from None
        if stat.S_ISLNK(info.st_mode):
            self._follow(name, pending)
        else:
            self.last = (name, info)

    def _follow(self, name: str, pending: list[str]) -> None:
        """Replace link ``name`` by its target's components (or refuse)."""
        self.links += 1
        if self.links > MAX_LINKS:
            raise PathRefused(name)
        try:
            target = os.readlink(name, dir_fd=self.top)
        except OSError:  # not a link after all (a file used as a directory), or gone
            raise PathRefused(name) from None
        if target.startswith("/"):
            parts = self.folder.below(target)
            self.close()  # back to the folder itself
        else:
            parts = _split(target)
        pending.extend(reversed(parts))

    def _lost(self, name: str) -> None:
        self.gone = True
        self.missing.append(name)
