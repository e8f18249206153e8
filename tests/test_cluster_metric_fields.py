"""The fleet's metric families are read from :class:`NodeStatistics` and
:class:`FleetSnapshot` by position: each name is pinned here to the field it reports, so a
reordered field cannot swap two series' values unnoticed."""

from __future__ import annotations

from typing import Any, cast

from prometheus_client import CollectorRegistry

from orchestrator.cluster.metrics import FleetCollector, FleetSnapshot, NodeCollector
from orchestrator.cluster.node import ClusterNode, NodeStatistics

NODE_SERIES = {
    "in_flight": "loopfuse_cluster_node_runs_in_flight",
    "slots": "loopfuse_cluster_node_run_slots",
    "submitted": "loopfuse_cluster_node_submitted_runs_total",
    "duplicates": "loopfuse_cluster_node_duplicate_submissions_total",
    "taken": "loopfuse_cluster_node_taken_runs_total",
    "finished": "loopfuse_cluster_node_finished_runs_total",
    "resumed": "loopfuse_cluster_node_resumed_runs_total",
    "crash_ended": "loopfuse_cluster_node_crash_ended_runs_total",
    "redelivered": "loopfuse_cluster_node_redeliveries_total",
    "ownership_conflicts": "loopfuse_cluster_node_ownership_conflicts_total",
}
FLEET_SERIES = {
    "queue_depth": "loopfuse_cluster_fleet_queue_depth_runs",
    "unacknowledged": "loopfuse_cluster_fleet_unacknowledged_runs",
    "waiting_redelivery": "loopfuse_cluster_fleet_waiting_redelivery_runs",
    "live_nodes": "loopfuse_cluster_fleet_live_nodes",
    "stored_events": "loopfuse_cluster_fleet_stored_events",
}


class _Node:
    def __init__(self, statistics: NodeStatistics) -> None:
        self._statistics = statistics

    def statistics(self) -> NodeStatistics:
        return self._statistics


def _values(registry: CollectorRegistry, names: dict[str, str]) -> dict[str, float | None]:
    return {field: registry.get_sample_value(name) for field, name in names.items()}


def test_each_node_series_reports_its_own_field() -> None:
    assert tuple(NODE_SERIES) == NodeStatistics._fields
    statistics = NodeStatistics(*range(1, len(NODE_SERIES) + 1))  # a value of its own each
    registry = CollectorRegistry()
    registry.register(NodeCollector(cast(ClusterNode, _Node(statistics))))
    assert _values(registry, NODE_SERIES) == statistics._asdict()


def test_each_fleet_series_reports_its_own_field() -> None:
    assert tuple(FLEET_SERIES) == FleetSnapshot._fields
    collector = FleetCollector(cast(ClusterNode, cast(Any, None)))
    collector.snapshot = FleetSnapshot(*range(11, 11 + len(FLEET_SERIES)))
    registry = CollectorRegistry()
    registry.register(collector)
    assert registry.get_sample_value("loopfuse_cluster_fleet_reporter") == 1
    assert _values(registry, FLEET_SERIES) == collector.snapshot._asdict()
