"""Detector 8, unknown tool: the model keeps calling a tool that does not exist.

OpenClaw's current ``unknown_tool_repeat``: the count is the streak of the latest results
that were "unknown tool" answers for the proposed tool's name (any other result ends it);
the proposed call is not counted, so with 10 the 11th attempt is refused. A refusal by
this detector extends the streak (upstream does not record it), so a ``break_at`` above
``block_at`` is reachable.
"""

from __future__ import annotations

from actors.loop.config import UnknownToolConfig
from actors.loop.history import CallRecord, Window
from actors.loop.verdicts import NEVER, Hit, Level, level_for, lowest_count

__all__ = ["UnknownTool"]


def _message(level: Level, tool: str, count: int) -> str:
    if level == "warning":
        return (
            f"WARNING: attempted unavailable tool {tool} {count} times. There is no such "
            "tool: use one of the tools you were given, or answer without it."
        )
    if level == "critical":
        return (
            f"CRITICAL: attempted unavailable tool {tool} {count} times. Stop retrying that "
            "missing tool and answer without it."
        )
    return f"Stopped: the model attempted the unavailable tool {tool} {count} times."


class UnknownTool:
    """Keeps the tool name of the current unknown-tool streak and its length."""

    __slots__ = ("_config", "_count", "_lowest", "_tool")

    records = False
    watches_results = True

    def __init__(self, config: UnknownToolConfig) -> None:
        self._config = config
        levels = (config.warn_at, config.block_at, config.break_at)
        self._lowest = lowest_count(*levels) if config.enabled else NEVER
        self._tool = ""
        self._count = 0

    def fresh(self) -> UnknownTool:
        return UnknownTool(self._config)

    def check(self, call: CallRecord, window: Window) -> Hit | None:
        count = self._count
        if count < self._lowest or call.tool != self._tool:
            return None
        cfg = self._config
        level = level_for(count, cfg.warn_at, cfg.block_at, cfg.break_at)
        if level == "none":
            return None
        return Hit(
            "unknown_tool",
            level,
            count,
            f"unknown-tool:{call.tool}",
            _message(level, call.tool, count),
        )

    def record(self, call: CallRecord) -> None:
        return None

    def on_result(self, call: CallRecord, previous: str | None) -> None:
        if not call.unknown:
            self._tool, self._count = "", 0
        elif call.tool == self._tool:
            self._count += 1
        else:
            self._tool, self._count = call.tool, 1

    def on_refused(self, call: CallRecord) -> None:
        if call.tool == self._tool:
            self._count += 1

    def state(self) -> dict[str, object]:
        return {"tool": self._tool, "count": self._count}

    def restore(self, state: dict[str, object]) -> None:
        tool, count = state.get("tool"), state.get("count")
        self._tool = tool if isinstance(tool, str) else ""
        self._count = count if isinstance(count, int) else 0
