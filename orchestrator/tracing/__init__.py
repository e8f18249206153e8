"""OpenTelemetry traces of runs (``docs/tracing.md``), an optional part: ``loopfuse[otel]``.

This package's root imports nothing of OpenTelemetry: the daemon reads ``traceparent``
headers with it whether tracing is on or not. The exporter
(:mod:`orchestrator.tracing.exporter`) and the SDK pipeline
(:mod:`orchestrator.tracing.provider`) are imported only when ``[tracing] enabled`` is
set, so with tracing off no OpenTelemetry module is loaded and nothing is subscribed.
"""

from __future__ import annotations

from orchestrator.tracing.traceparent import HEADER, TraceParent, parse_traceparent

__all__ = ["HEADER", "TraceParent", "parse_traceparent"]
