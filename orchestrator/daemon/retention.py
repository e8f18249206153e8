"""Retention: ended runs and their events are kept for a while, then pruned.

A run is pruned (its row, its events and its checkpoint) when it ended more than
``daemon.retention_seconds`` ago, or when more than ``daemon.retention_max_runs`` ended runs
are newer than it. Queued and running runs are never pruned. The deletion is one queued
write, committed with the store's next batch.
"""

from __future__ import annotations

import sqlite3
import time
from typing import Final

import anyio

from orchestrator.config import DaemonSettings
from orchestrator.daemon.store import Store

__all__ = ["INTERVAL_SECONDS", "keep_pruning", "prune", "prune_now"]

INTERVAL_SECONDS: Final = 600.0
"""At most this long between two prunings (less when ``retention_seconds`` is short)."""


async def prune(store: Store, *, ended_before: float, keep: int) -> None:
    """Delete the ended runs that ended before ``ended_before`` or are beyond the ``keep``
    most recent ended runs, with their events and checkpoints; returns once that is
    committed (and they are gone from the memory tail too)."""
    doomed: list[tuple[str]] = []

    def delete(conn: sqlite3.Connection) -> None:
        doomed[:] = [
            (row[0],)
            for row in conn.execute(
                "SELECT id FROM runs WHERE status = 'ended' AND ended_at < ? "
                "UNION SELECT id FROM (SELECT id FROM runs WHERE status = 'ended' "
                "ORDER BY ended_at DESC LIMIT -1 OFFSET ?)",
                (ended_before, keep),
            )
        ]
        for table in ("run_events", "run_checkpoints"):
            conn.executemany(
                f"DELETE FROM {table} WHERE run = (SELECT cursor FROM runs WHERE id = ?)", doomed
            )
        conn.executemany("DELETE FROM runs WHERE id = ?", doomed)

    await store.execute(delete).wait()
    store.memory.forget(run_id for (run_id,) in doomed)


async def prune_now(store: Store, settings: DaemonSettings) -> None:
    """Prune by ``settings`` as of now."""
    await prune(
        store,
        ended_before=time.time() - settings.retention_seconds,
        keep=settings.retention_max_runs,
    )


async def keep_pruning(store: Store, settings: DaemonSettings) -> None:
    """Prune every ``min(INTERVAL_SECONDS, retention_seconds / 10)``, until cancelled."""
    interval = min(INTERVAL_SECONDS, settings.retention_seconds / 10)
    while True:
        await anyio.sleep(interval)
        await prune_now(store, settings)
