"""``/metrics``: the runtime's registry when it has one, plus the daemon's own gauges.

The metrics recorder (one per runtime, ``runtime.metrics_registry``) owns the run metrics.
Until a runtime has one, the daemon makes a registry of its own. Either way the daemon adds
one collector whose values are read at scrape time from the service, the store and the SSE
streams (no other code touches a metric). Every label comes from a closed set and every
series exists from the start.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Final

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

from bus import ExitReason
from orchestrator.daemon.service import RunService
from orchestrator.daemon.store import Store
from orchestrator.runtime import Runtime

__all__ = ["DaemonCollector", "daemon_registry", "render"]

PREFIX: Final = "loopfuse_daemon"


def daemon_registry(runtime: Runtime) -> CollectorRegistry:
    """``runtime.metrics_registry`` if the runtime has one; else a fresh registry with the
    process, platform and GC collectors."""
    registry = getattr(runtime, "metrics_registry", None)
    if isinstance(registry, CollectorRegistry):
        return registry
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    return registry


class DaemonCollector(Collector):
    """The daemon's figures, computed at scrape time."""

    def __init__(self, service: RunService, store: Store, streams: Callable[[], int]) -> None:
        self._service = service
        self._store = store
        self._streams = streams

    def collect(self) -> Iterator[Metric]:
        stats = self._service.statistics()
        yield GaugeMetricFamily(
            f"{PREFIX}_runs_in_flight",
            "Runs accepted and not ended (running or queued).",
            value=stats.in_flight,
        )
        yield GaugeMetricFamily(
            f"{PREFIX}_runs_capacity",
            "Runs that may be in flight before new ones get a 429.",
            value=stats.capacity,
        )
        yield GaugeMetricFamily(
            f"{PREFIX}_draining",
            "1 while the daemon drains for shutdown.",
            value=1 if self._service.draining else 0,
        )
        yield CounterMetricFamily(
            f"{PREFIX}_runs_accepted", "Runs accepted with 202.", value=stats.accepted
        )
        rejected = CounterMetricFamily(
            f"{PREFIX}_runs_rejected", "Run submissions refused, by reason.", labels=["reason"]
        )
        rejected.add_metric(["queue_full"], stats.rejected_full)
        rejected.add_metric(["draining"], stats.rejected_draining)
        yield rejected
        recovered = CounterMetricFamily(
            f"{PREFIX}_runs_recovered",
            "Runs found active at start-up, by what was done with them.",
            labels=["action"],
        )
        recovered.add_metric(["resumed"], stats.resumed)
        recovered.add_metric(["crash_aborted"], stats.crash_aborted)
        yield recovered
        ended = CounterMetricFamily(
            f"{PREFIX}_runs_ended",
            "Runs ended since start-up, by exit reason.",
            labels=["exit_reason"],
        )
        for reason in ExitReason:
            ended.add_metric([reason.value], self._service.ended(reason))
        yield ended
        yield GaugeMetricFamily(
            f"{PREFIX}_sse_clients", "Open event streams.", value=self._streams()
        )
        store = self._store.statistics()
        yield CounterMetricFamily(
            f"{PREFIX}_store_commits", "Group commits to the store.", value=store.commits
        )
        yield CounterMetricFamily(
            f"{PREFIX}_store_events_written",
            "Events committed to the store.",
            value=store.events_written,
        )
        yield GaugeMetricFamily(
            f"{PREFIX}_store_pending_events",
            "Events queued for the next commit.",
            value=store.pending_events,
        )


def render(registry: CollectorRegistry, accept: str | None) -> tuple[bytes, str]:
    """The exposition of ``registry`` in the format ``accept`` asks for (OpenMetrics or
    text 0.0.4) and its content type."""
    encoder, content_type = choose_encoder(accept or "")
    return encoder(registry), content_type
