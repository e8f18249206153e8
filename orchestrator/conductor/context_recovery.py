"""The context gatekeeper's side of the transcript: what it was shown, its folds applied,
and recovery from "prompt too long" (collapse or compaction, then the turn is resent)."""

from __future__ import annotations

import logging
from typing import Final

from bus import ChatMessage, ContextAction, ModelError, PromptRejected, StopSignal, stop_signal
from orchestrator.conductor.inbox import ControlInbox
from orchestrator.conductor.inputs import ContextFunctions
from orchestrator.conductor.model_call import ModelCall
from orchestrator.conductor.state import RunRecord

__all__ = ["MAX_CONTEXT_RECOVERIES", "ContextRecovery"]

logger = logging.getLogger("loopfuse.conductor")

# Refusals of one turn's prompt as too long after which the run stops even if the context
# gatekeeper still answers (it stops after collapse and compaction; this bounds a bug).
MAX_CONTEXT_RECOVERIES: Final = 3


class ContextRecovery:
    """Keeps the context gatekeeper in step with the transcript and carries out its
    answers (with the ``functions`` the runtime passed in)."""

    __slots__ = ("_functions", "_pending", "_run", "_seen")

    def __init__(self, run: RunRecord, functions: ContextFunctions) -> None:
        self._run = run
        self._functions = functions
        self._seen = 0  # transcript messages the context gatekeeper was shown
        self._pending: ContextAction | None = None  # this turn's collapse or compaction

    def appended(self) -> tuple[tuple[ChatMessage, ...], int]:
        """The transcript's messages the context gatekeeper has not been shown yet, and
        how many of the first of them the previous turn request carried (a checkpoint's
        ``appended`` and ``already_sent``)."""
        run = self._run
        transcript = run.transcript
        seen = self._seen
        appended = tuple(transcript[seen:])
        sent = min(run.sent_messages, run.rewritten_from) - seen
        run.checkpoint_from = seen
        self._seen = run.checkpointed = len(transcript)
        return appended, sent if sent > 0 else 0

    def on_action(self, action: ContextAction) -> None:
        """The gatekeeper's answer, as it arrives: folds are applied at once."""
        run = self._run
        if action.kind == "collapse":
            if action.folds:
                run.rewritten(min(fold.index for fold in action.folds))
            missed = self._functions.fold(run.transcript, action.folds)
            if missed:
                logger.error("run %s: %d fold(s) did not match", run.run_id, len(missed))
        run.trace_event(f"context {action.kind.replace('_', ' ')}", action.detail)
        if action.kind in ("collapse", "compact") and action.turn == run.turn:
            self._pending = action
            if action.reactive:  # the hint of a prompt_too_long ending says so
                run.shortened_turn = action.turn

    async def recover(
        self, control: ControlInbox, model: ModelCall, error: ModelError, attempt: int
    ) -> None:
        """The endpoint refused this turn's prompt (``attempt``-th time): ask the gatekeeper
        what to do and do it, or end the run if nobody can make the prompt shorter."""
        run = self._run
        self._pending = None
        appended, already_sent = self.appended()
        await control.checkpoint(
            PromptRejected(
                run_id=run.run_id,
                turn=run.turn,
                attempt=attempt,
                prompt_messages=len(run.transcript),
                appended=appended,
                already_sent=already_sent,
                status=error.status,
                message=error.message,
            )
        )
        action = self._take_pending()  # a call: what the checkpoint set, not what mypy saw
        if action is None or attempt > MAX_CONTEXT_RECOVERIES:
            control.end(model.error_stop(error))
        if action.kind == "compact":
            await self._compact(control, model, action)

    def _take_pending(self) -> ContextAction | None:
        action, self._pending = self._pending, None
        return action

    async def _compact(
        self, control: ControlInbox, model: ModelCall, action: ContextAction
    ) -> None:
        """Put the model's summary of messages ``start``..``end`` in their place; an empty
        or failed summary ends the run ``prompt_too_long``."""
        run, functions = self._run, self._functions
        start, end = action.start, action.end
        answer = await model.summarise(
            functions.compaction_prompt(
                run.transcript[start:end],
                first_turn=action.first_turn,
                last_turn=action.last_turn,
                history_chars=action.history_chars,
                summary_max_tokens=action.summary_max_tokens,
            ),
            action.summary_max_tokens,
        )
        if isinstance(answer, ModelError):
            control.end(
                self._too_long(
                    "The endpoint refused the prompt as too long and the call to summarise "
                    f"it failed ({answer.kind}): {answer.message}"
                )
            )
        run.usage = run.usage + answer.usage
        control.end_if_stopped()
        text = answer.text.strip()
        if answer.aborted or not text:
            control.end(
                self._too_long(
                    "The endpoint refused the prompt as too long and the summary meant to "
                    "shorten it came back empty."
                )
            )
        run.rewritten(start)
        run.transcript[start:end] = [functions.summary(text, action.first_turn, action.last_turn)]
        self._seen -= end - start - 1
        run.trace_event(
            "context compacted", f"{end - start} messages → a summary of {len(text):,} chars"
        )

    def _too_long(self, detail: str) -> StopSignal:
        return stop_signal(
            "context.prompt_too_long", run_id=self._run.run_id, source="conductor", detail=detail
        )
