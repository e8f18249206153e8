"""The calls a detector remembers, and the interface every tool-call detector implements."""

from __future__ import annotations

import copy
from typing import ClassVar

import msgspec

from actors.loop.verdicts import Hit

__all__ = ["EMPTY_WINDOW", "CallRecord", "ToolDetector", "Window", "result_streak"]


class CallRecord(msgspec.Struct, gc=False):
    """One recorded call; ``result`` is its result fingerprint once known. (Strings only:
    it cannot be part of a reference cycle, so the cycle collector does not track it.)"""

    tool: str
    fingerprint: str
    call_id: str
    is_poll: bool
    result: str | None = None
    inspection: bool = False
    """A git-overview shell command (``shell_stagnation``)."""
    unknown: bool = False
    """Its result said the tool does not exist (``unknown_tool``)."""
    informative: bool = True
    """Its result is long enough to count as information (``no_new_information``)."""
    error: bool = False
    """Its result was an error (a failed call, an unknown tool): ``error_streak``."""
    error_text: str = ""
    """The start of that error's text (only while an error streak is watched)."""
    progress: bool = False
    """Its result made progress (``actors.loop.progress``; only when a detector asks)."""
    refused: bool = False
    """A refused call recorded with the call's last result (``record_blocked``)."""


class Window:
    """The last ``size`` accepted calls, oldest first, and how often each fingerprint is
    among them: "how often is this call in the window" is one dict look-up."""

    __slots__ = ("_counts", "_size", "records")

    def __init__(self, size: int) -> None:
        self._size = size
        self.records: list[CallRecord] = []
        self._counts: dict[str, int] = {}

    def count(self, fingerprint: str) -> int:
        """Calls in the window with this fingerprint."""
        return self._counts.get(fingerprint, 0)

    def append(self, call: CallRecord) -> None:
        """Add ``call``, forgetting the oldest past ``size``."""
        records, counts = self.records, self._counts
        records.append(call)
        counts[call.fingerprint] = counts.get(call.fingerprint, 0) + 1
        if len(records) > self._size:
            oldest = records.pop(0).fingerprint
            left = counts[oldest] - 1
            if left:
                counts[oldest] = left
            else:
                del counts[oldest]


EMPTY_WINDOW = Window(0)
"""What detectors that never read the window are given (nothing is ever appended to it)."""


class ToolDetector:
    """The base of a tool-call detector, each with its own counters (the defaults: a
    detector that keeps no state and needs nothing but :meth:`check`).

    ``check`` judges a proposed call without changing anything; ``record`` is called when
    the call is accepted into the history (only if ``records``); ``on_result`` when its
    result arrives (only if ``watches_results``); ``on_refused`` when a call it judged
    critical is refused. ``fresh`` gives the detector for a new run: the detector itself
    when it keeps no state of its own. ``STATE`` names the counters a snapshot keeps: each
    ``name`` is the attribute ``_name`` (plain data: a number, a string, a list or a dict).
    """

    __slots__ = ()

    STATE: ClassVar[tuple[str, ...]] = ()

    records: bool = False
    watches_results: bool = False
    # what it reads, so the engine keeps it: the window's calls and results; the window's
    # calls; ``CallRecord.progress``; each call's previous result (``on_result``'s ``previous``)
    window_results = reads_window = judges_progress = previous_results = False

    def fresh(self) -> ToolDetector:
        return self

    def check(self, call: CallRecord, window: Window) -> Hit | None:
        raise NotImplementedError

    def record(self, call: CallRecord) -> None:
        return None

    def on_result(self, call: CallRecord, previous: str | None) -> None:
        return None

    def on_refused(self, call: CallRecord) -> None:
        """``call`` was refused after this detector's finding (it never ran)."""

    def state(self) -> dict[str, object]:
        """This run's counters as plain data (empty when the detector keeps none)."""
        return {name: copy.copy(getattr(self, "_" + name)) for name in self.STATE}

    def restore(self, state: dict[str, object]) -> None:
        """Take back what :meth:`state` gave, into a fresh detector: a value missing, or
        not of the counter's type, leaves the counter as it is."""
        for name in self.STATE:
            value = state.get(name)
            if isinstance(value, type(getattr(self, "_" + name))):
                setattr(self, "_" + name, value)


def result_streak(window: Window, fingerprint: str) -> tuple[int, str | None]:
    """OpenClaw's no-progress streak of ``fingerprint``: newest first, calls without a
    result skipped, counting while the result equals the newest one. Returns the count
    and that newest result."""
    if not window.count(fingerprint):
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
