"""The conductor: one run's state machine. It owns the transcript and the order of events;
monitors decide loops, budgets and hooks. ``docs/architecture.md`` draws the route.

::

    start ─▶ PLAN: checkpoint TurnStarted, inject nudges, model call
                   (prompt too long ─▶ context recovery ─▶ model call again)
             ACT:  checkpoint ModelReplied
                   cut by the output limit ─▶ nudge to go on ─────────────▶ OBSERVE
                   no tool calls ─▶ a monitor continues it ───────────────▶ OBSERVE
                                 ─▶ else DONE (model.end_turn)
                   tool calls ─▶ tool phase (a checkpoint per proposed call) ─▶ OBSERVE
             OBSERVE: checkpoint TurnEnded, save a checkpoint ─▶ PLAN

Every checkpoint is a settling publish (every monitor has answered when it returns); a stop
among the answers raises :class:`Stopped` there, and :meth:`Conductor.run` ends the run.
"""

from __future__ import annotations

import logging
import time
from typing import Final, NoReturn

import anyio

from bus import (
    Bus,
    ChatMessage,
    Inbox,
    ModelReplied,
    ModelReply,
    Notice,
    RunEnding,
    RunStarted,
    StopSignal,
    TurnEnded,
    TurnStarted,
    stop_signal,
)
from orchestrator.conductor.context_recovery import ContextRecovery
from orchestrator.conductor.final_answer import FinalAnswer
from orchestrator.conductor.inbox import ControlInbox, Stopped
from orchestrator.conductor.inputs import ConductorSettings, RunInputs
from orchestrator.conductor.model_call import ModelCall, cut_mid_json
from orchestrator.conductor.state import RunRecord
from orchestrator.conductor.tool_phase import ToolPhase
from orchestrator.result import RunResult, finished_message

__all__ = ["Conductor"]

logger = logging.getLogger("loopfuse.conductor")


class Conductor:
    """Runs one run to its end and returns its :class:`RunResult`; never raises."""

    __slots__ = ("_bus", "_context", "_control", "_in", "_model", "_run", "_tools")

    def __init__(self, bus: Bus, inputs: RunInputs, inbox: Inbox) -> None:
        self._bus = bus
        self._in = inputs
        settings = inputs.settings
        self._run = run = RunRecord(inputs.run_id, inputs.trace_id, settings.deadline_seconds)
        run.notes = inputs.notes
        if inputs.resume is not None:
            run.restore(inputs.resume)
        self._context = ContextRecovery(run, inputs.context)
        self._control = control = ControlInbox(bus, inbox, run, self._context.on_action)
        if inputs.resume is not None:  # what the turn before the checkpoint said to the next
            control.nudges.extend(inputs.resume.pending_nudges)
        self._model = ModelCall(bus, run, control, inputs)
        self._tools = ToolPhase(bus, run, control, inputs)

    async def run(self) -> RunResult:
        """Run to the end. Exceptions end the run ``hook_stopped``/``internal.error``."""
        run, bus = self._run, self._bus
        stop: StopSignal
        try:
            await bus.publish(self._started())
            for note in self._in.notes:
                await bus.publish(
                    Notice(run_id=run.run_id, kind="loop.config", text=note, source="conductor")
                )
            await self._loop()
        except Stopped as stopped:
            stop = stopped.stop
        except Exception as exc:
            logger.exception("run %s failed inside the conductor", run.run_id)
            stop = stop_signal(
                "internal.error", run_id=run.run_id, source="conductor", detail=repr(exc)
            )
        settings = self._in.settings
        if settings.on_stop == "answer" and stop.answerable:
            await FinalAnswer(bus, run, self._control, settings).ask(stop)
        result = run.result(stop)
        with anyio.CancelScope(shield=True):
            await bus.publish_settled(
                RunEnding(run_id=run.run_id, exit_reason=stop.reason, cause=stop.cause)
            )
            await bus.publish(finished_message(result))
        return result

    async def _loop(self) -> NoReturn:
        run, control, model, inputs = self._run, self._control, self._model, self._in
        if not run.transcript:  # not resumed from a checkpoint that has one
            if inputs.system:
                run.transcript.append(ChatMessage(role="system", content=inputs.system))
            run.transcript.extend(inputs.history)
            run.transcript.append(ChatMessage(role="user", content=inputs.task))
        control.take_pending()  # e.g. aborted while queued
        control.end_if_stopped()
        while True:
            run.turn += 1
            run.enter("PLAN", "turn started")
            appended, already_sent = self._context.appended()
            await control.checkpoint(
                TurnStarted(
                    run_id=run.run_id,
                    turn=run.turn,
                    stage=inputs.stage,
                    prompt_messages=len(run.transcript),
                    appended=appended,
                    already_sent=already_sent,
                )
            )
            if control.nudges:
                nudges, control.nudges = control.nudges, []
                run.inject(nudges)
            reply = await self._reply()
            run.usage = run.usage + reply.usage
            if reply.aborted:
                # Cut by a monitor (content loop) without a stop: keep what streamed, go on.
                model.keep_partial(reply.text)
                run.trace_event("stream cut", reply.finish_reason or "")
                await self._end_turn(0)
                continue
            run.enter("ACT", "reply received")
            truncated = reply.finish_reason == "length" or cut_mid_json(reply)
            calls = () if truncated else reply.tool_calls
            run.transcript.append(
                ChatMessage(role="assistant", content=reply.text or None, tool_calls=calls)
            )
            await control.checkpoint(
                ModelReplied(
                    run_id=run.run_id,
                    turn=run.turn,
                    text_chars=len(reply.text),
                    tool_calls=len(calls),
                    finish_reason=reply.finish_reason,
                    usage=reply.usage,
                    total_usage=run.usage,
                )
            )
            if truncated:
                model.truncated(reply, dropped=len(reply.tool_calls))
                await self._end_turn(0)
                continue
            if not calls:
                if self._continued(reply):
                    await self._end_turn(0)
                    continue
                run.output = joined([*run.continued, run.recovered(reply.text)])
                control.end(self._completed("model", "The model ended its turn."))
            run.pieces.clear()  # tool calls: a cut answer was not continued
            finishing = await self._tools.run(calls)
            await self._end_turn(len(calls))
            if finishing is not None:
                control.end(
                    self._completed("conductor", f"The model called {finishing} to finish.")
                )

    async def _reply(self) -> ModelReply:
        """The turn's reply. When the endpoint refuses the prompt as too long, the context
        gatekeeper answers (collapse, then compaction, then a stop) and the turn is sent
        again."""
        model = self._model
        refusals = 0
        while True:
            await model.send()
            answer = await model.answer("model error")
            refused = model.too_long(answer)
            if refused is None:
                return model.reply(answer)
            refusals += 1
            await self._context.recover(self._control, model, refused, refusals)

    def _continued(self, reply: ModelReply) -> bool:
        """A monitor answered this end of turn "keep working" (``Nudge.continues``). Its
        ``keeps_answer`` says whether this reply stays part of the answer (a token target:
        the answer grows) or is dropped (a stop hook's veto: only the next one counts)."""
        run = self._run
        continuing = [n for n in self._control.nudges if n.continues]
        if not continuing:
            return False
        if any(n.keeps_answer for n in continuing):
            run.continued.append(run.recovered(reply.text))
        run.pieces.clear()
        run.output = joined(run.continued)
        run.trace_event("continued", ", ".join(n.kind for n in continuing))
        return True

    async def _end_turn(self, tool_calls: int) -> None:
        run = self._run
        run.enter("OBSERVE", "turn ended")
        await self._control.checkpoint(
            TurnEnded(run_id=run.run_id, turn=run.turn, tool_calls=tool_calls)
        )
        if self._in.on_checkpoint is not None:
            self._in.on_checkpoint(run.snapshot(tuple(self._control.nudges)))

    def _completed(self, source: str, detail: str) -> StopSignal:
        return stop_signal("model.end_turn", run_id=self._run.run_id, source=source, detail=detail)

    def _started(self) -> RunStarted:
        inputs, settings, run = self._in, self._in.settings, self._run
        resume = inputs.resume
        # A resumed run's budgets go on from where it was: the deadline counts the time
        # it ran before, the tool-call budget the calls it proposed.
        return RunStarted(
            run_id=run.run_id,
            trace_id=inputs.trace_id,
            traceparent=inputs.traceparent,
            task=inputs.task,
            stage=inputs.stage,
            plan=inputs.plan,
            folder=inputs.folder,
            tools=tuple(spec.name for spec in inputs.tool_specs),
            tool_specs=inputs.tool_specs,
            max_tool_calls=max(1, settings.max_tool_calls - len(run.call_log)),
            started_at=time.time() - (time.monotonic() - run.started),
            resumed_from_turn=resume.turn if resume is not None else None,
            **{key: getattr(settings, key) for key in _CARRIED},
        )


_CARRIED: Final = tuple(
    key
    for key in RunStarted.__struct_fields__
    if key in ConductorSettings.__dataclass_fields__ and key != "max_tool_calls"
)
"""The run settings ``RunStarted`` carries as they are (the tool-call budget is what is left)."""


def joined(texts: list[str]) -> str:
    return "\n\n".join(text for text in texts if text)
