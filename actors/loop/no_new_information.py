"""Detector 7, no new information: different calls returning the same (normalised) result.

A model cycling through a dozen shell commands (``git status``, ``git log -1``,
``git diff --stat`` …) that all print the same thing learns nothing new; no identical-call
detector sees it (qwen-code#4695). The count is the streak of the latest results (in the
order they arrive) equal to the newest one, once at least two different calls are in the
streak; a result shorter than ``min_result_chars`` neither counts nor ends it, and a refusal
by this detector extends it. Distinct results end it at once, so reads that return
different things never trip it.
"""

from __future__ import annotations

from actors.loop.config import NoNewInformationConfig
from actors.loop.history import CallRecord, ToolDetector, Window
from actors.loop.verdicts import Hit, Levels, by_level

__all__ = ["NoNewInformation"]


class NoNewInformation(ToolDetector):
    """Keeps the newest result, its streak and whether two different calls share it."""

    __slots__ = ("_config", "_count", "_first", "_levels", "_mixed", "_result")

    watches_results = True
    STATE = ("result", "first", "count", "mixed")

    def __init__(self, config: NoNewInformationConfig) -> None:
        self._config = config
        self._levels = Levels(config.warn_at, config.block_at, config.break_at)
        self._result = ""  # no result yet (a fingerprint is never empty)
        self._first = ""
        self._count = 0
        self._mixed = False

    def fresh(self) -> NoNewInformation:
        return NoNewInformation(self._config)

    def check(self, call: CallRecord, window: Window) -> Hit | None:
        count = self._count
        if count < self._levels.lowest or not self._mixed:
            return None
        level = self._levels.level(count)
        opening = (
            f"Your last {count} tool calls, with different arguments, all returned the same result."
        )
        message = by_level(
            level,
            f"WARNING: {opening} Asking again in other words will not tell you anything new: "
            "use what you have, try something that changes the state, or finish.",
            f"CRITICAL: {opening} This call was not run: nothing new is coming back; act on "
            "what you have or report the task as failed.",
            f"Stopped: {count} tool calls in a row returned the same result (no new information).",
        )
        return Hit("no_new_information", level, count, f"nonew:{self._result}", message)

    def on_result(self, call: CallRecord, previous: str | None) -> None:
        if not call.informative:
            return
        if call.result == self._result:
            self._count += 1
            if not self._mixed and call.fingerprint != self._first:
                self._mixed = True
        else:
            self._result = call.result or ""  # on_result: the result is known
            self._first = call.fingerprint
            self._count = 1
            self._mixed = False

    def on_refused(self, call: CallRecord) -> None:
        if self._mixed:
            self._count += 1
