"""The calls a detector remembers, and the interface every tool-call detector implements."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from actors.loop.verdicts import Hit

__all__ = ["CallRecord", "ToolDetector", "Window", "result_streak"]


@dataclass(slots=True)
class CallRecord:
    """One recorded call; ``result`` is its result fingerprint once known."""

    tool: str
    fingerprint: str
    call_id: str
    is_poll: bool
    result: str | None = None


class Window:
    """The last ``size`` accepted calls, oldest first, with their fingerprints in a list
    beside them, so "is this call in the window" and "how often" are one C-level scan."""

    __slots__ = ("_size", "fingerprints", "records")

    def __init__(self, size: int) -> None:
        self._size = size
        self.records: list[CallRecord] = []
        self.fingerprints: list[str] = []

    def append(self, call: CallRecord) -> None:
        """Add ``call``, forgetting the oldest past ``size``."""
        self.records.append(call)
        self.fingerprints.append(call.fingerprint)
        if len(self.records) > self._size:
            del self.records[0]
            del self.fingerprints[0]


EMPTY_WINDOW = Window(0)
"""What detectors that never read the window are given (nothing is ever appended to it)."""


class ToolDetector(Protocol):
    """A tool-call detector with its own counters.

    ``check`` judges a proposed call without changing anything; ``record`` is called when
    the call is accepted into the history (only if ``records``); ``on_result`` when its
    result arrives (only if ``watches_results``). ``fresh`` gives the detector for a new
    run: the detector itself when it keeps no state of its own.
    """

    @property
    def records(self) -> bool: ...

    @property
    def watches_results(self) -> bool: ...

    def fresh(self) -> ToolDetector: ...

    def check(self, call: CallRecord, window: Window) -> Hit | None: ...

    def record(self, call: CallRecord) -> None: ...

    def on_result(self, call: CallRecord, previous: str | None) -> None: ...


def result_streak(window: Window, fingerprint: str) -> tuple[int, str | None]:
    """OpenClaw's no-progress streak of ``fingerprint``: newest first, calls without a
    result skipped, counting while the result equals the newest one. Returns the count
    and that newest result."""
    if fingerprint not in window.fingerprints:
        return 0, None
    streak = 0
    latest: str | None = None
    for record in reversed(window.records):
        if record.fingerprint != fingerprint or record.result is None:
            continue
        if latest is None:
            latest = record.result
        elif record.result != latest:
            break
        streak += 1
    return streak, latest
