"""The calls a detector remembers, and the interface every tool-call detector implements."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from actors.loop.verdicts import Hit

__all__ = ["CallRecord", "ToolDetector", "result_streak"]


@dataclass(slots=True)
class CallRecord:
    """One recorded call; ``result`` is its result fingerprint once known."""

    tool: str
    fingerprint: str
    call_id: str
    is_poll: bool
    result: str | None = None


class ToolDetector(Protocol):
    """A tool-call detector with its own counters.

    ``check`` judges a proposed call without changing anything; ``record`` is called when
    the call is accepted into the history; ``on_result`` when its result arrives.
    """

    def check(self, call: CallRecord, history: Sequence[CallRecord]) -> Hit | None: ...

    def record(self, call: CallRecord) -> None: ...

    def on_result(self, call: CallRecord, previous: str | None) -> None: ...


def result_streak(history: Sequence[CallRecord], fingerprint: str) -> tuple[int, str | None]:
    """OpenClaw's no-progress streak of ``fingerprint``: newest first, calls without a
    result skipped, counting while the result equals the newest one. Returns the count
    and that newest result."""
    streak = 0
    latest: str | None = None
    for record in reversed(history):
        if record.fingerprint != fingerprint or record.result is None:
            continue
        if latest is None:
            latest = record.result
        elif record.result != latest:
            break
        streak += 1
    return streak, latest
