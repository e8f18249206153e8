"""Detector 2, no-progress poll: a poll tool repeating the same call with the same result.

The count is OpenClaw's streak of identical results for this call (newest first); a
result that changes ends the streak, so a poll reporting progress never trips it.
"""

from __future__ import annotations

from actors.loop.config import PollConfig
from actors.loop.history import CallRecord, ToolDetector, Window, result_streak
from actors.loop.verdicts import Hit, Levels, by_level

__all__ = ["PollNoProgress"]


class PollNoProgress(ToolDetector):
    """Fires only for poll tools; keeps no counters of its own (reads the window), so one
    instance serves every run."""

    __slots__ = ("_config", "_levels")

    window_results = True

    def __init__(self, config: PollConfig) -> None:
        self._config = config
        self._levels = Levels(config.warn_at, config.block_at, config.break_at)

    def check(self, call: CallRecord, window: Window) -> Hit | None:
        if not call.is_poll:
            return None
        streak, latest = result_streak(window, call.fingerprint)
        count = streak + self._config.include_proposed
        if count < self._levels.lowest:
            return None
        level = self._levels.level(count)
        message = by_level(
            level,
            f"WARNING: You have called {call.tool} {count} times with identical arguments and no "
            "progress. Stop polling and either (1) increase wait time between checks, or (2) "
            "report the task as failed if the process is stuck.",
            f"CRITICAL: Called {call.tool} with identical arguments and no progress {count} times. "
            "This appears to be a stuck no-progress loop. This call was not run: stop polling "
            "it, and report the task as failed if the process is stuck.",
            f"Stopped: {call.tool} was polled {count} times with no progress.",
        )
        key = f"noprogress:{call.tool}:{call.fingerprint}:{latest or 'none'}"
        return Hit("poll_no_progress", level, count, key, message)
