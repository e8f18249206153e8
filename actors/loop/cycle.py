"""Detector 5, cycles: a sequence of calls repeating itself (gemini-cli's tool-call check).

The last ``window`` fingerprints are kept. For each period ``k`` (smallest first) the tail
of the sequence, the proposed call included, is matched against itself shifted by ``k``;
the count is the number of whole repetitions of the last ``k`` calls. Results are never
looked at: A,B,A,B… trips even when the results change.

A call whose fingerprint is not in the window repeats nothing: every count is at most 1,
so when no threshold is that low the periods are not looked at.
"""

from __future__ import annotations

from collections.abc import Sequence

from actors.loop.config import CycleConfig
from actors.loop.history import CallRecord, ToolDetector, Window
from actors.loop.verdicts import Hit, Level, Levels, by_level

__all__ = ["Cycle", "repetitions"]


def repetitions(keys: Sequence[str], period: int) -> int:
    """Whole repetitions of the last ``period`` keys at the end of ``keys`` (0 when the
    block is itself a repetition of a shorter one)."""
    n = len(keys)
    if n < period:
        return 0
    block = keys[n - period :]
    if any(
        period % p == 0 and all(block[i] == block[i % p] for i in range(period))
        for p in range(1, period)
    ):
        return 0
    run = period
    while run < n and keys[n - 1 - run] == keys[n - 1 - run + period]:
        run += 1
    return run // period


def _message(level: Level, period: int, tools: str, count: int) -> str:
    pattern = f"a cycle of {period} tool calls ({tools}) {count} times in a row"
    return by_level(
        level,
        f"WARNING: You have repeated {pattern}. Change your approach or finish now.",
        f"CRITICAL: You have repeated {pattern}. This call was not run: the cycle is not "
        "making progress; try a different approach or finish with what you have.",
        f"Stopped: the model repeated {pattern}.",
    )


class Cycle(ToolDetector):
    """Keeps its own window of fingerprints (and tool names, for messages)."""

    __slots__ = ("_config", "_keys", "_levels", "_tools")

    records = True
    STATE = ("keys", "tools")

    def __init__(self, config: CycleConfig) -> None:
        self._config = config
        self._keys: list[str] = []
        self._tools: list[str] = []
        self._levels = Levels(config.warn_at, config.block_at, config.break_at)

    def fresh(self) -> Cycle:
        return Cycle(self._config)

    def check(self, call: CallRecord, window: Window) -> Hit | None:
        cfg = self._config
        if self._levels.lowest > 1 and call.fingerprint not in self._keys:
            return None
        keys = [*self._keys, call.fingerprint]
        for period in range(cfg.min_period, cfg.max_period + 1):
            count = repetitions(keys, period)
            level = self._levels.level(count)
            if level != "none":
                tools = " → ".join([*self._tools, call.tool][-period:])
                key = f"cycle:{period}:{'|'.join(sorted(keys[-period:]))}"
                return Hit("cycle", level, count, key, _message(level, period, tools, count))
        return None

    def record(self, call: CallRecord) -> None:
        keys, tools = self._keys, self._tools
        keys.append(call.fingerprint)
        tools.append(call.tool)
        if len(keys) > self._config.window:
            del keys[0]
            del tools[0]
