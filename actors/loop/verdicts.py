"""What the loop detector decides: levels, detector names, decisions and their texts."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Final, Literal

import msgspec

__all__ = [
    "NEVER",
    "Decision",
    "Detector",
    "Hit",
    "Level",
    "Levels",
    "by_level",
    "level_for",
]

Level = Literal["none", "warning", "critical", "break"]
"""``warning``: nudge, the call runs. ``critical``: the call is refused (for content: the
stream is cut and a nudge follows). ``break``: the run stops before the call runs."""

Detector = str
"""A detector's name: one of ``actors.loop.registry.DETECTORS``."""


@dataclass(frozen=True, slots=True)
class Hit:
    """One detector's finding about one call, before rate limiting and escalation."""

    detector: Detector
    level: Level
    count: int
    key: str
    message: str


NEVER: Final = sys.maxsize
"""A count no detector reaches: the lowest count of a detector whose levels are all off."""


def level_for(count: int, warn: int | None, block: int | None, brk: int | None) -> Level:
    """The highest level whose threshold ``count`` reaches."""
    if brk is not None and count >= brk:
        return "break"
    if block is not None and count >= block:
        return "critical"
    if warn is not None and count >= warn:
        return "warning"
    return "none"


def by_level(level: Level, warning: str, critical: str, stop: str) -> str:
    """The text of ``level``: ``warning``, ``critical``, else (a ``break``) ``stop``."""
    return warning if level == "warning" else critical if level == "critical" else stop


class Levels:
    """A detector's three thresholds. ``lowest``: the lowest count that reaches a level
    (``NEVER`` when every level is off): below it, a detector need not look further."""

    __slots__ = ("block", "brk", "lowest", "warn")

    def __init__(self, warn: int | None, block: int | None, brk: int | None) -> None:
        self.warn, self.block, self.brk = warn, block, brk
        on = [threshold for threshold in (warn, block, brk) if threshold is not None]
        self.lowest = min(on) if on else NEVER

    def level(self, count: int) -> Level:
        """The highest level whose threshold ``count`` reaches (``none`` below ``lowest``)."""
        if count < self.lowest:
            return "none"
        return level_for(count, self.warn, self.block, self.brk)


class Decision(msgspec.Struct, frozen=True, kw_only=True):
    """The answer to one proposed call or one piece of streamed text.

    ``nudge`` is the text to inject before the next model call, or ``None`` when nothing is
    to be injected (no finding, or a warning already given: ``rate_limited``).
    ``call_id`` names the call for :meth:`LoopDetector.record_result`.
    """

    level: Level = "none"
    detector: Detector | None = None
    count: int = 0
    message: str = ""
    nudge: str | None = None
    rate_limited: bool = False
    call_id: str = ""

    @property
    def cause(self) -> str | None:
        """The stop cause of this detector (``loop.<detector>``), if any."""
        return None if self.detector is None else f"loop.{self.detector}"
