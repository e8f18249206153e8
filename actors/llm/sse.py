"""Server-sent events over bytes: the ``data`` payload of each event, fed read by read.

The WHATWG event-stream grammar, reduced to what a chat-completions stream uses: lines end
with CR, LF or CRLF (a CRLF may be split across two reads); a blank line ends an event;
lines starting with ``:`` are comments (keep-alives); several ``data:`` lines of one event
are joined with LF; one space after the colon is dropped; other fields (``event``, ``id``,
``retry``) are ignored. An event without a ``data`` line is not dispatched, nor is one
left open when the stream ends (both as the specification says).

One decoder per response; it raises only :class:`LineTooLong`, for a line longer than
:data:`MAX_LINE_BYTES` (a server sending without end-of-line must not grow memory unbounded).
"""

from __future__ import annotations

from typing import Final

__all__ = ["MAX_LINE_BYTES", "LineTooLong", "SSEDecoder"]

MAX_LINE_BYTES: Final = 8 << 20
"""Bytes of one line (a ``data:`` line is one chunk: far below this) at most."""


class LineTooLong(ValueError):
    """A line of the event stream is longer than :data:`MAX_LINE_BYTES`."""


_CR: Final = b"\r"
_LF: Final = b"\n"
_BLANK_LINE: Final = b"\n\n"
_DATA_SPACE: Final = b"data: "


class SSEDecoder:
    """Incremental: :meth:`feed` each read, in order; get the payloads it completed."""

    __slots__ = ("_data", "_partial", "_pending", "_skip_lf")

    def __init__(self) -> None:
        self._partial: list[bytes] = []  # the pieces of a line not yet ended
        self._data: list[bytes] = []  # data lines of the open event
        self._skip_lf = False  # the last read ended with CR: a leading LF ends nothing
        self._pending = 0  # bytes in _partial

    def feed(self, chunk: bytes) -> list[bytes]:
        """The ``data`` of every event that ``chunk`` completes (``b"\\n"``-joined lines).
        Raises :class:`LineTooLong` once a line grows past :data:`MAX_LINE_BYTES`."""
        if self._skip_lf and chunk:
            self._skip_lf = False
            if chunk[0] == 10:  # LF
                chunk = chunk[1:]
        if 13 in chunk:  # CR (an int: `bytes in bytes` first fails as an index, costly)
            self._skip_lf = chunk.endswith(_CR)
            chunk = chunk.replace(b"\r\n", _LF).replace(_CR, _LF)
        if not self._partial and not self._data and chunk.endswith(_BLANK_LINE):
            # The usual read: whole events, each one "data: …" line. Anything else (a
            # comment, another field, several lines) is read line by line below.
            events = chunk.split(_BLANK_LINE)
            events.pop()
            payloads: list[bytes] = []
            for event in events:
                if event.startswith(_DATA_SPACE) and 10 not in event:
                    payloads.append(event[6:])
                elif event:
                    return self._lines(chunk)
            return payloads
        return self._lines(chunk)

    def _lines(self, chunk: bytes) -> list[bytes]:
        if 10 not in chunk:  # LF
            if chunk:
                self._keep(chunk)
            return []
        lines = chunk.split(_LF)
        rest = lines.pop()
        if self._partial:
            self._partial.append(lines[0])
            lines[0] = b"".join(self._partial)
            self._partial.clear()
            self._pending = 0
        if rest:
            self._keep(rest)
        events: list[bytes] = []
        data = self._data
        for line in lines:
            if not line:
                if data:
                    events.append(data[0] if len(data) == 1 else _LF.join(data))
                    data.clear()
            elif line.startswith(b"data:"):
                data.append(line[6:] if line[5:6] == b" " else line[5:])
            elif line == b"data":
                data.append(b"")
            # a comment (":…"), or a field this decoder has no use for
        return events

    def _keep(self, piece: bytes) -> None:
        self._partial.append(piece)
        self._pending += len(piece)
        if self._pending > MAX_LINE_BYTES:
            self._partial.clear()
            raise LineTooLong(f"an event-stream line is longer than {MAX_LINE_BYTES} bytes")
