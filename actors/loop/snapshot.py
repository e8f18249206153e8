"""A loop detector's state as bytes, so a resumed run keeps its fuses.

:meth:`LoopDetector.snapshot` gives the state of a run's detector (msgspec JSON);
:meth:`LoopDetector.restore` takes it back into a detector made with the same config. The
Struct lives here, outside the modules compiled with mypyc.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

from actors.loop.history import CallRecord

__all__ = ["LoopSnapshot", "decode_snapshot", "encode_snapshot"]


class LoopSnapshot(msgspec.Struct, frozen=True, kw_only=True):
    """Everything a :class:`~actors.loop.LoopDetector` remembers about one run."""

    version: int = 1
    config: str
    """The config's ``name`` (a snapshot is restored into a detector of the same config)."""
    detectors: int
    """How many detectors were enabled (a cheap check that the config is the same)."""
    seq: int = 0
    window: list[CallRecord] = []
    pending: list[CallRecord] = []
    last_results: dict[str, str] | None = None
    states: list[dict[str, Any]] = []
    buckets: dict[str, int] | None = None
    nudged: list[list[str]] | None = None
    strikes: int = 0
    refusals: int = 0
    """Refusals without progress in between (``refusal_limit``)."""
    since_refusal: dict[str, Any] | None = None
    """The results seen since the first of those refusals (``None``: no refusal)."""
    progress: dict[str, Any] | None = None
    """The results seen (``actors.loop.progress``), when a detector asks for progress."""
    content_offences: int = 0
    llm: list[int] | None = None
    """The model-based check's next turn, interval and loops found (``None``: never due)."""


encode_snapshot: Final = msgspec.json.Encoder().encode
"""A :class:`LoopSnapshot` as JSON bytes."""
decode_snapshot: Final = msgspec.json.Decoder(LoopSnapshot).decode
"""The :class:`LoopSnapshot` in JSON bytes (:class:`msgspec.DecodeError` if there is none)."""
