"""Scale-out on NATS JetStream: many daemons, one fleet (see ``docs/scale-out.md``).

A work-queue stream carries submissions (deduplicated by run id), an events stream every
run's bus messages (replayable by sequence: the SSE ids), a ``runstate`` KV bucket each
run's state (changed by compare-and-set: it decides who owns a run), a checkpoint bucket
every run's last completed turn (so another daemon can resume it), and a subject plus the
progress beat carry aborts to whichever daemon runs the run.
"""

from orchestrator.cluster.node import ClusterError, ClusterNode
from orchestrator.cluster.settings import ClusterSettings

__all__ = ["ClusterError", "ClusterNode", "ClusterSettings"]
