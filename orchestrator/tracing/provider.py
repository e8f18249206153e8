"""The OpenTelemetry SDK pipeline a runtime's trace exporter feeds: a tracer provider of its
own (never the global one), a bounded batch queue, the OTLP/HTTP exporter.

::

    TraceExporter ──span.end()──▶ CountingProcessor ──▶ BatchSpanProcessor ──thread──▶
                                   (drops when full)     (queue, batches)   OTLPSpanExporter

The SDK reads the standard variables itself: ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` /
``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_EXPORTER_OTLP_HEADERS``, ``OTEL_EXPORTER_OTLP_TIMEOUT``,
``OTEL_TRACES_SAMPLER``, ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_BSP_*``; a key set in
``[tracing]`` wins over its variable.

Nothing here ever blocks a run: ``span.end()`` hands the span to a queue, and a full queue
loses the span and counts it (:attr:`CountingProcessor.dropped`) instead of waiting. (The
SDK's own queue would drop its oldest span and log a warning for each; this one refuses the
newest, counted, and logs nothing per span.)

A backend that is down is one warning line (:data:`EXPORT_FAILED`, logged when exports
start failing, again only after one succeeded), not the OTLP exporter's three multi-line
records per batch: those are silenced, the failures counted
(``loopfuse_trace_spans_failed_total``).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence
from typing import Final, NamedTuple

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

from orchestrator.config import TracingSettings

__all__ = [
    "DEFAULT_SERVICE_NAME",
    "EXPORT_FAILED",
    "CountingProcessor",
    "ExportCounts",
    "RunTraceIds",
    "TracingPipeline",
    "open_pipeline",
]

DEFAULT_SERVICE_NAME: Final = "loopfuse"
INSTRUMENTATION: Final = "loopfuse"
"""The instrumentation scope's name on every span."""

EXPORT_FAILED: Final = (
    "spans not exported to %s (the backend refused them or did not answer); "
    "they are counted in loopfuse_trace_spans_failed_total; is the backend up, and is "
    "tracing.endpoint (or $OTEL_EXPORTER_OTLP_ENDPOINT) its address?"
)
"""The one warning a failing backend gets, until an export succeeds again."""

_OTLP_LOGGER: Final = "opentelemetry.exporter.otlp.proto.http.trace_exporter"

logger = logging.getLogger("loopfuse.tracing")

_DEFAULT_QUEUE: Final = 2048
_DEFAULT_BATCH: Final = 512


class RunTraceIds(RandomIdGenerator):
    """Random ids, except the trace id of a run's root span: the run's own ``trace_id``
    (set in :attr:`next_trace_id` just before that span starts, on the same thread)."""

    def __init__(self) -> None:
        self.next_trace_id = 0

    def generate_trace_id(self) -> int:
        trace_id, self.next_trace_id = self.next_trace_id, 0
        return trace_id or super().generate_trace_id()


class ExportCounts(NamedTuple):
    """Spans that left a runtime, at one instant."""

    queued: int
    """Spans handed to the batch queue."""
    dropped: int
    """Spans lost because the queue was full (the backend too slow or unreachable)."""
    exported: int
    """Spans the backend accepted."""
    failed: int
    """Spans in batches the exporter gave up on."""


def _silenced(record: logging.LogRecord) -> bool:
    """Drops the OTLP exporter's own records (a retry warning per attempt, an error per
    batch, each with the connection error's text): :data:`EXPORT_FAILED` says it once."""
    return False


class _CountingExporter(SpanExporter):
    """Counts what the batch thread takes from the queue and how each batch fared; warns
    once (:data:`EXPORT_FAILED`) when batches start failing."""

    def __init__(self, exporter: SpanExporter, *, target: str) -> None:
        self._exporter = exporter
        self._target = target
        self._lock = threading.Lock()
        self._closed = False
        self.warned = False  # since the last export that succeeded
        self.taken = 0  # written by the batch thread only
        self.exported = 0
        self.failed = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.taken += len(spans)
        result = self._exporter.export(spans)
        if result is SpanExportResult.SUCCESS:
            self.exported += len(spans)
            self.warned = False
        else:
            self.failed += len(spans)
            self.warn()
        return result

    def warn(self) -> None:
        """Log :data:`EXPORT_FAILED`, unless it was since the last export that succeeded."""
        with self._lock:
            if self.warned:
                return
            self.warned = True
        logger.warning(EXPORT_FAILED, self._target)

    def shutdown(self) -> None:
        """Shut the exporter down once (it aborts an export waiting to retry)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self._exporter.force_flush(timeout_millis)


class CountingProcessor(BatchSpanProcessor):
    """A :class:`BatchSpanProcessor` that refuses a span, counted, when its queue is full."""

    def __init__(
        self,
        exporter: SpanExporter,
        *,
        queue_size: int,
        schedule_delay_millis: float | None = None,
        target: str = "the backend",
    ) -> None:
        self._exporter = _CountingExporter(exporter, target=target)
        self._queue_size = queue_size
        batch = min(_env_int("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", _DEFAULT_BATCH), queue_size)
        super().__init__(
            self._exporter,
            max_queue_size=queue_size,
            max_export_batch_size=batch,
            schedule_delay_millis=schedule_delay_millis,
        )
        self.queued = 0  # written on the event loop's thread only
        self.dropped = 0

    def counts(self) -> ExportCounts:
        exporter = self._exporter
        return ExportCounts(self.queued, self.dropped, exporter.exported, exporter.failed)

    def on_end(self, span: ReadableSpan) -> None:
        if self.queued - self._exporter.taken >= self._queue_size:
            self.dropped += 1
            return
        self.queued += 1
        BatchSpanProcessor.on_end(self, span)

    def abandon(self) -> None:
        """Give up on what is still queued or being sent (a shutdown that takes too long):
        the exporter stops retrying, and the loss is warned about once."""
        if self.queued > self._exporter.exported + self._exporter.failed:
            self._exporter.warn()
        self._exporter.shutdown()


class TracingPipeline(NamedTuple):
    """A runtime's tracer provider, its trace-id generator and its counting processor."""

    provider: TracerProvider
    ids: RunTraceIds
    processor: CountingProcessor


def open_pipeline(
    settings: TracingSettings, exporter: SpanExporter | None = None
) -> TracingPipeline:
    """The provider for ``settings``; spans go to ``exporter`` (default: OTLP over HTTP to
    ``settings.endpoint``, or where the ``OTEL_*`` variables say). Close it with
    ``provider.shutdown()`` (it flushes what is queued)."""
    target = "the backend"
    if exporter is None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter(endpoint=settings.endpoint or None)
        logging.getLogger(_OTLP_LOGGER).addFilter(_silenced)  # once: the same filter
        # Where the OTLP exporter sends spans, as it decides (for messages).
        base = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "http://localhost:4318")
        target = (
            settings.endpoint
            or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            or f"{base.rstrip('/')}/v1/traces"
        )
    name = settings.service_name or os.environ.get("OTEL_SERVICE_NAME") or DEFAULT_SERVICE_NAME
    resource = Resource.create({"service.name": name})
    delay = settings.export_delay_seconds
    processor = CountingProcessor(
        exporter,
        queue_size=settings.queue_size or _env_int("OTEL_BSP_MAX_QUEUE_SIZE", _DEFAULT_QUEUE),
        schedule_delay_millis=delay * 1000 if delay is not None else None,
        target=target,
    )
    ids = RunTraceIds()
    # No shutdown at interpreter exit: the runtime shuts the provider down, bounded
    # (orchestrator.tracing.wiring); the SDK's own would wait up to 30 s for a dead backend.
    provider = TracerProvider(resource=resource, id_generator=ids, shutdown_on_exit=False)
    provider.add_span_processor(processor)
    return TracingPipeline(provider, ids, processor)


def _env_int(name: str, default: int) -> int:
    """A positive integer from the environment, ``default`` when unset or not one (as the
    SDK reads its ``OTEL_BSP_*`` variables)."""
    try:
        value = int(os.environ.get(name, ""))
    except ValueError:
        return default
    return value if value > 0 else default
