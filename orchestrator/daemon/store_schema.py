"""The store's SQLite layout: the schema, the connection settings, and the migration of
files an earlier version wrote."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Final

__all__ = ["SCHEMA", "connect", "migrate"]

SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS runs (
    cursor INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    trace_id TEXT NOT NULL,
    status TEXT NOT NULL,
    on_crash TEXT NOT NULL,
    request BLOB NOT NULL,
    request_hash TEXT NOT NULL,
    idempotency_key TEXT UNIQUE,
    created_at REAL NOT NULL,
    started_at REAL,
    ended_at REAL,
    exit_reason TEXT,
    cause TEXT,
    result BLOB,
    last_event INTEGER NOT NULL DEFAULT 0,
    events_dropped INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS runs_by_status ON runs (status, cursor);
CREATE INDEX IF NOT EXISTS runs_by_end ON runs (ended_at) WHERE status = 'ended';
CREATE TABLE IF NOT EXISTS run_events (
    run INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    type TEXT NOT NULL,
    data BLOB NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS run_events_by_run ON run_events (run, seq);
CREATE TABLE IF NOT EXISTS run_checkpoints (
    run INTEGER PRIMARY KEY,
    data BLOB NOT NULL
);
"""
# Events are appended in commit order (rowid) and found through a small index on (the run's
# cursor, seq): a commit writes the table's last pages. A run's newest checkpoint is a row
# of its own in ``run_checkpoints``, so a change of the run's row does not rewrite it
# (docs/daemon.md, "Durability").

_EVENTS_VIEW: Final = """
CREATE VIEW IF NOT EXISTS events AS
    SELECT runs.id AS run_id, run_events.seq, run_events.type, run_events.data
    FROM run_events JOIN runs ON runs.cursor = run_events.run;
"""
"""``events (run_id, seq, type, data)`` as before, for whoever queries the file by hand."""

_MIGRATE_EVENTS: Final = """
INSERT OR REPLACE INTO run_events (run, seq, type, data)
    SELECT runs.cursor, events.seq, events.type, events.data
    FROM events JOIN runs ON runs.id = events.run_id;
DROP TABLE events;
"""
"""A store written by an earlier version (an ``events`` table keyed by run id)."""

_MIGRATE_CHECKPOINTS: Final = """
INSERT OR REPLACE INTO run_checkpoints (run, data)
    SELECT cursor, checkpoint FROM runs WHERE checkpoint IS NOT NULL;
"""
"""A store written by an earlier version (each run's checkpoint in its ``runs`` row)."""


def connect(path: Path, *, same_thread: bool = False) -> sqlite3.Connection:
    """A connection to ``path``; ``same_thread``: usable only on this thread (the writer's:
    the sqlite3 module raises if any other thread touches it)."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=same_thread, timeout=30.0)
    conn.execute("PRAGMA busy_timeout = 30000")
    conn.execute("PRAGMA synchronous = FULL")
    return conn


def migrate(conn: sqlite3.Connection) -> None:
    """Move what an earlier version wrote to where this one keeps it: an ``events`` table
    into ``run_events``, checkpoints in ``runs`` rows into ``run_checkpoints``; make the
    view."""
    found = conn.execute("SELECT type FROM sqlite_master WHERE name = 'events'").fetchone()
    if found is not None and found[0] == "table":
        _in_transaction(conn, [s for s in _MIGRATE_EVENTS.split(";") if s.strip()])
    columns = {row[1] for row in conn.execute("PRAGMA table_info(runs)")}
    if "checkpoint" in columns:
        # Dropping a column needs SQLite 3.35; before it, the column stays, emptied.
        emptied = (
            "ALTER TABLE runs DROP COLUMN checkpoint"
            if sqlite3.sqlite_version_info >= (3, 35, 0)
            else "UPDATE runs SET checkpoint = NULL WHERE checkpoint IS NOT NULL"
        )
        _in_transaction(conn, [_MIGRATE_CHECKPOINTS, emptied])
    conn.executescript(_EVENTS_VIEW)


def _in_transaction(conn: sqlite3.Connection, statements: Sequence[str]) -> None:
    conn.execute("BEGIN IMMEDIATE")
    try:
        for statement in statements:
            conn.execute(statement)
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
