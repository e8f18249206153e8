"""The live progress line of ``loopfuse run`` and ``loopfuse report`` on a terminal.

One line, redrawn in place while the run goes and erased when it ends (the result is
printed after it)::

    turn 3 · 3 model calls · 4 tool calls · 12,480 tokens · last verdict: warn (loop.ping_pong)

A report run also names its stage (``stage 2/5 explore``). It reads the run's bus events
(the same the daemon streams) and never waits on the run: it is an observer.

Drawn with `rich <https://github.com/Textualize/rich>`_ (its ``Live`` display: cursor
control, terminal detection and width handling, which a hand-written ``\\r`` line gets
wrong on narrow terminals and redirected output). Off when the output is not a terminal
(or is JSON): a pipe or a file gets only the result.
"""

from __future__ import annotations

from rich.console import Console
from rich.live import Live
from rich.text import Text

from bus import (
    Message,
    ModelReplied,
    Progress,
    ToolCallProposed,
    ToolVerdict,
    TurnStarted,
)
from orchestrator.runtime import RunHandle

__all__ = ["ProgressLine", "RunTally"]


class RunTally:
    """What the line shows, counted from a run's events."""

    def __init__(self) -> None:
        self.turn = 0
        self.model_calls = 0
        self.tool_calls = 0
        self.tokens = 0
        self.verdict = ""
        self.stage = ""

    def add(self, event: Message) -> bool:
        """Count ``event``; whether the line changed."""
        match event:
            case TurnStarted(turn=turn):
                self.turn = turn
            case ModelReplied(total_usage=usage):
                self.model_calls += 1
                self.tokens = usage.prompt_tokens + usage.completion_tokens
            case ToolCallProposed():
                self.tool_calls += 1
            case ToolVerdict(verdict=verdict, cause=cause, source=source):
                self.verdict = f"{verdict} ({cause or source})"
            case Progress(index=index, total=total, stage=stage):
                self.stage = f"stage {index}/{total} {stage}"
            case _:
                return False
        return True

    def line(self) -> str:
        verdict = f"last verdict: {self.verdict}" if self.verdict else ""
        calls = f"{_count(self.model_calls, 'model call')} · {_count(self.tool_calls, 'tool call')}"
        parts = (self.stage, f"turn {self.turn}", calls, f"{self.tokens:,} tokens", verdict)
        return " · ".join(part for part in parts if part)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


class ProgressLine:
    """Draws a run's :class:`RunTally` on ``console`` until the run ends (erased then)."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console()
        self.tally = RunTally()

    async def follow(self, handle: RunHandle) -> None:
        """Redraw the line on each event that changes it, until the run's events end."""
        with Live(
            Text(self.tally.line()),
            console=self.console,
            auto_refresh=False,
            transient=True,
            redirect_stdout=False,
            redirect_stderr=False,
        ) as live:
            async for event in handle.events():
                if self.tally.add(event):
                    live.update(Text(self.tally.line()), refresh=True)
