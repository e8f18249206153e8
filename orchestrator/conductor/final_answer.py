"""What a limit leaves behind: with ``on_stop = "answer"``, one last call for an answer."""

from __future__ import annotations

import logging
import time
from typing import Final

import anyio

from bus import (
    AbortRequested,
    ChatMessage,
    ModelCancel,
    ModelError,
    ModelReply,
    ModelRequest,
    StopSignal,
    nudge_text,
)
from orchestrator.conductor.control import CANCEL_CONFIRM_SECONDS
from orchestrator.conductor.tool_phase import ToolPhase

__all__ = ["ANSWER_NUDGE", "ANSWER_NUDGE_KIND", "FinalAnswer", "answerable"]

logger = logging.getLogger("loopfuse.conductor")

ANSWER_NUDGE_KIND: Final = "stop.answer"
ANSWER_NUDGE: Final = (
    "The run has been stopped by a limit. Answer now with what you have gathered: no tools, "
    "no apology; say what is still missing."
)


class FinalAnswer(ToolPhase):
    """``on_stop = "answer"``: one last model call without tools after a limit stopped the run."""

    __slots__ = ()

    async def _final_answer(self, stop: StopSignal) -> None:
        """One last model call without tools after a budget or loop stop, so the run leaves
        an answer (``degraded``). Bounded by ``answer_max_tokens`` and
        ``answer_deadline_seconds``, counted against no budget (no checkpoints); a failure
        only leaves a trace entry, and the ending stays ``stop``'s."""
        self._enter("PLAN", f"final answer after {stop.cause}")
        try:
            reply = await self._ask_for_answer()
        except Exception as exc:
            logger.exception("run %s: the final answer failed", self._run_id)
            reply, failure = None, repr(exc)
        else:
            failure = "no reply" if reply is None else ""
        if reply is not None:
            self._usage = self._usage + reply.usage
            if reply.aborted or not reply.text.strip():
                failure = "cut off" if reply.aborted else "empty reply"
        if failure or reply is None:
            self._trace_event("final answer failed", failure)
            return
        self._transcript.append(ChatMessage(role="assistant", content=reply.text))
        self._output = reply.text
        self._degraded = True
        self._incomplete = self._incomplete or reply.finish_reason == "length"
        self._trace_event("final answer", f"{reply.usage.completion_tokens} completion tokens")

    async def _ask_for_answer(self) -> ModelReply | None:
        settings = self._settings
        self._close_open_calls()
        self._transcript.append(
            ChatMessage(role="user", content=nudge_text(ANSWER_NUDGE_KIND, ANSWER_NUDGE))
        )
        self._nudges += 1
        self._trace_event("nudge", ANSWER_NUDGE_KIND)
        turn = self._turn + 1  # its own request key: never confused with a cut-off reply
        self._llm_requests += 1
        await self._bus.publish(
            ModelRequest(
                run_id=self._run_id,
                turn=turn,
                model=settings.model,
                messages=tuple(self._transcript),
                max_tokens=settings.answer_max_tokens,
                deadline_at=time.time() + settings.answer_deadline_seconds,
            )
        )
        cancelled = False
        with anyio.move_on_after(settings.answer_deadline_seconds + CANCEL_CONFIRM_SECONDS):
            while True:
                msg = await self._inbox.receive()
                match msg:
                    case ModelReply(turn=reply_turn) if reply_turn == turn:
                        return msg
                    case ModelError(turn=error_turn) if error_turn == turn:
                        self._trace_event(f"final answer: model error ({msg.kind})", msg.message)
                        if msg.final:
                            return None
                    case AbortRequested() if not cancelled:
                        cancelled = True
                        await self._bus.publish(
                            ModelCancel(run_id=self._run_id, turn=turn, reason="abort")
                        )
                    case _:
                        pass  # the ending is decided: later stops and nudges change nothing
        return None

    def _close_open_calls(self) -> None:
        """Answer the last assistant message's calls that have no result (a stop decided
        at the reply), so the transcript is a valid request."""
        answered = {m.tool_call_id for m in self._transcript if m.role == "tool"}
        last = next((m for m in reversed(self._transcript) if m.role == "assistant"), None)
        for call in last.tool_calls if last is not None else ():
            if call.id not in answered:
                self._transcript.append(
                    ChatMessage(
                        role="tool",
                        tool_call_id=call.id,
                        content="Error: not run: the run was stopping.",
                    )
                )


def answerable(stop: StopSignal) -> bool:
    """A budget or loop stop; not an abort, a model or context failure, a hook, a bug."""
    return stop.cause.startswith(("budget.", "loop."))
