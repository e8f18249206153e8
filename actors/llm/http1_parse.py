"""HTTP/1.x responses parsed from a connection's receive buffer: the head (status line and
headers) and the body's framing (``Content-Length``, ``chunked``, or until the close).

Pure functions and small state machines over a ``bytearray`` (what has arrived and is not
consumed yet); no I/O. What a server may make the client hold is bounded: a head of at
most :data:`MAX_HEAD_BYTES` and :data:`MAX_HEADERS` header lines, a chunk-size line of at
most :data:`MAX_CHUNK_LINE_BYTES`, trailers of at most :data:`MAX_HEAD_BYTES`. Anything
malformed or over a limit raises ``httpcore2.RemoteProtocolError`` (one of the transport's
connection errors, raised to callers as the SDK's ``APIConnectionError``).
"""

from __future__ import annotations

from typing import Final

import httpcore2

__all__ = [
    "MAX_CHUNK_LINE_BYTES",
    "MAX_HEADERS",
    "MAX_HEAD_BYTES",
    "Body",
    "Chunked",
    "Head",
    "Sized",
    "UntilClose",
    "body_for",
    "parse_head",
]

MAX_HEAD_BYTES: Final = 64 * 1024
"""Bytes of a response head (status line and headers), and of a chunked body's trailers."""

MAX_HEADERS: Final = 256
"""Header lines of a response head."""

MAX_CHUNK_LINE_BYTES: Final = 4096
"""Bytes of a chunk-size line (the size and any chunk extensions)."""

_HEX: Final = b"0123456789abcdefABCDEF"
_BLANK: Final = b" \t"
_BLANK_BYTES: Final = frozenset(_BLANK)
_VERSIONS: Final = {b"HTTP/1.1": "HTTP/1.1", b"HTTP/1.0": "HTTP/1.0"}


def _error(text: str) -> httpcore2.RemoteProtocolError:
    return httpcore2.RemoteProtocolError(text)


class Head:
    """A response's status line and headers (names as sent; :meth:`get` ignores case).

    What the client acts on is picked out while the head is parsed, each header name
    lowered once: the values of ``Transfer-Encoding``, ``Content-Length`` and
    ``Set-Cookie`` in order, and the last ``Content-Encoding``."""

    __slots__ = (
        "content_encoding",
        "content_lengths",
        "cookies",
        "headers",
        "keep_alive",
        "reason",
        "status",
        "transfer_encodings",
        "version",
    )

    def __init__(
        self, version: str, status: int, reason: bytes, headers: list[tuple[bytes, bytes]]
    ) -> None:
        self.version = version
        self.status = status
        self.reason = reason
        self.headers = headers
        self.keep_alive = version == "HTTP/1.1"
        self.transfer_encodings: list[bytes] = []
        self.content_lengths: list[bytes] = []
        self.cookies: list[bytes] = []
        self.content_encoding: bytes | None = None
        for name, value in headers:
            field = _FIELDS.get(name.lower())
            if field is not None:
                self._note(field, value)

    def _note(self, field: int, value: bytes) -> None:
        if field == _TRANSFER_ENCODING:
            self.transfer_encodings.append(value)
        elif field == _CONTENT_LENGTH:
            self.content_lengths.append(value)
        elif field == _SET_COOKIE:
            self.cookies.append(value)
        elif field == _CONTENT_ENCODING:
            self.content_encoding = value.strip().lower()
        else:  # Connection
            tokens = {t.strip().lower() for t in value.split(b",")}
            if b"close" in tokens:
                self.keep_alive = False
            elif b"keep-alive" in tokens:
                self.keep_alive = True

    def get(self, name: bytes) -> list[bytes]:
        """Every value of header ``name`` (lower case), in order."""
        return [v for k, v in self.headers if k.lower() == name]


_TRANSFER_ENCODING, _CONTENT_LENGTH, _SET_COOKIE, _CONTENT_ENCODING, _CONNECTION = range(5)
_FIELDS: Final = {
    b"transfer-encoding": _TRANSFER_ENCODING,
    b"content-length": _CONTENT_LENGTH,
    b"set-cookie": _SET_COOKIE,
    b"content-encoding": _CONTENT_ENCODING,
    b"connection": _CONNECTION,
}


def parse_head(buffer: bytearray) -> Head | None:
    """The head at the start of ``buffer`` (consumed from it), or ``None`` until it is all
    there. Lines may end in CRLF or a bare LF."""
    end = buffer.find(b"\r\n\r\n")
    cut = end + 4
    if end < 0:
        end = buffer.find(b"\n\n")
        cut = end + 2
        if end < 0:
            if len(buffer) > MAX_HEAD_BYTES:
                raise _error(f"a response head longer than {MAX_HEAD_BYTES} bytes")
            return None
    else:  # a bare-LF head ending before the CRLF one
        early = buffer.find(b"\n\n", 0, end)
        if early >= 0:
            end, cut = early, early + 2
    if end > MAX_HEAD_BYTES:
        raise _error(f"a response head longer than {MAX_HEAD_BYTES} bytes")
    text = bytes(buffer[:end])
    del buffer[:cut]
    if 0 in text:  # NUL (ints: `bytes in bytes` is an index attempt first)
        raise _error("a response head holding NUL or a bare CR")
    if 13 in text:  # CR
        if text.count(b"\r") != text.count(b"\r\n"):
            raise _error("a response head holding NUL or a bare CR")
        text = text.replace(b"\r\n", b"\n")
    lines = text.split(b"\n")
    if len(lines) > MAX_HEADERS + 1:
        raise _error(f"a response head with more than {MAX_HEADERS} header lines")
    version, _, rest = lines[0].partition(b" ")
    code, _, reason = rest.partition(b" ")
    known = _VERSIONS.get(version)
    if known is None or len(code) != 3 or not code.isdigit():
        raise _error(f"not an HTTP/1.x status line: {lines[0][:100]!r}")
    headers: list[tuple[bytes, bytes]] = []
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or not name or name[-1] in _BLANK_BYTES or name[0] in _BLANK_BYTES:
            raise _error(f"a malformed header line: {line[:100]!r}")
        headers.append((name, value.strip(_BLANK)))
    return Head(known, int(code), reason.strip(), headers)


class Body:
    """A body's framing: :meth:`feed` takes what belongs to the body from the buffer."""

    __slots__ = ("done",)

    def __init__(self) -> None:
        self.done = False

    def feed(self, buffer: bytearray, out: list[bytes]) -> None:
        """Move the body's bytes at the start of ``buffer`` into ``out``; ``done`` once the
        body is complete (what follows it stays in ``buffer``)."""
        raise NotImplementedError

    def at_eof(self) -> None:
        """The server closed the connection: raises unless that ends the body."""
        if not self.done:
            raise _error("the server closed the connection before the body was complete")


class Sized(Body):
    """A body of ``Content-Length`` bytes."""

    __slots__ = ("remaining",)

    def __init__(self, length: int) -> None:
        super().__init__()
        self.remaining = length
        self.done = length == 0

    def feed(self, buffer: bytearray, out: list[bytes]) -> None:
        remaining = self.remaining
        if len(buffer) <= remaining:
            if buffer:
                out.append(bytes(buffer))
                remaining -= len(buffer)
                buffer.clear()
        else:
            out.append(bytes(buffer[:remaining]))
            del buffer[:remaining]
            remaining = 0
        self.remaining = remaining
        self.done = remaining == 0


class UntilClose(Body):
    """A body that ends when the server closes the connection."""

    __slots__ = ()

    def feed(self, buffer: bytearray, out: list[bytes]) -> None:
        if buffer:
            out.append(bytes(buffer))
            buffer.clear()

    def at_eof(self) -> None:
        self.done = True


_SIZE, _DATA, _DATA_END, _TRAILER = range(4)


class Chunked(Body):
    """A ``Transfer-Encoding: chunked`` body; chunk extensions and trailers are skipped."""

    __slots__ = ("remaining", "state", "trailer_bytes")

    def __init__(self) -> None:
        super().__init__()
        self.state = _SIZE
        self.remaining = 0
        self.trailer_bytes = 0

    def feed(self, buffer: bytearray, out: list[bytes]) -> None:
        # One pass over the buffer with a cursor: what was consumed is cut from it once, and
        # the data of every chunk completed or begun goes out as one piece.
        pos = 0
        size_of = len(buffer)
        spans: list[tuple[int, int]] = []
        state = self.state
        try:
            while pos < size_of:
                if state == _DATA:
                    remaining = self.remaining
                    stop = min(pos + remaining, size_of)
                    spans.append((pos, stop))
                    self.remaining = remaining - (stop - pos)
                    pos = stop
                    if self.remaining:
                        break
                    state = _DATA_END
                elif state == _SIZE:
                    end = buffer.find(b"\n", pos)
                    if end < 0:
                        if size_of - pos > MAX_CHUNK_LINE_BYTES:
                            raise _error("a chunk-size line longer than the limit")
                        break
                    if end - pos > MAX_CHUNK_LINE_BYTES:
                        raise _error("a chunk-size line longer than the limit")
                    size = buffer[pos:end].partition(b";")[0].strip(b" \t\r")
                    pos = end + 1
                    if not size or len(size) > 16 or size.strip(_HEX):
                        raise _error(f"a malformed chunk size: {bytes(size[:40])!r}")
                    remaining = int(size, 16)
                    if not remaining:
                        state = _TRAILER
                        continue
                    stop = pos + remaining
                    if stop + 1 < size_of and buffer[stop] == 0x0D and buffer[stop + 1] == 0x0A:
                        spans.append((pos, stop))  # the whole chunk is there, and its CRLF
                        pos = stop + 2
                        continue
                    self.remaining = remaining
                    state = _DATA
                elif state == _DATA_END:
                    byte = buffer[pos]
                    if byte == 0x0A:  # a bare LF
                        pos += 1
                    elif byte == 0x0D:
                        if size_of - pos < 2:
                            break
                        if buffer[pos + 1] != 0x0A:
                            raise _error("a chunk not followed by CRLF")
                        pos += 2
                    else:
                        raise _error("a chunk longer than its size")
                    state = _SIZE
                else:  # trailers: skipped, up to the empty line
                    end = buffer.find(b"\n", pos)
                    if end < 0:
                        if self.trailer_bytes + size_of - pos > MAX_HEAD_BYTES:
                            raise _error("trailers longer than the limit")
                        break
                    self.trailer_bytes += end + 1 - pos
                    if self.trailer_bytes > MAX_HEAD_BYTES:
                        raise _error("trailers longer than the limit")
                    line = buffer[pos:end]
                    pos = end + 1
                    if not line.strip(b"\r"):
                        self.done = True
                        break
        finally:
            self.state = state
            if spans:
                if len(spans) == 1:
                    start, stop = spans[0]
                    out.append(bytes(buffer[start:stop]))
                else:
                    out.append(b"".join([buffer[start:stop] for start, stop in spans]))
            del buffer[:pos]


def body_for(head: Head) -> Body:
    """The framing of ``head``'s body (RFC 9112 section 6.3); ``head.keep_alive`` is set
    false when the body ends with the connection. A response to a POST: no HEAD case."""
    status = head.status
    if status in (204, 304) or status < 200:
        return Sized(0)
    encodings = head.transfer_encodings
    if encodings:
        head.keep_alive = head.keep_alive and not head.content_lengths
        last = encodings[-1].rpartition(b",")[2].strip().lower()
        if last == b"chunked":
            return Chunked()
        head.keep_alive = False
        return UntilClose()
    lengths = head.content_lengths
    if lengths:
        values = {v.strip() for value in lengths for v in value.split(b",")}
        if len(values) != 1:
            raise _error("conflicting Content-Length headers")
        (value,) = values
        if not value.isdigit() or len(value) > 18:
            raise _error(f"a malformed Content-Length: {value[:40]!r}")
        return Sized(int(value))
    head.keep_alive = False
    return UntilClose()
