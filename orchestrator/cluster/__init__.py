"""Scale-out on NATS JetStream: many daemons, one fleet (see ``docs/scale-out.md``).

A work-queue stream carries submissions (deduplicated by run id), an events stream every
run's bus messages (replayable by sequence: the SSE ids), a ``runstate`` KV bucket each
run's state (changed by compare-and-set: it decides who owns a run), a checkpoint bucket
every run's last completed turn (so another daemon can resume it), and a subject plus the
progress beat carry aborts to whichever daemon runs the run.
"""

from orchestrator.cluster.errors import ClusterError
from orchestrator.cluster.events import ClusterEvent
from orchestrator.cluster.node import ClusterNode, NodeStatistics
from orchestrator.cluster.settings import ClusterSettings
from orchestrator.cluster.state import RunState

__all__ = [
    "ClusterError",
    "ClusterEvent",
    "ClusterNode",
    "ClusterSettings",
    "NodeStatistics",
    "RunState",
]
