"""One run's mutable state (transcript, counters, trace, call log) and the result it makes.

A plain record: the phases read and change it; it decides nothing."""

from __future__ import annotations

import time
from typing import Literal, cast

import msgspec

from bus import ChatMessage, Nudge, StopSignal, Usage, nudge_text
from orchestrator.conductor.inputs import RunCheckpoint
from orchestrator.result import CallLogEntry, RunPhase, RunResult, TraceEntry, end_result

__all__ = ["RunRecord"]

_RawTrace = tuple[float, int, RunPhase, str, str]
"""A trace entry as made: monotonic time, turn, state, event, detail."""


class RunRecord:
    """Everything a run changes as it goes."""

    __slots__ = (
        "call_log",
        "checkpoint_from",
        "checkpointed",
        "continued",
        "deadline_at",
        "degraded",
        "incomplete",
        "injected",
        "llm_requests",
        "notes",
        "nudges",
        "output",
        "pieces",
        "rewritten_from",
        "run_id",
        "sent_messages",
        "shortened_turn",
        "started",
        "state",
        "tool_calls",
        "trace",
        "trace_id",
        "traced",
        "transcript",
        "truncations",
        "turn",
        "usage",
    )

    def __init__(self, run_id: str, trace_id: str, deadline_seconds: float) -> None:
        self.run_id = run_id
        self.trace_id = trace_id
        self.notes: tuple[str, ...] = ()
        self.started = time.monotonic()
        self.deadline_at = time.time() + deadline_seconds
        self.transcript: list[ChatMessage] = []
        # Entries as made, turned into TraceEntry structs when a result or checkpoint reads them.
        self.trace: list[TraceEntry | _RawTrace] = []
        self.traced = 0  # entries converted so far
        self.call_log: list[CallLogEntry] = []
        self.turn = 0
        self.state: RunPhase = "PLAN"
        self.llm_requests = 0
        self.tool_calls = 0
        self.usage = Usage()
        self.injected: set[tuple[str, str]] | None = None  # made at the first nudge
        self.nudges = 0
        self.truncations = 0
        self.pieces: list[str] = []  # the pieces of an answer cut by the output limit
        self.output = ""
        self.incomplete = False
        self.degraded = False
        self.continued: list[str] = []  # texts of turns a monitor continued (token target)
        self.shortened_turn = -1  # the last turn whose refused prompt was folded or summarised
        # For event logs: how much of the previous turn request's prompt is still the same
        # (messages sent, then the lowest index rewritten in place since: folds, a summary).
        self.sent_messages = 0
        self.rewritten_from = 0
        # The messages the last checkpoint's ``appended`` stood for: from this index to
        # ``checkpointed`` (0: rewritten since, in place).
        self.checkpoint_from = 0
        self.checkpointed = 0

    def restore(self, point: RunCheckpoint) -> None:
        """Go on from ``point``: its transcript, and its counters for budgets and result."""
        self.started = time.monotonic() - point.elapsed_seconds
        self.deadline_at -= point.elapsed_seconds
        self.transcript = list(point.transcript)
        self.turn = point.turn
        self.llm_requests = point.llm_requests
        self.tool_calls = point.tool_calls
        self.usage = point.usage
        self.nudges = point.nudges
        self.injected = set(point.injected)
        self.truncations = point.truncations
        self.output = point.output
        self.trace = [*point.trace]
        self.traced = len(self.trace)
        self.call_log = list(point.call_log)
        self.trace_event("resumed", f"after turn {point.turn}")

    def snapshot(self, pending: tuple[Nudge, ...] = ()) -> RunCheckpoint:
        """The run after its last completed turn; ``pending``: nudges not injected yet."""
        return RunCheckpoint(
            run_id=self.run_id,
            trace_id=self.trace_id,
            turn=self.turn,
            elapsed_seconds=time.monotonic() - self.started,
            transcript=tuple(self.transcript),
            llm_requests=self.llm_requests,
            tool_calls=self.tool_calls,
            usage=self.usage,
            nudges=self.nudges,
            injected=tuple(sorted(self.injected or ())),
            truncations=self.truncations,
            output=self.output,
            trace=self.trace_entries(),
            call_log=tuple(self.call_log),
            pending_nudges=pending,
        )

    def enter(self, state: RunPhase, event: str) -> None:
        self.state = state
        self.trace.append((time.monotonic(), self.turn, state, event, ""))

    def trace_event(self, event: str, detail: str = "") -> None:
        self.trace.append((time.monotonic(), self.turn, self.state, event, detail))

    def trace_entries(self) -> tuple[TraceEntry, ...]:
        trace, started = self.trace, self.started
        for index in range(self.traced, len(trace)):
            entry = trace[index]
            if isinstance(entry, tuple):
                at, turn, state, event, detail = entry
                micros = round((at - started) * 1_000_000)  # see docs/performance.md
                trace[index] = TraceEntry(
                    at=micros / 1_000_000, turn=turn, state=state, event=event, detail=detail
                )
        self.traced = len(trace)
        return cast(tuple[TraceEntry, ...], tuple(trace))  # every entry converted above

    def rewritten(self, index: int) -> None:
        """Messages from ``index`` on were changed in place (not appended)."""
        self.rewritten_from = min(self.rewritten_from, index)
        self.checkpointed = 0

    def inject(self, nudges: list[Nudge]) -> None:
        """Append each nudge not injected before as a user message."""
        for nudge in nudges:
            key = (nudge.kind, nudge.text)
            if self.injected is None:
                self.injected = set()
            elif key in self.injected:
                continue
            self.injected.add(key)
            self.nudges += 1
            self.transcript.append(
                ChatMessage(role="user", content=nudge_text(nudge.kind, nudge.text))
            )
            self.trace_event("nudge", nudge.kind)

    def recovered(self, text: str) -> str:
        """``text`` after the pieces of the answer it continues (the output limit cut
        them; the model was asked to go on exactly where it stopped, so no separator)."""
        return "".join((*self.pieces, text))

    def result(self, stop: StopSignal) -> RunResult:
        ending = end_result(
            self.run_id,
            self.trace_id,
            stop.reason,
            stop.cause,
            stop.detail,
            shortened=self.shortened_turn == self.turn,  # read for context.prompt_too_long
        )
        final_state: Literal["DONE", "FAILED"] = "DONE" if ending.outcome == "done" else "FAILED"
        event = f"{stop.reason.value}/{stop.cause}"
        self.trace.append((time.monotonic(), self.turn, final_state, event, stop.detail))
        return msgspec.structs.replace(
            ending,
            turns=self.turn,
            llm_requests=self.llm_requests,
            tool_calls=self.tool_calls,
            usage=self.usage,
            output=self.output,
            incomplete=self.incomplete,
            degraded=self.degraded,
            nudges=self.nudges,
            trace=self.trace_entries(),
            call_log=tuple(self.call_log),
            transcript=tuple(self.transcript),
            notes=self.notes,
        )
