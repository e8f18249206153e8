"""The event recorder: every bus message of the daemon's runs, numbered, into the store.

An observer on the runtime's bus (lossless, never waited for by settling publishes). Each
run's messages get sequence numbers 1, 2, … in bus order; a resumed run goes on from its
last stored number. Past the per-run cap (``daemon.event_cap``) messages are counted as
dropped instead of stored, except ``RunFinished``, which always is: a stream always ends.
A slow disk slows the recorder, and through its full mailbox the runs, rather than lose
events; a slow SSE client slows nothing, since streams read the store.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import anyio
from anyio.abc import TaskStatus

from bus import ENCODER, Bus, Message, RunFinished, RunStarted, for_the_log
from orchestrator.daemon.store import Store

__all__ = ["EventRecorder"]


@dataclass
class _Track:
    seq: int
    dropped: int
    finished: anyio.Event = field(default_factory=anyio.Event)


class EventRecorder:
    """Records the runs it was told to :meth:`track`."""

    def __init__(self, bus: Bus, store: Store, *, cap: int) -> None:
        self._bus = bus
        self._store = store
        self._cap = cap
        self._runs: dict[str, _Track] = {}

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Record until the bus closes this subscription."""
        subscription = self._bus.subscribe(name="event_recorder")
        task_status.started()
        await subscription.serve(self._record)

    def track(self, run_id: str, *, last_seq: int = 0, dropped: int = 0) -> anyio.Event:
        """Record ``run_id`` from event ``last_seq + 1`` on; the returned event is set once
        its ``RunFinished`` is queued in the store."""
        track = self._runs[run_id] = _Track(last_seq, dropped)
        return track.finished

    def forget(self, run_id: str) -> None:
        """Stop recording ``run_id`` (it never started)."""
        self._runs.pop(run_id, None)

    async def _record(self, msg: Message) -> None:
        track = self._runs.get(msg.run_id)
        if track is None:
            return
        finished = isinstance(msg, RunFinished)
        if track.seq < self._cap or finished:
            track.seq += 1
            self._store.append_event(
                msg.run_id, track.seq, type(msg).__name__, ENCODER.encode(for_the_log(msg))
            )
        else:
            track.dropped += 1
        if isinstance(msg, RunStarted):
            self._store.update_run(msg.run_id, status="running", started_at=msg.started_at)
        elif finished:
            self._store.update_run(msg.run_id, events_dropped=track.dropped)
            del self._runs[msg.run_id]
            track.finished.set()
        await self._store.wait_for_room()
