"""The trace exporter's counts as Prometheus metrics, read at scrape time."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from orchestrator.tracing.exporter import TraceStatistics

__all__ = ["TraceCollector"]


class TraceCollector(Collector):
    """``loopfuse_trace_*``: spans queued, dropped, exported and failed; runs traced now."""

    def __init__(self, statistics: Callable[[], TraceStatistics]) -> None:
        self._statistics = statistics

    def describe(self) -> Iterator[Metric]:
        return self._families(TraceStatistics(0, 0, 0, 0, 0, 0))

    def collect(self) -> Iterator[Metric]:
        return self._families(self._statistics())

    @staticmethod
    def _families(stats: TraceStatistics) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "loopfuse_trace_runs_open", "Runs whose span is open now.", value=stats.runs
        )
        yield CounterMetricFamily(
            "loopfuse_trace_spans_queued",
            "Spans handed to the export queue.",
            value=stats.queued,
        )
        yield CounterMetricFamily(
            "loopfuse_trace_spans_dropped",
            "Spans lost because the export queue was full (the backend slow or unreachable).",
            value=stats.dropped,
        )
        yield CounterMetricFamily(
            "loopfuse_trace_spans_exported",
            "Spans the tracing backend accepted.",
            value=stats.exported,
        )
        yield CounterMetricFamily(
            "loopfuse_trace_spans_failed",
            "Spans in batches the exporter gave up on (the backend refused or was down).",
            value=stats.failed,
        )
        yield CounterMetricFamily(
            "loopfuse_trace_exporter_errors",
            "Messages the trace exporter failed on (logged; the run went on).",
            value=stats.errors,
        )
