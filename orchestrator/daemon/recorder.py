"""The event recorder: every bus message of the daemon's runs, numbered, into the store.

An observer on the runtime's bus (lossless, never waited for by settling publishes). Each
run's messages get sequence numbers 1, 2, … in bus order; a resumed run goes on from its
last stored number. Past the per-run cap (``daemon.event_cap``) messages are counted as
dropped instead of stored, except ``RunFinished``, which always is: a stream always ends.
A slow disk slows the recorder, and through its full mailbox the runs, rather than lose
events; a slow SSE client slows nothing, since streams read what was committed.

Each message is stored in its logged form (:func:`bus.for_the_log`; :class:`bus.LogReader`
rebuilds it), less what would be stored twice (``docs/daemon.md``, "Event streams"): a
turn's ``ModelTextDelta`` messages are held and stored as one when the next commit takes the
queued writes (or the run's next message comes first), dropped when the turn's
``ModelReply`` ends with their text, and the ``Progress`` whose ``running`` status restates
the ``TurnStarted`` just before it (no tokens or time) is not stored.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
from anyio.abc import TaskStatus

from bus import (
    ENCODER,
    Bus,
    Message,
    ModelReply,
    ModelTextDelta,
    Progress,
    RunFinished,
    RunStarted,
    TurnStarted,
    for_the_log,
)
from orchestrator.daemon.store import Store

__all__ = ["EventRecorder", "RecorderStatistics"]


@dataclass
class _Track:
    seq: int
    dropped: int
    finished: anyio.Event = field(default_factory=anyio.Event)
    text: list[str] | None = None
    """Streamed text held back (not stored yet), of turn ``text_turn``."""
    text_turn: int = 0
    turn: TurnStarted | None = None
    """The run's last stored ``TurnStarted`` whose ``Progress`` has not come yet."""


@dataclass
class RecorderStatistics:
    """What the recorder saved the store."""

    messages: int = 0
    coalesced_deltas: int = 0
    """``ModelTextDelta`` messages merged into another one."""
    deltas_in_replies: int = 0
    """Held text dropped because its ``ModelReply`` carried it."""
    folded_progress: int = 0


class EventRecorder:
    """Records the runs it was told to :meth:`track`."""

    def __init__(self, bus: Bus, store: Store, *, cap: int) -> None:
        self._bus = bus
        self._store = store
        self._cap = cap
        self._runs: dict[str, _Track] = {}
        self._holding: set[str] = set()
        self.statistics = RecorderStatistics()
        self._handlers: dict[type[Message], Callable[[Any, _Track], None]] = {}
        """Message type → how it is recorded (:meth:`_handler_for`, filled as types come)."""
        store.before_commit(self._release_all)

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
        self._holding.discard(run_id)

    def _record(self, msg: Message) -> Awaitable[None] | None:
        """Record ``msg``; the wait for room in the store when it is full, else ``None`` (the
        subscription awaits only a result: no coroutine per message while the store keeps up)."""
        track = self._runs.get(msg.run_id)
        if track is None:
            return None
        self.statistics.messages += 1
        kind = type(msg)
        handle = self._handlers.get(kind)
        if handle is None:
            handle = self._handlers[kind] = self._handler_for(kind)
        handle(msg, track)
        store = self._store
        return None if store.has_room() else store.wait_for_room()

    def _handler_for(self, kind: type[Message]) -> Callable[[Any, _Track], None]:
        """How messages of ``kind`` are recorded (looked up once per type)."""
        for base, handler in (
            (ModelTextDelta, self._hold),
            (ModelReply, self._reply),
            (Progress, self._progress),
            (TurnStarted, self._turn),
            (RunStarted, self._started),
            (RunFinished, self._finished),
        ):
            if issubclass(kind, base):
                return handler
        return self._plain

    def _plain(self, msg: Message, track: _Track) -> None:
        if track.text is not None:
            self._release(msg.run_id, track)
        self._append(msg.run_id, track, msg)

    def _reply(self, msg: ModelReply, track: _Track) -> None:
        if track.text is not None:
            if msg.turn == track.text_turn and msg.text.endswith("".join(track.text)):
                track.text = None
                self._holding.discard(msg.run_id)
                self.statistics.deltas_in_replies += 1
            else:
                self._release(msg.run_id, track)
        self._append(msg.run_id, track, msg)

    def _progress(self, msg: Progress, track: _Track) -> None:
        if track.text is not None:
            self._release(msg.run_id, track)
        restated, track.turn = track.turn, None  # only the first progress after it
        if _restates(msg, restated):
            self.statistics.folded_progress += 1
            return
        self._append(msg.run_id, track, msg)

    def _turn(self, msg: TurnStarted, track: _Track) -> None:
        self._plain(msg, track)
        track.turn = msg

    def _started(self, msg: RunStarted, track: _Track) -> None:
        self._plain(msg, track)
        self._store.update_run(msg.run_id, status="running", started_at=msg.started_at)

    def _finished(self, msg: RunFinished, track: _Track) -> None:
        run_id = msg.run_id
        if track.text is not None:
            self._release(run_id, track)
        self._append(run_id, track, msg, past_cap=True)  # a stream always ends
        self._store.update_run(run_id, events_dropped=track.dropped)
        del self._runs[run_id]
        track.finished.set()

    def _append(self, run_id: str, track: _Track, msg: Message, *, past_cap: bool = False) -> None:
        if track.seq < self._cap or past_cap:
            track.seq += 1
            self._store.append_event(
                run_id, track.seq, type(msg).__name__, ENCODER.encode(for_the_log(msg))
            )
        else:
            track.dropped += 1

    def _hold(self, msg: ModelTextDelta, track: _Track) -> None:
        if track.text is not None and track.text_turn == msg.turn:
            track.text.append(msg.text)
            self.statistics.coalesced_deltas += 1
            return
        if track.text is not None:
            self._release(msg.run_id, track)
        track.text = [msg.text]
        track.text_turn = msg.turn
        self._holding.add(msg.run_id)
        self._store.poke()  # the writer queues it (with whatever follows) at its next commit

    def _release(self, run_id: str, track: _Track) -> None:
        """Queue the text ``track`` holds as one ``ModelTextDelta``."""
        assert track.text is not None
        text = "".join(track.text)
        track.text = None
        self._holding.discard(run_id)
        delta = ModelTextDelta(run_id=run_id, turn=track.text_turn, text=text)
        self._append(run_id, track, delta)

    def _release_all(self) -> None:
        """Before a commit: queue every held text (the store's hook)."""
        if not self._holding:
            return
        holding, self._holding = self._holding, set()
        for run_id in holding:
            track = self._runs.get(run_id)
            if track is not None and track.text is not None:
                self._release(run_id, track)


def _restates(progress: Progress, turn: TurnStarted | None) -> bool:
    """Whether ``progress`` is the reporter's ``running`` event for ``turn`` and nothing more."""
    if turn is None or progress.status != "running" or progress.stage != turn.stage:
        return False
    return progress.turn == turn.turn and not (progress.tokens or progress.elapsed_seconds)
