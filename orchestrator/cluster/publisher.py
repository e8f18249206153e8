"""What a daemon sends to JetStream while it runs runs: their events and their checkpoints.

:class:`EventPublisher` observes the daemon's bus (losslessly, like the daemon's event
recorder) and publishes each tracked run's messages, in bus order, to
``<prefix>.run.<id>.events``; each publish carries ``Nats-Msg-Id = <run>:<attempt>:<n>``,
so a publish retried across a NATS restart is stored once. :class:`KvJournal` is the
runtime's journal: every completed turn's checkpoint goes to the checkpoint bucket, where
any daemon that takes the run over finds it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Final

import anyio
from anyio.abc import TaskStatus
from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from bus import ENCODER, Bus, Message, RunFinished, for_the_log
from orchestrator.cluster.jetstream import retrying
from orchestrator.cluster.settings import ClusterSettings
from orchestrator.conductor import RunCheckpoint
from orchestrator.runtime import StartPoint

__all__ = ["TYPE_HEADER", "EventPublisher", "KvJournal"]

TYPE_HEADER: Final = "Loopfuse-Type"


@dataclass
class _Track:
    attempt: int
    n: int = 0
    finished: anyio.Event = field(default_factory=anyio.Event)


class EventPublisher:
    """Publishes the bus messages of the runs it was told to :meth:`track`."""

    def __init__(self, bus: Bus, js: JetStreamContext, settings: ClusterSettings) -> None:
        self._bus = bus
        self._js = js
        self._settings = settings
        self._runs: dict[str, _Track] = {}

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        subscription = self._bus.subscribe(name="cluster_events")
        task_status.started()
        await subscription.serve(self._publish)

    def track(self, run_id: str, attempt: int) -> anyio.Event:
        """Publish ``run_id``'s messages; the event is set once its ``RunFinished`` is stored
        in the stream."""
        track = self._runs[run_id] = _Track(attempt)
        return track.finished

    def forget(self, run_id: str) -> None:
        self._runs.pop(run_id, None)

    async def _publish(self, msg: Message) -> None:
        track = self._runs.get(msg.run_id)
        if track is None:
            return
        track.n += 1
        await self.publish(msg, msg_id=f"{msg.run_id}:{track.attempt}:{track.n}")
        if isinstance(msg, RunFinished):
            del self._runs[msg.run_id]
            track.finished.set()

    async def publish(self, msg: Message, *, msg_id: str) -> None:
        """Store ``msg`` on its run's subject (retrying through outages)."""
        subject = self._settings.events_subject(msg.run_id)
        payload = ENCODER.encode(for_the_log(msg))
        headers = {"Nats-Msg-Id": msg_id, TYPE_HEADER: type(msg).__name__}
        stream = self._settings.events_stream
        publish = partial(self._js.publish, subject, payload, stream=stream, headers=headers)
        await retrying("event publish", publish)


class KvJournal:
    """The runtime's journal in a fleet: start points given by the node, checkpoints to KV.

    :meth:`checkpoint` must not block, so it keeps the newest checkpoint per run and a task
    (:meth:`run`) writes them out.
    """

    def __init__(self, bucket: KeyValue) -> None:
        self._bucket = bucket
        self._points: dict[str, StartPoint] = {}
        self._pending: dict[str, bytes] = {}
        self._wake = anyio.Event()

    def expect(self, run_id: str, point: StartPoint) -> None:
        self._points[run_id] = point

    def forget(self, run_id: str) -> None:
        """Drop ``run_id``'s start point and unwritten checkpoint (it ended)."""
        self._points.pop(run_id, None)
        self._pending.pop(run_id, None)

    def start_point(self, run_id: str) -> StartPoint | None:
        return self._points.pop(run_id, None)

    def checkpoint(self, checkpoint: RunCheckpoint) -> None:
        self._pending[checkpoint.run_id] = ENCODER.encode(checkpoint)
        self._wake.set()

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Write checkpoints out as they come."""
        task_status.started()
        while True:
            await self._wake.wait()
            self._wake = anyio.Event()
            while self._pending:
                run_id = next(iter(self._pending))
                value = self._pending.pop(run_id)
                await retrying("checkpoint", partial(self._bucket.put, run_id, value))
