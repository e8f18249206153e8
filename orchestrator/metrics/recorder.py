"""The metrics recorder: the one bus subscriber that turns messages into Prometheus metrics.

It is an **observer that drops**: it subscribes to every message type with
``on_full="drop"`` and a large mailbox (:data:`METRICS_MAILBOX_SIZE`). A run never waits for
it (a lossless observer would make a publisher wait whenever its mailbox is full, and
metrics must never slow a run); when it cannot keep up, the bus counts what it lost and
``loopfuse_bus_dropped_messages_total{subscriber="metrics_recorder"}`` shows it, which
the ``LoopfuseMetricsDropping`` alert watches. Per-run state is bounded
(:data:`MAX_TRACKED_RUNS`), so a lost ``RunFinished`` cannot make it grow forever. A bug in
the recorder is counted (``loopfuse_metrics_recorder_errors_total``) and logged, never
raised: a metrics fault must not end a run.

Cost is computed from each reply's usage and the run's prices (``RunStarted``). What the
bus does not carry yet has a method here (the seams): :meth:`record_cost`,
:meth:`record_context_action`, :meth:`observe_store_write` and :meth:`set_context_window`.
Whoever owns that fact calls the method (or publishes a
message whose ``case`` below calls it); no other code touches a metric.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Container, Iterable
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar, assert_never, cast

import anyio
from anyio.abc import TaskStatus
from prometheus_client import CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase

from actors.context import window_for
from actors.loop_monitor import SOURCE as LOOP_MONITOR
from bus import (
    AbortRequested,
    ActorFailed,
    Bus,
    BusMessage,
    ContextAction,
    ExitReason,
    ModelCancel,
    ModelError,
    ModelReplied,
    ModelReply,
    ModelRequest,
    ModelTextDelta,
    Nudge,
    Progress,
    PromptRejected,
    RunEnding,
    RunFinished,
    RunStarted,
    StopSignal,
    ToolCallProposed,
    ToolExecute,
    ToolResult,
    ToolsCancel,
    ToolVerdict,
    TurnEnded,
    TurnStarted,
)
from orchestrator.metrics.collectors import RunCounts, StateCollector
from orchestrator.metrics.definitions import Metrics
from orchestrator.metrics.labels import (
    CONTEXT_ACTIONS,
    OTHER,
    TRUNCATION_RECOVER,
    BoundedLabel,
    cause_label,
    exemplar,
    loop_detector,
    nudge_kind,
    tool_outcome,
    truncation_step,
)

__all__ = ["MAX_TRACKED_RUNS", "METRICS_MAILBOX_SIZE", "SUBSCRIBER", "MetricsRecorder"]

_Metric = TypeVar("_Metric", bound=MetricWrapperBase)

logger = logging.getLogger("loopfuse.metrics")

SUBSCRIBER: Final = "metrics_recorder"

METRICS_MAILBOX_SIZE: Final = 16_384
"""Messages the recorder may fall behind by before it drops (and counts) new ones."""

MAX_TRACKED_RUNS: Final = 100_000
"""Runs whose state the recorder keeps at most; the oldest is forgotten beyond that."""


@dataclass(slots=True)
class _Run:
    model: str
    model_label: str
    exemplar: dict[str, str]
    started: float
    input_price: float = 0.0
    output_price: float = 0.0
    retries: int = 0
    truncations: int = 0
    calls: dict[str, str] = field(default_factory=dict)


class MetricsRecorder:
    """Records every bus message of a runtime into metrics registered on ``registry``.

    :param models: model names that keep their own ``model`` label (others: ``other``).
    :param tools: tool names (a live container such as the tool registry) that keep their
        own ``tool`` label.
    :param runs: reads the runtime's run counts at scrape time.
    :param context_window: the context window (tokens) of a model name, for
        ``loopfuse_model_prompt_window_ratio``; by default the context gatekeeper's table
        (:func:`actors.context.window_for`). :meth:`set_context_window` overrides it.
    :param clock: monotonic seconds, for run durations.
    :param mailbox_size: messages it may fall behind by before it drops new ones.
    """

    def __init__(
        self,
        bus: Bus,
        registry: CollectorRegistry,
        *,
        models: Iterable[str] = (),
        tools: Container[str] = (),
        runs: Callable[[], RunCounts] | None = None,
        context_window: Callable[[str], int | None] = window_for,
        clock: Callable[[], float] = time.monotonic,
        mailbox_size: int = METRICS_MAILBOX_SIZE,
    ) -> None:
        self._bus = bus
        self._mailbox_size = mailbox_size
        self.metrics = Metrics(registry)
        self._models = BoundedLabel()
        self._tools = BoundedLabel(tools)
        self._windows: dict[str, int] = {}
        self._window_of = context_window
        self._clock = clock
        self._runs: dict[str, _Run] = {}
        # prometheus_client's labels() validates and locks on every call: children are
        # looked up once per label set and kept.
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        self.collector = StateCollector(bus, runs or (lambda: RunCounts(0, 0, 0)))
        registry.register(self.collector)
        self.add_models(models)
        self.metrics.add_tools(self._tools.values())

    # ------------------------------------------------------------------ lifecycle

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Record until the bus closes this subscription."""
        subscription = self._bus.subscribe(
            name=SUBSCRIBER, on_full="drop", capacity=self._mailbox_size, inline=True
        )
        try:
            await subscription.serve(self._record, task_status=task_status)
        finally:
            self._bus.unsubscribe(subscription)

    def _record(self, msg: BusMessage) -> None:
        try:
            self.handle(msg)
        except Exception:
            logger.exception("metrics recorder failed on %s", type(msg).__name__)
            self.metrics.recorder_errors.inc()

    def _labelled(self, metric: _Metric, *values: str) -> _Metric:
        key = (id(metric), values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*values)
        return cast(_Metric, child)

    # ------------------------------------------------------------------ label sets

    def add_models(self, models: Iterable[str]) -> None:
        """Give each of ``models`` its own ``model`` label (zero series created now)."""
        names = tuple(models)
        self._models.add(names)
        self.metrics.add_models(names)

    def add_tools(self, tools: Iterable[str]) -> None:
        """Give each of ``tools`` its own ``tool`` label (zero series created now), for tools
        registered after the recorder was made (a scenario's scripted tools)."""
        names = tuple(tools)
        self._tools.add(names)
        self.metrics.add_tools(names)

    # ------------------------------------------------------------------ seams

    def record_cost(self, model: str, cost: float) -> None:
        """Add ``cost`` (in the currency of the configured prices) spent on ``model``, for
        spend the bus does not show (replies' usage times the run's prices is counted
        already)."""
        if cost > 0:
            self._labelled(self.metrics.model_cost, self._models(model)).inc(cost)

    def record_context_action(self, action: str) -> None:
        """Count one ``collapse`` or ``compact`` of a transcript, or a ``silent_truncation``
        seen (the context gatekeeper's).

        :raises ValueError: ``action`` is not one of :data:`~labels.CONTEXT_ACTIONS`.
        """
        if action not in CONTEXT_ACTIONS:
            raise ValueError(f"context action {action!r} is not one of {CONTEXT_ACTIONS}")
        self._labelled(self.metrics.context_actions, action).inc()

    def observe_store_write(self, seconds: float) -> None:
        """Record one durable-store write (commit) that took ``seconds``."""
        self.metrics.store_write_duration.observe(seconds)

    def set_context_window(self, model: str, tokens: int) -> None:
        """Use ``tokens`` as ``model``'s context window for the prompt/window ratio.

        :raises ValueError: ``tokens`` is not positive.
        """
        if tokens <= 0:
            raise ValueError(f"context window of {model!r} must be positive, got {tokens}")
        self._windows[model] = tokens

    def tracked_runs(self) -> int:
        """Runs whose state the recorder holds (started, not yet finished)."""
        return len(self._runs)

    # ------------------------------------------------------------------ messages

    def handle(self, msg: BusMessage) -> None:
        """Record one message; never blocks."""
        m = self.metrics
        self._labelled(m.bus_messages, type(msg).__name__).inc()
        match msg:
            case RunStarted():
                m.runs_started.inc()
                self._start(msg)
            case RunFinished():
                self._finish(msg)
            case TurnStarted():
                m.turns.inc()
            case ModelRequest():
                run = self._run(msg.run_id)
                run.retries = 0
                if msg.model != run.model:
                    run.model, run.model_label = msg.model, self._models(msg.model)
            case ModelError():
                run = self._run(msg.run_id)
                self._labelled(m.model_requests, run.model_label, msg.kind).inc()
                if not msg.final:
                    run.retries += 1
            case ModelReply():
                self._reply(msg)
            case ModelReplied():
                if msg.finish_reason == "length":
                    self._run(msg.run_id).truncations += 1
            case ToolCallProposed():
                self._run(msg.run_id).calls[msg.call.id] = self._tools(msg.call.name)
            case ToolVerdict():
                self._verdict_seen(msg)
            case ToolResult():
                self._tool_result(msg)
            case Nudge():
                self._labelled(m.nudges, nudge_kind(msg.kind)).inc()
                if msg.source == LOOP_MONITOR and msg.kind == "loop.content":
                    # The only loop nudge without a verdict: streamed text cut (critical).
                    self._labelled(m.loop_detections, loop_detector(msg.kind), "critical").inc()
            case StopSignal():
                if msg.cause.startswith("loop."):
                    self._labelled(m.loop_detections, loop_detector(msg.cause), "break").inc()
            case ContextAction():
                # "blocked" is counted from the run's ending (blocking_limit), once.
                if msg.kind in CONTEXT_ACTIONS:
                    self._labelled(m.context_actions, msg.kind).inc()
            case (
                RunEnding()
                | TurnEnded()
                | Progress()
                | ModelTextDelta()
                | ModelCancel()
                | ToolExecute()
                | ToolsCancel()
                | AbortRequested()
                | ActorFailed()
                | PromptRejected()  # the refusal is counted as ModelError(context_length)
            ):
                pass
            case _:
                assert_never(msg)

    # ------------------------------------------------------------------ internals

    def _start(self, msg: RunStarted) -> None:
        self._runs.pop(msg.run_id, None)
        self._runs[msg.run_id] = _Run(
            model=msg.model,
            model_label=self._models(msg.model),
            exemplar=exemplar(msg.run_id, msg.trace_id),
            started=self._clock(),
            input_price=msg.input_price_per_million / 1_000_000,
            output_price=msg.output_price_per_million / 1_000_000,
        )
        while len(self._runs) > MAX_TRACKED_RUNS:
            del self._runs[next(iter(self._runs))]

    def _run(self, run_id: str) -> _Run:
        """The state of ``run_id``; made up (unknown model, started now) if its
        ``RunStarted`` was not seen."""
        run = self._runs.get(run_id)
        if run is None:
            run = _Run(
                model="", model_label=OTHER, exemplar=exemplar(run_id), started=self._clock()
            )
            self._runs[run_id] = run
            while len(self._runs) > MAX_TRACKED_RUNS:
                del self._runs[next(iter(self._runs))]
        return run

    def _finish(self, msg: RunFinished) -> None:
        m = self.metrics
        run = self._runs.pop(msg.run_id, None)
        reason = msg.exit_reason.value
        cause = cause_label(msg.cause)
        ex = run.exemplar if run is not None else exemplar(msg.run_id)
        self._labelled(m.runs_finished, reason, cause, msg.outcome.value).inc(exemplar=ex)
        self._labelled(m.run_turns, reason).observe(msg.turns)
        if run is None:
            return
        self._labelled(m.run_duration, reason).observe(max(self._clock() - run.started, 0.0), ex)
        if msg.exit_reason is ExitReason.BLOCKING_LIMIT:
            self._labelled(m.blocked_requests, run.model_label).inc()
        # Each reply cut by the output limit was answered with a recovery nudge, except
        # the last one when the run gave up.
        recoveries = run.truncations - (1 if msg.cause == "truncation.gave_up" else 0)
        for number in range(1, recoveries + 1):
            self._labelled(m.truncation_recoveries, truncation_step(number)).inc()
        if recoveries > 0:
            self._labelled(m.nudges, TRUNCATION_RECOVER).inc(recoveries)
        if msg.cause == "truncation.gave_up":
            self._labelled(m.truncation_recoveries, "gave_up").inc()

    def _reply(self, msg: ModelReply) -> None:
        m = self.metrics
        run = self._run(msg.run_id)
        model = run.model_label
        # Attempts beyond the retried failures were silent retries with a higher output
        # limit (the first step of truncation recovery).
        escalations = max(msg.attempts - 1 - run.retries, 0)
        if escalations:
            self._labelled(m.model_requests, model, "ok").inc(escalations)
            self._labelled(m.truncation_recoveries, "escalate").inc(escalations)
        self._labelled(m.model_requests, model, "aborted" if msg.aborted else "ok").inc()
        self._labelled(m.model_duration, model).observe(msg.latency_seconds, run.exemplar)
        if msg.ttft_seconds is not None:
            self._labelled(m.model_ttft, model).observe(msg.ttft_seconds, run.exemplar)
        usage = msg.usage
        self._labelled(m.model_tokens, model, "input").inc(usage.prompt_tokens)
        self._labelled(m.model_tokens, model, "output").inc(usage.completion_tokens)
        cost = usage.prompt_tokens * run.input_price + usage.completion_tokens * run.output_price
        if cost > 0:
            self._labelled(m.model_cost, model).inc(cost)
        if usage.prompt_tokens > 0:
            self._labelled(m.prompt_tokens, model).observe(usage.prompt_tokens)
            window = self._window(run)
            if window:
                self._labelled(m.prompt_window_ratio, model).observe(usage.prompt_tokens / window)

    def _window(self, run: _Run) -> int | None:
        window = self._windows.get(run.model)
        if window is None:
            window = self._window_of(run.model)
            if window is not None and run.model_label != OTHER:  # cache known models only
                self._windows[run.model] = window
        return window

    def _tool_result(self, msg: ToolResult) -> None:
        run = self._runs.get(msg.run_id)
        tool = run.calls.pop(msg.call_id, None) if run is not None else None
        tool = tool or self._tools(msg.tool)
        self._labelled(self.metrics.tool_calls, tool, tool_outcome(msg)).inc()
        if msg.executed and msg.cache != "hit":
            ex = run.exemplar if run is not None else None
            self._labelled(self.metrics.tool_duration, tool).observe(msg.duration_seconds, ex)

    def _verdict_seen(self, msg: ToolVerdict) -> None:
        if msg.verdict == "allow":
            return
        if msg.verdict == "block":
            run = self._runs.get(msg.run_id)
            tool = run.calls.pop(msg.call_id, None) if run is not None else None
            if tool is not None:  # once per call, however many monitors block it
                self._labelled(self.metrics.tool_calls, tool, "blocked").inc()
        if msg.source == LOOP_MONITOR and msg.cause.startswith("loop."):
            level = "warning" if msg.verdict == "warn" else "critical"
            self._labelled(self.metrics.loop_detections, loop_detector(msg.cause), level).inc()
