"""Detector 1, generic repeat: the same call fingerprint N times, whatever its results."""

from __future__ import annotations

from actors.loop.config import GenericRepeatConfig
from actors.loop.history import CallRecord, Window
from actors.loop.verdicts import NEVER, Hit, Level, level_for, lowest_count

__all__ = ["GenericRepeat"]


def _message(level: Level, tool: str, count: int) -> str:
    if level == "warning":
        return (
            f"WARNING: You have called {tool} {count} times with identical arguments. If this "
            "is not making progress, stop retrying and report the task as failed."
        )
    if level == "critical":
        return (
            f"CRITICAL: Called {tool} with identical arguments {count} times. This call was "
            "not run: use the result you already have, change the arguments, or finish."
        )
    return f"Stopped: {tool} was called {count} times with identical arguments."


class GenericRepeat:
    """Counts a fingerprint in the window, in the whole run, or as a consecutive streak.

    In ``window`` scope it keeps no state of its own (one instance serves every run)."""

    __slots__ = (
        "_config",
        "_counts",
        "_extra",
        "_last",
        "_lowest",
        "_scope",
        "_skip_polls",
        "_streak",
        "records",
    )

    watches_results = False

    def __init__(self, config: GenericRepeatConfig) -> None:
        self._config = config
        self._scope = config.scope
        self._skip_polls = config.skip_poll_tools
        self._extra = int(config.include_proposed)
        levels = (config.warn_at, config.block_at, config.break_at)
        self._lowest = lowest_count(*levels) if config.enabled else NEVER
        self._counts: dict[str, int] = {}
        self._last: str | None = None
        self._streak = 0
        self.records = config.scope != "window"

    def fresh(self) -> GenericRepeat:
        return GenericRepeat(self._config) if self.records else self

    def check(self, call: CallRecord, window: Window) -> Hit | None:
        if self._skip_polls and call.is_poll:
            return None
        fp = call.fingerprint
        scope = self._scope
        if scope == "run":
            count = self._counts.get(fp, 0)
        elif scope == "window":
            count = window.count(fp)
        else:
            count = self._streak if self._last == fp else 0
        count += self._extra
        if count < self._lowest:
            return None
        cfg = self._config
        level = level_for(count, cfg.warn_at, cfg.block_at, cfg.break_at)
        return Hit(
            "generic_repeat",
            level,
            count,
            f"generic:{call.tool}:{fp}",
            _message(level, call.tool, count),
        )

    def record(self, call: CallRecord) -> None:
        fp = call.fingerprint
        scope = self._scope
        if scope == "run":
            counts = self._counts
            counts[fp] = counts.get(fp, 0) + 1
        elif scope == "consecutive":
            self._streak = self._streak + 1 if self._last == fp else 1
            self._last = fp

    def on_result(self, call: CallRecord, previous: str | None) -> None:
        return None
