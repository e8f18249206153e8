"""Recovery from "prompt too long": the gatekeeper collapses or compacts, the turn is resent."""

from __future__ import annotations

import logging
from typing import Final

from actors.context import apply_folds, compaction_prompt, summary_message
from bus import (
    ChatMessage,
    ContextAction,
    ExitReason,
    ModelError,
    ModelReply,
    ModelRequest,
    PromptRejected,
)
from orchestrator.conductor.model_call import ModelCall, PromptTooLong
from orchestrator.conductor.state import Stopped

__all__ = ["MAX_CONTEXT_RECOVERIES", "ContextRecovery"]

logger = logging.getLogger("loopfuse.conductor")

# Refusals of one turn's prompt as too long after which the run stops even if the context
# gatekeeper still answers (it stops after collapse and compaction; this bounds a bug).
MAX_CONTEXT_RECOVERIES: Final = 3


class ContextRecovery(ModelCall):
    """Keeps the context gatekeeper in step, and recovers from "prompt too long"."""

    __slots__ = ()

    def _appended(self) -> tuple[ChatMessage, ...]:
        """The transcript's messages the context gatekeeper has not been shown yet."""
        appended = tuple(self._transcript[self._context_seen :])
        self._context_seen = len(self._transcript)
        return appended

    async def _model_reply(self) -> ModelReply:
        """The turn's reply. When the endpoint refuses the prompt as too long, the context
        gatekeeper answers (collapse, then compaction, then a stop) and the turn is sent
        again."""
        refusals = 0
        while True:
            await self._send_model_request()
            answer = await self._answer("model error")
            try:
                return self._model_outcome(answer)
            except PromptTooLong as refused:
                refusals += 1
                await self._recover_context(refused.error, refusals)

    async def _recover_context(self, error: ModelError, attempt: int) -> None:
        self._context_action = None
        await self._checkpoint(
            PromptRejected(
                run_id=self._run_id,
                turn=self._turn,
                attempt=attempt,
                prompt_messages=len(self._transcript),
                appended=self._appended(),
                status=error.status,
                message=error.message,
            )
        )
        action = self._take_context_action()
        if action is None or attempt > MAX_CONTEXT_RECOVERIES:
            # Nobody can make the prompt shorter: the refusal ends the run.
            raise Stopped(self._model_error_stop(error))
        if action.kind == "compact":
            await self._compact(action)

    def _take_context_action(self) -> ContextAction | None:
        action, self._context_action = self._context_action, None
        return action

    def _on_context_action(self, action: ContextAction) -> None:
        if action.kind == "collapse":
            if action.folds:
                self._rewritten(min(fold.index for fold in action.folds))
            missed = apply_folds(self._transcript, action.folds)
            if missed:
                logger.error("run %s: %d fold(s) did not match", self._run_id, len(missed))
        self._trace_event(f"context {action.kind.replace('_', ' ')}", action.detail)
        if action.kind in ("collapse", "compact") and action.turn == self._turn:
            self._context_action = action

    async def _compact(self, action: ContextAction) -> None:
        """Put the model's summary of messages ``start``..``end`` in their place (a model
        call without tools); an empty or failed summary ends the run ``prompt_too_long``."""
        start, end = action.start, action.end
        self._llm_requests += 1
        await self._bus.publish(
            ModelRequest(
                run_id=self._run_id,
                turn=self._turn,
                model=self._settings.model,
                messages=compaction_prompt(
                    self._transcript[start:end],
                    first_turn=action.first_turn,
                    last_turn=action.last_turn,
                    history_chars=action.history_chars,
                    summary_max_tokens=action.summary_max_tokens,
                ),
                max_tokens=action.summary_max_tokens,
                deadline_at=self._deadline_at,
                purpose="compact",
            )
        )
        reply = await self._summary_reply()
        text = reply.text.strip()
        if reply.aborted or not text:
            raise Stopped(
                self._make_stop(
                    ExitReason.PROMPT_TOO_LONG,
                    "context.prompt_too_long",
                    "conductor",
                    "The endpoint refused the prompt as too long and the summary meant to "
                    "shorten it came back empty.",
                )
            )
        self._rewritten(start)
        self._transcript[start:end] = [summary_message(text, action.first_turn, action.last_turn)]
        self._context_seen -= end - start - 1
        self._trace_event(
            "context compacted", f"{end - start} messages → a summary of {len(text):,} chars"
        )

    async def _summary_reply(self) -> ModelReply:
        answer = await self._answer("compaction: model error")
        if isinstance(answer, ModelError):
            raise Stopped(
                self._stop
                or self._make_stop(
                    ExitReason.PROMPT_TOO_LONG,
                    "context.prompt_too_long",
                    "conductor",
                    "The endpoint refused the prompt as too long and the call "
                    f"to summarise it failed ({answer.kind}): {answer.message}",
                )
            )
        self._usage = self._usage + answer.usage
        if self._stop is not None:
            raise Stopped(self._stop)
        return answer
