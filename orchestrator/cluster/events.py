"""Reading one run's events back from the events stream, from any daemon.

A run's events are the messages on ``<prefix>.run.<id>.events``; their ids are the
stream's sequence numbers (increasing, not consecutive: the stream holds every run).
:func:`run_events` replays from after a given id through an ordered consumer and follows
the run live until its ``RunFinished``: resuming with the last id seen gives no gaps and
no duplicates, whichever daemon serves it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import suppress
from typing import Final, NamedTuple

import nats.errors
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from orchestrator.cluster.publisher import TYPE_HEADER
from orchestrator.cluster.settings import ClusterSettings

__all__ = ["ClusterEvent", "last_event", "run_events"]

POLL_SECONDS: Final = 1.0


class ClusterEvent(NamedTuple):
    """One stored bus message of a run: its stream sequence, type name and JSON."""

    seq: int
    type: str
    data: bytes


async def last_event(
    js: JetStreamContext, settings: ClusterSettings, run_id: str
) -> ClusterEvent | None:
    """The newest stored event of ``run_id`` (``None``: none yet)."""
    try:
        raw = await js.get_last_msg(settings.events_stream, settings.events_subject(run_id))
    except NotFoundError:
        return None
    assert raw.seq is not None
    return ClusterEvent(raw.seq, (raw.headers or {}).get(TYPE_HEADER, ""), raw.data or b"")


async def run_events(
    js: JetStreamContext,
    settings: ClusterSettings,
    run_id: str,
    *,
    after: int = 0,
) -> AsyncIterator[ClusterEvent]:
    """``run_id``'s events with ids above ``after``, live until its ``RunFinished``.

    Ends at once if the newest stored event is ``RunFinished`` and its id is ``after`` or
    below (a client resuming after the end).
    """
    newest = await last_event(js, settings, run_id)
    if newest is not None and newest.type == "RunFinished" and newest.seq <= after:
        return
    subject = settings.events_subject(run_id)
    config = ConsumerConfig(
        deliver_policy=DeliverPolicy.BY_START_SEQUENCE if after else DeliverPolicy.ALL,
        opt_start_seq=after + 1 if after else None,
    )
    sub = await js.subscribe(
        subject, stream=settings.events_stream, ordered_consumer=True, config=config
    )
    try:
        while True:
            try:
                msg = await sub.next_msg(timeout=POLL_SECONDS)
            except TimeoutError:
                continue
            kind = (msg.headers or {}).get(TYPE_HEADER, "")
            yield ClusterEvent(msg.metadata.sequence.stream, kind, msg.data)
            if kind == "RunFinished":
                return
    finally:
        with suppress(nats.errors.Error):
            await sub.unsubscribe()
