"""``read_file``: text of a file in the run's folder, by lines, cut at a character budget.

``offset`` and ``limit`` count lines (``offset`` is the 0-based first line). The text is
cut at whole lines before it passes ``read_chars`` (seed 000: 7000), and a note at the end
says which ``offset`` reads on, so continuing never skips or repeats a line. A single line
longer than the budget is shown cut, and reading continues with the next line. The file is
streamed: only as much is read as the answer needs.

Reading is bounded by bytes and time, whatever the lines' length: every read, skipping
the rest of a long line included, counts against ``max_scan_bytes`` and
``max_scan_seconds``, so a one-line multi-GiB file (a sparse file costs its owner nothing)
holds a worker thread for at most that long.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Annotated

import msgspec

from actors.tools.context import ToolContext
from actors.tools.errors import ToolError
from actors.tools.limits import ToolLimits
from actors.tools.path_guard import open_regular_file
from actors.tools.threads import run_in_thread

__all__ = ["ReadFile", "read_file", "read_text"]

_CHUNK = 64 * 1024


class ReadFile(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Read a text file in the folder, a range of lines at a time."""

    path: Annotated[str, msgspec.Meta(description="File path, relative to the folder.")]
    offset: Annotated[
        int, msgspec.Meta(ge=0, description="First line to read (0-based). Default 0.")
    ] = 0
    limit: Annotated[
        Annotated[int, msgspec.Meta(ge=1)] | None,
        msgspec.Meta(description="How many lines to read at most. Default: as many as fit."),
    ] = None


async def read_file(params: ReadFile, ctx: ToolContext) -> str:
    """The ``read_file`` tool: :func:`read_text` in a worker thread."""
    return await run_in_thread(
        lambda: read_text(ctx.root, params.path, params.offset, params.limit, ctx.limits)
    )


def read_text(
    root: Path | None, path: str, offset: int, limit: int | None, limits: ToolLimits
) -> str:
    """Lines ``offset`` … of ``path`` inside ``root``, cut as the module docstring says.

    :raises ToolError: kind ``path`` (missing, outside, not a regular file), ``binary``
        (NUL bytes in the first ``binary_probe_bytes``) or ``too_large`` (``offset`` lies
        beyond ``max_scan_bytes`` or ``max_scan_seconds`` of reading).
    """
    file, _ = open_regular_file(root, path)
    with file:
        if b"\x00" in file.read(limits.binary_probe_bytes):
            raise ToolError(
                "binary",
                f"{path} is a binary file (it has NUL bytes); read_file reads text files only",
            )
        file.seek(0)
        budget = limits.read_chars
        lines = _lines(file, keep=budget * 4 + 1, limits=limits, path=path)
        for skipped in range(offset):
            if next(lines, None) is None:
                return (
                    f"[read_file: offset {offset} is past the end of the file ({skipped} lines).]"
                )

        parts: list[str] = []
        used = 0
        index = offset
        note = ""
        for raw in lines:
            if limit is not None and index - offset == limit:
                note = f"[read_file: {limit} lines shown; the file continues at offset={index}.]"
                break
            text = raw.decode("utf-8", "replace")
            if used + len(text) > budget:
                if parts:
                    note = (
                        f"[read_file: cut at {budget} characters. The file continues: call "
                        f"read_file with offset={index} and a limit in lines to read on.]"
                    )
                else:
                    parts.append(text[:budget])
                    note = (
                        f"[read_file: the line at offset {index} is longer than {budget} "
                        f"characters and was cut. Call read_file with offset={index + 1} to read "
                        "the lines after it.]"
                    )
                break
            parts.append(text)
            used += len(text)
            index += 1

        if not parts and not note:
            if offset == 0:
                return "[read_file: the file is empty.]"
            return f"[read_file: offset {offset} is the end of the file ({offset} lines).]"
        body = "".join(parts)
        if note:
            body += ("" if body.endswith("\n") or not body else "\n") + note
        return body


def _lines(file: IO[bytes], *, keep: int, limits: ToolLimits, path: str) -> Iterator[bytes]:
    """Each line with its newline, at most ``keep`` bytes of it. The rest of a longer line
    is skipped only when the next line is asked for, and every read (the skipping too)
    stops at ``max_scan_bytes`` read or ``max_scan_seconds`` spent.

    :raises ToolError: kind ``too_large`` when a bound is reached.
    """
    max_bytes = limits.max_scan_bytes
    deadline = time.monotonic() + limits.max_scan_seconds
    read = 0

    def readline(size: int) -> bytes:
        nonlocal read
        if read > max_bytes or time.monotonic() > deadline:
            bound = f"{max_bytes} bytes" if read > max_bytes else f"{limits.max_scan_seconds:g} s"
            raise ToolError(
                "too_large",
                f"{path}: stopped reading after {bound}; use a smaller offset",
            )
        line = file.readline(size)
        read += len(line)
        return line

    while line := readline(keep):
        yield line
        if len(line) == keep and not line.endswith(b"\n"):
            while (rest := readline(_CHUNK)) and not rest.endswith(b"\n"):
                pass
