"""Call and result fingerprints: computed once per call, shared by every monitor.

A call fingerprint is SHA-256 over the tool name and the canonical JSON of its full
arguments: keys sorted at every depth, integral floats written as integers (``1.0`` and
``1`` are the same argument), strings as decoded (so ``"\\u00e9"`` and ``"é"`` agree).
It never raises: arguments that are not JSON hash as their raw text.
"""

from __future__ import annotations

import hashlib
import math

import msgspec

__all__ = ["canonical_arguments", "fingerprint_call", "fingerprint_result"]

_INTEGRAL_LIMIT = 2**53


def _float(text: str) -> float | int:
    """A JSON float literal as the canonical form has it: integral values as integers."""
    value = float(text)
    if value.is_integer():
        return int(value) if abs(value) < _INTEGRAL_LIMIT else value
    if math.isinf(value):  # as msgspec's own float parsing: out of range
        raise ValueError("Number out of range")
    return value


# Floats are normalised as they are decoded (float_hook): no second walk over the value.
_decode = msgspec.json.Decoder(float_hook=_float).decode
_encoder = msgspec.json.Encoder(order="sorted")


def canonical_arguments(arguments: str) -> bytes:
    """The canonical JSON of ``arguments`` (raw text tagged as such when not JSON)."""
    try:
        return _encoder.encode(_decode(arguments))
    except (msgspec.DecodeError, msgspec.EncodeError, RecursionError, ValueError, TypeError):
        return b"raw:" + arguments.encode("utf-8", "surrogatepass")


def fingerprint_call(tool: str, arguments: str) -> str:
    """Hex SHA-256 of ``tool`` and its canonical arguments."""
    key = b"%b\x00%b" % (tool.encode("utf-8", "surrogatepass"), canonical_arguments(arguments))
    return hashlib.sha256(key).hexdigest()


def fingerprint_result(content: str, *, is_error: bool = False) -> str:
    """Hex SHA-256 of a tool result (errors and successes never collide)."""
    prefix = b"error:" if is_error else b"ok:"
    return hashlib.sha256(prefix + content.encode("utf-8", "surrogatepass")).hexdigest()
