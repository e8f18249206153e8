"""The model call: one request, its reply, the endpoint's final errors, truncation recovery."""

from __future__ import annotations

import logging
import time
from typing import Final

from bus import (
    ChatMessage,
    ExitReason,
    ModelCancel,
    ModelError,
    ModelReply,
    ModelRequest,
    Nudge,
    StopSignal,
)
from orchestrator.conductor.control import ControlInbox
from orchestrator.conductor.state import Stopped

__all__ = [
    "TRUNCATED_CALLS_NOTE",
    "TRUNCATION_NUDGES",
    "ModelCall",
    "PromptTooLong",
    "cut_mid_json",
]

logger = logging.getLogger("loopfuse.conductor")

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


class PromptTooLong(Exception):
    """Internal: the endpoint refused the turn's prompt as too long (a final error)."""

    def __init__(self, error: ModelError) -> None:
        self.error = error


class ModelCall(ControlInbox):
    """One model request and its reply; endpoint failures and output-limit cuts."""

    __slots__ = ()

    async def _send_model_request(self) -> None:
        self._llm_requests += 1
        unchanged = min(self._sent_messages, self._rewritten_from)
        self._sent_messages = self._rewritten_from = len(self._transcript)
        await self._bus.publish(
            ModelRequest(
                run_id=self._run_id,
                turn=self._turn,
                model=self._settings.model,
                messages=tuple(self._transcript),
                tools=self._in.tool_specs,
                max_tokens=self._settings.max_output_tokens,
                escalated_max_tokens=self._settings.escalated_max_tokens,
                deadline_at=self._deadline_at,
                unchanged=unchanged,
            )
        )

    def _model_outcome(self, answer: ModelReply | ModelError) -> ModelReply:
        """The turn's reply; raises :class:`PromptTooLong` or :class:`Stopped` otherwise."""
        if isinstance(answer, ModelError):
            if answer.kind == "context_length" and self._stop is None:
                raise PromptTooLong(answer)
            raise Stopped(self._stop or self._model_error_stop(answer))
        if self._stop is not None:
            self._keep_partial(answer)
            self._usage = self._usage + answer.usage
            raise Stopped(self._stop)
        return answer

    async def _answer(self, label: str) -> ModelReply | ModelError:
        """The reply to this turn's model request, or its final error (each failed attempt
        is traced as ``label``). A stop that arrives meanwhile cancels the request; the
        reply, partial, still comes back (or the run stops if it never does)."""
        cancelled = False
        while True:
            if self._stop is not None and not cancelled:
                cancelled = True
                await self._bus.publish(
                    ModelCancel(run_id=self._run_id, turn=self._turn, reason=self._stop.cause)
                )
            # Awaiting the inbox itself while nothing is cancelled: one coroutine frame
            # less held by every run waiting for its model.
            msg = await (self._receive(confirming=True) if cancelled else self._inbox.receive())
            if msg is None:  # the caller never confirmed the cancellation
                raise Stopped(self._require_stop())
            match msg:
                case ModelReply(turn=turn) if turn == self._turn:
                    return msg
                case ModelError(turn=turn) if turn == self._turn:
                    self._trace_event(f"{label} ({msg.kind})", msg.message)
                    if msg.final:
                        return msg
                case _:
                    self._control(msg)

    def _model_error_stop(self, error: ModelError) -> StopSignal:
        detail = f"{error.kind} after {error.attempt} attempt(s): {error.message}"
        match error.kind:
            case "context_length":
                return self._make_stop(
                    ExitReason.PROMPT_TOO_LONG, "context.prompt_too_long", "llm_caller", detail
                )
            case "deadline" if time.time() >= self._deadline_at:
                return self._make_stop(
                    ExitReason.MAX_TURNS, "budget.deadline", "llm_caller", detail
                )
            case "bad_request" | "auth":
                return self._make_stop(
                    ExitReason.ABORTED_STREAMING, "model.bad_request", "llm_caller", detail
                )
            case _:
                return self._make_stop(
                    ExitReason.ABORTED_STREAMING, "model.unavailable", "llm_caller", detail
                )

    def _keep_partial(self, reply: ModelReply) -> None:
        if reply.text:
            self._transcript.append(ChatMessage(role="assistant", content=reply.text))
            self._output = self._recovered(reply.text)

    def _recovered(self, text: str) -> str:
        """``text`` after the pieces of the answer it continues (the output limit cut
        them; the model was asked to go on exactly where it stopped, so no separator)."""
        return "".join((*self._pieces, text))

    def _on_truncated(self, reply: ModelReply, *, dropped: int) -> StopSignal | None:
        self._output = self._recovered(reply.text)
        self._pieces.append(reply.text)
        if self._truncations >= self._settings.truncation_recoveries:
            self._incomplete = True
            return self._make_stop(
                ExitReason.COMPLETED,
                "truncation.gave_up",
                "conductor",
                f"The answer was cut off by the output limit {self._truncations + 1} times; "
                "the partial text is kept.",
            )
        text = TRUNCATION_NUDGES[min(self._truncations, len(TRUNCATION_NUDGES) - 1)]
        self._truncations += 1
        if dropped:
            text += TRUNCATED_CALLS_NOTE
        detail = f"recovery {self._truncations}" + (
            f", {dropped} tool call(s) dropped" if dropped else ""
        )
        self._trace_event("truncated", detail)
        self._pending_nudges.append(
            Nudge(run_id=self._run_id, kind="truncation.recover", text=text, source="conductor")
        )
        return None


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
