"""qwen-code's heuristics as detectors 9–12: tool stagnation, shell stagnation, read loops
and the per-run call cap. Each counts the proposed call (qwen-code tracks a call before it
checks it), so a threshold of 8 fires on the 8th call.
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
from actors.loop.history import CallRecord, Window
from actors.loop.verdicts import NEVER, Hit, Level, level_for, lowest_count

__all__ = ["CallCap", "ReadLoop", "ShellStagnation", "ToolStagnation", "is_git_overview"]

# RE2 (linear time): the commands are the model's
_SEGMENTS: Final = re2.compile(r"&&|\|\||[;&|\n]")
_GIT: Final = re2.compile(r"(?i)^git(?:\s+(?:-C\s+\S+|--no-pager))*\s+(status|diff|ls-files)\b")
_REVISION: Final = re2.compile(r"(?i)^(?:HEAD|@)(?:[~^]\d*)*$|^[0-9a-f]{7,40}$|^\S+\.{2,3}\S+$")


def _overview_diff(args: str) -> bool:
    tokens = args.split()
    if "--" in tokens and tokens.index("--") < len(tokens) - 1:
        return False  # a pathspec after --
    return all(t.startswith("-") or t == "--" or _REVISION.match(t) for t in tokens)


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
        if match.group(1).lower() == "diff" and not _overview_diff(segment[match.end() :]):
            return False
    return True


def _text(level: Level, what: str, count: int) -> str:
    if level == "warning":
        return f"WARNING: {what} ({count} calls). Change your approach or finish now."
    if level == "critical":
        return (
            f"CRITICAL: {what} ({count} calls). This call was not run: try something "
            "different or finish with what you have."
        )
    return f"Stopped: {what} ({count} calls)."


class _Levels:
    __slots__ = ("_block", "_brk", "_lowest", "_warn")

    def __init__(self, warn: int | None, block: int | None, brk: int | None, enabled: bool) -> None:
        self._warn, self._block, self._brk = warn, block, brk
        self._lowest = lowest_count(warn, block, brk) if enabled else NEVER

    def level(self, count: int) -> Level:
        if count < self._lowest:
            return "none"
        return level_for(count, self._warn, self._block, self._brk)


class ToolStagnation:
    """Consecutive calls of one tool name, whatever the arguments. With
    ``progress_resets``, a call whose result changed since its previous one restarts the
    streak (qwen-code's reset for stateful read tools)."""

    __slots__ = ("_config", "_last", "_levels", "_results", "_streak", "watches_results")

    records = True

    def __init__(self, config: ToolStagnationConfig) -> None:
        self._config = config
        self._levels = _Levels(config.warn_at, config.block_at, config.break_at, config.enabled)
        self._last = ""
        self._streak = 0
        self._results: dict[str, str] = {}  # a call's last result, with progress_resets
        self.watches_results = config.progress_resets

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
        if call.tool == self._last:
            self._streak += 1
        else:
            self._last, self._streak = call.tool, 1

    def on_result(self, call: CallRecord, previous: str | None) -> None:
        result = call.result
        if result is None:
            return
        before = self._results.get(call.fingerprint)
        self._results[call.fingerprint] = result
        if before is not None and before != result and call.tool == self._last:
            self._streak = 1

    def on_refused(self, call: CallRecord) -> None:
        return None

    def state(self) -> dict[str, object]:
        return {"last": self._last, "streak": self._streak, "results": dict(self._results)}

    def restore(self, state: dict[str, object]) -> None:
        last, streak = state.get("last"), state.get("streak")
        self._last = last if isinstance(last, str) else ""
        self._streak = streak if isinstance(streak, int) else 0
        results = state.get("results")
        self._results = (
            {str(k): str(v) for k, v in results.items()} if isinstance(results, dict) else {}
        )


class ShellStagnation:
    """Consecutive git-overview shell commands (``CallRecord.inspection``)."""

    __slots__ = ("_config", "_levels", "_streak")

    records = True
    watches_results = False

    def __init__(self, config: ShellStagnationConfig) -> None:
        self._config = config
        self._levels = _Levels(config.warn_at, config.block_at, config.break_at, config.enabled)
        self._streak = 0

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
        self._streak = self._streak + 1 if call.inspection else 0

    def on_result(self, call: CallRecord, previous: str | None) -> None:
        return None

    def on_refused(self, call: CallRecord) -> None:
        return None

    def state(self) -> dict[str, object]:
        return {"streak": self._streak}

    def restore(self, state: dict[str, object]) -> None:
        streak = state.get("streak")
        self._streak = streak if isinstance(streak, int) else 0


class ReadLoop:
    """Read-like calls among the last ``window`` calls, after a non-read call was seen."""

    __slots__ = ("_config", "_levels", "_names", "_prefixes", "_reads", "_seen_other")

    records = True
    watches_results = False

    def __init__(self, config: ReadLoopConfig) -> None:
        self._config = config
        self._levels = _Levels(config.warn_at, config.block_at, config.break_at, config.enabled)
        self._names = frozenset(config.read_tools)
        self._prefixes = config.read_prefixes
        self._reads: list[bool] = []
        self._seen_other = not config.cold_start

    def fresh(self) -> ReadLoop:
        return ReadLoop(self._config)

    def _is_read(self, tool: str) -> bool:
        return tool in self._names or tool.startswith(self._prefixes)

    def check(self, call: CallRecord, window: Window) -> Hit | None:
        read = self._is_read(call.tool)
        if not (self._seen_other or not read):
            return None
        recent = self._reads[-(self._config.window - 1) :] if self._config.window > 1 else []
        count = sum(recent) + read
        level = self._levels.level(count)
        if level == "none":
            return None
        what = f"{count} of your last {len(recent) + 1} calls only read"
        return Hit("read_loop", level, count, "read-loop", _text(level, what, count))

    def record(self, call: CallRecord) -> None:
        read = self._is_read(call.tool)
        if not read:
            self._seen_other = True
        reads = self._reads
        reads.append(read)
        if len(reads) > self._config.window:
            del reads[0]

    def on_result(self, call: CallRecord, previous: str | None) -> None:
        return None

    def on_refused(self, call: CallRecord) -> None:
        return None

    def state(self) -> dict[str, object]:
        return {"reads": list(self._reads), "seen_other": self._seen_other}

    def restore(self, state: dict[str, object]) -> None:
        reads = state.get("reads")
        self._reads = [bool(r) for r in reads] if isinstance(reads, list) else []
        self._seen_other = state.get("seen_other") is True or not self._config.cold_start


class CallCap:
    """Calls of the run and the most any one call was repeated (qwen-code's adaptive cap)."""

    __slots__ = ("_config", "_counts", "_max_repeat", "_total")

    records = True
    watches_results = False

    def __init__(self, config: CallCapConfig) -> None:
        self._config = config
        self._counts: dict[str, int] = {}
        self._max_repeat = 0
        self._total = 0

    def fresh(self) -> CallCap:
        return CallCap(self._config)

    def check(self, call: CallRecord, window: Window) -> Hit | None:
        cfg = self._config
        total = self._total + 1
        soft = cfg.soft_cap
        if not cfg.enabled or soft is None or total <= soft:
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
        return Hit(
            "call_cap",
            "break",
            total,
            "call-cap",
            f"Stopped: {total} tool calls in this run, {why}.",
        )

    def record(self, call: CallRecord) -> None:
        self._total += 1
        counts = self._counts
        count = counts[call.fingerprint] = counts.get(call.fingerprint, 0) + 1
        if count > self._max_repeat:
            self._max_repeat = count

    def on_result(self, call: CallRecord, previous: str | None) -> None:
        return None

    def on_refused(self, call: CallRecord) -> None:
        return None

    def state(self) -> dict[str, object]:
        return {"counts": dict(self._counts), "max_repeat": self._max_repeat, "total": self._total}

    def restore(self, state: dict[str, object]) -> None:
        counts = state.get("counts")
        self._counts = (
            {str(k): int(v) for k, v in counts.items()} if isinstance(counts, dict) else {}
        )
        max_repeat, total = state.get("max_repeat"), state.get("total")
        self._max_repeat = max_repeat if isinstance(max_repeat, int) else 0
        self._total = total if isinstance(total, int) else 0
