"""The store's event layout: events appended in commit order under their run's cursor, a
store written by an earlier version (events keyed by run id) moved over when opened, and
the ``events`` view for whoever reads the file by hand."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import anyio
import pytest

from orchestrator.daemon import retention
from orchestrator.daemon.store import RunRow, Store

OLD_SCHEMA = """
CREATE TABLE runs (
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
    events_dropped INTEGER NOT NULL DEFAULT 0,
    checkpoint BLOB
);
CREATE TABLE events (
    run_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    type TEXT NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (run_id, seq)
) WITHOUT ROWID;
"""


def row(run_id: str, status: str = "running") -> RunRow:
    return RunRow(
        id=run_id,
        trace_id="t",
        status=status,
        on_crash="abort",
        request=b"{}",
        request_hash="h",
        created_at=1.0,
    )


def old_store(path: Path) -> None:
    with closing(sqlite3.connect(path)) as db:
        db.executescript(OLD_SCHEMA)
        for cursor, run_id in ((1, "a"), (7, "b")):
            db.execute(
                "INSERT INTO runs (cursor, id, trace_id, status, on_crash, request, "
                "request_hash, created_at, last_event) VALUES (?, ?, 't', 'ended', 'abort', "
                "'{}', 'h', 1.0, 2)",
                (cursor, run_id),
            )
            for seq in (1, 2):
                db.execute(
                    "INSERT INTO events VALUES (?, ?, 'E', ?)",
                    (run_id, seq, f"{run_id}{seq}".encode()),
                )
        db.execute("INSERT INTO events VALUES ('orphan', 1, 'E', 'x')")
        db.execute("DELETE FROM runs WHERE id = 'b'")  # the sequence remembers cursor 7
        db.execute(
            "INSERT INTO runs (cursor, id, trace_id, status, on_crash, request, request_hash, "
            "created_at) VALUES (3, 'c', 't', 'running', 'abort', '{}', 'h', 1.0)"
        )
        db.commit()


@pytest.mark.asyncio
async def test_an_earlier_versions_store_is_moved_over_when_opened(tmp_path: Path) -> None:
    path = tmp_path / "daemon.db"
    old_store(path)
    store = Store(path)
    async with anyio.create_task_group() as tg:
        await tg.start(store.run)
        events = await store.events("a")
        assert [(e.seq, e.data) for e in events] == [(1, b"a1"), (2, b"a2")]
        new = row("d")
        store.insert_run(new)
        assert new.cursor == 8  # above every cursor ever given, the deleted run's too
        store.append_event("d", 1, "E", b"d1")
        store.append_event("c", 1, "E", b"c1")  # a run from before: its cursor looked up
        await store.flush()
        assert [e.data for e in await store.events("d")] == [b"d1"]
        assert [e.data for e in await store.tail("c", 5)] == [b"c1"]
        store.close()
    with closing(sqlite3.connect(path)) as db:
        kinds = dict(db.execute("SELECT name, type FROM sqlite_master").fetchall())
        by_hand = db.execute("SELECT run_id, seq, data FROM events ORDER BY run_id, seq").fetchall()
    assert kinds["events"] == "view"
    assert kinds["run_events"] == "table"
    assert by_hand == [("a", 1, b"a1"), ("a", 2, b"a2"), ("c", 1, b"c1"), ("d", 1, b"d1")]


@pytest.mark.asyncio
async def test_events_of_pruned_runs_go_with_them(tmp_path: Path) -> None:
    store = Store(tmp_path / "daemon.db")
    async with anyio.create_task_group() as tg:
        await tg.start(store.run)
        for run_id in ("old", "new"):
            store.insert_run(row(run_id))
            store.append_event(run_id, 1, "E", b"x")
        store.update_run("old", status="ended", ended_at=10.0)
        store.update_run("new", status="ended", ended_at=1e12)
        await store.flush()
        await retention.prune(store, ended_before=100.0, keep=10)
        assert await store.events("old") == []
        assert [e.data for e in await store.events("new")] == [b"x"]
        store.close()
    with closing(sqlite3.connect(tmp_path / "daemon.db")) as db:
        assert db.execute("SELECT count(*) FROM run_events").fetchone() == (1,)


def test_the_store_leaves_the_sqlite3_module_as_it_found_it() -> None:
    """Adapters are the module's, so every connection of the process would get them: the
    store registers none (a library's caller may use sqlite3 too)."""
    script = (
        "import sqlite3; before = dict(sqlite3.adapters); "
        "import orchestrator.daemon.store; "
        "assert sqlite3.adapters == before, set(sqlite3.adapters) - set(before)"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
