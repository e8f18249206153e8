"""The conductor: one run's state machine, PLAN → ACT → OBSERVE → … → DONE | FAILED.

The conductor owns the transcript and the order of events; it decides nothing about loops,
budgets or hooks. At every checkpoint it publishes a settling message, so every monitor has
answered before the run goes on (the barrier rule), then reads its control inbox: the first
stop ends the run, nudges are injected before the next model call, verdicts gate tools.

Checkpoints: before each model call (``TurnStarted``), after each reply (``ModelReplied``),
before each tool call (``ToolCallProposed``), after the turn's tools (``TurnEnded``). Tool
results reach every monitor before ``TurnEnded`` settles, because mailboxes are FIFO."""

from __future__ import annotations

import logging

import anyio

from bus import (
    ChatMessage,
    ExitReason,
    ModelReplied,
    RunEnding,
    StopSignal,
    TurnEnded,
    TurnStarted,
)
from orchestrator.conductor.final_answer import FinalAnswer, answerable
from orchestrator.conductor.model_call import cut_mid_json
from orchestrator.conductor.state import Stopped
from orchestrator.result import RunResult, finished_message

__all__ = ["Conductor"]

logger = logging.getLogger("loopfuse.conductor")


class Conductor(FinalAnswer):
    """Runs one run to its end and returns its :class:`RunResult`; never raises."""

    __slots__ = ()

    async def run(self) -> RunResult:
        """Run to the end. Exceptions end the run ``hook_stopped``/``internal.error``."""
        stop: StopSignal
        try:
            await self._publish_started()
            stop = await self._loop()
        except Stopped as stopped:
            stop = stopped.stop
        except Exception as exc:
            logger.exception("run %s failed inside the conductor", self._run_id)
            stop = self._make_stop(
                ExitReason.HOOK_STOPPED, "internal.error", "conductor", repr(exc)
            )
        if self._settings.on_stop == "answer" and answerable(stop):
            await self._final_answer(stop)
        result = self._result(stop)
        with anyio.CancelScope(shield=True):
            await self._bus.publish_settled(
                RunEnding(run_id=self._run_id, exit_reason=stop.reason, cause=stop.cause)
            )
            await self._bus.publish(finished_message(result))
        return result

    async def _loop(self) -> StopSignal:
        if not self._transcript:  # not resumed from a checkpoint that has one
            if self._in.system:
                self._transcript.append(ChatMessage(role="system", content=self._in.system))
            self._transcript.extend(self._in.history)
            self._transcript.append(ChatMessage(role="user", content=self._in.task))
        while (early := self._inbox.receive_nowait()) is not None:  # e.g. aborted while queued
            self._control(early)
        if self._stop is not None:
            return self._stop
        while True:
            self._turn += 1
            self._enter("PLAN", "turn started")
            await self._checkpoint(
                TurnStarted(
                    run_id=self._run_id,
                    turn=self._turn,
                    stage=self._in.stage,
                    prompt_messages=len(self._transcript),
                    appended=self._appended(),
                )
            )
            self._inject_nudges()
            reply = await self._model_reply()
            self._usage = self._usage + reply.usage
            if reply.aborted:
                # Cut by a monitor (content loop) without a stop: keep what streamed, go on.
                self._keep_partial(reply)
                self._trace_event("stream cut", reply.finish_reason or "")
                await self._end_turn(0)
                continue
            self._enter("ACT", "reply received")
            truncated = reply.finish_reason == "length" or cut_mid_json(reply)
            calls = () if truncated else reply.tool_calls
            self._transcript.append(
                ChatMessage(role="assistant", content=reply.text or None, tool_calls=calls)
            )
            await self._checkpoint(
                ModelReplied(
                    run_id=self._run_id,
                    turn=self._turn,
                    text_chars=len(reply.text),
                    tool_calls=len(calls),
                    finish_reason=reply.finish_reason,
                    usage=reply.usage,
                    total_usage=self._usage,
                )
            )
            if truncated:
                stop = self._on_truncated(reply, dropped=len(reply.tool_calls))
                if stop is not None:
                    return stop
                await self._end_turn(0)
                continue
            if not calls:
                continuing = [n for n in self._pending_nudges if n.continues]
                if continuing:
                    # A monitor answered this end of turn: "keep working" (a token target:
                    # the answer grows, so its parts are kept) or a stop hook's veto (the
                    # answer is refused, so only the next one counts).
                    if any(n.kind.startswith("budget.") for n in continuing):
                        self._continued.append(self._recovered(reply.text))
                    self._pieces.clear()
                    self._output = joined(self._continued)
                    self._trace_event("continued", ", ".join(n.kind for n in continuing))
                    await self._end_turn(0)
                    continue
                self._output = joined([*self._continued, self._recovered(reply.text)])
                return self._make_stop(
                    ExitReason.COMPLETED, "model.end_turn", "model", "The model ended its turn."
                )
            self._pieces.clear()  # tool calls: a cut answer was not continued
            finished = await self._act(calls)
            await self._end_turn(len(calls))
            if finished is not None:
                return finished

    async def _end_turn(self, tool_calls: int) -> None:
        self._enter("OBSERVE", "turn ended")
        await self._checkpoint(
            TurnEnded(run_id=self._run_id, turn=self._turn, tool_calls=tool_calls)
        )
        if self._in.on_checkpoint is not None:
            self._in.on_checkpoint(self._snapshot())


def joined(texts: list[str]) -> str:
    return "\n\n".join(text for text in texts if text)
