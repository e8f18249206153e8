"""One run's state: the transcript, counters, trace and call log, and the result they make."""

from __future__ import annotations

import logging
import time
from typing import Literal, cast

from bus import (
    Bus,
    ChatMessage,
    ContextAction,
    ExitReason,
    Inbox,
    Nudge,
    RunStarted,
    StopSignal,
    Usage,
    cause_hint,
    nudge_text,
    outcome_of,
)
from orchestrator.conductor.inputs import RunCheckpoint, RunInputs
from orchestrator.result import CallLogEntry, RunResult, RunState, TraceEntry

__all__ = ["ConductorState", "Stopped"]

logger = logging.getLogger("loopfuse.conductor")


_RawTrace = tuple[float, int, RunState, str, str]
"""A trace entry as made: monotonic time, turn, state, event, detail."""


class Stopped(Exception):
    """Internal: raised to unwind the loop once a stop has been decided."""

    def __init__(self, stop: StopSignal) -> None:
        self.stop = stop


class ConductorState:
    """One run's state and bookkeeping: transcript, counters, trace, call log, result."""

    # Slots: thousands of runs are in flight at once, each holding one of these.
    __slots__ = (
        "_bus",
        "_call_log",
        "_context_action",
        "_context_seen",
        "_continued",
        "_deadline_at",
        "_degraded",
        "_in",
        "_inbox",
        "_incomplete",
        "_injected",
        "_llm_requests",
        "_nudges",
        "_output",
        "_pending_nudges",
        "_pieces",
        "_rewritten_from",
        "_run_id",
        "_sent_messages",
        "_settings",
        "_started",
        "_state",
        "_stop",
        "_tool_calls",
        "_trace",
        "_traced",
        "_transcript",
        "_truncations",
        "_turn",
        "_usage",
    )

    def __init__(self, bus: Bus, inputs: RunInputs, inbox: Inbox) -> None:
        self._bus = bus
        self._inbox = inbox
        self._in = inputs
        self._settings = inputs.settings
        self._run_id = inputs.run_id
        self._started = time.monotonic()
        self._deadline_at = time.time() + inputs.settings.deadline_seconds
        self._transcript: list[ChatMessage] = []
        # Entries as made: a raw tuple per state change (made every turn, so cheap), turned
        # into TraceEntry structs once, when a result or a checkpoint reads them.
        self._trace: list[TraceEntry | _RawTrace] = []
        self._traced = 0  # entries converted so far (a checkpoint per turn converts the new)
        self._call_log: list[CallLogEntry] = []
        self._turn = 0
        self._state: RunState = "PLAN"
        self._llm_requests = 0
        self._tool_calls = 0
        self._usage = Usage()
        self._pending_nudges: list[Nudge] = []
        self._injected: set[tuple[str, str]] | None = None  # made at the first nudge
        self._nudges = 0
        self._stop: StopSignal | None = None
        self._truncations = 0
        self._pieces: list[str] = []  # the pieces of an answer cut by the output limit
        self._output = ""
        self._incomplete = False
        self._context_seen = 0  # transcript messages the context gatekeeper was shown
        self._context_action: ContextAction | None = None
        self._degraded = False
        self._continued: list[str] = []  # texts of turns a monitor continued (token target)
        # For event logs: how much of the previous turn request's prompt is still the same
        # (messages sent, then the lowest index rewritten in place since: folds, a summary).
        self._sent_messages = 0
        self._rewritten_from = 0
        if inputs.resume is not None:
            self._restore(inputs.resume)

    def _snapshot(self) -> RunCheckpoint:
        return RunCheckpoint(
            run_id=self._run_id,
            trace_id=self._in.trace_id,
            turn=self._turn,
            elapsed_seconds=time.monotonic() - self._started,
            transcript=tuple(self._transcript),
            llm_requests=self._llm_requests,
            tool_calls=self._tool_calls,
            usage=self._usage,
            nudges=self._nudges,
            injected=tuple(sorted(self._injected or ())),
            truncations=self._truncations,
            output=self._output,
            trace=self._trace_entries(),
            call_log=tuple(self._call_log),
        )

    def _restore(self, point: RunCheckpoint) -> None:
        self._started = time.monotonic() - point.elapsed_seconds
        self._deadline_at -= point.elapsed_seconds
        self._transcript = list(point.transcript)
        self._turn = point.turn
        self._llm_requests = point.llm_requests
        self._tool_calls = point.tool_calls
        self._usage = point.usage
        self._nudges = point.nudges
        self._injected = set(point.injected)
        self._truncations = point.truncations
        self._output = point.output
        self._trace = [*point.trace]
        self._traced = len(self._trace)
        self._call_log = list(point.call_log)
        self._trace_event("resumed", f"after turn {point.turn}")

    def _set_stop(self, stop: StopSignal) -> None:
        if self._stop is None:  # a run needs only its first stop
            self._stop = stop
            self._trace_event("stop", f"{stop.reason.value}/{stop.cause}: {stop.detail}")

    def _require_stop(self) -> StopSignal:
        assert self._stop is not None
        return self._stop

    def _inject_nudges(self) -> None:
        if not self._pending_nudges:
            return
        for nudge in self._pending_nudges:
            key = (nudge.kind, nudge.text)
            if self._injected is None:
                self._injected = set()
            elif key in self._injected:
                continue
            self._injected.add(key)
            self._nudges += 1
            self._transcript.append(
                ChatMessage(role="user", content=nudge_text(nudge.kind, nudge.text))
            )
            self._trace_event("nudge", nudge.kind)
        self._pending_nudges.clear()

    def _make_stop(self, reason: ExitReason, cause: str, source: str, detail: str) -> StopSignal:
        return StopSignal(
            run_id=self._run_id, reason=reason, cause=cause, source=source, detail=detail
        )

    def _trace_entries(self) -> tuple[TraceEntry, ...]:
        trace, started = self._trace, self._started
        for index in range(self._traced, len(trace)):
            entry = trace[index]
            if isinstance(entry, tuple):
                at, turn, state, event, detail = entry
                # Whole microseconds: round(x, 6) goes through decimal conversion (~1,400
                # instructions an entry, four entries a turn); the nearest integer does not.
                micros = round((at - started) * 1_000_000)
                trace[index] = TraceEntry(
                    at=micros / 1_000_000, turn=turn, state=state, event=event, detail=detail
                )
        self._traced = len(trace)
        return cast(tuple[TraceEntry, ...], tuple(trace))  # every entry converted above

    def _rewritten(self, index: int) -> None:
        """Messages from ``index`` on were changed in place (not appended)."""
        self._rewritten_from = min(self._rewritten_from, index)

    def _enter(self, state: RunState, event: str) -> None:
        self._state = state
        self._trace.append((time.monotonic(), self._turn, state, event, ""))

    def _trace_event(self, event: str, detail: str = "") -> None:
        self._trace.append((time.monotonic(), self._turn, self._state, event, detail))

    async def _publish_started(self) -> None:
        settings = self._settings
        resume = self._in.resume
        # A resumed run's budgets go on from where it was: the deadline counts the time
        # it ran before, the tool-call budget the calls it proposed.
        max_tool_calls = max(1, settings.max_tool_calls - len(self._call_log))
        await self._bus.publish(
            RunStarted(
                run_id=self._run_id,
                trace_id=self._in.trace_id,
                task=self._in.task,
                model=settings.model,
                stage=self._in.stage,
                plan=self._in.plan,
                folder=self._in.folder,
                tools=tuple(spec.name for spec in self._in.tool_specs),
                tool_specs=self._in.tool_specs,
                max_turns=settings.max_turns,
                max_tool_calls=max_tool_calls,
                deadline_seconds=settings.deadline_seconds,
                max_cache_hits=settings.max_cache_hits,
                cache_ttl_seconds=settings.cache_ttl_seconds,
                cache_max_entries=settings.cache_max_entries,
                tool_timeout_seconds=settings.tool_timeout_seconds,
                started_at=time.time() - (time.monotonic() - self._started),
                resumed_from_turn=resume.turn if resume is not None else None,
                output_token_budget=settings.output_token_budget or 0,
                input_token_budget=settings.input_token_budget or 0,
                cost_budget=settings.cost_budget or 0.0,
                budget_mode=settings.budget_mode,
                input_price_per_million=settings.input_price_per_million or 0.0,
                output_price_per_million=settings.output_price_per_million or 0.0,
            )
        )

    def _result(self, stop: StopSignal) -> RunResult:
        outcome = outcome_of(stop.reason)
        final_state: Literal["DONE", "FAILED"] = "DONE" if outcome.value == "done" else "FAILED"
        event = f"{stop.reason.value}/{stop.cause}"
        self._trace.append((time.monotonic(), self._turn, final_state, event, stop.detail))
        return RunResult(
            run_id=self._run_id,
            trace_id=self._in.trace_id,
            exit_reason=stop.reason,
            cause=stop.cause,
            outcome=outcome,
            detail=stop.detail,
            hint=cause_hint(stop.cause),
            turns=self._turn,
            llm_requests=self._llm_requests,
            tool_calls=self._tool_calls,
            usage=self._usage,
            output=self._output,
            incomplete=self._incomplete,
            degraded=self._degraded,
            nudges=self._nudges,
            trace=self._trace_entries(),
            call_log=tuple(self._call_log),
            transcript=tuple(self._transcript),
        )
