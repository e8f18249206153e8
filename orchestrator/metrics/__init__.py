"""loopfuse's Prometheus metrics: one recorder on the bus, metrics on an injected registry.

::

    registry = new_registry()
    recorder = MetricsRecorder(bus, registry, models=("gpt-4o",), tools=tool_registry)
    await tg.start(recorder.run)          # then serve make_asgi_app(registry) at /metrics

The metric names, labels and the question each answers are in ``docs/metrics.md``.
"""

from __future__ import annotations

from orchestrator.metrics.collectors import RunCounts, StateCollector
from orchestrator.metrics.definitions import Metrics, new_registry
from orchestrator.metrics.labels import OTHER, BoundedLabel
from orchestrator.metrics.recorder import (
    MAX_TRACKED_RUNS,
    METRICS_MAILBOX_SIZE,
    SUBSCRIBER,
    MetricsRecorder,
)

__all__ = [
    "MAX_TRACKED_RUNS",
    "METRICS_MAILBOX_SIZE",
    "OTHER",
    "SUBSCRIBER",
    "BoundedLabel",
    "Metrics",
    "MetricsRecorder",
    "RunCounts",
    "StateCollector",
    "new_registry",
]
