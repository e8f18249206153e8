"""``scan``: a deterministic, bounded, path-guarded survey of a data folder (no model).

Files are bucketed by extension into documents / images / data / other with counts and
sizes. The walk is bounded by file count, depth, entries read per directory and time (no
file's content is read), and skips hidden entries; :func:`scan_folder` says how it stays
inside the folder.
"""

from __future__ import annotations

import itertools
import os
import stat
import time
from dataclasses import dataclass, field
from typing import Final, Literal, get_args

import msgspec

from actors.tools.folder import Folder, PathRefused

__all__ = ["Bucket", "FolderScan", "ScannedFile", "scan_folder"]

Bucket = Literal["documents", "images", "data", "other"]

_BUCKETS: Final[dict[str, Bucket]] = {
    **dict.fromkeys(
        (".txt", ".md", ".rst", ".pdf", ".doc", ".docx", ".tex", ".html", ".odt"), "documents"
    ),
    **dict.fromkeys((".png", ".jpg", ".jpeg", ".gif", ".bmp", ".tif", ".tiff", ".svg"), "images"),
    **dict.fromkeys(
        (".csv", ".tsv", ".json", ".xlsx", ".xls", ".dat", ".toml", ".yaml", ".yml", ".ini"),
        "data",
    ),
}
BUCKET_ORDER: Final[tuple[Bucket, ...]] = get_args(Bucket)
_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NONBLOCK


class ScannedFile(msgspec.Struct, frozen=True, kw_only=True):
    path: str
    """Relative to the scanned folder, with ``/`` separators."""
    size: int
    bucket: Bucket


class FolderScan(msgspec.Struct, frozen=True, kw_only=True):
    """What the folder holds, and whether a bound cut the walk short."""

    files: tuple[ScannedFile, ...]
    truncated: str | None = None
    """Which bound stopped the walk (``files``, ``depth``, ``entries``, ``time``), or
    ``None``."""

    def summary(self) -> str:
        """One line: counts and sizes per bucket (the first progress event's detail)."""
        grouped = [(b, [f for f in self.files if f.bucket == b]) for b in BUCKET_ORDER]
        parts = [f"{len(fs)} {b} ({_human(sum(f.size for f in fs))})" for b, fs in grouped if fs]
        text = f"{len(self.files)} files: " + ", ".join(parts) if parts else "no files"
        return text + (f" (cut short by the {self.truncated} bound)" if self.truncated else "")

    def listing(self) -> str:
        """The bucketed file list as text for a prompt (at most 200 files a bucket)."""
        lines: list[str] = []
        for bucket in BUCKET_ORDER:
            if entries := [f for f in self.files if f.bucket == bucket]:
                lines.append(f"{bucket}:")
                lines += [f"  {f.path} ({_human(f.size)})" for f in entries[:200]]
        return "\n".join(lines) or "(empty folder)"


def _human(size: int) -> str:
    if size < 1024:
        return f"{size} B"
    if size < 1024 * 1024:
        return f"{size / 1024:.1f} KB"
    return f"{size / (1024 * 1024):.1f} MB"


def scan_folder(
    root: str | os.PathLike[str],
    *,
    max_files: int = 2_000,
    max_depth: int = 8,
    max_entries: int = 100_000,
) -> FolderScan:
    """Scan ``root`` recursively within the bounds and 5 s (``max_entries``: entries read of
    one directory; a directory of millions of empty files costs its owner little).

    The walk goes through directory descriptors (each subdirectory opened with
    ``O_NOFOLLOW`` beneath its parent's), so a directory swapped for a link while it runs
    leads nowhere outside. A link is looked up through the path guard's walker and counts
    only when it leads to a file or directory inside the folder.

    :raises NotADirectoryError: ``root`` is not a directory.
    """
    try:
        folder = Folder(root)
    except OSError:
        raise NotADirectoryError(f"report folder {str(root)!r} is not a directory") from None
    with folder:
        walk = _Scan(folder, max_files, max_depth, time.monotonic() + 5.0, max_entries)
        try:
            with folder.entry(".") as top:
                fd = top.open(_DIR_FLAGS)
        except (PathRefused, OSError):
            raise NotADirectoryError(f"report folder {str(root)!r} cannot be read") from None
        try:
            walk.visit(fd, "", 0)
        finally:
            os.close(fd)
        files = sorted(walk.files, key=lambda f: f.path)
        return FolderScan(files=tuple(files), truncated=walk.truncated)


@dataclass
class _Scan:
    """One bounded walk: depth first, each directory's entries by name."""

    folder: Folder
    max_files: int
    max_depth: int
    deadline: float
    max_entries: int
    files: list[ScannedFile] = field(default_factory=list)
    truncated: str | None = None

    def visit(self, fd: int, prefix: str, depth: int) -> None:
        """Directory ``fd`` (at ``prefix``, ``depth`` below the folder) and what it holds."""
        try:
            with os.scandir(fd) as scan:
                read = list(itertools.islice(scan, self.max_entries + 1))
        except OSError:
            return
        if len(read) > self.max_entries:
            self.truncated = "entries"
        subfolders: list[tuple[os.DirEntry[str], str]] = []
        for entry in sorted(read[: self.max_entries], key=lambda e: e.name):
            if entry.name.startswith("."):
                continue
            if time.monotonic() > self.deadline:
                self.truncated = "time"
                break
            relative = prefix + entry.name
            kind, size = self._kind(entry, relative)
            if kind == "dir":
                if depth + 1 > self.max_depth:
                    self.truncated = "depth"
                    continue
                subfolders.append((entry, relative))
            elif kind == "file":
                if len(self.files) >= self.max_files:
                    self.truncated = "files"
                    break
                bucket = _BUCKETS.get(os.path.splitext(entry.name)[1].lower(), "other")
                self.files.append(ScannedFile(path=relative, size=size, bucket=bucket))
        for entry, relative in subfolders:
            if self.truncated is not None:
                return
            sub = self._open(fd, entry, relative)
            if sub is None:
                continue
            try:
                self.visit(sub, relative + "/", depth + 1)
            finally:
                os.close(sub)

    def _kind(self, entry: os.DirEntry[str], relative: str) -> tuple[str | None, int]:
        """``dir``, ``file`` (with its size) or neither; a link as what it leads to inside."""
        try:
            if entry.is_symlink():
                info = self.folder.stat(relative)
            else:
                info = entry.stat(follow_symlinks=False)
        except (PathRefused, OSError):
            return None, 0  # a link out of the folder, a loop, or gone since the listing
        if stat.S_ISDIR(info.st_mode):
            return "dir", 0
        return ("file", info.st_size) if stat.S_ISREG(info.st_mode) else (None, 0)

    def _open(self, parent: int, entry: os.DirEntry[str], relative: str) -> int | None:
        try:
            if not entry.is_symlink():
                return os.open(entry.name, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=parent)
            with self.folder.entry(relative) as target:
                if not stat.S_ISDIR(target.info.st_mode):
                    return None
                return target.open(_DIR_FLAGS)
        except (PathRefused, OSError):
            return None  # gone, or swapped for a link or a file since the listing
