"""The in-process bus: typed subscriptions, bounded FIFO mailboxes, settling publishes.

Two kinds of subscriber:

* **answering** subscribers (monitors, hooks) may publish a stop, a nudge or a verdict in
  reaction to a message. :meth:`Bus.publish_settled` returns once every answering subscriber
  of that message type has handled it, and therefore everything published to it before
  (mailboxes are FIFO). This is the barrier rule of DESIGN.md.
* **observers** (metrics, event log, progress) get the same messages without being waited
  for. An observer whose mailbox is full either makes the publisher wait (``on_full="wait"``,
  lossless) or loses the message and counts it (``on_full="drop"``).

Answers must never block: actors publish from inside a handler with
:meth:`Bus.publish_nowait`, which may overfill a lossless mailbox rather than wait. Without
that, "conductor waits for the monitor, monitor waits for room in a full mailbox" would be a
deadlock.

Each run's conductor has a control :class:`Inbox`: messages of :data:`INBOX_TYPES` are also
delivered there, after every subscriber's mailbox got them.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any, Final, Literal, NamedTuple

import anyio
from anyio.abc import TaskStatus

from bus.messages import INBOX_TYPES, ActorFailed, Message

__all__ = [
    "MAILBOX_SIZE",
    "Bus",
    "Handler",
    "Inbox",
    "Job",
    "RunHandler",
    "Subscription",
    "SubscriptionStatistics",
]

logger = logging.getLogger("loopfuse.bus")

MAILBOX_SIZE: Final = 4096
"""Default capacity of a subscriber's mailbox (messages)."""

Handler = Callable[[Any], Awaitable[None] | None]
Job = Callable[[], Awaitable[None]]
RunHandler = Callable[[Any], Job | None]
"""A :meth:`Subscription.serve_per_run` handler: ``None`` when done, or a job to await."""
OnFull = Literal["wait", "drop"]


class _Ticket:
    """Counts the acknowledgements a settling publish still waits for."""

    __slots__ = ("event", "remaining")

    def __init__(self, remaining: int) -> None:
        self.remaining = remaining
        self.event = anyio.Event()

    def done(self) -> None:
        self.remaining -= 1
        if self.remaining == 0:
            self.event.set()


_Item = tuple[Message, _Ticket | None]


class SubscriptionStatistics(NamedTuple):
    """A subscriber's mailbox at a glance (exported as metrics)."""

    name: str
    answers: bool
    depth: int
    capacity: int
    handled: int
    dropped: int
    failed: int


class _Mailbox:
    """A bounded FIFO drained in batches, so a busy actor handles many runs per wake-up."""

    __slots__ = ("_closed", "_items", "_not_empty", "_not_full", "capacity")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._items: deque[_Item] = deque()
        self._not_empty: anyio.Event | None = None
        self._not_full: anyio.Event | None = None
        self._closed = False

    def __len__(self) -> int:
        return len(self._items)

    def put_nowait(self, item: _Item, *, force: bool = False) -> bool:
        if self._closed:
            if item[1] is not None:
                item[1].done()
            return True
        if not force and len(self._items) >= self.capacity:
            return False
        self._items.append(item)
        if self._not_empty is not None:
            self._not_empty.set()
            self._not_empty = None
        return True

    async def put(self, item: _Item) -> None:
        while not self.put_nowait(item):
            if self._not_full is None:
                self._not_full = anyio.Event()
            await self._not_full.wait()

    async def get_batch(self) -> list[_Item]:
        """Every queued item; waits while empty. An empty list means closed and drained."""
        while not self._items:
            if self._closed:
                return []
            if self._not_empty is None:
                self._not_empty = anyio.Event()
            await self._not_empty.wait()
        batch = list(self._items)
        self._items.clear()
        if self._not_full is not None:
            self._not_full.set()
            self._not_full = None
        return batch

    def close(self) -> None:
        self._closed = True
        for event in (self._not_empty, self._not_full):
            if event is not None:
                event.set()
        self._not_empty = self._not_full = None

    def release_all(self) -> None:
        """Acknowledge everything still queued, so no settling publisher waits forever."""
        while self._items:
            _, ticket = self._items.popleft()
            if ticket is not None:
                ticket.done()


class Subscription:
    """One subscriber's mailbox; :meth:`serve` runs its handler over every message."""

    def __init__(
        self,
        bus: Bus,
        name: str,
        types: frozenset[type[Message]] | None,
        *,
        answers: bool,
        on_full: OnFull,
        capacity: int,
    ) -> None:
        self._bus = bus
        self.name = name
        self.types = types
        self.answers = answers
        self.on_full: OnFull = on_full
        self.mailbox = _Mailbox(capacity)
        self.handled = 0
        self.dropped = 0
        self.failed = 0

    def statistics(self) -> SubscriptionStatistics:
        return SubscriptionStatistics(
            self.name,
            self.answers,
            len(self.mailbox),
            self.mailbox.capacity,
            self.handled,
            self.dropped,
            self.failed,
        )

    async def serve(
        self, handler: Handler, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Handle messages in order until the subscription is closed.

        A handler that raises is isolated: the failure is published as :class:`ActorFailed`
        for that message's run (which ends that run) and the next message is handled.
        """
        task_status.started()
        try:
            while batch := await self.mailbox.get_batch():
                for index, (msg, ticket) in enumerate(batch):
                    try:
                        result = handler(msg)
                        if result is not None:
                            await result
                    except Exception as exc:
                        self.failed += 1
                        self._bus.report_failure(self.name, msg, exc)
                    except BaseException:
                        for _, pending in batch[index + 1 :]:
                            if pending is not None:
                                pending.done()
                        raise
                    finally:
                        self.handled += 1
                        if ticket is not None:
                            ticket.done()
        finally:
            self.mailbox.close()
            self.mailbox.release_all()

    async def serve_per_run(
        self, handler: RunHandler, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Like :meth:`serve`, but a run whose handling must wait holds up only that run.

        ``handler`` decides at once: it returns ``None`` when the message is handled, or a
        job (a zero-argument async function) that finishes handling it. A run with a job
        in progress gets a lane (one task) that runs its jobs and handles its later
        messages in order; other runs' messages are handled meanwhile. Each message is
        acknowledged once its handling finished, so settling publishes keep the barrier
        rule. A lane holds only its run's outstanding messages (a run waits for each of
        its settled checkpoints), so lanes stay short. Failures are isolated as in
        :meth:`serve`; when serving stops, every queued message is acknowledged.
        """
        lanes: dict[str, deque[_Item]] = {}
        try:
            async with anyio.create_task_group() as tg:
                task_status.started()
                while batch := await self.mailbox.get_batch():
                    for item in batch:
                        run_id = item[0].run_id
                        lane = lanes.get(run_id)
                        if lane is not None:
                            lane.append(item)
                            continue
                        job = self._decide(handler, item[0])
                        if job is None:
                            self._acknowledge(item[1])
                            continue
                        lanes[run_id] = deque((item,))
                        tg.start_soon(self._lane, handler, lanes, run_id, job)
        finally:
            for lane in lanes.values():  # lanes cancelled before they began
                for _, ticket in lane:
                    self._acknowledge(ticket)
            lanes.clear()
            self.mailbox.close()
            self.mailbox.release_all()

    async def _lane(
        self,
        handler: RunHandler,
        lanes: dict[str, deque[_Item]],
        run_id: str,
        job: Job | None,
    ) -> None:
        lane = lanes[run_id]
        try:
            while lane:
                msg, ticket = lane[0]
                if job is None:
                    job = self._decide(handler, msg)
                if job is not None:
                    try:
                        await job()
                    except Exception as exc:
                        self.failed += 1
                        self._bus.report_failure(self.name, msg, exc)
                    job = None
                lane.popleft()
                self._acknowledge(ticket)
        finally:
            del lanes[run_id]
            for _, ticket in lane:  # cancelled: release the rest of this run
                self._acknowledge(ticket)
            lane.clear()

    def _decide(self, handler: RunHandler, msg: Message) -> Job | None:
        try:
            return handler(msg)
        except Exception as exc:
            self.failed += 1
            self._bus.report_failure(self.name, msg, exc)
            return None

    def _acknowledge(self, ticket: _Ticket | None) -> None:
        self.handled += 1
        if ticket is not None:
            ticket.done()

    def close(self) -> None:
        """Stop after the messages already queued; :meth:`serve` then returns."""
        self.mailbox.close()


class Inbox:
    """A run's control inbox. Unbounded on purpose: a run only receives answers to its own
    requests and a few control messages, and a monitor's answer must never wait for room."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self._items: deque[Message] = deque()
        self._event: anyio.Event | None = None

    def deliver(self, msg: Message) -> None:
        self._items.append(msg)
        if self._event is not None:
            self._event.set()
            self._event = None

    def receive_nowait(self) -> Message | None:
        return self._items.popleft() if self._items else None

    async def receive(self) -> Message:
        while not self._items:
            if self._event is None:
                self._event = anyio.Event()
            await self._event.wait()
        return self._items.popleft()

    def pending(self) -> int:
        return len(self._items)


class Bus:
    """Routes messages by exact type to subscribers, and control messages to run inboxes."""

    def __init__(self) -> None:
        self._subscriptions: list[Subscription] = []
        self._routes: dict[type[Message], tuple[Subscription, ...]] = {}
        self._inboxes: dict[str, Inbox] = {}
        self.published = 0

    # ---------------------------------------------------------------- subscribing

    def subscribe(
        self,
        *types: type[Message],
        name: str,
        answers: bool = False,
        on_full: OnFull = "wait",
        capacity: int = MAILBOX_SIZE,
    ) -> Subscription:
        """Subscribe to ``types`` (all message types when none are given).

        :param answers: the subscriber may answer (stop, nudge, verdict), so settling
            publishes wait for it. Observers leave this false.
        :param on_full: what a full mailbox does to a publisher: ``wait`` or ``drop``.
        """
        if answers and on_full == "drop":
            raise ValueError(f"subscriber {name!r}: an answering subscriber cannot drop messages")
        sub = Subscription(
            self,
            name,
            frozenset(types) if types else None,
            answers=answers,
            on_full=on_full,
            capacity=capacity,
        )
        self._subscriptions.append(sub)
        self._routes.clear()
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        """Remove ``sub``; messages already in its mailbox are still handled."""
        if sub in self._subscriptions:
            self._subscriptions.remove(sub)
            self._routes.clear()
        sub.close()

    def close(self) -> None:
        """Close every subscription: each actor finishes its queue and stops."""
        for sub in self._subscriptions:
            sub.close()

    def _targets(self, kind: type[Message]) -> tuple[Subscription, ...]:
        targets = self._routes.get(kind)
        if targets is None:
            targets = tuple(s for s in self._subscriptions if s.types is None or kind in s.types)
            self._routes[kind] = targets
        return targets

    # ---------------------------------------------------------------- run inboxes

    @contextmanager
    def open_inbox(self, run_id: str) -> Iterator[Inbox]:
        """The control inbox of ``run_id`` for as long as the ``with`` block lasts."""
        if run_id in self._inboxes:
            raise ValueError(f"run {run_id!r} already has an inbox")
        inbox = Inbox(run_id)
        self._inboxes[run_id] = inbox
        try:
            yield inbox
        finally:
            del self._inboxes[run_id]

    def _to_inbox(self, msg: Message) -> None:
        if type(msg) in INBOX_TYPES:
            inbox = self._inboxes.get(msg.run_id)
            if inbox is not None:
                inbox.deliver(msg)

    # ---------------------------------------------------------------- publishing

    async def publish(self, msg: Message) -> None:
        """Deliver ``msg``; waits for room in lossless mailboxes, never for handling."""
        self.published += 1
        for sub in self._targets(type(msg)):
            if not sub.mailbox.put_nowait((msg, None)):
                if sub.on_full == "drop":
                    sub.dropped += 1
                else:
                    await sub.mailbox.put((msg, None))
        self._to_inbox(msg)

    def publish_nowait(self, msg: Message) -> None:
        """Deliver ``msg`` without ever waiting: how actors answer from inside a handler.

        A full lossless mailbox takes the message anyway (a run sends few answers); a full
        dropping mailbox loses it and counts the drop.
        """
        self.published += 1
        for sub in self._targets(type(msg)):
            if not sub.mailbox.put_nowait((msg, None), force=sub.on_full == "wait"):
                sub.dropped += 1
        self._to_inbox(msg)

    async def publish_settled(self, msg: Message) -> None:
        """Deliver ``msg`` and return once every answering subscriber has handled it."""
        self.published += 1
        targets = self._targets(type(msg))
        answering = sum(1 for sub in targets if sub.answers)
        ticket = _Ticket(answering) if answering else None
        for sub in targets:
            item: _Item = (msg, ticket if sub.answers else None)
            if not sub.mailbox.put_nowait(item):
                if sub.on_full == "drop":
                    sub.dropped += 1
                else:
                    await sub.mailbox.put(item)
        if ticket is not None and ticket.remaining > 0:
            await ticket.event.wait()
        self._to_inbox(msg)

    def report_failure(self, actor: str, msg: Message, exc: BaseException) -> None:
        """Record that ``actor`` failed on ``msg``; the run it belongs to will end."""
        logger.error(
            "actor %s failed on %s of run %s: %r", actor, type(msg).__name__, msg.run_id, exc
        )
        if not isinstance(msg, ActorFailed):
            self.publish_nowait(ActorFailed(run_id=msg.run_id, actor=actor, error=repr(exc)))

    # ---------------------------------------------------------------- introspection

    def statistics(self) -> tuple[SubscriptionStatistics, ...]:
        """Every subscription's mailbox statistics."""
        return tuple(sub.statistics() for sub in self._subscriptions)

    def active_inboxes(self) -> int:
        return len(self._inboxes)
