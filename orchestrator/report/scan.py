"""``scan``: a deterministic, bounded, path-guarded survey of a data folder (no model).

Files are bucketed by extension into documents / images / data / other with counts and
sizes. The walk is bounded by file count, depth and time, never follows a symbolic link
out of the folder, and skips hidden entries.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Final, Literal

import msgspec

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
BUCKET_ORDER: Final[tuple[Bucket, ...]] = ("documents", "images", "data", "other")


class ScannedFile(msgspec.Struct, frozen=True, kw_only=True):
    path: str
    """Relative to the scanned folder, with ``/`` separators."""
    size: int
    bucket: Bucket


class FolderScan(msgspec.Struct, frozen=True, kw_only=True):
    """What the folder holds, and whether a bound cut the walk short."""

    root: str
    files: tuple[ScannedFile, ...]
    truncated: str | None = None
    """Which bound stopped the walk (``files``, ``depth``, ``time``), or ``None``."""

    def count(self, bucket: Bucket) -> int:
        return sum(1 for f in self.files if f.bucket == bucket)

    def size(self, bucket: Bucket) -> int:
        return sum(f.size for f in self.files if f.bucket == bucket)

    def summary(self) -> str:
        """One line: counts and sizes per bucket (the first progress event's detail)."""
        parts = [
            f"{self.count(b)} {b} ({_human(self.size(b))})" for b in BUCKET_ORDER if self.count(b)
        ]
        text = f"{len(self.files)} files: " + ", ".join(parts) if parts else "no files"
        return text + (f" (cut short by the {self.truncated} bound)" if self.truncated else "")

    def listing(self, limit: int = 200) -> str:
        """The bucketed file list as text for a prompt."""
        lines: list[str] = []
        for bucket in BUCKET_ORDER:
            entries = [f for f in self.files if f.bucket == bucket]
            if entries:
                lines.append(f"{bucket}:")
                lines += [f"  {f.path} ({_human(f.size)})" for f in entries[:limit]]
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
    max_seconds: float = 5.0,
) -> FolderScan:
    """Scan ``root`` recursively within the bounds.

    :raises NotADirectoryError: ``root`` is not a directory.
    """
    base = Path(root).resolve()
    if not base.is_dir():
        raise NotADirectoryError(f"report folder {str(root)!r} is not a directory")
    deadline = time.monotonic() + max_seconds
    files: list[ScannedFile] = []
    truncated: str | None = None
    stack: list[tuple[Path, int]] = [(base, 0)]
    while stack and truncated is None:
        folder, depth = stack.pop()
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError:
            continue
        subfolders: list[Path] = []
        for entry in entries:
            if entry.name.startswith("."):
                continue
            if time.monotonic() > deadline:
                truncated = "time"
                break
            path = Path(entry.path)
            if not path.resolve().is_relative_to(base):
                continue  # a link out of the folder
            if entry.is_dir():
                if depth + 1 > max_depth:
                    truncated = "depth"
                    continue
                subfolders.append(path)
            elif entry.is_file():
                if len(files) >= max_files:
                    truncated = "files"
                    break
                bucket = _BUCKETS.get(path.suffix.lower(), "other")
                relative = path.relative_to(base).as_posix()
                files.append(ScannedFile(path=relative, size=entry.stat().st_size, bucket=bucket))
        stack.extend((sub, depth + 1) for sub in reversed(subfolders))
    files.sort(key=lambda f: f.path)
    return FolderScan(root=str(base), files=tuple(files), truncated=truncated)
