"""The files sandboxed code saved, read back from its result channel (untrusted bytes).

The sandbox writes nothing on the host: its output folder is a size-limited tmpfs that
disappears with it. Before it ends, the driver (:mod:`actors.tools.sandbox.driver`) writes
the folder's regular files to its stdout, which the runner points at a temporary file
(``RLIMIT_FSIZE`` bounds it). The code could have written anything there, so
:func:`read_outputs` checks every byte: the header, names of letters, digits, ``.``,
``_`` and ``-`` only, sizes that match, the end marker. :func:`save_outputs` then writes
the files into the host's output folder itself.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import BinaryIO, Final

__all__ = ["MAX_FILES", "OutputsUnreadable", "read_outputs", "save_outputs"]

HEADER: Final = b"loopfuse-figures 1\n"
END: Final = b"end\n"
MAX_FILES: Final = 32
"""Files one call may pass back (the host writes, and later removes, each of them)."""
NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
_ENTRY: Final = re.compile(rb"([A-Za-z0-9][A-Za-z0-9._-]{0,99}) (0|[1-9][0-9]{0,11})\n")


class OutputsUnreadable(ValueError):
    """The result channel does not hold what the driver writes."""


def read_outputs(channel: BinaryIO, max_bytes: int) -> dict[str, bytes]:
    """Parse the channel (at most ``max_bytes`` are read): name → content, in order.

    :raises OutputsUnreadable: naming what is wrong.
    """
    data = channel.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise OutputsUnreadable(f"more than {max_bytes} bytes")
    if not data.startswith(HEADER):
        raise OutputsUnreadable("no header")
    files: dict[str, bytes] = {}
    at = len(HEADER)
    while not data.startswith(END, at):
        entry = _ENTRY.match(data, at, at + 120)
        if entry is None:
            raise OutputsUnreadable(f"a malformed entry at byte {at}")
        name, size = entry[1].decode(), int(entry[2])
        start = entry.end()
        if start + size > len(data):
            raise OutputsUnreadable(f"{name!r} is cut short")
        if name in files:
            raise OutputsUnreadable(f"{name!r} twice")
        if len(files) == MAX_FILES:
            raise OutputsUnreadable(f"more than {MAX_FILES} files")
        files[name] = data[start : start + size]
        at = start + size
    if at + len(END) != len(data):
        raise OutputsUnreadable("bytes after the end marker")
    return files


def save_outputs(files: dict[str, bytes], out_dir: Path) -> tuple[str, ...]:
    """Write ``files`` into ``out_dir`` (the daemon's own folder; names already checked);
    return their names, sorted."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        if not NAME.fullmatch(name):  # read_outputs only returns such names
            raise OutputsUnreadable(f"{name!r} is not a file name")
        (out_dir / name).write_bytes(content)
    return tuple(sorted(files))
