"""Detector 8, unknown tool: the model keeps calling a tool that does not exist.

OpenClaw's current ``unknown_tool_repeat``: the count is the streak of the latest results
that were "unknown tool" answers for the proposed tool's name (any other result ends it);
the proposed call is not counted, so with 10 the 11th attempt is refused. A refusal by
this detector extends the streak (upstream does not record it), so a ``break_at`` above
``block_at`` is reachable.

A model can dodge that count by inventing a new name each time, so the ``storm_*`` levels
count the run's unknown-tool results of any name, while the latest result was one
(issue #32); a storm refusal is given once per count.
"""

from __future__ import annotations

from typing import Final

from actors.loop.config import UnknownToolConfig
from actors.loop.history import CallRecord, ToolDetector, Window
from actors.loop.verdicts import Hit, Level, Levels, by_level

__all__ = ["STORM_KEY", "UnknownTool"]

STORM_KEY: Final = "unknown-tool:*"
"""The warning key of the run-wide count (its warning is given once per run)."""

_RANK: Final[dict[Level, int]] = {"none": 0, "warning": 1, "critical": 2, "break": 3}


def _message(level: Level, tool: str, count: int) -> str:
    return by_level(
        level,
        f"WARNING: attempted unavailable tool {tool} {count} times. There is no such "
        "tool: use one of the tools you were given, or answer without it.",
        f"CRITICAL: attempted unavailable tool {tool} {count} times. Stop retrying that "
        "missing tool and answer without it.",
        f"Stopped: the model attempted the unavailable tool {tool} {count} times.",
    )


class UnknownTool(ToolDetector):
    """Keeps the tool name of the current unknown-tool streak and its length, and the
    run's unknown-tool results of any name (``storm_*``)."""

    __slots__ = (
        "_config",
        "_count",
        "_levels",
        "_live",
        "_refused_at",
        "_storms",
        "_tool",
        "_total",
    )

    watches_results = True
    STATE = ("tool", "count", "total", "live", "refused_at")

    def __init__(self, config: UnknownToolConfig) -> None:
        self._config = config
        self._levels = Levels(config.warn_at, config.block_at, config.break_at)
        self._storms = Levels(config.storm_warn_at, config.storm_block_at, config.storm_break_at)
        self._tool = ""
        self._count = 0
        self._total = 0  # unknown-tool results of the run, any name
        self._live = False  # the latest result was an unknown-tool answer
        self._refused_at = 0  # the storm count a storm refusal was given at

    def fresh(self) -> UnknownTool:
        return UnknownTool(self._config)

    def _storm(self) -> Level:
        total = self._total
        if not self._live:
            return "none"
        level = self._storms.level(total)
        if level == "critical" and total == self._refused_at:
            return "none"  # refused at this count already: the next one needs a new failure
        return level

    def check(self, call: CallRecord, window: Window) -> Hit | None:
        count = self._count
        if count < self._levels.lowest and (not self._live or self._total < self._storms.lowest):
            return None  # the common case: nothing to look at
        storm = self._storm()
        if call.tool == self._tool:
            level = self._levels.level(count)
            if level != "none" and _RANK[level] >= _RANK[storm]:
                key = f"unknown-tool:{call.tool}"
                return Hit("unknown_tool", level, count, key, _message(level, call.tool, count))
        if storm == "none":
            return None
        total = self._total
        message = by_level(
            storm,
            f"WARNING: {total} of your tool calls named tools that do not exist. Use only "
            "the tools you were given (their names are in your tool list), or answer "
            "without tools.",
            f"CRITICAL: {total} of your tool calls named tools that do not exist. This call "
            "was not run: use only the tools you were given, or answer without them.",
            f"Stopped: the model called {total} tools that do not exist.",
        )
        return Hit("unknown_tool", storm, total, STORM_KEY, message)

    def on_result(self, call: CallRecord, previous: str | None) -> None:
        if call.refused:
            return
        self._live = call.unknown
        if not call.unknown:
            self._tool, self._count = "", 0
            return
        self._total += 1
        if call.tool == self._tool:
            self._count += 1
        else:
            self._tool, self._count = call.tool, 1

    def on_refused(self, call: CallRecord) -> None:
        if call.tool == self._tool:
            self._count += 1
        if self._storm() == "critical":
            self._refused_at = self._total
