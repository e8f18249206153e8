"""What a limit leaves behind: with ``on_stop = "answer"``, one last call for an answer."""

from __future__ import annotations

import logging
import time
from typing import Final

import anyio

from bus import (
    AbortRequested,
    Bus,
    ChatMessage,
    ModelCancel,
    ModelError,
    ModelReply,
    ModelRequest,
    StopSignal,
    nudge_text,
)
from orchestrator.conductor.inbox import CANCEL_CONFIRM_SECONDS, ControlInbox
from orchestrator.conductor.inputs import ConductorSettings
from orchestrator.conductor.state import RunRecord

__all__ = ["ANSWER_NUDGE", "ANSWER_NUDGE_KIND", "FinalAnswer"]

logger = logging.getLogger("loopfuse.conductor")

ANSWER_NUDGE_KIND: Final = "stop.answer"
ANSWER_NUDGE: Final = (
    "The run has been stopped by a limit. Answer now with what you have gathered: no tools, "
    "no apology; say what is still missing."
)


class FinalAnswer:
    """One last model call without tools after an answerable stop, so the run leaves an
    answer (``degraded``). Bounded by ``answer_max_tokens`` and ``answer_deadline_seconds``,
    counted against no budget (no checkpoints); a failure only leaves a trace entry, and the
    ending stays the stop's."""

    __slots__ = ("_bus", "_control", "_run", "_settings")

    def __init__(
        self, bus: Bus, run: RunRecord, control: ControlInbox, settings: ConductorSettings
    ) -> None:
        self._bus = bus
        self._run = run
        self._control = control
        self._settings = settings

    async def ask(self, stop: StopSignal) -> None:
        run = self._run
        run.enter("PLAN", f"final answer after {stop.cause}")
        try:
            reply = await self._request()
        except Exception as exc:
            logger.exception("run %s: the final answer failed", run.run_id)
            reply, failure = None, repr(exc)
        else:
            failure = "no reply" if reply is None else ""
        if reply is not None:
            run.usage = run.usage + reply.usage
            if reply.aborted or not reply.text.strip():
                failure = "cut off" if reply.aborted else "empty reply"
        if failure or reply is None:
            run.trace_event("final answer failed", failure)
            return
        run.transcript.append(ChatMessage(role="assistant", content=reply.text))
        run.output = reply.text
        run.degraded = True
        run.incomplete = run.incomplete or reply.finish_reason == "length"
        run.trace_event("final answer", f"{reply.usage.completion_tokens} completion tokens")

    async def _request(self) -> ModelReply | None:
        run, settings = self._run, self._settings
        self._close_open_calls()
        run.transcript.append(
            ChatMessage(role="user", content=nudge_text(ANSWER_NUDGE_KIND, ANSWER_NUDGE))
        )
        run.nudges += 1
        run.trace_event("nudge", ANSWER_NUDGE_KIND)
        turn = run.turn + 1  # its own request key: never confused with a cut-off reply
        run.llm_requests += 1
        await self._bus.publish(
            ModelRequest(
                run_id=run.run_id,
                turn=turn,
                model=settings.model,
                messages=tuple(run.transcript),
                max_tokens=settings.answer_max_tokens,
                deadline_at=time.time() + settings.answer_deadline_seconds,
                unchanged=min(run.sent_messages, run.rewritten_from),  # what a log holds
            )
        )
        cancelled = False
        with anyio.move_on_after(settings.answer_deadline_seconds + CANCEL_CONFIRM_SECONDS):
            while True:
                msg = await self._control.receive()
                match msg:
                    case ModelReply(turn=reply_turn) if reply_turn == turn:
                        return msg
                    case ModelError(turn=error_turn) if error_turn == turn:
                        run.trace_event(f"final answer: model error ({msg.kind})", msg.message)
                        if msg.final:
                            return None
                    case AbortRequested() if not cancelled:
                        cancelled = True
                        await self._bus.publish(
                            ModelCancel(run_id=run.run_id, turn=turn, reason="abort")
                        )
                    case _:
                        pass  # the ending is decided: later stops and nudges change nothing
        return None

    def _close_open_calls(self) -> None:
        """Answer the last assistant message's calls that have no result (a stop decided
        at the reply), so the transcript is a valid request."""
        transcript = self._run.transcript
        answered = {m.tool_call_id for m in transcript if m.role == "tool"}
        last = next((m for m in reversed(transcript) if m.role == "assistant"), None)
        for call in last.tool_calls if last is not None else ():
            if call.id not in answered:
                transcript.append(
                    ChatMessage(
                        role="tool",
                        tool_call_id=call.id,
                        content="Error: not run: the run was stopping.",
                    )
                )
