"""Durable runs across restarts: the store-backed journal and the crash ending.

:class:`StoreJournal` is the runtime's :class:`~orchestrator.runtime.RunJournal`: every
completed turn's checkpoint (the transcript and the counters) goes to the store as the run's
newest checkpoint (:meth:`~orchestrator.daemon.store.Store.save_checkpoint`), and a run the
daemon starts again after a crash is handed the checkpoint to resume from.

A run that was running when the process died either resumes (``on_crash = "resume"``, the
default) or is ended as it would have been by an abort at that moment: cause ``abort.crash``,
with the exit reason the cause table gives after the run's last stored steps
(:func:`bus.abort_reason_after`: ``aborted_tools`` if tools were running).
:func:`crash_ending` builds the events and the result for that ending.

A stored request that no longer passes validation (a value an older version accepted is
now out of range) is not started: it ends the same way, with a detail naming the key and
why (:func:`refused_detail`), and the other runs are recovered.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import Final

import msgspec

from bus import DECODER, ENCODER, AbortRequested, ExitReason, Message, abort_reason_after
from orchestrator.conductor import RunCheckpoint
from orchestrator.daemon.store import Store, StoredEvent
from orchestrator.result import RunResult, TraceEntry, end_result, finished_message
from orchestrator.runtime import StartPoint

__all__ = [
    "CHECKPOINT_DECODER",
    "StoreJournal",
    "crash_detail",
    "crash_ending",
    "phase_of",
    "refused_detail",
]

CHECKPOINT_DECODER: Final = msgspec.json.Decoder(RunCheckpoint)


class StoreJournal:
    """Checkpoints into the store; start points for the runs the daemon (re)starts."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._points: dict[str, StartPoint] = {}

    def expect(self, run_id: str, point: StartPoint) -> None:
        """Start ``run_id`` at ``point`` when the runtime starts it."""
        self._points[run_id] = point

    def forget(self, run_id: str) -> None:
        self._points.pop(run_id, None)

    def start_point(self, run_id: str) -> StartPoint | None:
        return self._points.pop(run_id, None)

    def checkpoint(self, checkpoint: RunCheckpoint) -> None:
        self._store.save_checkpoint(checkpoint.run_id, ENCODER.encode(checkpoint))


def phase_of(tail: Sequence[StoredEvent]) -> ExitReason:
    """The exit reason of a crash after ``tail`` (a run's newest stored events, oldest
    first), from the cause table: ``aborted_tools`` if its newest step was the tools',
    else ``aborted_streaming``."""
    return abort_reason_after(_newest_first(tail))


def _newest_first(tail: Sequence[StoredEvent]) -> Iterator[Message]:
    """``tail``'s messages, decoded newest first as they are asked for; an event this
    version cannot decode (stored by another) is passed over."""
    for event in reversed(tail):
        try:
            yield DECODER.decode(event.data)
        except msgspec.DecodeError:
            continue


def crash_ending(
    run_id: str,
    trace_id: str,
    reason: ExitReason,
    checkpoint: RunCheckpoint | None,
    detail: str,
) -> tuple[tuple[Message, ...], RunResult]:
    """The events that end a crashed run (an abort by ``crash``, then ``RunFinished``) and
    its result, which keeps what the last checkpoint had."""
    point = checkpoint or RunCheckpoint(
        run_id=run_id, trace_id=trace_id, turn=0, elapsed_seconds=0.0, transcript=()
    )
    final = TraceEntry(
        at=round(point.elapsed_seconds, 6),
        turn=point.turn,
        state="FAILED",
        event=f"{reason.value}/abort.crash",
        detail=detail,
    )
    result = msgspec.structs.replace(
        end_result(run_id, trace_id, reason, "abort.crash", detail),
        turns=point.turn,
        llm_requests=point.llm_requests,
        tool_calls=point.tool_calls,
        usage=point.usage,
        output=point.output,
        nudges=point.nudges,
        trace=(*point.trace, final),
        call_log=point.call_log,
        transcript=point.transcript,
    )
    finished = finished_message(result)
    abort = AbortRequested(run_id=run_id, source="crash", detail=detail)
    return (abort, finished), result


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def crash_detail() -> str:
    """The detail of a crash ending."""
    return f"The daemon stopped while this run was active; found at restart ({_now()})."


def refused_detail(key: str | None, reason: str) -> str:
    """The detail of a crash ending whose stored request this version refuses to start:
    ``key`` (``config.loop.cycle.max_period``) and ``reason`` say what is wrong."""
    where = f"{key}: " if key else ""
    return (
        "The daemon stopped while this run was active; at restart "
        f"({_now()}) its stored request was refused: {where}{reason}. Submit it again "
        "with a valid value."
    )
