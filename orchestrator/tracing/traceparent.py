"""The W3C Trace Context ``traceparent`` header: parsed strictly, formatted exactly.

``version-trace_id-parent_id-flags``, lowercase hex: ``00-<32>-<16>-<2>``. A header that
does not parse is ignored, as the specification asks of a receiver (the run starts a trace
of its own): :func:`parse_traceparent` returns ``None`` and never raises. This module
imports nothing of OpenTelemetry, so the daemon reads the header whether tracing is on or
not (the run's trace id is the caller's either way).
"""

from __future__ import annotations

import re
from typing import Final, NamedTuple

__all__ = ["HEADER", "TraceParent", "format_traceparent", "parse_traceparent"]

HEADER: Final = "traceparent"

_FIELDS: Final = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
_LENGTH: Final = 55
"""Characters of a version-00 header (a later version may append ``-`` and more)."""


class TraceParent(NamedTuple):
    """The caller's span: its trace id (32 hex), span id (16 hex) and trace flags."""

    trace_id: str
    span_id: str
    flags: int

    @property
    def sampled(self) -> bool:
        return bool(self.flags & 0x01)

    def header(self) -> str:
        """This span as a version-00 ``traceparent`` value."""
        return format_traceparent(self.trace_id, self.span_id, self.flags)


def format_traceparent(trace_id: str, span_id: str, flags: int) -> str:
    """``00-{trace_id}-{span_id}-{flags:02x}``."""
    return f"00-{trace_id}-{span_id}-{flags & 0xFF:02x}"


def parse_traceparent(value: str | None) -> TraceParent | None:
    """The span a ``traceparent`` header names, or ``None`` when it is absent or invalid.

    Strict, as the specification reads: lowercase hex only, version ``ff`` invalid, a
    version-00 header exactly 55 characters, a later version's extra fields after a ``-``,
    neither id all zeros. Spaces and tabs around the value are allowed (HTTP's).
    """
    value = (value or "").strip(" \t")
    if len(value) < _LENGTH or len(value) > 512:
        return None
    match = _FIELDS.match(value)
    if match is None:
        return None
    version, trace_id, span_id, flags = match.groups()
    if version == "ff" or (version == "00" and len(value) != _LENGTH):
        return None
    if len(value) > _LENGTH and value[_LENGTH] != "-":
        return None
    if trace_id == "0" * 32 or span_id == "0" * 16:
        return None
    return TraceParent(trace_id, span_id, int(flags, 16))
