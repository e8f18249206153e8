"""The in-process bus: typed subscriptions, bounded FIFO mailboxes, settling publishes.

* **answering** subscribers (monitors, hooks) may answer a message with a stop, a nudge or
  a verdict: :meth:`Bus.publish_settled` returns once each of them has handled it, and so
  everything published to it before (mailboxes are FIFO). The barrier rule of DESIGN.md.
* **observers** (metrics, event log) are never waited for: a full mailbox makes the
  publisher wait (``on_full="wait"``, lossless) or loses the message and counts it (``"drop"``).
* either kind can be **inline**: a synchronous handler the bus calls during the publish.
  What it publishes is delivered after the message being handled: one FIFO order for all.

Answers never block: handlers publish with :meth:`Bus.publish_nowait`, which may overfill a
lossless mailbox rather than wait for room (the conductor waits for the monitor: a monitor
waiting for room would deadlock). Messages of :data:`INBOX_TYPES` also go to their run's
control :class:`Inbox`, after every subscriber got them.
"""

from __future__ import annotations

import inspect
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final, Literal, NamedTuple

import anyio
from anyio.abc import TaskStatus

from bus import aio_seam
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


# The bus's hot paths wait on asyncio's Event and Future (:mod:`bus.aio_seam` says why).
# Waiting on them inside anyio cancel scopes is fine: cancellation arrives at the await.


class _Ticket:
    """Counts the acknowledgements a settling publish still waits for."""

    __slots__ = ("_event", "remaining")

    def __init__(self) -> None:
        self.remaining = 0
        self._event: aio_seam.Event | None = None

    def done(self) -> None:
        self.remaining -= 1
        if self.remaining == 0 and self._event is not None:
            self._event.set()

    async def wait(self) -> None:
        if self.remaining > 0:
            self._event = aio_seam.Event()
            await self._event.wait()


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
        self._not_empty: aio_seam.Event | None = None
        self._not_full: aio_seam.Event | None = None
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
                self._not_full = aio_seam.Event()
            await self._not_full.wait()

    async def get_batch(self) -> list[_Item]:
        """Every queued item; waits while empty. An empty list means closed and drained."""
        while not self._items:
            if self._closed:
                return []
            if self._not_empty is None:
                self._not_empty = aio_seam.Event()
            await self._not_empty.wait()
        batch = list(self._items)
        self._items.clear()
        if self._not_full is not None:
            self._not_full.set()
            self._not_full = None
        return batch

    def drain(self) -> list[_Item]:
        """Everything queued, at once (an inline subscriber's backlog)."""
        batch = list(self._items)
        self._items.clear()
        return batch

    async def closed(self) -> None:
        """Wait until :meth:`close` (an inline subscriber's task waits here)."""
        while not self._closed:
            if self._not_empty is None:
                self._not_empty = aio_seam.Event()
            await self._not_empty.wait()

    def close(self) -> None:
        self._closed = True
        for event in (self._not_empty, self._not_full):
            if event is not None:
                event.set()
        self._not_empty = self._not_full = None

    def release_all(self) -> None:
        """Close, and acknowledge what is still queued: no settling publisher waits forever."""
        self.close()
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
        inline: bool = False,
    ) -> None:
        self._bus = bus
        self.name = name
        self.types = types
        self.answers = answers
        self.on_full: OnFull = on_full
        self.inline = inline
        self.mailbox = _Mailbox(capacity)
        self.handled = 0
        self.dropped = 0
        self.failed = 0
        # Inline: how a published message is handled while serving (None: queue it).
        self._deliver: Callable[[Message, _Ticket | None], None] | None = None
        # Inline ``serve``: the handler itself, which the bus calls directly while serving;
        # with ``serve_by_type``, the function of each message type.
        self.direct: Handler | None = None
        self.by_type: dict[type[Message], Callable[[Any], None]] | None = None

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

    def offer(self, msg: Message, ticket: _Ticket | None) -> None:
        """Inline: handle ``msg`` now (or queue it until :meth:`serve` begins)."""
        deliver = self._deliver
        if deliver is not None:
            deliver(msg, ticket)
        else:
            self.mailbox.put_nowait((msg, ticket), force=True)

    async def serve(
        self, handler: Handler, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Handle messages in order until the subscription is closed.

        A handler that raises is isolated: the failure is published as :class:`ActorFailed`
        for that message's run (which ends that run) and the next message is handled.
        An inline subscription's handler must be synchronous.
        """
        if self.inline:
            await self._serve_inline(handler, task_status)
            return
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
            self.mailbox.release_all()

    async def serve_by_type(
        self,
        handlers: Mapping[type[Message], Callable[[Any], None]],
        *,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Like :meth:`serve` for an inline subscription, with one synchronous function per
        message type: the bus calls each message's own function (no dispatch on the type
        per message, which costs a busy monitor more than its work). Messages of a type
        without a function are not delivered."""
        if not self.inline:
            raise TypeError(f"subscriber {self.name!r}: serve_by_type needs inline=True")
        table = dict(handlers)
        for kind, function in table.items():
            if inspect.iscoroutinefunction(function):
                raise TypeError(
                    f"subscriber {self.name!r}: the {kind.__name__} handler must be synchronous"
                )

        def handler(msg: Message) -> None:  # the backlog queued before serving began
            function = table.get(type(msg))
            if function is not None:
                function(msg)

        self.by_type = table  # until _serve_inline returns
        await self._serve_inline(handler, task_status)

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

                def deliver(msg: Message, ticket: _Ticket | None) -> None:
                    lane = lanes.get(msg.run_id)
                    if lane is not None:
                        lane.append((msg, ticket))
                        return
                    try:  # _acknowledge written out: this runs for every message
                        job = handler(msg)
                    except Exception as exc:
                        self.failed += 1
                        self._bus.report_failure(self.name, msg, exc)
                        job = None
                    if job is None:
                        self.handled += 1
                        if ticket is not None:
                            ticket.done()
                        return
                    lanes[msg.run_id] = deque(((msg, ticket),))
                    tg.start_soon(self._lane, handler, lanes, msg.run_id, job)

                if self.inline:
                    await self._hold(deliver, task_status)
                    return
                task_status.started()
                while batch := await self.mailbox.get_batch():
                    for msg, ticket in batch:
                        deliver(msg, ticket)
        finally:
            self._release(lanes)
            self.mailbox.release_all()

    async def _serve_inline(self, handler: Handler, task_status: TaskStatus[None]) -> None:
        if inspect.iscoroutinefunction(handler):
            raise TypeError(f"subscriber {self.name!r}: an inline handler must be synchronous")

        def deliver(msg: Message, ticket: _Ticket | None) -> None:
            try:
                if handler(msg) is not None:
                    raise TypeError(f"inline handler of {self.name!r} returned an awaitable")
            except Exception as exc:
                self.failed += 1
                self._bus.report_failure(self.name, msg, exc)
            finally:
                self.handled += 1
                if ticket is not None:
                    ticket.done()

        self.direct = handler  # the bus calls it itself: no wrapper, no ticket
        try:
            await self._hold(deliver, task_status)
        finally:
            self.direct = self.by_type = None

    def _release(self, lanes: dict[str, deque[_Item]]) -> None:
        """Acknowledge what lanes cancelled before they began still hold."""
        for lane in lanes.values():
            for _, ticket in lane:
                self._acknowledge(ticket)
        lanes.clear()

    async def _hold(
        self, deliver: Callable[[Message, _Ticket | None], None], task_status: TaskStatus[None]
    ) -> None:
        """Deliver inline until closed: what was queued before serving first, in order."""
        for msg, ticket in self.mailbox.drain():
            deliver(msg, ticket)
        self._deliver = deliver
        self._bus.reroute()  # routes call ``deliver`` directly from now on
        task_status.started()
        try:
            await self.mailbox.closed()
        finally:
            self._deliver = None
            self._bus.reroute()
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
                try:  # the handler decides on a later message here, once its lane exists
                    if job is None:
                        job = handler(msg)
                    if job is not None:
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

    def _acknowledge(self, ticket: _Ticket | None) -> None:
        self.handled += 1
        if ticket is not None:
            ticket.done()

    def close(self) -> None:
        """Stop after the messages already queued; :meth:`serve` then returns."""
        self.mailbox.close()


class Inbox:
    """A run's control inbox. Unbounded on purpose: a run only receives answers to its own
    requests and a few control messages, and a monitor's answer must never wait for room.

    Thousands of runs hold one each, parked most of the time: it is a list (a few
    messages at a time) and a future made only while its run waits."""

    __slots__ = ("_items", "_registry", "_waiter", "run_id")

    def __init__(self, run_id: str, registry: dict[str, Inbox] | None = None) -> None:
        self.run_id = run_id
        self._items: list[Message] = []
        self._waiter: aio_seam.Future[None] | None = None
        self._registry = registry  # where the bus finds it, while it is open

    def __enter__(self) -> Inbox:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._registry is not None and self._registry.get(self.run_id) is self:
            del self._registry[self.run_id]

    def deliver(self, msg: Message) -> None:
        self._items.append(msg)
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def receive_nowait(self) -> Message | None:
        return self._items.pop(0) if self._items else None

    async def receive(self) -> Message:
        while not self._items:
            waiter = self._waiter
            if waiter is None or waiter.done():
                waiter = self._waiter = aio_seam.Future()
            await waiter
        return self._items.pop(0)

    def pending(self) -> int:
        return len(self._items)


_Inline = tuple[Callable[..., Any], Subscription, bool]
"""An inline subscriber on a route: ``(handler, sub, True)`` for a serving handler the bus
calls itself, ``(deliver, sub, False)`` for one that takes the message and its ticket (a
per-run handler, or a subscription not serving yet)."""


class _Route(NamedTuple):
    """Where one message type goes: queued subscribers, inline ones, the inboxes, and how
    many acknowledgements a settling publish waits for (a handler the bus calls itself
    is done when it returns: it needs none)."""

    queued: tuple[Subscription, ...]
    inline: tuple[_Inline, ...]
    answering: int
    to_inbox: bool


class Bus:
    """Routes messages by exact type to subscribers, and control messages to run inboxes."""

    def __init__(self) -> None:
        self._subscriptions: list[Subscription] = []
        self._routes: dict[type[Message], _Route] = {}
        self._inboxes: dict[str, Inbox] = {}
        # Messages published from inside an inline handler wait here for their turn.
        self._pending: deque[Message] = deque()
        self._dispatching = False
        self.published = 0

    # ---------------------------------------------------------------- subscribing

    def subscribe(
        self,
        *types: type[Message],
        name: str,
        answers: bool = False,
        on_full: OnFull = "wait",
        capacity: int = MAILBOX_SIZE,
        inline: bool = False,
    ) -> Subscription:
        """Subscribe to ``types`` (all message types when none are given).

        :param answers: the subscriber may answer (stop, nudge, verdict), so settling
            publishes wait for it. Observers leave this false.
        :param on_full: what a full mailbox does to a publisher: ``wait`` or ``drop``.
        :param inline: the handler is synchronous and never blocks: the bus calls it during
            the publish (no mailbox, no trip through the event loop).
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
            inline=inline,
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

    def reroute(self) -> None:
        """Forget the routes (a subscriber came, went, or began or stopped serving)."""
        self._routes.clear()

    def _route(self, kind: type[Message]) -> _Route:
        route = self._routes.get(kind)
        if route is None:
            targets = [s for s in self._subscriptions if s.types is None or kind in s.types]
            inline: list[_Inline] = []
            for s in targets:
                if not s.inline:
                    continue
                if s.direct is None:
                    inline.append((s._deliver or s.offer, s, False))
                elif s.by_type is None:
                    inline.append((s.direct, s, True))
                elif (function := s.by_type.get(kind)) is not None:
                    inline.append((function, s, True))
            route = _Route(
                tuple(s for s in targets if not s.inline),
                tuple(inline),
                sum(1 for s in targets if s.answers and s.direct is None),
                kind in INBOX_TYPES,
            )
            self._routes[kind] = route
        return route

    # ---------------------------------------------------------------- run inboxes

    def open_inbox(self, run_id: str) -> Inbox:
        """The control inbox of ``run_id``, open for as long as its ``with`` block lasts
        (the inbox is its own context manager: no generator held per run in flight)."""
        if run_id in self._inboxes:
            raise ValueError(f"run {run_id!r} already has an inbox")
        inbox = self._inboxes[run_id] = Inbox(run_id, self._inboxes)
        return inbox

    def _to_inbox(self, msg: Message) -> None:
        inbox = self._inboxes.get(msg.run_id)
        if inbox is not None:
            inbox.deliver(msg)

    # ---------------------------------------------------------------- publishing

    async def publish(self, msg: Message) -> None:
        """Deliver ``msg``; waits for room in lossless mailboxes, never for handling."""
        self.published += 1
        route = self._routes.get(type(msg)) or self._route(type(msg))
        for sub in route.queued:
            if not sub.mailbox.put_nowait((msg, None)):
                if sub.on_full == "drop":
                    sub.dropped += 1
                else:
                    await sub.mailbox.put((msg, None))
        if route.inline:
            self._dispatch(msg, route.inline, None)
        if route.to_inbox:
            self._to_inbox(msg)

    def publish_nowait(self, msg: Message) -> None:
        """Deliver ``msg`` without ever waiting: how actors answer from inside a handler.

        A full lossless mailbox takes the message anyway (a run sends few answers); a full
        dropping mailbox loses it and counts the drop. From inside an inline handler, the
        message is delivered once the message being handled reached every inline subscriber.
        """
        self.published += 1
        if self._dispatching:
            self._pending.append(msg)
            return
        self._dispatching = True
        try:
            self._deliver_nowait(msg)
            self._drain_pending()
        finally:
            self._dispatching = False

    def _deliver_nowait(self, msg: Message) -> None:
        route = self._routes.get(type(msg)) or self._route(type(msg))
        for sub in route.queued:
            if not sub.mailbox.put_nowait((msg, None), force=sub.on_full == "wait"):
                sub.dropped += 1
        if route.inline:
            self._call_inline(msg, route.inline, None)
        if route.to_inbox:
            self._to_inbox(msg)

    def _drain_pending(self) -> None:
        pending = self._pending
        while pending:
            self._deliver_nowait(pending.popleft())

    def _dispatch(self, msg: Message, inline: tuple[_Inline, ...], ticket: _Ticket | None) -> None:
        """Hand ``msg`` to the inline subscribers, then what they published meanwhile."""
        if self._dispatching:  # only reachable from a synchronous handler: keep FIFO order
            self._call_inline(msg, inline, ticket)
            return
        self._dispatching = True
        try:
            self._call_inline(msg, inline, ticket)
            if self._pending:
                self._drain_pending()
        finally:
            self._dispatching = False

    def _call_inline(
        self, msg: Message, inline: tuple[_Inline, ...], ticket: _Ticket | None
    ) -> None:
        for handle, sub, direct in inline:
            if direct:  # the hot path: a monitor's handler, called as is
                try:
                    if handle(msg) is not None:
                        raise TypeError(f"inline handler of {sub.name!r} returned an awaitable")
                except Exception as exc:
                    sub.failed += 1
                    self.report_failure(sub.name, msg, exc)
                sub.handled += 1
            else:
                handle(msg, ticket if sub.answers else None)

    async def publish_settled(self, msg: Message) -> None:
        """Deliver ``msg`` and return once every answering subscriber has handled it."""
        self.published += 1
        route = self._routes.get(type(msg)) or self._route(type(msg))
        ticket: _Ticket | None = None
        if route.answering:
            ticket = _Ticket()
            ticket.remaining = route.answering
        for sub in route.queued:
            item: _Item = (msg, ticket if sub.answers else None)
            if not sub.mailbox.put_nowait(item):
                if sub.on_full == "drop":
                    sub.dropped += 1
                else:
                    await sub.mailbox.put(item)
        if route.inline:
            self._dispatch(msg, route.inline, ticket)
        if ticket is not None and ticket.remaining:
            await ticket.wait()
        if route.to_inbox:
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
