"""Where a fleet's work, events and state live in NATS JetStream (the ``[cluster]`` settings)."""

from __future__ import annotations

from typing import Annotated

import msgspec

__all__ = ["ClusterSettings"]

_Positive = Annotated[float, msgspec.Meta(gt=0)]


class ClusterSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One fleet's JetStream layout; every daemon of the fleet must use the same names.

    * ``runs_stream`` (subject ``<subject_prefix>.submit``): work-queue retention, one durable
      pull consumer ``workers`` shared by all daemons; publishes deduplicated by run id
      within ``duplicate_window_seconds``.
    * ``events_stream`` (subjects ``<subject_prefix>.run.<id>.events``): every bus message
      of every run; its stream sequence numbers are the SSE event ids.
    * ``state_bucket`` (KV): one :class:`~orchestrator.cluster.state.RunState` per run,
      changed only by compare-and-set; ``checkpoint_bucket``: each run's last completed
      turn; ``nodes_bucket``: a key per live daemon, expiring ``node_ttl_seconds`` after
      its last heartbeat (a dead owner's runs are then taken over).
    """

    nats_url: str = "nats://127.0.0.1:4222"
    subject_prefix: str = "loopfuse"
    runs_stream: str = "LOOPFUSE_RUNS"
    events_stream: str = "LOOPFUSE_EVENTS"
    state_bucket: str = "loopfuse_runstate"
    checkpoint_bucket: str = "loopfuse_checkpoints"
    nodes_bucket: str = "loopfuse_nodes"
    ack_wait_seconds: _Positive = 30.0
    max_deliver: Annotated[int, msgspec.Meta(ge=1)] = 20
    duplicate_window_seconds: _Positive = 120.0
    events_max_age_seconds: _Positive = 86400.0
    node_ttl_seconds: _Positive = 15.0

    def named(self, fleet: str) -> ClusterSettings:
        """These settings with every subject, stream and bucket name derived from ``fleet``
        (several fleets on one NATS)."""
        return msgspec.structs.replace(
            self,
            subject_prefix=fleet,
            runs_stream=f"{fleet.upper()}_RUNS",
            events_stream=f"{fleet.upper()}_EVENTS",
            state_bucket=f"{fleet}_runstate",
            checkpoint_bucket=f"{fleet}_checkpoints",
            nodes_bucket=f"{fleet}_nodes",
        )

    @property
    def submit_subject(self) -> str:
        return f"{self.subject_prefix}.submit"

    def events_subject(self, run_id: str) -> str:
        return f"{self.subject_prefix}.run.{run_id}.events"

    def abort_subject(self, run_id: str) -> str:
        return f"{self.subject_prefix}.run.{run_id}.abort"
