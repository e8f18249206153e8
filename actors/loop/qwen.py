"""qwen-code's heuristics as detectors 9–12: tool stagnation, shell stagnation, read loops
and the per-run call cap. Each counts the proposed call (qwen-code tracks a call before it
checks it), so a threshold of 8 fires on the 8th call.

With their progress options (the ``qwen`` preset) each counts only calls without progress
(``actors.loop.progress``), once their result is known: a paginated read, 30 different
files read or a wandering search is not stagnation.
"""

from __future__ import annotations

from typing import Final

import re2

from actors.loop.config import (
    CallCapConfig,
    ReadLoopConfig,
    ShellStagnationConfig,
    ToolStagnationConfig,
)
from actors.loop.history import CallRecord, ToolDetector, Window
from actors.loop.verdicts import Hit, Level, Levels, by_level

__all__ = ["CallCap", "ReadLoop", "ShellStagnation", "ToolStagnation", "is_git_overview"]

# RE2 (linear time): the commands are the model's
_SEGMENTS: Final = re2.compile(r"&&|\|\||[;&|\n]")
_GIT: Final = re2.compile(r"(?i)^git(?:\s+(?:-C\s+\S+|--no-pager))*\s+(status|diff|ls-files)\b")
_REVISION: Final = re2.compile(r"(?i)^(?:HEAD|@)(?:[~^]\d*)*$|^[0-9a-f]{7,40}$|^\S+\.{2,3}\S+$")
_KINDS_MAX: Final = 1024
"""Tool names whose read-likeness is remembered per config."""


def is_git_overview(command: str) -> bool:
    """Every segment of the shell chain is ``git status``, ``git ls-files`` or a
    ``git diff`` with flags and revisions only (qwen-code's rule)."""
    segments = [s.strip() for s in _SEGMENTS.split(command) if s.strip()]
    if not segments:
        return False
    for segment in segments:
        match = _GIT.match(segment)
        if match is None:
            return False
        if match.group(1).lower() != "diff":
            continue
        tokens = segment[match.end() :].split()
        if "--" in tokens[:-1]:
            return False  # a pathspec after --
        if not all(t.startswith("-") or _REVISION.match(t) for t in tokens):
            return False
    return True


def _text(level: Level, what: str, count: int) -> str:
    return by_level(
        level,
        f"WARNING: {what} ({count} calls). Change your approach or finish now.",
        f"CRITICAL: {what} ({count} calls). This call was not run: try something "
        "different or finish with what you have.",
        f"Stopped: {what} ({count} calls).",
    )


class _Qwen(ToolDetector):
    """A qwen-code rule: with its progress option it watches results and judges progress."""

    __slots__ = ("judges_progress", "records", "watches_results")


class ToolStagnation(_Qwen):
    """Consecutive calls of one tool name, whatever the arguments. With
    ``progress_resets``, a call whose result changed since its previous one restarts the
    streak (qwen-code's reset for stateful read tools)."""

    __slots__ = ("_config", "_last", "_levels", "_streak")
    STATE = ("last", "streak")

    def __init__(self, config: ToolStagnationConfig) -> None:
        self._config = config
        self._levels = Levels(config.warn_at, config.block_at, config.break_at)
        self._last = ""
        self._streak = 0
        self.watches_results = self.judges_progress = config.progress_resets
        self.records = not config.progress_resets  # else counted from results

    def fresh(self) -> ToolStagnation:
        return ToolStagnation(self._config)

    def check(self, call: CallRecord, window: Window) -> Hit | None:
        count = (self._streak if call.tool == self._last else 0) + 1
        level = self._levels.level(count)
        if level == "none":
            return None
        what = f"{call.tool} called {count} times in a row with varying arguments"
        return Hit(
            "tool_stagnation", level, count, f"stagnation:{call.tool}", _text(level, what, count)
        )

    def record(self, call: CallRecord) -> None:
        if self.watches_results:
            return  # counted when its result shows no progress
        if call.tool == self._last:
            self._streak += 1
        else:
            self._last, self._streak = call.tool, 1

    def on_result(self, call: CallRecord, previous: str | None) -> None:
        if call.result is None or call.refused:
            return
        if call.progress:
            if call.tool == self._last:
                self._streak = 0
        elif call.tool == self._last:
            self._streak += 1
        else:
            self._last, self._streak = call.tool, 1


class ShellStagnation(_Qwen):
    """Consecutive git-overview shell commands (``CallRecord.inspection``); with
    ``progress_resets`` an overview counts once its output shows no progress."""

    __slots__ = ("_config", "_levels", "_streak")
    STATE = ("streak",)

    def __init__(self, config: ShellStagnationConfig) -> None:
        self._config = config
        self._levels = Levels(config.warn_at, config.block_at, config.break_at)
        self._streak = 0
        self.watches_results = self.judges_progress = config.progress_resets
        self.records = True

    def fresh(self) -> ShellStagnation:
        return ShellStagnation(self._config)

    def check(self, call: CallRecord, window: Window) -> Hit | None:
        if not call.inspection:
            return None
        count = self._streak + 1
        level = self._levels.level(count)
        if level == "none":
            return None
        what = "repository overview commands (git status / diff / ls-files) repeated in a row"
        return Hit(
            "shell_stagnation", level, count, "shell:git-inspection", _text(level, what, count)
        )

    def record(self, call: CallRecord) -> None:
        if not call.inspection:
            self._streak = 0
        elif not self.watches_results:
            self._streak += 1

    def on_result(self, call: CallRecord, previous: str | None) -> None:
        if call.inspection and call.result is not None and not call.refused:
            self._streak = 0 if call.progress else self._streak + 1


class ReadLoop(_Qwen):
    """Read-like calls among the last ``window`` calls, after a non-read call was seen.
    With ``count_no_progress`` a read counts once its result is known and made no
    progress (each call of the window is kept as its id and whether it counts)."""

    __slots__ = ("_config", "_count", "_ids", "_kinds", "_levels", "_reads", "_seen_other")
    STATE = ("reads", "ids", "seen_other")

    def __init__(self, config: ReadLoopConfig, kinds: dict[str, bool] | None = None) -> None:
        self._config = config
        self._levels = Levels(config.warn_at, config.block_at, config.break_at)
        # whether a tool name is read-like, shared by the runs of one config (bounded)
        self._kinds: dict[str, bool] = {} if kinds is None else kinds
        self._reads: list[bool] = []
        self._count = 0  # True entries of _reads
        self._ids: list[str] = []  # with count_no_progress: the window's call ids
        self._seen_other = not config.cold_start
        self.watches_results = self.judges_progress = config.count_no_progress
        self.records = True

    def fresh(self) -> ReadLoop:
        return ReadLoop(self._config, self._kinds)

    def _is_read(self, tool: str) -> bool:
        read = self._kinds.get(tool)
        if read is None:
            cfg = self._config
            read = tool in cfg.read_tools or tool.startswith(cfg.read_prefixes)
            if len(self._kinds) < _KINDS_MAX:
                self._kinds[tool] = read
        return read

    def check(self, call: CallRecord, window: Window) -> Hit | None:
        read = self._is_read(call.tool)
        if not (self._seen_other or not read):
            return None
        reads = self._reads
        # the last window - 1 calls, and the proposed one
        count = self._count + read
        if reads and len(reads) >= self._config.window and reads[0]:
            count -= 1
        level = self._levels.level(count)
        if level == "none":
            return None
        seen = min(len(reads), self._config.window - 1) + 1
        what = f"{count} of your last {seen} calls only read"
        return Hit("read_loop", level, count, "read-loop", _text(level, what, count))

    def record(self, call: CallRecord) -> None:
        read = self._is_read(call.tool)
        if not read:
            self._seen_other = True
        reads = self._reads
        ids = self._ids
        if self.watches_results:
            reads.append(False)  # counted when its result shows no progress
            ids.append(call.call_id if read else "")
        else:
            reads.append(read)
            self._count += read
        if len(reads) > self._config.window:
            self._count -= reads.pop(0)
            if ids:
                del ids[0]

    def on_result(self, call: CallRecord, previous: str | None) -> None:
        if call.progress or call.result is None or call.refused:
            return
        ids = self._ids
        for index in range(len(ids) - 1, -1, -1):
            if ids[index] == call.call_id:
                if not self._reads[index]:
                    self._reads[index] = True
                    self._count += 1
                return

    def restore(self, state: dict[str, object]) -> None:
        super().restore(state)
        self._count = sum(self._reads)
        if self.watches_results and len(self._ids) != len(self._reads):
            self._ids = [""] * len(self._reads)
        self._seen_other = self._seen_other or not self._config.cold_start


class CallCap(_Qwen):
    """Calls of the run and the most any one call was repeated (qwen-code's adaptive cap).
    With ``count_no_progress`` both count only calls whose result is known and made no
    progress."""

    __slots__ = ("_config", "_counts", "_max_repeat", "_total")
    STATE = ("counts", "max_repeat", "total")

    def __init__(self, config: CallCapConfig) -> None:
        self._config = config
        self._counts: dict[str, int] = {}
        self._max_repeat = 0
        self._total = 0
        self.watches_results = self.judges_progress = config.count_no_progress
        self.records = not config.count_no_progress  # else counted from results

    def fresh(self) -> CallCap:
        return CallCap(self._config)

    def check(self, call: CallRecord, window: Window) -> Hit | None:
        cfg = self._config
        total = self._total + 1
        soft = cfg.soft_cap
        if soft is None or total <= soft:
            return None
        repeat = max(self._max_repeat, self._counts.get(call.fingerprint, 0) + 1)
        hard = cfg.hard_cap
        if repeat < cfg.stuck_repeats and (hard is None or total <= hard):
            return None
        why = (
            f"past {soft} calls with one call repeated {repeat} times"
            if repeat >= cfg.stuck_repeats
            else f"past the hard cap of {hard} calls"
        )
        what = "without progress" if self.watches_results else "made"
        message = f"Stopped: {total} tool calls {what} in this run, {why}."
        return Hit("call_cap", "break", total, "call-cap", message)

    def record(self, call: CallRecord) -> None:
        if not self.watches_results:
            self._count(call)

    def _count(self, call: CallRecord) -> None:
        self._total += 1
        counts = self._counts
        count = counts[call.fingerprint] = counts.get(call.fingerprint, 0) + 1
        if count > self._max_repeat:
            self._max_repeat = count

    def on_result(self, call: CallRecord, previous: str | None) -> None:
        if not call.progress and call.result is not None and not call.refused:
            self._count(call)
