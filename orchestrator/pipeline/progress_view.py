"""Progress for people: a live one-line bar on a terminal, plain lines otherwise.

Both render the run's :class:`bus.Progress` events (the same events the daemon streams):
stage, index/total, percent, elapsed seconds and tokens. Hand-written (a dozen lines) rather
than a dependency: the bar needs no layout, colour or multi-bar support.
"""

from __future__ import annotations

from typing import TextIO

from bus import Progress

__all__ = ["ProgressView", "percent_of"]

BAR_WIDTH = 24


def percent_of(event: Progress) -> int:
    """How far the plan is: a stage counts as done once it finished or was skipped."""
    done = event.index if event.status in ("finished", "skipped") else event.index - 1
    return round(100 * done / event.total) if event.total else 100


class ProgressView:
    """Renders progress events to ``out``: a bar redrawn in place when ``live``."""

    def __init__(self, out: TextIO, *, live: bool) -> None:
        self._out = out
        self._live = live
        self._drawn = False

    def show(self, event: Progress) -> None:
        percent = percent_of(event)
        facts = (
            f"{event.index}/{event.total} {event.stage} {event.status}"
            f" {percent:3d}% {event.elapsed_seconds:5.1f}s {event.tokens:,} tokens"
        )
        if self._live:
            filled = BAR_WIDTH * percent // 100
            bar = "#" * filled + "-" * (BAR_WIDTH - filled)
            self._out.write(f"\r\x1b[K[{bar}] {facts}")
            self._drawn = True
        else:
            detail = f": {event.detail}" if event.detail else ""
            self._out.write(f"{facts}{detail}\n")
        self._out.flush()

    def close(self) -> None:
        """End the bar's line (plain output needs nothing)."""
        if self._drawn:
            self._out.write("\n")
            self._out.flush()
            self._drawn = False
