"""The trace exporter: the bus observer that turns a run's messages into OpenTelemetry spans,
following the GenAI semantic conventions (the span tree: ``docs/tracing.md``).

The run span's trace id is the run's ``trace_id``; a run started with a ``traceparent``
(``RunStarted.traceparent``) is a child of the caller's span. The LLM caller asks
:meth:`TraceExporter.traceparent` for the header that names a request's chat span.

An **inline observer**: the bus calls its synchronous handlers during each publish, so each
span starts and ends when its message is published, and nothing ever waits for it. Ended
spans go to a bounded queue exported by an SDK thread (a full queue loses the span,
counted). A fault in here is logged and counted, never raised (a raise would end the run).
Per-run state is bounded (:data:`MAX_TRACKED_RUNS`).
"""

from __future__ import annotations

import logging
import re
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, NamedTuple

import anyio
from anyio.abc import TaskStatus
from opentelemetry.context import Context
from opentelemetry.trace import (
    NonRecordingSpan,
    Span,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    set_span_in_context,
)

from bus import (
    AbortRequested,
    ActorFailed,
    Bus,
    ContextAction,
    Message,
    ModelError,
    ModelReply,
    ModelRequest,
    Nudge,
    Outcome,
    RunFinished,
    RunStarted,
    StopSignal,
    ToolExecute,
    ToolResult,
    ToolVerdict,
)
from orchestrator.tracing.content import input_messages, output_messages
from orchestrator.tracing.provider import INSTRUMENTATION, TracingPipeline
from orchestrator.tracing.traceparent import format_traceparent, parse_traceparent

__all__ = ["AGENT_NAME", "MAX_TRACKED_RUNS", "SUBSCRIBER", "TraceExporter", "TraceStatistics"]

logger = logging.getLogger("loopfuse.tracing")

SUBSCRIBER: Final = "trace_exporter"
AGENT_NAME: Final = "loopfuse"
"""``gen_ai.agent.name`` of every run span (``invoke_agent loopfuse``)."""
MAX_TRACKED_RUNS: Final = 100_000
"""Runs whose spans the exporter keeps open at most; the oldest is ended beyond that."""

_TRACE_ID: Final = re.compile("[0-9a-f]{32}")


class TraceStatistics(NamedTuple):
    """The exporter at a glance (exported as metrics)."""

    runs: int
    """Runs with an open span."""
    queued: int
    dropped: int
    exported: int
    failed: int
    errors: int
    """Messages the exporter failed on (logged; the run went on)."""


@dataclass(slots=True)
class _Run:
    span: Span
    context: Context
    chats: dict[int, tuple[Span, str]]  # by turn: the open chat span and its traceparent
    tools: dict[str, Span]  # by call id


class TraceExporter:
    """Spans of every run on ``bus``, ended into ``pipeline``'s provider.

    :param capture_content: put prompts, replies, tool arguments and results, nudge texts
        and stop details on the spans (off: only names, ids, counts and causes).
    :param base_url: the model endpoint (``server.address`` and ``server.port`` of chat
        spans whose reply came from it; not of those the simulator answered in process).
    :param provider: ``gen_ai.provider.name`` (:mod:`orchestrator.tracing.gen_ai_provider`).
    """

    def __init__(
        self,
        bus: Bus,
        pipeline: TracingPipeline,
        *,
        capture_content: bool = False,
        base_url: str | None = None,
        provider: str = "openai",
    ) -> None:
        self._bus = bus
        self._pipeline = pipeline
        self._tracer = pipeline.provider.get_tracer(INSTRUMENTATION)
        self._ids = pipeline.ids
        self._content = capture_content
        self._server = _server(base_url)
        self._provider = provider
        self._workflows: dict[str, _Run] = {}  # pipeline run id → its workflow span
        self._runs: dict[str, _Run] = {}
        self._errors = 0
        # Epoch nanoseconds that never go back (durations from a monotonic clock).
        self._epoch = time.time_ns() - time.perf_counter_ns()
        handlers: dict[type[Message], Callable[[Any], None]] = {
            RunStarted: self._run_started,
            RunFinished: self._run_finished,
            ModelRequest: self._model_request,
            ModelError: self._model_error,
            ModelReply: self._model_reply,
            ToolExecute: self._tool_execute,
            ToolResult: self._tool_result,
            ToolVerdict: self._verdict,
            Nudge: self._nudge,
            StopSignal: self._stop,
            ContextAction: self._context_action,
            AbortRequested: self._abort,
            ActorFailed: self._actor_failed,
        }
        self._handlers = {kind: self._guarded(h) for kind, h in handlers.items()}

    # ------------------------------------------------------------------ lifecycle

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Export until the bus closes this subscription; then end the spans still open."""
        sub = self._bus.subscribe(*self._handlers, name=SUBSCRIBER, on_full="drop", inline=True)
        try:
            await sub.serve_by_type(self._handlers, task_status=task_status)
        finally:
            self._bus.unsubscribe(sub)
            now = self._now()
            for run in (*self._runs.values(), *self._workflows.values()):
                _end(run, now, unfinished=True)
            self._runs.clear()
            self._workflows.clear()

    def statistics(self) -> TraceStatistics:
        return TraceStatistics(len(self._runs), *self._pipeline.processor.counts(), self._errors)

    def traceparent(self, request: ModelRequest) -> str | None:
        """The ``traceparent`` header naming ``request``'s chat span (``None``: none open)."""
        run = self._runs.get(request.run_id)
        chat = run.chats.get(request.turn) if run is not None else None
        return chat[1] if chat is not None else None

    # ------------------------------------------------------------------ internals

    def _now(self) -> int:
        return self._epoch + time.perf_counter_ns()

    def _guarded(self, handler: Callable[[Any], None]) -> Callable[[Any], None]:
        def guarded(msg: Message) -> None:
            try:
                handler(msg)
            except Exception:
                self._errors += 1
                logger.exception("trace exporter failed on %s", type(msg).__name__)

        return guarded

    def _start(
        self, name: str, context: Context, kind: SpanKind, attributes: dict[str, Any], now: int
    ) -> Span:
        return self._tracer.start_span(
            name, context=context, kind=kind, attributes=attributes, start_time=now
        )

    def _track(self, runs: dict[str, _Run], run_id: str, span: Span, now: int) -> _Run:
        """``span`` as the open span of ``run_id`` in ``runs``; the oldest beyond
        :data:`MAX_TRACKED_RUNS` is ended."""
        run = runs[run_id] = _Run(span, set_span_in_context(span, Context()), {}, {})
        while len(runs) > MAX_TRACKED_RUNS:
            _end(runs.pop(next(iter(runs))), now, unfinished=True)
        return run

    # ------------------------------------------------------------------ the run

    def _run_started(self, msg: RunStarted) -> None:
        now = self._now()
        if (earlier := self._runs.pop(msg.run_id, None)) is not None:
            _end(earlier, now, unfinished=True)
        parent = parse_traceparent(msg.traceparent)
        workflow = self._workflow_of(msg, now)
        if workflow is not None:  # a pipeline's stage run: a child of the pipeline's span
            context = workflow.context
        elif parent is not None and parent.trace_id == msg.trace_id:
            caller = SpanContext(
                int(parent.trace_id, 16),
                int(parent.span_id, 16),
                is_remote=True,
                trace_flags=TraceFlags(parent.flags),
            )
            context = set_span_in_context(NonRecordingSpan(caller), Context())
        else:
            context = Context()  # a root span, whatever the current context holds
            self._ids.next_trace_id = _trace_id(msg.trace_id)
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": AGENT_NAME,
            "gen_ai.provider.name": self._provider,
            "gen_ai.request.model": msg.model,
            "gen_ai.conversation.id": msg.run_id,
            "loopfuse.run_id": msg.run_id,
            "loopfuse.stage": msg.stage,
            "loopfuse.tools": msg.tools,
            "loopfuse.budget.max_turns": msg.max_turns,
            "loopfuse.budget.max_tool_calls": msg.max_tool_calls,
            "loopfuse.budget.deadline_seconds": msg.deadline_seconds,
        }
        if msg.output_token_budget:
            attributes["loopfuse.budget.output_tokens"] = msg.output_token_budget
            attributes["loopfuse.budget.mode"] = msg.budget_mode
        if msg.input_token_budget:
            attributes["loopfuse.budget.input_tokens"] = msg.input_token_budget
        if msg.cost_budget:
            attributes["loopfuse.budget.cost"] = msg.cost_budget
        if msg.resumed_from_turn is not None:
            attributes["loopfuse.resumed_from_turn"] = msg.resumed_from_turn
        if self._content:
            attributes["loopfuse.task"] = msg.task
        span = self._start(
            f"invoke_agent {AGENT_NAME}", context, SpanKind.INTERNAL, attributes, now
        )
        self._track(self._runs, msg.run_id, span, now)

    def _workflow_of(self, msg: RunStarted, now: int) -> _Run | None:
        """The span of the pipeline ``msg`` is a stage run of (``RUN.STAGE``), started at its
        first stage run; ``None`` for a run of its own."""
        pipeline, dot, rest = msg.run_id.partition(".")
        if not dot or not rest.startswith(msg.stage):
            return None
        workflow = self._workflows.get(pipeline)
        if workflow is None:
            self._ids.next_trace_id = _trace_id(msg.trace_id)
            attributes = {
                "gen_ai.operation.name": "invoke_workflow",
                "gen_ai.provider.name": self._provider,
                "loopfuse.run_id": pipeline,
            }
            name = f"invoke_workflow {AGENT_NAME}"
            span = self._start(name, Context(), SpanKind.INTERNAL, attributes, now)
            workflow = self._track(self._workflows, pipeline, span, now)
        return workflow

    def _run_finished(self, msg: RunFinished) -> None:
        run = self._runs.pop(msg.run_id, None) or self._workflows.pop(msg.run_id, None)
        if run is None:
            return
        span = run.span
        span.set_attributes(
            {
                "loopfuse.exit_reason": msg.exit_reason.value,
                "loopfuse.cause": msg.cause,
                "loopfuse.outcome": msg.outcome.value,
                "loopfuse.turns": msg.turns,
                "loopfuse.llm_requests": msg.llm_requests,
                "loopfuse.tool_calls": msg.tool_calls,
                "loopfuse.incomplete": msg.incomplete,
                "loopfuse.degraded": msg.degraded,
                "gen_ai.usage.input_tokens": msg.usage.prompt_tokens,
                "gen_ai.usage.output_tokens": msg.usage.completion_tokens,
            }
        )
        if self._content and msg.detail:
            span.set_attribute("loopfuse.detail", msg.detail)
        if msg.outcome is Outcome.FAILED:
            span.set_attribute("error.type", msg.cause)
            span.set_status(Status(StatusCode.ERROR, msg.cause))
        # Chats and tools a stop cut short end with the run.
        _end(run, self._now(), unfinished=False)

    # ------------------------------------------------------------------ model requests

    def _model_request(self, msg: ModelRequest) -> None:
        run = self._runs.get(msg.run_id)
        if run is None:
            return
        now = self._now()
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": self._provider,
            "gen_ai.request.model": msg.model,
            "loopfuse.turn": msg.turn,
        }
        if msg.max_tokens is not None:
            attributes["gen_ai.request.max_tokens"] = msg.max_tokens
        if msg.purpose != "turn":
            attributes["loopfuse.purpose"] = msg.purpose
        if self._content:
            attributes["gen_ai.input.messages"] = input_messages(msg.messages)
        span = self._start(f"chat {msg.model}", run.context, SpanKind.CLIENT, attributes, now)
        if (earlier := run.chats.get(msg.turn)) is not None:
            earlier[0].end(end_time=now)
        ids = span.get_span_context()
        header = format_traceparent(f"{ids.trace_id:032x}", f"{ids.span_id:016x}", ids.trace_flags)
        run.chats[msg.turn] = (span, header)

    def _model_error(self, msg: ModelError) -> None:
        run = self._runs.get(msg.run_id)
        if run is None or (chat := run.chats.get(msg.turn)) is None:
            return
        span, now = chat[0], self._now()
        event: dict[str, Any] = {
            "error.type": msg.kind,
            "loopfuse.attempt": msg.attempt,
            "loopfuse.final": msg.final,
        }
        if msg.status is not None:
            event["http.response.status_code"] = msg.status
        span.add_event("loopfuse.model_error", event, timestamp=now)
        if msg.final:
            del run.chats[msg.turn]
            span.set_attributes(self._server)  # a failed request: the endpoint was asked
            span.set_attribute("error.type", msg.kind)
            span.set_attribute("loopfuse.attempts", msg.attempt)
            span.set_status(Status(StatusCode.ERROR, msg.kind))
            span.end(end_time=now)

    def _model_reply(self, msg: ModelReply) -> None:
        run = self._runs.get(msg.run_id)
        chat = run.chats.pop(msg.turn, None) if run is not None else None
        if chat is None:
            return
        span = chat[0]
        usage = msg.usage
        attributes: dict[str, Any] = {
            "gen_ai.usage.input_tokens": usage.prompt_tokens,
            "gen_ai.usage.output_tokens": usage.completion_tokens,
            "loopfuse.attempts": msg.attempts,
            "loopfuse.tool_calls": len(msg.tool_calls),
        }
        if not msg.in_process:  # answered by the endpoint, not by a script in process
            attributes.update(self._server)
        if msg.response_id:
            attributes["gen_ai.response.id"] = msg.response_id
        if msg.response_model:
            attributes["gen_ai.response.model"] = msg.response_model
        if msg.finish_reason is not None:
            attributes["gen_ai.response.finish_reasons"] = (msg.finish_reason,)
        if msg.ttft_seconds is not None:
            attributes["gen_ai.response.time_to_first_chunk"] = msg.ttft_seconds
        if usage.estimated:
            attributes["loopfuse.usage_estimated"] = True
        if msg.aborted:
            attributes["loopfuse.aborted"] = True
        if self._content:
            attributes["gen_ai.output.messages"] = output_messages(
                msg.text, msg.tool_calls, msg.finish_reason
            )
        span.set_attributes(attributes)
        span.end(end_time=self._now())

    # ------------------------------------------------------------------ tool calls

    def _tool_execute(self, msg: ToolExecute) -> None:
        run = self._runs.get(msg.run_id)
        if run is None:
            return
        now = self._now()
        for call in msg.calls:
            attributes: dict[str, Any] = {
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": call.name,
                "gen_ai.tool.call.id": call.id,
                "gen_ai.tool.type": "function",
                "loopfuse.turn": msg.turn,
            }
            if self._content:
                attributes["gen_ai.tool.call.arguments"] = call.arguments
            name = f"execute_tool {call.name}"
            run.tools[call.id] = self._start(name, run.context, SpanKind.INTERNAL, attributes, now)

    def _tool_result(self, msg: ToolResult) -> None:
        run = self._runs.get(msg.run_id)
        span = run.tools.pop(msg.call_id, None) if run is not None else None
        if span is None:
            return
        if msg.cache != "none":
            span.set_attribute("loopfuse.cache", msg.cache)
        if not msg.executed:
            span.set_attribute("loopfuse.executed", False)
        if msg.is_error:
            kind = msg.error_kind or "tool_error"
            span.set_attribute("error.type", kind)
            span.set_status(Status(StatusCode.ERROR, kind))
        if self._content:
            span.set_attribute("gen_ai.tool.call.result", msg.content)
        span.end(end_time=self._now())

    # ------------------------------------------------------------------ events of the run

    def _add_event(self, run_id: str, name: str, event: dict[str, Any]) -> None:
        if (run := self._runs.get(run_id)) is not None:
            run.span.add_event(name, event, timestamp=self._now())

    def _verdict(self, msg: ToolVerdict) -> None:
        if msg.verdict == "allow":
            return
        event: dict[str, Any] = {
            "loopfuse.verdict": msg.verdict,
            "loopfuse.cause": msg.cause,
            "loopfuse.source": msg.source,
            "gen_ai.tool.call.id": msg.call_id,
            "loopfuse.turn": msg.turn,
        }
        if self._content and msg.message:
            event["loopfuse.message"] = msg.message
        self._add_event(msg.run_id, "loopfuse.verdict", event)

    def _nudge(self, msg: Nudge) -> None:
        event: dict[str, Any] = {
            "loopfuse.kind": msg.kind,
            "loopfuse.source": msg.source,
            "loopfuse.continues": msg.continues,
        }
        if self._content:
            event["loopfuse.text"] = msg.text
        self._add_event(msg.run_id, "loopfuse.nudge", event)

    def _stop(self, msg: StopSignal) -> None:
        event: dict[str, Any] = {
            "loopfuse.exit_reason": msg.reason.value,
            "loopfuse.cause": msg.cause,
            "loopfuse.source": msg.source,
        }
        if self._content and msg.detail:
            event["loopfuse.detail"] = msg.detail
        self._add_event(msg.run_id, "loopfuse.stop", event)

    def _context_action(self, msg: ContextAction) -> None:
        event: dict[str, Any] = {
            "loopfuse.kind": msg.kind,
            "loopfuse.reactive": msg.reactive,
            "loopfuse.turn": msg.turn,
            "loopfuse.estimate_tokens": msg.estimate_tokens,
            "loopfuse.after_tokens": msg.after_tokens,
            "loopfuse.limit_tokens": msg.limit_tokens,
        }
        self._add_event(msg.run_id, "loopfuse.context", event)

    def _abort(self, msg: AbortRequested) -> None:
        self._add_event(msg.run_id, "loopfuse.abort", {"loopfuse.source": msg.source})

    def _actor_failed(self, msg: ActorFailed) -> None:
        self._add_event(msg.run_id, "loopfuse.actor_failed", {"loopfuse.actor": msg.actor})


def _end(run: _Run, now: int, *, unfinished: bool) -> None:
    """End ``run``'s open spans, itself last (``unfinished``: its end was not seen)."""
    for span in (*(chat[0] for chat in run.chats.values()), *run.tools.values(), run.span):
        if unfinished:
            span.set_attribute("loopfuse.unfinished", True)
        span.end(end_time=now)


def _trace_id(text: str) -> int:
    """``text`` (a run's ``trace_id``) as an OpenTelemetry trace id; 0 when it is not one
    (32 hex digits, not all zeros): the span then gets a random one."""
    return int(text, 16) if _TRACE_ID.fullmatch(text) else 0


def _server(base_url: str | None) -> dict[str, Any]:
    """``server.address`` and ``server.port`` of the endpoint at ``base_url``."""
    if not base_url:
        return {}
    try:
        url = urllib.parse.urlsplit(base_url)
        port = url.port or (443 if url.scheme == "https" else 80)
    except ValueError:
        return {}
    return {"server.address": url.hostname, "server.port": port} if url.hostname else {}
