"""Gauges that change on their own, read at scrape time from the objects that own them.

Runs active and queued come from the runtime, mailbox depth and drops from the bus: nothing
has to remember to update a gauge, and a scrape always sees the current value. (The daemon's
own figures, SSE clients included, come from its collector, ``loopfuse_daemon_*``.)
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import NamedTuple

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from actors.tools.executor import ToolCacheStatistics
from bus import Bus, SubscriptionStatistics

__all__ = ["RunCounts", "StateCollector", "ToolCacheCollector"]


class RunCounts(NamedTuple):
    """Runs of a runtime at one instant."""

    active: int
    queued: int
    limit: int


class ToolCacheCollector(Collector):
    """The idempotent result caches of every run, computed on each scrape."""

    def __init__(self, counts: Callable[[], ToolCacheStatistics]) -> None:
        self._counts = counts

    def describe(self) -> Iterator[Metric]:
        return self._families(ToolCacheStatistics(0, 0, 0, 0))

    def collect(self) -> Iterator[Metric]:
        return self._families(self._counts())

    @staticmethod
    def _families(counts: ToolCacheStatistics) -> Iterator[Metric]:
        entries, hits, misses, loops = counts
        yield GaugeMetricFamily(
            "loopfuse_tool_cache_entries",
            "Idempotent tool results cached now, every run together (is the cache bounded?).",
            value=entries,
        )
        yield CounterMetricFamily(
            "loopfuse_tool_cache_hits",
            "Idempotent calls answered from the cache without running the tool.",
            value=hits,
        )
        yield CounterMetricFamily(
            "loopfuse_tool_cache_misses",
            "Idempotent calls that ran the tool (and were cached).",
            value=misses,
        )
        yield CounterMetricFamily(
            "loopfuse_tool_cache_loops",
            "Calls refused because their cached result was asked for too often (loop.cache_hits).",
            value=loops,
        )


class StateCollector(Collector):
    """Runs and bus mailboxes, computed on each scrape."""

    def __init__(self, bus: Bus, runs: Callable[[], RunCounts]) -> None:
        self._bus = bus
        self._runs = runs

    def describe(self) -> Iterator[Metric]:
        # Names only (lets the registry refuse a duplicate), without reading any source.
        return self._families(_State(RunCounts(0, 0, 0), 0, 0, ()))

    def collect(self) -> Iterator[Metric]:
        bus = self._bus
        state = _State(self._runs(), bus.active_inboxes(), bus.published, bus.statistics())
        return self._families(state)

    @staticmethod
    def _families(state: _State) -> Iterator[Metric]:
        runs = state.runs
        yield GaugeMetricFamily("loopfuse_runs_active", "Runs executing now.", value=runs.active)
        yield GaugeMetricFamily(
            "loopfuse_runs_queued", "Runs accepted and waiting for a free slot.", value=runs.queued
        )
        yield GaugeMetricFamily(
            "loopfuse_runs_max_concurrent",
            "How many runs may execute at once (runtime.max_concurrent_runs).",
            value=runs.limit,
        )
        yield GaugeMetricFamily(
            "loopfuse_bus_run_inboxes",
            "Run control inboxes open on the bus (one per executing run).",
            value=state.inboxes,
        )
        yield CounterMetricFamily(
            "loopfuse_bus_published_messages",
            "Messages published on the bus.",
            value=state.published,
        )
        yield from _mailboxes(state.subscriptions)


class _State(NamedTuple):
    runs: RunCounts
    inboxes: int
    published: int
    subscriptions: tuple[SubscriptionStatistics, ...]


def _mailboxes(subscriptions: tuple[SubscriptionStatistics, ...]) -> Iterator[Metric]:
    labels = ["subscriber"]
    families: dict[str, GaugeMetricFamily | CounterMetricFamily] = {
        "depth": GaugeMetricFamily(
            "loopfuse_bus_mailbox_depth",
            "Messages waiting in a subscriber's mailbox.",
            labels=labels,
        ),
        "capacity": GaugeMetricFamily(
            "loopfuse_bus_mailbox_capacity", "Size of a subscriber's mailbox.", labels=labels
        ),
        "handled": CounterMetricFamily(
            "loopfuse_bus_handled_messages", "Messages a subscriber handled.", labels=labels
        ),
        "dropped": CounterMetricFamily(
            "loopfuse_bus_dropped_messages",
            "Messages lost because a dropping subscriber's mailbox was full.",
            labels=labels,
        ),
        "failed": CounterMetricFamily(
            "loopfuse_bus_handler_failures",
            "Messages whose handler raised (each ends that message's run).",
            labels=labels,
        ),
    }
    # Subscribers sharing a name are summed, so no series is exposed twice.
    totals: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(families, 0))
    for stats in subscriptions:
        row = totals[stats.name]
        for field in families:
            row[field] += getattr(stats, field)
    for name in sorted(totals):
        for field, family in families.items():
            family.add_metric([name], totals[name][field])
    yield from families.values()
