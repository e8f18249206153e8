"""The run's control inbox: what monitors and actors send the conductor, and checkpoints.

The one place a stop becomes the :class:`Stopped` exception that ends the run."""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from typing import Any, Final, NoReturn

import anyio

from bus import (
    AbortRequested,
    ActorFailed,
    Bus,
    ContextAction,
    ExitReason,
    Inbox,
    Message,
    ModelReply,
    Nudge,
    StopSignal,
    ToolVerdict,
    abort_cause,
    stop_signal,
)
from orchestrator.conductor.state import RunRecord

__all__ = ["CANCEL_CONFIRM_SECONDS", "ControlInbox", "Stopped"]

logger = logging.getLogger("loopfuse.conductor")

# How long to wait for the LLM caller / tool executor to confirm a cancellation before the
# run ends without them; only reached if an actor is broken.
CANCEL_CONFIRM_SECONDS: Final = 10.0

_SEVERITY: Final = {"allow": 0, "warn": 1, "block": 2}


class Stopped(Exception):
    """The run's ending is decided. Raised by :meth:`ControlInbox.end` only, caught by
    ``Conductor.run`` only."""

    def __init__(self, stop: StopSignal) -> None:
        self.stop = stop


class ControlInbox:
    """Receives the run's control messages: keeps the first stop, the nudges for the next
    model call, and the verdicts on the calls being proposed; hands the context
    gatekeeper's answers to ``on_context`` as they arrive."""

    __slots__ = ("_bus", "_inbox", "_on_context", "_run", "nudges", "stop", "verdicts")

    def __init__(
        self,
        bus: Bus,
        inbox: Inbox,
        run: RunRecord,
        on_context: Callable[[ContextAction], None],
    ) -> None:
        self._bus = bus
        self._inbox = inbox
        self._run = run
        self._on_context = on_context
        self.stop: StopSignal | None = None
        """The first stop received (a run needs only its first)."""
        self.nudges: list[Nudge] = []
        """Nudges to inject before the next model call."""
        self.verdicts: dict[str, ToolVerdict] | None = None
        """The most severe verdict per call id, while calls are proposed (else ``None``)."""

    async def checkpoint(self, msg: Message) -> None:
        """Publish ``msg``, wait until every monitor answered, take the answers; a stop
        among them ends the run here."""
        await self._bus.publish_settled(msg)  # not through settle(): a coroutine less a turn
        self.take_pending()
        if self.stop is not None:
            self.end()

    async def settle(self, msg: Message) -> None:
        """:meth:`checkpoint` without ending the run on a stop."""
        await self._bus.publish_settled(msg)
        self.take_pending()

    def take_pending(self) -> None:
        """Take every message already in the inbox."""
        while (pending := self._inbox.receive_nowait()) is not None:
            self.take(pending)

    def receive_nowait(self) -> Message | None:
        return self._inbox.receive_nowait()

    def receive(self) -> Coroutine[Any, Any, Message]:
        """The next message (the inbox's own coroutine: no frame of ours per waiting run)."""
        return self._inbox.receive()

    async def receive_confirming(self, extra: float = 0.0) -> Message | None:
        """The next message, or ``None`` if nothing came in time (a cancellation that a
        broken actor never confirmed)."""
        with anyio.move_on_after(CANCEL_CONFIRM_SECONDS + extra):
            return await self._inbox.receive()
        logger.error("run %s: no confirmation of cancellation", self._run.run_id)
        return None

    def take(self, msg: Message) -> None:
        """Act on one control message."""
        match msg:
            case StopSignal():
                self._keep(msg)
            case Nudge():
                self.nudges.append(msg)
            case ModelReply(turn=turn) if turn < 0:  # the loop monitor's model-based check
                self._run.usage = self._run.usage + msg.usage
            case ToolVerdict():
                verdicts = self.verdicts
                if verdicts is not None and msg.turn == self._run.turn:
                    current = verdicts.get(msg.call_id)
                    if current is None or _SEVERITY[msg.verdict] > _SEVERITY[current.verdict]:
                        verdicts[msg.call_id] = msg
            case AbortRequested():
                reason = (
                    ExitReason.ABORTED_STREAMING
                    if self._run.state == "PLAN"
                    else ExitReason.ABORTED_TOOLS
                )
                self._keep(
                    stop_signal(
                        abort_cause(msg.source),
                        run_id=self._run.run_id,
                        source=msg.source,
                        detail=msg.detail or f"Aborted by the {msg.source}.",
                        reason=reason,
                    )
                )
            case ActorFailed():
                self._keep(
                    stop_signal(
                        "internal.error",
                        run_id=self._run.run_id,
                        source=msg.actor,
                        detail=f"actor {msg.actor} failed: {msg.error}",
                    )
                )
            case ContextAction():
                self._on_context(msg)
            case _:
                logger.debug("run %s: ignored stale %s", self._run.run_id, type(msg).__name__)

    def end_if_stopped(self) -> None:
        if self.stop is not None:
            self.end()

    def end(self, stop: StopSignal | None = None) -> NoReturn:
        """End the run: with the first stop received, else with ``stop`` (one the
        conductor decided itself: the model finished, an endpoint failure, …)."""
        ending = self.stop or stop
        assert ending is not None, "end() without a stop"
        raise Stopped(ending)

    def _keep(self, stop: StopSignal) -> None:
        if self.stop is None:
            self.stop = stop
            self._run.trace_event("stop", f"{stop.reason.value}/{stop.cause}: {stop.detail}")
