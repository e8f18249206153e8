"""The model call: one request, its reply or final error, and output-limit cuts."""

from __future__ import annotations

import time
from typing import Final

from bus import (
    Bus,
    ChatMessage,
    ModelCancel,
    ModelError,
    ModelReply,
    ModelRequest,
    Nudge,
    StopSignal,
    stop_signal,
)
from orchestrator.conductor.inbox import ControlInbox
from orchestrator.conductor.inputs import RunInputs
from orchestrator.conductor.state import RunRecord

__all__ = ["TRUNCATED_CALLS_NOTE", "TRUNCATION_NUDGES", "ModelCall", "cut_mid_json"]

TRUNCATION_NUDGES: Final = (
    "Your previous answer was cut off by the output limit. Continue exactly where you "
    "stopped: no apology, no recap. Break the remaining work into smaller pieces.",
    "Cut off again. Continue from the exact point where you stopped, much more concisely: "
    "only what is still missing, in small pieces.",
    "Still cut off. Finish now with the shortest complete version of what remains.",
)
TRUNCATED_CALLS_NOTE: Final = (
    " The tool calls in that answer did not run: make them again, with smaller arguments."
)


class ModelCall:
    """Sends the turn's request and waits for its reply; turns endpoint failures into the
    run's ending and output-limit cuts into a nudge to go on."""

    __slots__ = ("_bus", "_control", "_run", "_settings", "_tools")

    def __init__(self, bus: Bus, run: RunRecord, control: ControlInbox, inputs: RunInputs) -> None:
        self._bus = bus
        self._run = run
        self._control = control
        self._settings = inputs.settings
        self._tools = inputs.tool_specs

    async def send(self) -> None:
        """Publish the turn's request: the whole transcript, with the tools (the run's
        own: ``RunStarted.tool_specs``), saying what of it an event log already holds."""
        run, settings = self._run, self._settings
        run.llm_requests += 1
        unchanged = min(run.sent_messages, run.rewritten_from)
        checkpointed = run.checkpointed
        if not run.checkpoint_from <= unchanged <= checkpointed:
            checkpointed = 0
        run.sent_messages = run.rewritten_from = len(run.transcript)
        await self._bus.publish(
            ModelRequest(
                run_id=run.run_id,
                turn=run.turn,
                model=settings.model,
                messages=tuple(run.transcript),
                tools=self._tools,
                max_tokens=settings.max_output_tokens,
                escalated_max_tokens=settings.escalated_max_tokens,
                deadline_at=run.deadline_at,
                unchanged=unchanged,
                checkpointed=checkpointed,
                run_tools=True,
            )
        )

    async def summarise(
        self, messages: tuple[ChatMessage, ...], max_tokens: int
    ) -> ModelReply | ModelError:
        """A compaction: ``messages`` (the summarising prompt) sent without tools."""
        run = self._run
        run.llm_requests += 1
        await self._bus.publish(
            ModelRequest(
                run_id=run.run_id,
                turn=run.turn,
                model=self._settings.model,
                messages=messages,
                max_tokens=max_tokens,
                deadline_at=run.deadline_at,
                purpose="compact",
            )
        )
        return await self.answer("compaction: model error")

    async def answer(self, label: str) -> ModelReply | ModelError:
        """The reply to this turn's request, or its final error (each failed attempt is
        traced as ``label``). A stop that arrives meanwhile cancels the request; the reply,
        partial, still comes back (or the run ends if it never does)."""
        run, control = self._run, self._control
        cancelled = False
        while True:
            stop = control.stop
            if stop is not None and not cancelled:
                cancelled = True
                await self._bus.publish(
                    ModelCancel(run_id=run.run_id, turn=run.turn, reason=stop.cause)
                )
            msg = await (control.receive_confirming() if cancelled else control.receive())
            if msg is None:  # the caller never confirmed the cancellation
                control.end()
            match msg:
                case ModelReply(turn=turn) if turn == run.turn:
                    return msg
                case ModelError(turn=turn) if turn == run.turn:
                    run.trace_event(f"{label} ({msg.kind})", msg.message)
                    if msg.final:
                        return msg
                case _:
                    control.take(msg)

    def too_long(self, answer: ModelReply | ModelError) -> ModelError | None:
        """``answer`` if the endpoint refused the prompt as too long (and nothing stops)."""
        if isinstance(answer, ModelError) and answer.kind == "context_length":
            return answer if self._control.stop is None else None
        return None

    def reply(self, answer: ModelReply | ModelError) -> ModelReply:
        """The turn's reply; a final error or a stop that came meanwhile ends the run."""
        control = self._control
        if isinstance(answer, ModelError):
            # What streamed before a final failure (a server that died mid-stream) is kept
            # as a cut reply's is, and its usage counted.
            self._run.usage = self._run.usage + answer.usage
            self.keep_partial(answer.partial_text)
            control.end(self.error_stop(answer))
        if control.stop is not None:
            self.keep_partial(answer.text)
            self._run.usage = self._run.usage + answer.usage
            control.end()
        return answer

    def error_stop(self, error: ModelError) -> StopSignal:
        """How a final model error ends the run."""
        run_id = self._run.run_id
        detail = f"{error.kind} after {error.attempt} attempt(s): {error.message}"
        match error.kind:
            case "context_length":
                cause = "context.prompt_too_long"
            case "deadline" if time.time() >= self._run.deadline_at:
                cause = "budget.deadline"
            case "bad_request" | "auth":
                cause = "model.bad_request"
            case "interrupted":
                cause = "model.interrupted"
            case _:
                cause = "model.unavailable"
        return stop_signal(cause, run_id=run_id, source="llm_caller", detail=detail)

    def keep_partial(self, text: str) -> None:
        """Keep ``text``, what streamed of a cut reply."""
        run = self._run
        if text:
            run.transcript.append(ChatMessage(role="assistant", content=text))
            run.output = run.recovered(text)

    def truncated(self, reply: ModelReply, *, dropped: int) -> None:
        """The output limit cut ``reply``: queue a nudge to go on where it stopped, or end
        the run with the pieces once ``truncation_recoveries`` are used up."""
        run = self._run
        run.output = run.recovered(reply.text)
        run.pieces.append(reply.text)
        if run.truncations >= self._settings.truncation_recoveries:
            run.incomplete = True
            self._control.end(
                stop_signal(
                    "truncation.gave_up",
                    run_id=run.run_id,
                    source="conductor",
                    detail=f"The answer was cut off by the output limit {run.truncations + 1} "
                    "times; the partial text is kept.",
                )
            )
        text = TRUNCATION_NUDGES[min(run.truncations, len(TRUNCATION_NUDGES) - 1)]
        run.truncations += 1
        detail = f"recovery {run.truncations}"
        if dropped:
            text += TRUNCATED_CALLS_NOTE
            detail += f", {dropped} tool call(s) dropped"
        run.trace_event("truncated", detail)
        self._control.nudges.append(
            Nudge(run_id=run.run_id, kind="truncation.recover", text=text, source="conductor")
        )


def cut_mid_json(reply: ModelReply) -> bool:
    """Whether a tool call's arguments stop mid-JSON (the output limit cut the reply, even
    if the server did not say ``length``). Complete but malformed JSON is not a cut: that
    call runs and the model reads the decoding error."""
    if not reply.invalid_tool_calls:  # every turn: nothing to look at
        return False
    invalid = set(reply.invalid_tool_calls)
    return any(unclosed_json(call.arguments) for call in reply.tool_calls if call.id in invalid)


def unclosed_json(text: str) -> bool:
    """``text`` ends inside a string or with an object or array still open."""
    depth, in_string, escaped = 0, False, False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "{[":
            depth += 1
        elif char in "}]":
            depth -= 1
    return in_string or depth > 0
