"""The in-memory event log: every bus message of a run, in order, readable while it runs.

It is a lossless observer (it never drops, and is never waited for by settling publishes).
Readers iterate from any position, so a late reader replays what it missed and then
follows live; iteration ends after the run's ``RunFinished``. Each run keeps at most
``cap`` events; past the cap new events are counted as dropped (positions never shift, so
readers can resume by position), except ``RunFinished``, which is always kept.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Final

import anyio
from anyio.abc import TaskStatus

from bus import Bus, Message, RunFinished, aio_seam

__all__ = ["DEFAULT_EVENT_CAP", "EventLog"]

DEFAULT_EVENT_CAP: Final = 10_000


class _RunEvents:
    __slots__ = ("dropped", "events", "finished", "following")

    def __init__(self) -> None:
        self.events: list[Message] = []
        self.finished = False
        self.dropped = 0
        self.following: aio_seam.Event | None = None  # made only while someone follows

    def wake(self) -> None:
        if self.following is not None:
            self.following.set()
            self.following = None

    async def changed(self) -> None:
        if self.following is None:
            self.following = aio_seam.Event()
        await self.following.wait()


class _Follower:
    """One reader of a run's events (an iterator class, not an async generator: this module
    is compiled with mypyc, which does not compile async generators)."""

    __slots__ = ("_log", "_position", "_run_id", "_runs", "_started")

    def __init__(self, runs: dict[str, _RunEvents], run_id: str, position: int) -> None:
        self._runs = runs
        self._run_id = run_id
        self._position = position
        self._log: _RunEvents | None = None
        self._started = False

    def __aiter__(self) -> _Follower:
        return self

    async def __anext__(self) -> Message:
        if not self._started:  # looked up at the first step, as a generator would
            self._started = True
            self._log = self._runs.get(self._run_id)
        log = self._log
        if log is None:
            raise StopAsyncIteration
        while self._position >= len(log.events):
            if log.finished:
                raise StopAsyncIteration
            await log.changed()
        self._position += 1
        return log.events[self._position - 1]


class EventLog:
    """Keeps the events of the runs opened with :meth:`open_run`."""

    def __init__(self, bus: Bus, *, cap: int = DEFAULT_EVENT_CAP) -> None:
        self._bus = bus
        self._cap = cap
        self._runs: dict[str, _RunEvents] = {}

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Record until the bus closes this subscription."""
        subscription = self._bus.subscribe(name="event_log", inline=True)
        task_status.started()
        await subscription.serve(self.record)

    def open_run(self, run_id: str) -> None:
        """Start keeping ``run_id``'s events (before its first message is published)."""
        self._runs.setdefault(run_id, _RunEvents())

    def close_run(self, run_id: str) -> None:
        """Forget ``run_id``'s events; readers still iterating stop."""
        log = self._runs.pop(run_id, None)
        if log is not None:
            log.finished = True
            log.wake()

    def events(self, run_id: str) -> tuple[Message, ...]:
        """What has been recorded for ``run_id`` so far."""
        log = self._runs.get(run_id)
        return tuple(log.events) if log is not None else ()

    def dropped(self, run_id: str) -> int:
        log = self._runs.get(run_id)
        return log.dropped if log is not None else 0

    def follow(self, run_id: str, *, after: int = 0) -> AsyncIterator[Message]:
        """Yield ``run_id``'s events from position ``after``, live, until the run ends."""
        return _Follower(self._runs, run_id, after)

    def record(self, msg: Message) -> None:
        """Keep ``msg`` if its run is open (what the bus calls with every message)."""
        # Called inline for every message of every run: a type check rather than
        # isinstance (bus messages have no subclasses), and no call unless someone follows.
        log = self._runs.get(msg.run_id)
        if log is None:
            return
        if type(msg) is RunFinished:
            log.finished = True
        elif len(log.events) >= self._cap:
            log.dropped += 1
            return
        log.events.append(msg)
        if log.following is not None:
            log.wake()
