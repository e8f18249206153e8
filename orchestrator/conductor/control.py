"""The conductor's checkpoints and control inbox: stops, nudges, verdicts, aborts, failures."""

from __future__ import annotations

import logging
from typing import Final

import anyio

from bus import (
    AbortRequested,
    ActorFailed,
    ContextAction,
    ExitReason,
    Message,
    Nudge,
    StopSignal,
    ToolVerdict,
)
from orchestrator.conductor.state import ConductorState, Stopped

__all__ = ["CANCEL_CONFIRM_SECONDS", "ControlInbox"]

logger = logging.getLogger("loopfuse.conductor")

# How long to wait for the LLM caller / tool executor to confirm a cancellation before the
# run ends without them; only reached if an actor is broken.
CANCEL_CONFIRM_SECONDS: Final = 10.0

_SEVERITY: Final = {"allow": 0, "warn": 1, "block": 2}


class ControlInbox(ConductorState):
    """Checkpoints (publish, wait until every monitor answered) and the control inbox."""

    __slots__ = ()

    async def _checkpoint(
        self,
        msg: Message,
        *,
        verdicts: dict[str, ToolVerdict] | None = None,
        raise_on_stop: bool = True,
    ) -> None:
        """Publish ``msg``, wait until every monitor answered, then act on the answers."""
        await self._bus.publish_settled(msg)
        while (pending := self._inbox.receive_nowait()) is not None:
            self._control(pending, verdicts)
        if raise_on_stop and self._stop is not None:
            raise Stopped(self._stop)

    async def _receive(self, *, confirming: bool, extra: float = 0.0) -> Message | None:
        if not confirming:
            return await self._inbox.receive()
        with anyio.move_on_after(CANCEL_CONFIRM_SECONDS + extra):
            return await self._inbox.receive()
        logger.error("run %s: no confirmation of cancellation", self._run_id)
        return None

    def _control(self, msg: Message, verdicts: dict[str, ToolVerdict] | None = None) -> None:
        match msg:
            case StopSignal():
                self._set_stop(msg)
            case Nudge():
                self._pending_nudges.append(msg)
            case ToolVerdict():
                if verdicts is not None and msg.turn == self._turn:
                    current = verdicts.get(msg.call_id)
                    if current is None or _SEVERITY[msg.verdict] > _SEVERITY[current.verdict]:
                        verdicts[msg.call_id] = msg
            case AbortRequested():
                reason = (
                    ExitReason.ABORTED_STREAMING
                    if self._state == "PLAN"
                    else ExitReason.ABORTED_TOOLS
                )
                cause = "abort.caller" if msg.source in ("caller", "api") else f"abort.{msg.source}"
                detail = msg.detail or f"Aborted by the {msg.source}."
                self._set_stop(self._make_stop(reason, cause, msg.source, detail))
            case ActorFailed():
                self._set_stop(
                    self._make_stop(
                        ExitReason.HOOK_STOPPED,
                        "internal.error",
                        msg.actor,
                        f"actor {msg.actor} failed: {msg.error}",
                    )
                )
            case ContextAction():
                self._on_context_action(msg)
            case _:
                logger.debug("run %s: ignored stale %s", self._run_id, type(msg).__name__)

    def _on_context_action(self, action: ContextAction) -> None:
        """Apply the context gatekeeper's answer (see :class:`ContextRecovery`)."""
        raise NotImplementedError
