"""Fleet metrics without double counting (``docs/scale-out.md``).

* :class:`NodeCollector`, on every daemon: what *this* daemon did; each of these happens on
  exactly one daemon, so a sum over all instances is the fleet's total.
* :class:`FleetCollector`: what JetStream says about the whole fleet, reported only by the
  holder of the ``fleet-metrics`` lease (a key in the nodes bucket taken by compare-and-set,
  renewed on each refresh, expiring with its holder); every other daemon exports
  ``loopfuse_cluster_fleet_reporter 0`` and no fleet series.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import suppress
from typing import Final, NamedTuple

import anyio
import nats.errors
from anyio.abc import TaskStatus
from nats.js.errors import KeyWrongLastSequenceError, NotFoundError
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from orchestrator.cluster.jetstream import bucket_keys
from orchestrator.cluster.node import CONSUMER, ClusterNode
from orchestrator.metrics.collectors import ScalarCollector, Scalars

__all__ = ["FleetCollector", "FleetSnapshot", "NodeCollector", "fleet_snapshot"]

PREFIX: Final = "loopfuse_cluster"
LEASE_KEY: Final = "fleet-metrics"

_COUNTERS: Final = (
    ("submitted_runs", "Runs this daemon queued for the fleet."),
    ("duplicate_submissions", "Submissions this daemon answered with an existing run (same key)."),
    ("taken_runs", "Runs this daemon took from the queue (first time or taken over)."),
    ("finished_runs", "Runs whose end this daemon stored."),
    ("resumed_runs", "Runs this daemon took over from a dead daemon and resumed."),
    (
        "crash_ended_runs",
        "Runs this daemon took over and ended with abort.crash (on_crash = abort).",
    ),
    ("redeliveries", "Deliveries this daemon received that were not a run's first."),
    ("ownership_conflicts", "Deliveries of runs another live daemon owned (not run here)."),
)
_NODE: Final[Scalars] = (
    (GaugeMetricFamily, f"{PREFIX}_node_runs_in_flight", "Runs this daemon holds."),
    (GaugeMetricFamily, f"{PREFIX}_node_run_slots", "Runs this daemon may hold at once."),
    *((CounterMetricFamily, f"{PREFIX}_node_{name}", help_text) for name, help_text in _COUNTERS),
)
"""A family per field of :class:`~orchestrator.cluster.node.NodeStatistics`, in its order."""


class NodeCollector(ScalarCollector):
    """This daemon's share of the fleet's work (sum over instances for fleet totals)."""

    def __init__(self, node: ClusterNode) -> None:
        super().__init__(_NODE, node.statistics)


class FleetSnapshot(NamedTuple):
    """JetStream's view of the fleet at one moment."""

    queue_depth: int
    unacknowledged: int
    waiting_redelivery: int
    live_nodes: int
    stored_events: int


_FIGURES: Final = (
    ("queue_depth_runs", "Submitted runs no daemon has taken yet."),
    ("unacknowledged_runs", "Runs taken by a daemon whose end is not stored and acknowledged yet."),
    ("waiting_redelivery_runs", "Runs delivered more than once and not acknowledged yet."),
    ("live_nodes", "Daemons with a current heartbeat."),
    ("stored_events", "Messages in the events stream."),
)
"""A gauge's name and help per field of :class:`FleetSnapshot`, in its order."""


async def fleet_snapshot(node: ClusterNode) -> FleetSnapshot:
    """Read the fleet's figures from JetStream through ``node``'s connection."""
    settings = node.settings
    events = await node.js.stream_info(settings.events_stream)
    try:
        consumer = await node.js.consumer_info(settings.runs_stream, CONSUMER)
        depth = consumer.num_pending or 0
        unacknowledged = consumer.num_ack_pending or 0
        waiting = consumer.num_redelivered or 0
    except NotFoundError:  # no daemon has pulled yet: every stored submission waits
        depth = (await node.js.stream_info(settings.runs_stream)).state.messages
        unacknowledged = waiting = 0
    live = 0
    for key in await bucket_keys(node.nc, settings.nodes_bucket):
        if key != LEASE_KEY:
            with suppress(NotFoundError):  # left the fleet (deleted) or expired since the listing
                await node.buckets.nodes.get(key)
                live += 1
    return FleetSnapshot(
        queue_depth=depth,
        unacknowledged=unacknowledged,
        waiting_redelivery=waiting,
        live_nodes=live,
        stored_events=events.state.messages,
    )


class FleetCollector(Collector):
    """The fleet's figures, reported by the lease holder only; :meth:`run` keeps them fresh."""

    def __init__(self, node: ClusterNode) -> None:
        self._node = node
        self._revision: int | None = None
        self.snapshot: FleetSnapshot | None = None

    @property
    def reporting(self) -> bool:
        return self._revision is not None

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Hold or wait for the lease, and refresh the snapshot while holding it."""
        task_status.started()
        while True:
            await self.refresh()
            await anyio.sleep(5.0)  # the lease is renewed every 5 s (docs/scale-out.md)

    async def refresh(self) -> None:
        """Renew (or try to take) the lease; if held, read a new snapshot."""
        nodes = self._node.buckets.nodes
        holder = self._node.name.encode()
        try:
            if self._revision is None:
                self._revision = await nodes.create(LEASE_KEY, holder)
            else:
                self._revision = await nodes.update(LEASE_KEY, holder, last=self._revision)
        except (KeyWrongLastSequenceError, NotFoundError):
            self._revision = None  # another daemon holds it (or it just expired)
        except (nats.errors.Error, TimeoutError):
            return  # NATS is away: keep the last snapshot
        if self._revision is None:
            self.snapshot = None
            return
        with suppress(nats.errors.Error, TimeoutError):
            self.snapshot = await fleet_snapshot(self._node)

    def collect(self) -> Iterator[Metric]:
        snapshot = self.snapshot
        yield GaugeMetricFamily(
            f"{PREFIX}_fleet_reporter",
            "1 on the one daemon that reports the fleet-wide series, 0 elsewhere.",
            value=1 if snapshot is not None else 0,
        )
        if snapshot is None:
            return
        for (name, help_text), value in zip(_FIGURES, snapshot, strict=True):
            yield GaugeMetricFamily(f"{PREFIX}_fleet_{name}", help_text, value=value)
