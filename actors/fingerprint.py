"""Call and result fingerprints: computed once per call, shared by every monitor.

A call fingerprint is SHA-256 over the tool name and the canonical JSON of its full
arguments: keys sorted at every depth, integral floats written as integers (``1.0`` and
``1`` are the same argument), strings as decoded (so ``"\\u00e9"`` and ``"é"`` agree).
It never raises: arguments that are not JSON hash as their raw text.
"""

from __future__ import annotations

import hashlib
from typing import Any

import msgspec

__all__ = ["canonical_arguments", "fingerprint_call", "fingerprint_result"]

_decode = msgspec.json.Decoder().decode
_encoder = msgspec.json.Encoder(order="sorted")


def _normalise(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if isinstance(value, dict):
        return {key: _normalise(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_normalise(item) for item in value]
    return value


def canonical_arguments(arguments: str) -> bytes:
    """The canonical JSON of ``arguments`` (raw text tagged as such when not JSON)."""
    try:
        return _encoder.encode(_normalise(_decode(arguments)))
    except (msgspec.DecodeError, msgspec.EncodeError, RecursionError, ValueError, TypeError):
        return b"raw:" + arguments.encode("utf-8", "surrogatepass")


def fingerprint_call(tool: str, arguments: str) -> str:
    """Hex SHA-256 of ``tool`` and its canonical arguments."""
    digest = hashlib.sha256(tool.encode("utf-8", "surrogatepass"))
    digest.update(b"\x00")
    digest.update(canonical_arguments(arguments))
    return digest.hexdigest()


def fingerprint_result(content: str, *, is_error: bool = False) -> str:
    """Hex SHA-256 of a tool result (errors and successes never collide)."""
    digest = hashlib.sha256(b"error:" if is_error else b"ok:")
    digest.update(content.encode("utf-8", "surrogatepass"))
    return digest.hexdigest()
