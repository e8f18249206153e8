"""Detector 1, generic repeat: the same call fingerprint N times, whatever its results."""

from __future__ import annotations

from collections.abc import Sequence

from actors.loop.config import GenericRepeatConfig
from actors.loop.history import CallRecord
from actors.loop.verdicts import Hit, Level, level_for

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
    """Counts a fingerprint in the window, in the whole run, or as a consecutive streak."""

    def __init__(self, config: GenericRepeatConfig) -> None:
        self._config = config
        self._counts: dict[str, int] = {}
        self._last: str | None = None
        self._streak = 0

    def check(self, call: CallRecord, history: Sequence[CallRecord]) -> Hit | None:
        cfg = self._config
        if not cfg.enabled or (cfg.skip_poll_tools and call.is_poll):
            return None
        fp = call.fingerprint
        if cfg.scope == "window":
            count = sum(1 for record in history if record.fingerprint == fp)
        elif cfg.scope == "run":
            count = self._counts.get(fp, 0)
        else:
            count = self._streak if self._last == fp else 0
        count += cfg.include_proposed
        level = level_for(count, cfg.warn_at, cfg.block_at, cfg.break_at)
        if level == "none":
            return None
        return Hit(
            "generic_repeat",
            level,
            count,
            f"generic:{call.tool}:{fp}",
            _message(level, call.tool, count),
        )

    def record(self, call: CallRecord) -> None:
        fp = call.fingerprint
        if self._config.scope == "run":
            self._counts[fp] = self._counts.get(fp, 0) + 1
        elif self._config.scope == "consecutive":
            self._streak = self._streak + 1 if self._last == fp else 1
            self._last = fp

    def on_result(self, call: CallRecord, previous: str | None) -> None:
        return None
