"""Detector 1, generic repeat: the same call fingerprint N times.

Results ignored by default (OpenClaw's warning, gemini-cli, qwen-code). With
``stop_needs_no_progress`` / ``warn_needs_no_progress`` a level counts only the call's streak
of identical (normalised) results: a call whose result changed is progress, counted only
under the ``progress_*`` ceiling (``progress_ceiling``).
"""

from __future__ import annotations

import zlib

from actors.loop.config import GenericRepeatConfig
from actors.loop.history import CallRecord, ToolDetector, Window, result_streak
from actors.loop.verdicts import Hit, Level, Levels, by_level, level_for

__all__ = ["GenericRepeat"]


def _message(level: Level, tool: str, count: int, same_results: bool) -> str:
    what = "identical arguments and identical results" if same_results else "identical arguments"
    return by_level(
        level,
        f"WARNING: You have called {tool} {count} times with {what}. If this "
        "is not making progress, stop retrying and report the task as failed.",
        f"CRITICAL: Called {tool} with {what} {count} times. This call was "
        "not run: use the result you already have, change the arguments, or finish.",
        f"Stopped: {tool} was called {count} times with {what}.",
    )


def _progress_message(level: Level, tool: str, count: int) -> str:
    return by_level(
        level,
        f"WARNING: You have called {tool} {count} times with identical arguments. Its "
        "result keeps changing, so this is not a loop yet, but check less often (wait "
        "longer between calls) or finish with what you have.",
        f"CRITICAL: Called {tool} with identical arguments {count} times. This call was "
        "not run: you have polled it enough; finish with what you have.",
        f"Stopped: {tool} was called {count} times with identical arguments (its result "
        "kept changing).",
    )


def _result_key(result: str | None) -> int:
    """A result fingerprint as a 64-bit number (its first 16 hex digits): what a call's
    last result is compared by, a third of the memory of the string it kept alive."""
    if result is None:
        return -1
    try:
        return int(result[:16], 16)
    except ValueError:
        return zlib.crc32(result.encode("utf-8", "surrogatepass"))


class _Track:
    """One call's results: the streak of identical results, calls still waiting for theirs."""

    __slots__ = ("last", "pending", "streak")

    def __init__(self) -> None:
        self.last = -1  # no result yet
        self.pending = 0
        self.streak = 0


class GenericRepeat(ToolDetector):
    """Counts a fingerprint in the window, in the whole run, or as a consecutive streak.

    In ``window`` scope it keeps no state of its own (one instance serves every run)."""

    __slots__ = (
        "_aware",
        "_aware_tools",
        "_config",
        "_counts",
        "_extra",
        "_last",
        "_lowest",
        "_scope",
        "_skip_polls",
        "_streak",
        "_tracks",
        "reads_window",
        "records",
        "watches_results",
    )
    STATE = ("counts", "last", "streak")

    def __init__(self, config: GenericRepeatConfig) -> None:
        self._config = config
        self._scope = config.scope
        self._skip_polls = config.skip_poll_tools
        self._extra = int(config.include_proposed)
        progress = (config.progress_warn_at, config.progress_block_at, config.progress_break_at)
        levels = Levels(config.warn_at, config.block_at, config.break_at)
        self._lowest = min(levels.lowest, Levels(*progress).lowest)
        self._aware = config.stop_needs_no_progress or config.warn_needs_no_progress
        self._aware_tools = frozenset(config.no_progress_tools)
        self._counts: dict[str, int] = {}
        self._tracks: dict[str, _Track] = {}
        self._last = ""  # the fingerprint of the consecutive streak (none yet)
        self._streak = 0
        self.records = config.scope != "window"
        self.watches_results = self._aware and self.records
        self.reads_window = not self.records

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
        same = count
        aware = self._aware and (not self._aware_tools or call.tool in self._aware_tools)
        if aware:
            if scope == "window":
                same = result_streak(window, fp)[0] + self._extra
            else:
                track = self._tracks.get(fp)
                same = self._extra + (track.streak + track.pending if track is not None else 0)
                same = min(same, count)
        stop_count = same if aware and cfg.stop_needs_no_progress else count
        warn_count = same if aware and cfg.warn_needs_no_progress else count
        level = level_for(stop_count, None, cfg.block_at, cfg.break_at)
        shown = stop_count
        if level == "none":
            level, shown = level_for(warn_count, cfg.warn_at, None, None), warn_count
        if level != "none":
            key = f"generic:{call.tool}:{fp}"
            return Hit(
                "generic_repeat", level, shown, key, _message(level, call.tool, shown, aware)
            )
        level = level_for(count, cfg.progress_warn_at, cfg.progress_block_at, cfg.progress_break_at)
        if level == "none":
            return None
        key = f"progress:{call.tool}:{fp}"
        return Hit(
            "progress_ceiling", level, count, key, _progress_message(level, call.tool, count)
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
        if self.watches_results:
            track = self._tracks.get(fp)
            if track is None:
                track = self._tracks[fp] = _Track()
            track.pending += 1

    def on_result(self, call: CallRecord, previous: str | None) -> None:
        track = self._tracks.get(call.fingerprint)
        if track is None:
            return
        if track.pending:
            track.pending -= 1
        key = _result_key(call.result)
        if track.last == -1 or track.last == key:
            track.streak += 1
        else:
            track.streak = 1
        track.last = key

    def state(self) -> dict[str, object]:
        tracks = {fp: [t.last, t.pending, t.streak] for fp, t in self._tracks.items()}
        return {**super().state(), "tracks": tracks}

    def restore(self, state: dict[str, object]) -> None:
        super().restore(state)
        tracks = state.get("tracks")
        if isinstance(tracks, dict):
            for fp, values in tracks.items():
                track = self._tracks[str(fp)] = _Track()
                track.last, track.pending, track.streak = (int(v) for v in values[:3])
