"""``/metrics``: the runtime's registry, plus the daemon's own gauges.

The metrics recorder (one per runtime, ``runtime.metrics_registry``) owns the run metrics.
The daemon adds one collector to that registry whose values are read at scrape time from the
service, the store and the SSE streams (no other code touches a metric). Every label comes
from a closed set and every series exists from the start.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Final

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector
from starlette.responses import Response

from bus import ExitReason
from orchestrator.daemon.errors import ApiError
from orchestrator.daemon.service import RunService
from orchestrator.daemon.store import Store

__all__ = ["DaemonCollector", "render"]

PREFIX: Final = "loopfuse_daemon"


class DaemonCollector(Collector):
    """The daemon's figures, computed at scrape time."""

    def __init__(self, service: RunService, store: Store, streams: Callable[[], int]) -> None:
        self._service = service
        self._store = store
        self._streams = streams

    def collect(self) -> Iterator[Metric]:
        runs = self._service
        stats = runs.statistics
        yield _gauge(
            "runs_in_flight", "Runs accepted and not ended (running or queued).", runs.in_flight
        )
        yield _gauge(
            "runs_capacity", "Runs that may be in flight before new ones get a 429.", runs.capacity
        )
        yield _gauge("draining", "1 while the daemon drains for shutdown.", int(runs.draining))
        yield _counter("runs_accepted", "Runs accepted with 202.", stats.accepted)
        yield _counter(
            "runs_rejected",
            "Run submissions refused, by reason.",
            reason={"queue_full": stats.rejected_full, "draining": stats.rejected_draining},
        )
        yield _counter(
            "runs_recovered",
            "Runs found active at start-up, by what was done with them.",
            action={"resumed": stats.resumed, "crash_aborted": stats.crash_aborted},
        )
        yield _counter(
            "runs_ended",
            "Runs ended since start-up, by exit reason.",
            exit_reason={reason.value: runs.ended(reason) for reason in ExitReason},
        )
        yield _gauge("sse_clients", "Open event streams.", self._streams())
        store = self._store.statistics()
        yield _counter("store_commits", "Group commits to the store.", store.commits)
        yield _counter(
            "store_events_written", "Events committed to the store.", store.events_written
        )
        yield _gauge(
            "store_pending_events", "Events queued for the next commit.", store.pending_events
        )


def _gauge(name: str, text: str, value: int) -> Metric:
    return GaugeMetricFamily(f"{PREFIX}_{name}", text, value=value)


def _counter(name: str, text: str, value: int | None = None, **by: dict[str, int]) -> Metric:
    """A counter: one ``value``, or one series per value of the one label ``by`` names."""
    if value is not None:
        return CounterMetricFamily(f"{PREFIX}_{name}", text, value=value)
    [(label, values)] = by.items()
    counter = CounterMetricFamily(f"{PREFIX}_{name}", text, labels=[label])
    for key, count in values.items():
        counter.add_metric([key], count)
    return counter


def render(registry: CollectorRegistry | None, accept: str | None) -> Response:
    """The ``/metrics`` answer: the exposition of ``registry`` in the format ``accept`` asks
    for (OpenMetrics or text 0.0.4); a 503 while there is none yet (the daemon is starting)."""
    if registry is None:
        raise ApiError(503, "starting", "the daemon is starting")
    encoder, content_type = choose_encoder(accept or "")
    return Response(encoder(registry), headers={"Content-Type": content_type})
