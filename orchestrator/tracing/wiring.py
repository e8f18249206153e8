"""How a runtime turns tracing on: the extra checked at construction, the SDK pipeline and the
exporter made when it starts, the pipeline flushed when it stops.

Importing this module imports nothing of OpenTelemetry; :func:`open_tracing` does.
"""

from __future__ import annotations

import importlib
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING, Final

import anyio
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from bus import Bus
from orchestrator.config import TracingSettings
from orchestrator.errors import ConfigError
from orchestrator.metrics.collectors import ScalarCollector, Scalars

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

    from orchestrator.tracing.exporter import TraceExporter
    from orchestrator.tracing.provider import TracingPipeline

__all__ = ["FLUSH_SECONDS", "TRACE_METRICS", "open_tracing", "require_tracing"]

FLUSH_SECONDS: Final = 2.0
"""How long a stopping runtime waits for its queued spans to be exported: a command-line
run exits at most this late when the backend is down (then the spans are lost, one
warning line says so)."""

TRACE_METRICS: Final[Scalars] = (
    (GaugeMetricFamily, "loopfuse_trace_runs_open", "Runs whose span is open now."),
    (CounterMetricFamily, "loopfuse_trace_spans_queued", "Spans handed to the export queue."),
    (
        CounterMetricFamily,
        "loopfuse_trace_spans_dropped",
        "Spans lost because the export queue was full (the backend slow or unreachable).",
    ),
    (CounterMetricFamily, "loopfuse_trace_spans_exported", "Spans the tracing backend accepted."),
    (
        CounterMetricFamily,
        "loopfuse_trace_spans_failed",
        "Spans in batches the exporter gave up on (the backend refused or was down).",
    ),
    (
        CounterMetricFamily,
        "loopfuse_trace_exporter_errors",
        "Messages the trace exporter failed on (logged; the run went on).",
    ),
)
"""``loopfuse_trace_*``, read at scrape time: the exporter's
:class:`~orchestrator.tracing.exporter.TraceStatistics`."""

_EXTRA: Final = ("opentelemetry.sdk.trace", "opentelemetry.exporter.otlp.proto.http")


def require_tracing() -> None:
    """:raises ConfigError: ``tracing.enabled`` is set but the ``otel`` extra is missing."""
    for module in _EXTRA:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ConfigError(
                "tracing.enabled",
                f"tracing needs the otel extra: pip install 'loopfuse[otel]' ({exc})",
            ) from None


def open_tracing(
    settings: TracingSettings,
    bus: Bus,
    registry: CollectorRegistry,
    stack: AsyncExitStack,
    *,
    base_url: str | None,
    provider: str,
    exporter: SpanExporter | None = None,
) -> TraceExporter:
    """The trace exporter of a runtime's ``bus`` (start its ``run`` in the task group),
    its counts on ``registry``, its pipeline shut down (flushed) when ``stack`` closes.

    Enter ``stack`` *before* the task group its actors run in: the pipeline then closes
    after the exporter has ended the spans still open.
    """
    from orchestrator.tracing.exporter import TraceExporter
    from orchestrator.tracing.provider import open_pipeline

    pipeline = open_pipeline(settings, exporter)
    stack.push_async_callback(_shut_down, pipeline)
    tracer = TraceExporter(
        bus,
        pipeline,
        capture_content=settings.capture_content,
        base_url=base_url,
        provider=settings.provider_name or provider,
    )
    registry.register(ScalarCollector(TRACE_METRICS, tracer.statistics))
    return tracer


async def _shut_down(pipeline: TracingPipeline) -> None:
    """Flush and close the pipeline's provider in a thread (the export is blocking I/O),
    waiting at most :data:`FLUSH_SECONDS`; then a backend that is down loses what was
    queued: the exporter is shut down (it stops retrying) and one line warns."""
    with anyio.move_on_after(FLUSH_SECONDS, shield=True) as waited:
        await anyio.to_thread.run_sync(pipeline.provider.shutdown, abandon_on_cancel=True)
    if waited.cancelled_caught:
        pipeline.processor.abandon()
