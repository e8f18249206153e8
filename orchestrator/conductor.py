"""The conductor: one run's state machine, PLAN → ACT → OBSERVE → … → DONE | FAILED.

The conductor owns the transcript and the order of events; it decides nothing about loops,
budgets or hooks. At every checkpoint it publishes a settling message, so every monitor has
answered before the run goes on (the barrier rule), then reads its control inbox: the first
stop ends the run, nudges are injected before the next model call, verdicts gate tools.

Checkpoints: before each model call (``TurnStarted``), after each reply (``ModelReplied``),
before each tool call (``ToolCallProposed``), after the turn's tools (``TurnEnded``). Tool
results reach every monitor before ``TurnEnded`` settles, because mailboxes are FIFO.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final, Literal

import anyio
import msgspec

from actors.context import apply_folds, compaction_prompt, summary_message
from actors.fingerprint import fingerprint_call
from bus import (
    AbortRequested,
    ActorFailed,
    Bus,
    ChatMessage,
    ContextAction,
    ExitReason,
    Inbox,
    Message,
    ModelCancel,
    ModelError,
    ModelReplied,
    ModelReply,
    ModelRequest,
    Nudge,
    PromptRejected,
    RunEnding,
    RunFinished,
    RunStarted,
    StopSignal,
    ToolCall,
    ToolCallProposed,
    ToolExecute,
    ToolResult,
    ToolsCancel,
    ToolSpec,
    ToolVerdict,
    TurnEnded,
    TurnStarted,
    Usage,
    cause_hint,
    nudge_text,
    outcome_of,
)
from orchestrator.config import RunSettings
from orchestrator.result import CallLogEntry, RunResult, RunState, TraceEntry

__all__ = ["Conductor", "RunCheckpoint", "RunInputs"]

logger = logging.getLogger("loopfuse.conductor")

# How long to wait for the LLM caller / tool executor to confirm a cancellation before the
# run ends without them; only reached if an actor is broken.
CANCEL_CONFIRM_SECONDS: Final = 10.0

# Refusals of one turn's prompt as too long after which the run stops even if the context
# gatekeeper still answers (it stops after collapse and compaction; this bounds a bug).
MAX_CONTEXT_RECOVERIES: Final = 3

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

ANSWER_NUDGE_KIND: Final = "stop.answer"
ANSWER_NUDGE: Final = (
    "The run has been stopped by a limit. Answer now with what you have gathered: no tools, "
    "no apology; say what is still missing."
)


class RunCheckpoint(msgspec.Struct, frozen=True, kw_only=True):
    """A run's state after a completed turn: what it takes to resume it elsewhere or later.

    The transcript is the state; the counters carry on so that budgets and the result
    count the turns before the resume too.
    """

    run_id: str
    trace_id: str
    turn: int
    elapsed_seconds: float
    transcript: tuple[ChatMessage, ...]
    llm_requests: int = 0
    tool_calls: int = 0
    usage: Usage = Usage()
    nudges: int = 0
    injected: tuple[tuple[str, str], ...] = ()
    truncations: int = 0
    output: str = ""
    trace: tuple[TraceEntry, ...] = ()
    call_log: tuple[CallLogEntry, ...] = ()


@dataclass(frozen=True, kw_only=True)
class RunInputs:
    """Everything one run needs, fixed before it starts."""

    run_id: str
    trace_id: str
    task: str
    settings: RunSettings
    tool_specs: tuple[ToolSpec, ...] = ()
    finishing_tools: frozenset[str] = frozenset()
    system: str | None = None
    folder: str | None = None
    stage: str = "agent"
    plan: tuple[str, ...] = ("agent",)
    resume: RunCheckpoint | None = None
    """Go on after this checkpoint's turn (its transcript) instead of starting afresh;
    an empty transcript starts from the task, still marked as resumed."""
    on_checkpoint: Callable[[RunCheckpoint], None] | None = None
    """Called after every completed turn with the state to resume from (must not block)."""


@dataclass
class _Turn:
    """What the inbox delivered while one step of a turn was pending."""

    verdicts: dict[str, ToolVerdict] = field(default_factory=dict)


class _PromptTooLong(Exception):
    """Internal: the endpoint refused the turn's prompt as too long (a final error)."""

    def __init__(self, error: ModelError) -> None:
        self.error = error


class _Stopped(Exception):
    """Internal: raised to unwind the loop once a stop has been decided."""

    def __init__(self, stop: StopSignal) -> None:
        self.stop = stop


class Conductor:
    """Runs one run to its end and returns its :class:`RunResult`; never raises."""

    def __init__(self, bus: Bus, inputs: RunInputs, inbox: Inbox) -> None:
        self._bus = bus
        self._inbox = inbox
        self._in = inputs
        self._settings = inputs.settings
        self._run_id = inputs.run_id
        self._started = time.monotonic()
        self._deadline_at = time.time() + inputs.settings.deadline_seconds
        self._transcript: list[ChatMessage] = []
        self._trace: list[TraceEntry] = []
        self._call_log: list[CallLogEntry] = []
        self._turn = 0
        self._state: RunState = "PLAN"
        self._llm_requests = 0
        self._tool_calls = 0
        self._usage = Usage()
        self._pending_nudges: list[Nudge] = []
        self._injected: set[tuple[str, str]] = set()
        self._nudges = 0
        self._stop: StopSignal | None = None
        self._truncations = 0
        self._pieces: list[str] = []  # the pieces of an answer cut by the output limit
        self._output = ""
        self._incomplete = False
        self._context_seen = 0  # transcript messages the context gatekeeper was shown
        self._context_action: ContextAction | None = None
        self._degraded = False
        self._continued: list[str] = []  # texts of turns a monitor continued (token target)
        if inputs.resume is not None:
            self._restore(inputs.resume)

    # ------------------------------------------------------------------ entry point

    async def run(self) -> RunResult:
        """Run to the end. Exceptions end the run ``hook_stopped``/``internal.error``."""
        stop: StopSignal
        try:
            await self._publish_started()
            stop = await self._loop()
        except _Stopped as stopped:
            stop = stopped.stop
        except Exception as exc:
            logger.exception("run %s failed inside the conductor", self._run_id)
            stop = self._make_stop(
                ExitReason.HOOK_STOPPED, "internal.error", "conductor", repr(exc)
            )
        if self._settings.on_stop == "answer" and _answerable(stop):
            await self._final_answer(stop)
        result = self._result(stop)
        with anyio.CancelScope(shield=True):
            await self._bus.publish_settled(
                RunEnding(run_id=self._run_id, exit_reason=stop.reason, cause=stop.cause)
            )
            await self._bus.publish(self._finished_message(result))
        return result

    # ------------------------------------------------------------------ the loop

    async def _loop(self) -> StopSignal:
        if not self._transcript:  # not resumed from a checkpoint that has one
            if self._in.system:
                self._transcript.append(ChatMessage(role="system", content=self._in.system))
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
            truncated = reply.finish_reason == "length" or _cut_mid_json(reply)
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
                if any(nudge.continues for nudge in self._pending_nudges):
                    # A monitor answered this end of turn with "keep working" (token target).
                    self._continued.append(self._recovered(reply.text))
                    self._pieces.clear()
                    self._output = _joined(self._continued)
                    self._trace_event("continued", "a monitor asked for more")
                    await self._end_turn(0)
                    continue
                self._output = _joined([*self._continued, self._recovered(reply.text)])
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

    # ------------------------------------------------------------------ resuming

    def _snapshot(self) -> RunCheckpoint:
        return RunCheckpoint(
            run_id=self._run_id,
            trace_id=self._in.trace_id,
            turn=self._turn,
            elapsed_seconds=time.monotonic() - self._started,
            transcript=tuple(self._transcript),
            llm_requests=self._llm_requests,
            tool_calls=self._tool_calls,
            usage=self._usage,
            nudges=self._nudges,
            injected=tuple(sorted(self._injected)),
            truncations=self._truncations,
            output=self._output,
            trace=tuple(self._trace),
            call_log=tuple(self._call_log),
        )

    def _restore(self, point: RunCheckpoint) -> None:
        self._started = time.monotonic() - point.elapsed_seconds
        self._deadline_at -= point.elapsed_seconds
        self._transcript = list(point.transcript)
        self._turn = point.turn
        self._llm_requests = point.llm_requests
        self._tool_calls = point.tool_calls
        self._usage = point.usage
        self._nudges = point.nudges
        self._injected = set(point.injected)
        self._truncations = point.truncations
        self._output = point.output
        self._trace = [*point.trace]
        self._call_log = list(point.call_log)
        self._trace_event("resumed", f"after turn {point.turn}")

    # ------------------------------------------------------------------ model call

    async def _call_model(self) -> ModelReply:
        self._llm_requests += 1
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
            )
        )
        cancelled = False
        while True:
            if self._stop is not None and not cancelled:
                cancelled = True
                await self._bus.publish(
                    ModelCancel(run_id=self._run_id, turn=self._turn, reason=self._stop.cause)
                )
            msg = await self._receive(confirming=cancelled)
            if msg is None:  # the caller never confirmed the cancellation
                raise _Stopped(self._require_stop())
            match msg:
                case ModelReply(turn=turn) if turn == self._turn:
                    if self._stop is not None:
                        self._keep_partial(msg)
                        self._usage = self._usage + msg.usage
                        raise _Stopped(self._stop)
                    return msg
                case ModelError(turn=turn) if turn == self._turn:
                    self._trace_event(
                        f"model error ({msg.kind})",
                        msg.message,
                    )
                    if msg.final and msg.kind == "context_length" and self._stop is None:
                        raise _PromptTooLong(msg)
                    if msg.final:
                        raise _Stopped(self._stop or self._model_error_stop(msg))
                case _:
                    self._control(msg)

    # ------------------------------------------------------------------ on_stop = "answer"

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

    # ------------------------------------------------------------------ context limits

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
            try:
                return await self._call_model()
            except _PromptTooLong as refused:
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
            raise _Stopped(self._model_error_stop(error))
        if action.kind == "compact":
            await self._compact(action)

    def _take_context_action(self) -> ContextAction | None:
        action, self._context_action = self._context_action, None
        return action

    def _on_context_action(self, action: ContextAction) -> None:
        if action.kind == "collapse":
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
            raise _Stopped(
                self._make_stop(
                    ExitReason.PROMPT_TOO_LONG,
                    "context.prompt_too_long",
                    "conductor",
                    "The endpoint refused the prompt as too long and the summary meant to "
                    "shorten it came back empty.",
                )
            )
        self._transcript[start:end] = [summary_message(text, action.first_turn, action.last_turn)]
        self._context_seen -= end - start - 1
        self._trace_event(
            "context compacted", f"{end - start} messages → a summary of {len(text):,} chars"
        )

    async def _summary_reply(self) -> ModelReply:
        cancelled = False
        while True:
            if self._stop is not None and not cancelled:
                cancelled = True
                await self._bus.publish(
                    ModelCancel(run_id=self._run_id, turn=self._turn, reason=self._stop.cause)
                )
            msg = await self._receive(confirming=cancelled)
            if msg is None:  # the caller never confirmed the cancellation
                raise _Stopped(self._require_stop())
            match msg:
                case ModelReply(turn=turn) if turn == self._turn:
                    self._usage = self._usage + msg.usage
                    if self._stop is not None:
                        raise _Stopped(self._stop)
                    return msg
                case ModelError(turn=turn) if turn == self._turn:
                    self._trace_event(f"compaction: model error ({msg.kind})", msg.message)
                    if msg.final:
                        raise _Stopped(
                            self._stop
                            or self._make_stop(
                                ExitReason.PROMPT_TOO_LONG,
                                "context.prompt_too_long",
                                "conductor",
                                "The endpoint refused the prompt as too long and the call "
                                f"to summarise it failed ({msg.kind}): {msg.message}",
                            )
                        )
                case _:
                    self._control(msg)

    # ------------------------------------------------------------------ tools

    async def _act(self, calls: tuple[ToolCall, ...]) -> StopSignal | None:
        turn = _Turn()
        fingerprints = [fingerprint_call(call.name, call.arguments) for call in calls]
        approved: list[int] = []
        blocked: dict[int, str] = {}
        for index, call in enumerate(calls):
            await self._checkpoint(
                ToolCallProposed(
                    run_id=self._run_id,
                    turn=self._turn,
                    call=call,
                    fingerprint=fingerprints[index],
                    index=index,
                ),
                verdicts=turn.verdicts,
                raise_on_stop=False,
            )
            if self._stop is not None:
                break
            verdict = turn.verdicts.get(call.id)
            if verdict is not None and verdict.verdict == "block":
                blocked[index] = verdict.message or "This call was blocked."
            else:
                approved.append(index)

        results: dict[int, ToolResult] = {}
        if approved and (self._stop is None or _call_specific(self._stop)):
            # A stop decided on one call (a budget or loop verdict) still lets the calls
            # approved before it run, so their work is kept; any other stop runs nothing.
            results = await self._execute(calls, fingerprints, approved)

        finished: StopSignal | None = None
        for index, call in enumerate(calls):
            verdict = turn.verdicts.get(call.id)
            result = results.get(index)
            if result is not None:
                content = result.content
                self._tool_calls += 1 if result.executed else 0
                if (
                    call.name in self._in.finishing_tools
                    and not result.is_error
                    and finished is None
                ):
                    self._output = call.arguments
                    finished = self._make_stop(
                        ExitReason.COMPLETED,
                        "model.end_turn",
                        "conductor",
                        f"The model called {call.name} to finish.",
                    )
            elif index in blocked:
                content = f"Error: {blocked[index]}"
            else:
                content = "Error: not run: the run was stopping."
            self._transcript.append(ChatMessage(role="tool", tool_call_id=call.id, content=content))
            self._call_log.append(
                CallLogEntry(
                    turn=self._turn,
                    call_id=call.id,
                    tool=call.name,
                    arguments=call.arguments,
                    fingerprint=fingerprints[index],
                    verdict=(
                        "block"
                        if index in blocked
                        else "not_run"
                        if result is None or not result.executed
                        else (verdict.verdict if verdict is not None else "allow")
                    ),
                    cache=result.cache if result is not None else "none",
                    is_error=result.is_error if result is not None else True,
                    error_kind=result.error_kind if result is not None else None,
                    duration_seconds=result.duration_seconds if result is not None else 0.0,
                )
            )
        if self._stop is not None:
            raise _Stopped(self._stop)
        return finished

    async def _execute(
        self, calls: tuple[ToolCall, ...], fingerprints: list[str], approved: list[int]
    ) -> dict[int, ToolResult]:
        self._enter("ACT", f"running {len(approved)} tool call(s)")
        await self._bus.publish(
            ToolExecute(
                run_id=self._run_id,
                turn=self._turn,
                calls=tuple(calls[i] for i in approved),
                fingerprints=tuple(fingerprints[i] for i in approved),
            )
        )
        by_id = {calls[i].id: i for i in approved}
        results: dict[int, ToolResult] = {}
        cancelled = False
        while len(results) < len(approved):
            if self._stop is not None and not cancelled and not _call_specific(self._stop):
                cancelled = True
                await self._bus.publish(
                    ToolsCancel(
                        run_id=self._run_id,
                        turn=self._turn,
                        grace_seconds=self._settings.abort_grace_seconds,
                        reason=self._stop.cause,
                    )
                )
            msg = await self._receive(
                confirming=cancelled, extra=self._settings.abort_grace_seconds
            )
            if msg is None:
                break
            match msg:
                case ToolResult(turn=turn, call_id=call_id) if (
                    turn == self._turn and call_id in by_id
                ):
                    results[by_id[call_id]] = msg
                case _:
                    self._control(msg)
        return results

    # ------------------------------------------------------------------ control inbox

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
            raise _Stopped(self._stop)

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

    def _set_stop(self, stop: StopSignal) -> None:
        if self._stop is None:  # a run needs only its first stop
            self._stop = stop
            self._trace_event("stop", f"{stop.reason.value}/{stop.cause}: {stop.detail}")

    def _require_stop(self) -> StopSignal:
        assert self._stop is not None
        return self._stop

    def _inject_nudges(self) -> None:
        for nudge in self._pending_nudges:
            key = (nudge.kind, nudge.text)
            if key in self._injected:
                continue
            self._injected.add(key)
            self._nudges += 1
            self._transcript.append(
                ChatMessage(role="user", content=nudge_text(nudge.kind, nudge.text))
            )
            self._trace_event("nudge", nudge.kind)
        self._pending_nudges.clear()

    # ------------------------------------------------------------------ bookkeeping

    def _make_stop(self, reason: ExitReason, cause: str, source: str, detail: str) -> StopSignal:
        return StopSignal(
            run_id=self._run_id, reason=reason, cause=cause, source=source, detail=detail
        )

    def _now(self) -> float:
        return round(time.monotonic() - self._started, 6)

    def _enter(self, state: RunState, event: str) -> None:
        self._state = state
        self._trace.append(TraceEntry(at=self._now(), turn=self._turn, state=state, event=event))

    def _trace_event(self, event: str, detail: str = "") -> None:
        self._trace.append(
            TraceEntry(
                at=self._now(), turn=self._turn, state=self._state, event=event, detail=detail
            )
        )

    async def _publish_started(self) -> None:
        settings = self._settings
        resume = self._in.resume
        # A resumed run's budgets go on from where it was: the deadline counts the time
        # it ran before, the tool-call budget the calls it proposed.
        max_tool_calls = max(1, settings.max_tool_calls - len(self._call_log))
        await self._bus.publish(
            RunStarted(
                run_id=self._run_id,
                trace_id=self._in.trace_id,
                task=self._in.task,
                model=settings.model,
                stage=self._in.stage,
                plan=self._in.plan,
                folder=self._in.folder,
                tools=tuple(spec.name for spec in self._in.tool_specs),
                tool_specs=self._in.tool_specs,
                max_turns=settings.max_turns,
                max_tool_calls=max_tool_calls,
                deadline_seconds=settings.deadline_seconds,
                max_cache_hits=settings.max_cache_hits,
                cache_ttl_seconds=settings.cache_ttl_seconds,
                cache_max_entries=settings.cache_max_entries,
                started_at=time.time() - (time.monotonic() - self._started),
                resumed_from_turn=resume.turn if resume is not None else None,
                output_token_budget=settings.output_token_budget or 0,
                input_token_budget=settings.input_token_budget or 0,
                cost_budget=settings.cost_budget or 0.0,
                budget_mode=settings.budget_mode,
                input_price_per_million=settings.input_price_per_million or 0.0,
                output_price_per_million=settings.output_price_per_million or 0.0,
            )
        )

    def _result(self, stop: StopSignal) -> RunResult:
        outcome = outcome_of(stop.reason)
        final_state: Literal["DONE", "FAILED"] = "DONE" if outcome.value == "done" else "FAILED"
        self._trace.append(
            TraceEntry(
                at=self._now(),
                turn=self._turn,
                state=final_state,
                event=f"{stop.reason.value}/{stop.cause}",
                detail=stop.detail,
            )
        )
        return RunResult(
            run_id=self._run_id,
            trace_id=self._in.trace_id,
            exit_reason=stop.reason,
            cause=stop.cause,
            outcome=outcome,
            detail=stop.detail,
            hint=cause_hint(stop.cause),
            turns=self._turn,
            llm_requests=self._llm_requests,
            tool_calls=self._tool_calls,
            usage=self._usage,
            output=self._output,
            incomplete=self._incomplete,
            degraded=self._degraded,
            nudges=self._nudges,
            trace=tuple(self._trace),
            call_log=tuple(self._call_log),
            transcript=tuple(self._transcript),
        )

    def _finished_message(self, result: RunResult) -> RunFinished:
        return RunFinished(
            run_id=result.run_id,
            exit_reason=result.exit_reason,
            cause=result.cause,
            outcome=result.outcome,
            detail=result.detail,
            hint=result.hint,
            turns=result.turns,
            llm_requests=result.llm_requests,
            tool_calls=result.tool_calls,
            usage=result.usage,
            incomplete=result.incomplete,
            degraded=result.degraded,
        )


_SEVERITY: Final = {"allow": 0, "warn": 1, "block": 2}


def _call_specific(stop: StopSignal) -> bool:
    return stop.cause == "budget.max_tool_calls" or stop.cause.startswith(("loop.", "hook."))


def _answerable(stop: StopSignal) -> bool:
    """A budget or loop stop; not an abort, a model or context failure, a hook, a bug."""
    return stop.cause.startswith(("budget.", "loop."))


def _joined(texts: list[str]) -> str:
    return "\n\n".join(text for text in texts if text)


def _cut_mid_json(reply: ModelReply) -> bool:
    """Whether a tool call's arguments stop mid-JSON (the output limit cut the reply, even
    if the server did not say ``length``). Complete but malformed JSON is not a cut: that
    call runs and the model reads the decoding error."""
    invalid = set(reply.invalid_tool_calls)
    return any(_unclosed_json(call.arguments) for call in reply.tool_calls if call.id in invalid)


def _unclosed_json(text: str) -> bool:
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
