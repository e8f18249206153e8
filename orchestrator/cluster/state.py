"""A run's fleet-wide state: one KV entry per run, changed only by compare-and-set.

``queued`` (submitted, no owner) → ``running`` (``owner`` = the daemon running it) →
``ended`` (the result is in the entry). ``aborting`` is set by ``POST …/abort`` on any
daemon; the owner hears it on the abort subject (or reads it on its next progress beat)
and aborts the run.
A daemon may only take a run whose entry it updated from the revision it read: two daemons
that both got the message cannot both own the run.
"""

from __future__ import annotations

from typing import Any, Final, Literal

import msgspec

from orchestrator.daemon.schemas import RunStatus

__all__ = ["STATE_DECODER", "STATE_ENCODER", "FleetStatus", "RunState"]

FleetStatus = Literal[RunStatus, "aborting"]
"""The API's statuses and ``aborting`` (the API shows it as ``running``)."""


class RunState(msgspec.Struct, frozen=True, kw_only=True):
    """The ``runstate`` KV value of one run."""

    run_id: str
    trace_id: str
    status: FleetStatus
    on_crash: str
    request: dict[str, Any]
    request_hash: str
    created_at: float
    owner: str | None = None
    attempts: int = 0
    exit_reason: str | None = None
    cause: str | None = None
    result: dict[str, Any] | None = None
    ended_at: float | None = None


STATE_ENCODER: Final = msgspec.json.Encoder(order="sorted")
STATE_DECODER: Final = msgspec.json.Decoder(RunState)
