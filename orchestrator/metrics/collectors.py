"""Gauges that change on their own, read at scrape time from the objects that own them.

Runs active and queued come from the runtime, mailbox depth and drops from the bus: nothing
has to remember to update a gauge, and a scrape always sees the current value. (The daemon's
own figures, SSE clients included, come from its collector, ``loopfuse_daemon_*``.)
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from typing import Final, NamedTuple

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from bus import Bus, SubscriptionStatistics

__all__ = ["TOOL_CACHE", "RunCounts", "ScalarCollector", "Scalars", "StateCollector"]


class RunCounts(NamedTuple):
    """Runs of a runtime at one instant."""

    active: int
    queued: int
    limit: int


Scalars = tuple[tuple[type[GaugeMetricFamily | CounterMetricFamily], str, str], ...]
"""Unlabelled families: each one's kind, name and help."""


class ScalarCollector(Collector):
    """Unlabelled gauges and counters read at scrape time: ``read()`` gives their values in
    the order of ``families`` (zeros for the registry's describe, which reads no source)."""

    def __init__(self, families: Scalars, read: Callable[[], Sequence[float]]) -> None:
        self._families = families
        self._read = read

    def describe(self) -> Iterator[Metric]:
        return self._metrics((0,) * len(self._families))

    def collect(self) -> Iterator[Metric]:
        return self._metrics(self._read())

    def _metrics(self, values: Sequence[float]) -> Iterator[Metric]:
        for (kind, name, documentation), value in zip(self._families, values, strict=True):
            yield kind(name, documentation, value=value)


TOOL_CACHE: Final[Scalars] = (
    (
        GaugeMetricFamily,
        "loopfuse_tool_cache_entries",
        "Idempotent tool results cached now, every run together (is the cache bounded?).",
    ),
    (
        CounterMetricFamily,
        "loopfuse_tool_cache_hits",
        "Idempotent calls answered from the cache without running the tool.",
    ),
    (
        CounterMetricFamily,
        "loopfuse_tool_cache_misses",
        "Idempotent calls that ran the tool (and were cached).",
    ),
    (
        CounterMetricFamily,
        "loopfuse_tool_cache_loops",
        "Calls refused because their cached result was asked for too often (loop.cache_hits).",
    ),
)
"""The idempotent result caches of every run (``ToolExecutor.cache_statistics()``)."""

_STATE: Final[Scalars] = (
    (GaugeMetricFamily, "loopfuse_runs_active", "Runs executing now."),
    (GaugeMetricFamily, "loopfuse_runs_queued", "Runs accepted and waiting for a free slot."),
    (
        GaugeMetricFamily,
        "loopfuse_runs_max_concurrent",
        "How many runs may execute at once (runtime.max_concurrent_runs).",
    ),
    (
        GaugeMetricFamily,
        "loopfuse_bus_run_inboxes",
        "Run control inboxes open on the bus (one per executing run).",
    ),
    (CounterMetricFamily, "loopfuse_bus_published_messages", "Messages published on the bus."),
)


class StateCollector(ScalarCollector):
    """Runs and bus mailboxes, computed on each scrape."""

    def __init__(self, bus: Bus, runs: Callable[[], RunCounts]) -> None:
        super().__init__(_STATE, lambda: (*runs(), bus.active_inboxes(), bus.published))
        self._bus = bus

    def describe(self) -> Iterator[Metric]:
        yield from super().describe()
        yield from _mailboxes(())

    def collect(self) -> Iterator[Metric]:
        yield from super().collect()
        yield from _mailboxes(self._bus.statistics())


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
