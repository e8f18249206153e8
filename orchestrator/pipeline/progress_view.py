"""Progress for logs and pipes: one plain line per :class:`bus.Progress` event.

``loopfuse report`` prints these on stderr when stderr is not a terminal; on a terminal
the command line's live line (:mod:`orchestrator.cli_progress`) shows the stages instead.
A line holds the stage, index/total, percent, elapsed seconds, tokens and the event's
detail.
"""

from __future__ import annotations

from typing import TextIO

from bus import Progress

__all__ = ["ProgressView", "percent_of"]


def percent_of(event: Progress) -> int:
    """How far the plan is: a stage counts as done once it finished or was skipped."""
    done = event.index if event.status in ("finished", "skipped") else event.index - 1
    return round(100 * done / event.total) if event.total else 100


class ProgressView:
    """Writes one line per progress event to ``out``, flushed at once."""

    def __init__(self, out: TextIO) -> None:
        self._out = out

    def show(self, event: Progress) -> None:
        detail = f": {event.detail}" if event.detail else ""
        self._out.write(
            f"{event.index}/{event.total} {event.stage} {event.status}"
            f" {percent_of(event):3d}% {event.elapsed_seconds:5.1f}s {event.tokens:,} tokens"
            f"{detail}\n"
        )
        self._out.flush()
