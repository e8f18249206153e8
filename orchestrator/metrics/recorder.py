"""The metrics recorder: the one bus subscriber that turns messages into Prometheus metrics.

An inline observer of every message type: it counts each message and calls its type's
handler (:meth:`MetricsRecorder.handlers`; the types of :data:`COUNTED_ONLY` have none).
Series are plain numbers (:mod:`orchestrator.metrics.series`), turned into samples only
when the registry is scraped. Per-run state is bounded (:data:`MAX_TRACKED_RUNS`), so a lost
``RunFinished`` cannot make it grow forever. A fault in the recorder is counted
(``loopfuse_metrics_recorder_errors_total``) and logged, never raised: a metrics fault must
not end a run. Cost is each reply's usage times the run's prices (``RunStarted``); facts the
bus does not carry have a method here (:meth:`~MetricsRecorder.record_cost`,
:meth:`~MetricsRecorder.record_context_action`, :meth:`~MetricsRecorder.observe_store_write`,
:meth:`~MetricsRecorder.set_context_window`), and no other code touches a metric.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Container, Iterable
from dataclasses import dataclass
from typing import Any, Final

import anyio
from anyio.abc import TaskStatus
from prometheus_client import CollectorRegistry

from actors.context import window_for
from actors.loop.monitor import SOURCE as LOOP_MONITOR
from bus import (
    AbortRequested,
    ActorFailed,
    Bus,
    BusMessage,
    ContextAction,
    ExitReason,
    Message,
    ModelCancel,
    ModelError,
    ModelReplied,
    ModelReply,
    ModelRequest,
    ModelTextDelta,
    Notice,
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
from orchestrator.metrics.series import CounterSeries, HistogramSeries

__all__ = ["MAX_TRACKED_RUNS", "METRICS_MAILBOX_SIZE", "SUBSCRIBER", "MetricsRecorder"]

logger = logging.getLogger("loopfuse.metrics")

SUBSCRIBER: Final = "metrics_recorder"

METRICS_MAILBOX_SIZE: Final = 16_384
"""The capacity its subscription names (an inline subscriber never falls behind)."""

MAX_TRACKED_RUNS: Final = 100_000
"""Runs whose state the recorder keeps at most; the oldest is forgotten beyond that."""

MAX_CACHED_WINDOWS: Final = 1_024
"""Model names whose context window is remembered (beyond that the cache starts over)."""

COUNTED_ONLY: Final[tuple[type[Message], ...]] = (
    RunEnding,
    TurnEnded,
    Progress,
    ModelTextDelta,
    ModelCancel,
    ToolExecute,
    ToolsCancel,
    AbortRequested,
    ActorFailed,
    Notice,
    PromptRejected,  # the refusal is counted as ModelError(context_length)
)
"""Message types only counted (``loopfuse_bus_messages_total``); every other type has a
handler."""


class _ModelSeries:
    """The series of one ``model`` label, looked up once (all exist from the start)."""

    __slots__ = (
        "aborted",
        "blocked",
        "cost",
        "duration",
        "label",
        "ok",
        "prompt_tokens",
        "tokens_in",
        "tokens_out",
        "ttft",
        "window_ratio",
    )

    def __init__(self, metrics: Metrics, label: str) -> None:
        self.label = label
        self.ok = metrics.model_requests.labels(label, "ok")
        self.aborted = metrics.model_requests.labels(label, "aborted")
        self.duration = metrics.model_duration.labels(label)
        self.ttft = metrics.model_ttft.labels(label)
        self.tokens_in = metrics.model_tokens.labels(label, "input")
        self.tokens_out = metrics.model_tokens.labels(label, "output")
        self.cost = metrics.model_cost.labels(label)
        self.prompt_tokens = metrics.prompt_tokens.labels(label)
        self.window_ratio = metrics.prompt_window_ratio.labels(label)
        self.blocked = metrics.blocked_requests.labels(label)


class _ToolSeries:
    """The series of one ``tool`` label, each looked up at its first use (a tool
    registered after the recorder was made has no series until it is called)."""

    __slots__ = ("duration", "label", "outcomes")

    def __init__(self, label: str) -> None:
        self.label = label
        self.outcomes: dict[str, CounterSeries] = {}
        self.duration: HistogramSeries | None = None


@dataclass(slots=True)
class _Run:
    model: str
    series: _ModelSeries
    exemplar: dict[str, str]
    started: float
    input_price: float = 0.0
    output_price: float = 0.0
    retries: int = 0
    truncations: int = 0
    calls: dict[str, _ToolSeries] | None = None  # by call id, made at the first call


class MetricsRecorder:
    """Records every bus message of a runtime into metrics registered on ``registry``.

    :param models: model names that keep their own ``model`` label (others: ``other``).
    :param tools: tool names (a live container such as the tool registry) that keep their
        own ``tool`` label. A name once found there keeps its label (tools are added to a
        registry, never removed).
    :param runs: reads the runtime's run counts at scrape time.
    :param clock: monotonic seconds, for run durations.
    :param mailbox_size: the subscription's mailbox capacity (:data:`METRICS_MAILBOX_SIZE`);
        inline, the recorder handles each message during its publish and drops none.
    :param max_runs: runs whose state is kept at most (:data:`MAX_TRACKED_RUNS`); beyond
        that the oldest is forgotten.
    """

    def __init__(
        self,
        bus: Bus,
        registry: CollectorRegistry,
        *,
        models: Iterable[str] = (),
        tools: Container[str] = (),
        runs: Callable[[], RunCounts] | None = None,
        clock: Callable[[], float] = time.monotonic,
        mailbox_size: int = METRICS_MAILBOX_SIZE,
        max_runs: int = MAX_TRACKED_RUNS,
    ) -> None:
        self._bus = bus
        self._mailbox_size = mailbox_size
        self._max_runs = max_runs
        self.metrics = m = Metrics(registry)
        self._models = BoundedLabel()
        self._tools = BoundedLabel(tools)
        self._tool_names: dict[str, _ToolSeries] = {}  # kept names: bounded by the registry
        self._tool_series: dict[str, _ToolSeries] = {}  # by label
        self._windows: dict[str, int] = {}  # model name -> window (0: none), cached
        self._windows_set: dict[str, int] = {}  # set_context_window's, never forgotten
        self._clock = clock
        self._runs: dict[str, _Run] = {}
        self._model_series: dict[str, _ModelSeries] = {}
        self._runs_started = m.runs_started.labels()
        self._turns = m.turns.labels()
        self._errors = m.recorder_errors.labels()
        self._store_writes = m.store_write_duration.labels()
        self._escalations = m.truncation_recoveries.labels("escalate")
        self._actions = {action: m.context_actions.labels(action) for action in CONTEXT_ACTIONS}
        # Each type's message counter and handler (None: only counted), made at its first
        # message: one dict lookup per message.
        self._kinds: dict[type, tuple[CounterSeries, Callable[[Any], None] | None]] = {}
        self._handlers: dict[type, Callable[[Any], None]] = {
            RunStarted: self._run_started,
            RunFinished: self._finish,
            TurnStarted: self._turn_started,
            ModelRequest: self._model_request,
            ModelError: self._model_error,
            ModelReply: self._reply,
            ModelReplied: self._replied,
            ToolCallProposed: self._call_proposed,
            ToolVerdict: self._verdict_seen,
            ToolResult: self._tool_result,
            Nudge: self._nudge,
            StopSignal: self._stop_signal,
            ContextAction: self._context_action,
        }
        registry.register(StateCollector(bus, runs or (lambda: RunCounts(0, 0, 0))))
        self.add_models(models)
        if isinstance(tools, Iterable):  # the names known now (a registry's) get zero series
            self.metrics.add_tools(sorted({name for name in tools if isinstance(name, str)}))

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
        # :meth:`handle` written out (the bus calls this for every message: one call less).
        try:
            counted, handler = self._kinds.get(type(msg)) or self._kind(type(msg))
            counted.value += 1
            if handler is not None:
                handler(msg)
        except Exception:
            logger.exception("metrics recorder failed on %s", type(msg).__name__)
            self._errors.value += 1

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
            self._series_of(self._models(model)).cost.value += cost

    def record_context_action(self, action: str) -> None:
        """Count one ``collapse`` or ``compact`` of a transcript, or a ``silent_truncation``
        seen (the context gatekeeper's).

        :raises ValueError: ``action`` is not one of :data:`~labels.CONTEXT_ACTIONS`.
        """
        if action not in CONTEXT_ACTIONS:
            raise ValueError(f"context action {action!r} is not one of {CONTEXT_ACTIONS}")
        self._actions[action].value += 1

    def observe_store_write(self, seconds: float) -> None:
        """Record one durable-store write (commit) that took ``seconds``."""
        self._store_writes.observe(seconds)

    def set_context_window(self, model: str, tokens: int) -> None:
        """Use ``tokens`` as ``model``'s context window for the prompt/window ratio.

        :raises ValueError: ``tokens`` is not positive.
        """
        if tokens <= 0:
            raise ValueError(f"context window of {model!r} must be positive, got {tokens}")
        self._windows_set[model] = self._windows[model] = tokens

    def tracked_runs(self) -> int:
        """Runs whose state the recorder holds (started, not yet finished)."""
        return len(self._runs)

    def handlers(self) -> dict[type, Callable[[Any], None]]:
        """The handler of each message type that changes more than its message count (the
        types of :data:`COUNTED_ONLY` are only counted)."""
        return dict(self._handlers)

    # ------------------------------------------------------------------ messages

    def handle(self, msg: BusMessage) -> None:
        """Record one message; never blocks."""
        counted, handler = self._kinds.get(type(msg)) or self._kind(type(msg))
        counted.value += 1
        if handler is not None:
            handler(msg)

    def _kind(self, kind: type) -> tuple[CounterSeries, Callable[[Any], None] | None]:
        entry = self._kinds[kind] = (
            self.metrics.bus_messages.labels(kind.__name__),
            self._handlers.get(kind),
        )
        return entry

    def _run_started(self, msg: RunStarted) -> None:
        self._runs_started.value += 1
        self._runs.pop(msg.run_id, None)
        self._runs[msg.run_id] = _Run(
            model=msg.model,
            series=self._series_of(self._models(msg.model)),
            exemplar=exemplar(msg.run_id, msg.trace_id),
            started=self._clock(),
            input_price=msg.input_price_per_million / 1_000_000,
            output_price=msg.output_price_per_million / 1_000_000,
        )
        self._bound_runs()

    def _turn_started(self, msg: TurnStarted) -> None:
        self._turns.value += 1

    def _model_request(self, msg: ModelRequest) -> None:
        run = self._runs.get(msg.run_id) or self._run(msg.run_id)
        run.retries = 0
        if msg.model != run.model:
            run.model, run.series = msg.model, self._series_of(self._models(msg.model))

    def _model_error(self, msg: ModelError) -> None:
        run = self._run(msg.run_id)
        self.metrics.model_requests.labels(run.series.label, msg.kind).value += 1
        if not msg.final:
            run.retries += 1
        elif msg.usage.completion_tokens:  # text had streamed before the failure
            usage = msg.usage
            series, prompt, completion = run.series, usage.prompt_tokens, usage.completion_tokens
            series.tokens_in.value += prompt
            series.tokens_out.value += completion
            cost = prompt * run.input_price + completion * run.output_price
            if cost > 0:
                series.cost.value += cost

    def _replied(self, msg: ModelReplied) -> None:
        if msg.finish_reason == "length":
            self._run(msg.run_id).truncations += 1

    def _call_proposed(self, msg: ToolCallProposed) -> None:
        call = msg.call
        run = self._runs.get(msg.run_id) or self._run(msg.run_id)
        if run.calls is None:
            run.calls = {}
        run.calls[call.id] = self._tool_names.get(call.name) or self._tool(call.name)

    def _nudge(self, msg: Nudge) -> None:
        m = self.metrics
        m.nudges.labels(nudge_kind(msg.kind)).value += 1
        if msg.source == LOOP_MONITOR and msg.kind == "loop.content":
            # The only loop nudge without a verdict: streamed text cut (critical).
            m.loop_detections.labels(loop_detector(msg.kind), "critical").value += 1

    def _stop_signal(self, msg: StopSignal) -> None:
        if msg.cause.startswith("loop."):
            self.metrics.loop_detections.labels(loop_detector(msg.cause), "break").value += 1

    def _context_action(self, msg: ContextAction) -> None:
        # "blocked" is counted from the run's ending (blocking_limit), once.
        series = self._actions.get(msg.kind)
        if series is not None:
            series.value += 1

    # ------------------------------------------------------------------ internals

    def _series_of(self, label: str) -> _ModelSeries:
        series = self._model_series.get(label)
        if series is None:
            series = self._model_series[label] = _ModelSeries(self.metrics, label)
        return series

    def _tool(self, name: str) -> _ToolSeries:
        """The series of tool ``name``'s label (a kept name is remembered)."""
        label = self._tools(name)
        tool = self._tool_series.get(label)
        if tool is None:
            tool = self._tool_series[label] = _ToolSeries(label)
        if label != OTHER:
            self._tool_names[name] = tool
        return tool

    def _count_call(self, tool: _ToolSeries, outcome: str) -> None:
        series = tool.outcomes.get(outcome)
        if series is None:
            series = tool.outcomes[outcome] = self.metrics.tool_calls.labels(tool.label, outcome)
        series.value += 1

    def _bound_runs(self) -> None:
        runs = self._runs
        while len(runs) > self._max_runs:
            del runs[next(iter(runs))]

    def _run(self, run_id: str) -> _Run:
        """The state of ``run_id``; made up (unknown model, started now) if its
        ``RunStarted`` was not seen."""
        run = self._runs.get(run_id)
        if run is None:
            run = _Run(
                model="",
                series=self._series_of(OTHER),
                exemplar=exemplar(run_id),
                started=self._clock(),
            )
            self._runs[run_id] = run
            self._bound_runs()
        return run

    def _finish(self, msg: RunFinished) -> None:
        m = self.metrics
        run = self._runs.pop(msg.run_id, None)
        reason = msg.exit_reason.value
        cause = cause_label(msg.cause)
        ex = run.exemplar if run is not None else exemplar(msg.run_id)
        m.runs_finished.labels(reason, cause, msg.outcome.value).inc(1, ex)
        m.run_turns.labels(reason).observe(msg.turns)
        if run is None:
            return
        m.run_duration.labels(reason).observe(max(self._clock() - run.started, 0.0), ex)
        if msg.exit_reason is ExitReason.BLOCKING_LIMIT:
            run.series.blocked.value += 1
        # Each reply cut by the output limit was answered with a recovery nudge, except
        # the last one when the run gave up.
        recoveries = run.truncations - (1 if msg.cause == "truncation.gave_up" else 0)
        for number in range(1, recoveries + 1):
            m.truncation_recoveries.labels(truncation_step(number)).value += 1
        if recoveries > 0:
            m.nudges.labels(TRUNCATION_RECOVER).value += recoveries
        if msg.cause == "truncation.gave_up":
            m.truncation_recoveries.labels("gave_up").value += 1

    def _reply(self, msg: ModelReply) -> None:
        run = self._runs.get(msg.run_id) or self._run(msg.run_id)
        series = run.series
        # Attempts beyond the retried failures were silent retries with a higher output
        # limit (the first step of truncation recovery).
        escalations = msg.attempts - 1 - run.retries
        if escalations > 0:
            series.ok.value += escalations
            self._escalations.value += escalations
        if msg.aborted:
            series.aborted.value += 1
        else:
            series.ok.value += 1
        series.duration.observe(msg.latency_seconds, run.exemplar)
        if msg.ttft_seconds is not None:
            series.ttft.observe(msg.ttft_seconds, run.exemplar)
        usage = msg.usage
        prompt = usage.prompt_tokens
        completion = usage.completion_tokens
        if prompt < 0 or completion < 0:
            raise ValueError(f"negative token counts in a reply: {prompt}, {completion}")
        series.tokens_in.value += prompt
        series.tokens_out.value += completion
        cost = prompt * run.input_price + completion * run.output_price
        if cost > 0:
            series.cost.value += cost
        if prompt > 0:
            series.prompt_tokens.observe(prompt)
            window = self._windows.get(run.model)
            if window is None:
                window = self._window(run)
            if window:
                series.window_ratio.observe(prompt / window)

    def _window(self, run: _Run) -> int:
        """``run``'s model's context window for ``loopfuse_model_prompt_window_ratio`` (0: none
        known): the context gatekeeper's table's (:func:`actors.context.window_for`) unless
        :meth:`set_context_window` set it; remembered for next time."""
        window = window_for(run.model) or 0
        if len(self._windows) >= MAX_CACHED_WINDOWS:  # open-ended names: start over
            self._windows = dict(self._windows_set)
        self._windows[run.model] = window
        return window

    def _tool_result(self, msg: ToolResult) -> None:
        run = self._runs.get(msg.run_id)
        tool = run.calls.pop(msg.call_id, None) if run is not None and run.calls else None
        tool = tool or self._tool_names.get(msg.tool) or self._tool(msg.tool)
        if msg.is_error:
            self._count_call(tool, tool_outcome(msg))
        else:  # tool_outcome's first answer, written out with the count: most calls
            outcome = "cache_hit" if msg.cache == "hit" else "ok"
            series = tool.outcomes.get(outcome)
            if series is None:
                series = tool.outcomes[outcome] = self.metrics.tool_calls.labels(
                    tool.label, outcome
                )
            series.value += 1
        if msg.executed and msg.cache != "hit":
            duration = tool.duration
            if duration is None:
                duration = tool.duration = self.metrics.tool_duration.labels(tool.label)
            duration.observe(msg.duration_seconds, run.exemplar if run is not None else None)

    def _verdict_seen(self, msg: ToolVerdict) -> None:
        if msg.verdict == "allow":
            return
        if msg.verdict == "block":
            run = self._runs.get(msg.run_id)
            tool = run.calls.pop(msg.call_id, None) if run is not None and run.calls else None
            if tool is not None:  # once per call, however many monitors block it
                self._count_call(tool, "blocked")
        if msg.source == LOOP_MONITOR and msg.cause.startswith("loop."):
            level = "warning" if msg.verdict == "warn" else "critical"
            self.metrics.loop_detections.labels(loop_detector(msg.cause), level).value += 1
