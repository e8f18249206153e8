"""Detector 14, error streak: tool calls failing one after another, each one different.

A small model that invents paths calls ``read_file`` again and again, each call with other
arguments and each one failing: no repeat rule sees it (issue #32, item 9). The count is
the streak of the latest results that were errors (any tool, any arguments; an unknown
tool included), the proposed call not counted; any result that is not an error ends it.

The warning is given once per streak and its nudge quotes the latest errors, so the model
reads what went wrong (the monitor adds the folder's real listing after path errors). A
refusal is given once per count: the next call is judged again only after another failure,
so the model gets its try. ``break`` stops the run (``loop.error_streak``).
"""

from __future__ import annotations

from typing import Final

from actors.loop.config import ErrorStreakConfig
from actors.loop.history import CallRecord, ToolDetector, Window
from actors.loop.verdicts import Hit, Levels, by_level

__all__ = ["ERRORS_QUOTED", "ERROR_CHARS", "ErrorStreak"]

ERROR_CHARS: Final = 200
"""Characters of one error kept to quote it."""
ERRORS_QUOTED: Final = 3
"""The latest errors quoted in a message."""


class ErrorStreak(ToolDetector):
    """The streak of failed calls and the latest errors."""

    __slots__ = ("_config", "_errors", "_levels", "_refused_at", "_streak", "_warned")

    records = True
    watches_results = True
    STATE = ("streak", "warned", "refused_at", "errors")

    def __init__(self, config: ErrorStreakConfig) -> None:
        self._config = config
        self._levels = Levels(config.warn_at, config.block_at, config.break_at)
        self._streak = 0
        self._warned = False
        self._refused_at = 0
        self._errors: list[list[str]] = []  # [tool, the start of its error]

    def fresh(self) -> ErrorStreak:
        return ErrorStreak(self._config)

    def check(self, call: CallRecord, window: Window) -> Hit | None:
        count = self._streak
        if count < self._levels.lowest:
            return None  # the common case: the last call did not fail
        level = self._levels.level(count)
        if (
            level == "none"
            or (level == "warning" and self._warned)
            or (level == "critical" and count == self._refused_at)
        ):
            return None
        errors = "\n".join(f"- {tool}: {text}" for tool, text in self._errors)
        message = by_level(
            level,
            f"WARNING: your last {count} tool calls failed. The latest errors:\n{errors}\n"
            "Read them: check the names, paths and arguments you use against what you "
            "have actually seen (list the folder first), or change your approach.",
            f"CRITICAL: your last {count} tool calls failed; this call was not run. The "
            f"latest errors:\n{errors}\nFix what they say before calling again, or "
            "finish with what you have.",
            f"Stopped: {count} tool calls in a row failed. The latest errors:\n{errors}",
        )
        return Hit("error_streak", level, count, "error-streak", message)

    def record(self, call: CallRecord) -> None:
        warn = self._levels.warn
        if warn is not None and self._streak >= warn:
            self._warned = True  # this streak's warning was given (or outranked)

    def on_result(self, call: CallRecord, previous: str | None) -> None:
        if call.refused:
            return  # a refusal ran nothing: neither a failure nor a success
        if call.error:
            self._streak += 1
            errors = self._errors
            errors.append([call.tool, call.error_text])
            if len(errors) > ERRORS_QUOTED:
                del errors[0]
        elif self._streak:
            self._streak, self._warned, self._refused_at = 0, False, 0
            self._errors.clear()

    def on_refused(self, call: CallRecord) -> None:
        self._refused_at = self._streak
