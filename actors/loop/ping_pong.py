"""Detector 3, ping-pong: two calls alternating A,B,A,B… (OpenClaw's algorithm).

A is the newest call in the window and B the newest earlier call with a different
fingerprint; the alternating tail is counted back from A, and the proposed call must be B.
The count includes the proposed call. No-progress evidence means every call of the tail has
a result, all of A's results are equal and all of B's are: a read-modify-write whose reads
see the file change is not stuck.
"""

from __future__ import annotations

from typing import NamedTuple

from actors.loop.config import PingPongConfig
from actors.loop.history import CallRecord, Window
from actors.loop.verdicts import Hit, Level, level_for

__all__ = ["PingPong", "alternation"]


class Alternation(NamedTuple):
    length: int
    paired: str
    no_progress: bool


def alternation(window: Window, proposed: str) -> Alternation | None:
    """The alternating tail that ``proposed`` would extend, or ``None``. A call not in the
    window cannot be B: no scan then."""
    if not window.count(proposed):
        return None
    calls = window.records
    a = calls[-1].fingerprint
    b = next((r.fingerprint for r in reversed(calls[:-1]) if r.fingerprint != a), None)
    if b is None or proposed != b:
        return None
    tail = 0
    for record in reversed(calls):
        if record.fingerprint != (a if tail % 2 == 0 else b):
            break
        tail += 1
    if tail < 2:
        return None
    results: dict[str, str] = {}
    no_progress = True
    for record in calls[-tail:]:
        if record.result is None or results.setdefault(record.fingerprint, record.result) != (
            record.result
        ):
            no_progress = False
            break
    return Alternation(tail + 1, a, no_progress and len(results) == 2)


def _message(level: Level, count: int) -> str:
    if level == "warning":
        return (
            f"WARNING: You are alternating between repeated tool-call patterns ({count} "
            "consecutive calls). This looks like a ping-pong loop; stop retrying and report "
            "the task as failed."
        )
    if level == "critical":
        return (
            f"CRITICAL: You are alternating between repeated tool-call patterns ({count} "
            "consecutive calls) with no progress. This appears to be a stuck ping-pong loop. "
            "This call was not run: neither call changes anything, so stop alternating and "
            "try a different approach or report the task as failed."
        )
    return f"Stopped: two calls alternated {count} times with no progress."


class PingPong:
    """Reads the window; keeps no counters of its own, so one instance serves every run."""

    __slots__ = ("_config",)

    records = False
    watches_results = False

    def __init__(self, config: PingPongConfig) -> None:
        self._config = config

    def fresh(self) -> PingPong:
        return self

    def check(self, call: CallRecord, window: Window) -> Hit | None:
        cfg = self._config
        if not cfg.enabled:
            return None
        found = alternation(window, call.fingerprint)
        if found is None:
            return None
        level = level_for(found.length, cfg.warn_at, cfg.block_at, cfg.break_at)
        if level in ("critical", "break") and cfg.stop_needs_no_progress and not found.no_progress:
            level = level_for(found.length, cfg.warn_at, None, None)
        if level == "warning" and cfg.warn_needs_no_progress and not found.no_progress:
            level = "none"
        if level == "none":
            return None
        key = "pingpong:" + "|".join(sorted((call.fingerprint, found.paired)))
        return Hit("ping_pong", level, found.length, key, _message(level, found.length))

    def record(self, call: CallRecord) -> None:
        return None

    def on_result(self, call: CallRecord, previous: str | None) -> None:
        return None

    def on_refused(self, call: CallRecord) -> None:
        return None

    def state(self) -> dict[str, object]:
        return {}

    def restore(self, state: dict[str, object]) -> None:
        return None
