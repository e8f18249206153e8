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
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Final, NamedTuple

from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

from orchestrator.config import TracingSettings

__all__ = [
    "DEFAULT_SERVICE_NAME",
    "CountingProcessor",
    "ExportCounts",
    "RunTraceIds",
    "TracingPipeline",
    "open_pipeline",
]

DEFAULT_SERVICE_NAME: Final = "loopfuse"
INSTRUMENTATION: Final = "loopfuse"
"""The instrumentation scope's name on every span."""

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


class _CountingExporter(SpanExporter):
    """Counts what the batch thread takes from the queue and how each batch fared."""

    def __init__(self, exporter: SpanExporter) -> None:
        self._exporter = exporter
        self.taken = 0  # written by the batch thread only
        self.exported = 0
        self.failed = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.taken += len(spans)
        result = self._exporter.export(spans)
        if result is SpanExportResult.SUCCESS:
            self.exported += len(spans)
        else:
            self.failed += len(spans)
        return result

    def shutdown(self) -> None:
        self._exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self._exporter.force_flush(timeout_millis)


class CountingProcessor(SpanProcessor):
    """A :class:`BatchSpanProcessor` that refuses a span, counted, when its queue is full."""

    def __init__(
        self,
        exporter: SpanExporter,
        *,
        queue_size: int,
        schedule_delay_millis: float | None = None,
    ) -> None:
        self._exporter = _CountingExporter(exporter)
        self._queue_size = queue_size
        batch = min(_env_int("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", _DEFAULT_BATCH), queue_size)
        self._batch = BatchSpanProcessor(
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

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        if self.queued - self._exporter.taken >= self._queue_size:
            self.dropped += 1
            return
        self.queued += 1
        self._batch.on_end(span)

    def shutdown(self) -> None:
        self._batch.shutdown()  # type: ignore[no-untyped-call]

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self._batch.force_flush(timeout_millis)


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
    if exporter is None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter(endpoint=settings.endpoint or None)
    name = settings.service_name or os.environ.get("OTEL_SERVICE_NAME") or DEFAULT_SERVICE_NAME
    resource = Resource.create({"service.name": name})
    queue_size = settings.queue_size or _env_int("OTEL_BSP_MAX_QUEUE_SIZE", _DEFAULT_QUEUE)
    delay = settings.export_delay_seconds
    processor = CountingProcessor(
        exporter,
        queue_size=queue_size,
        schedule_delay_millis=delay * 1000 if delay is not None else None,
    )
    ids = RunTraceIds()
    provider = TracerProvider(resource=resource, id_generator=ids)
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
