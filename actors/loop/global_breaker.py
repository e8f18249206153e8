"""Detector 4, global breaker: calls that make no progress, whatever the tool.

``streak`` (OpenClaw): the proposed call's streak of identical results in the window.
``total``: every call of the run whose result equalled the previous result of that call.
"""

from __future__ import annotations

from actors.loop.config import GlobalBreakerConfig
from actors.loop.history import CallRecord, ToolDetector, Window, result_streak
from actors.loop.verdicts import Hit, Levels, by_level

__all__ = ["GlobalBreaker"]


class GlobalBreaker(ToolDetector):
    """In ``total`` mode counts no-progress results itself; in ``streak`` mode reads the
    window and keeps no state (one instance serves every run)."""

    __slots__ = ("_config", "_levels", "_total", "previous_results", "watches_results")

    window_results = True
    STATE = ("total",)

    def __init__(self, config: GlobalBreakerConfig) -> None:
        self._config = config
        self._levels = Levels(config.warn_at, config.block_at, config.break_at)
        self._total = 0
        self.watches_results = self.previous_results = config.mode == "total"

    def fresh(self) -> GlobalBreaker:
        return GlobalBreaker(self._config) if self.watches_results else self

    def check(self, call: CallRecord, window: Window) -> Hit | None:
        total = self.watches_results
        latest: str | None
        if total:
            count, latest = self._total, "run"
        else:
            count, latest = result_streak(window, call.fingerprint)
        if count < self._levels.lowest:
            return None
        level = self._levels.level(count)
        what = "no-progress calls in this run" if total else "identical no-progress outcomes"
        message = by_level(
            level,
            f"WARNING: {call.tool}: {count} {what}. Change your approach or finish now.",
            f"CRITICAL: {call.tool} has repeated {what} {count} times. This call was not run: "
            "stop repeating calls that change nothing; finish with what you have.",
            f"CRITICAL: {call.tool} has repeated {what} {count} times. Run stopped by the global "
            "circuit breaker to prevent runaway loops.",
        )
        key = f"global:{call.tool}:{call.fingerprint}:{latest or 'none'}"
        return Hit("global_breaker", level, count, key, message)

    def on_result(self, call: CallRecord, previous: str | None) -> None:
        if self.watches_results and previous is not None and previous == call.result:
            self._total += 1
