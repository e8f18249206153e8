"""Checkpoints in a table of their own (``run_checkpoints``, keyed by the run's cursor), a
store whose runs rows held them (an earlier version) moved over when opened, their pruning
with their run, and a commit that fails: its waiters are told, nobody waits forever."""

from __future__ import annotations

import json
import signal
import sqlite3
import threading
import time
from contextlib import closing
from pathlib import Path
from typing import Any

import anyio
import pytest

from orchestrator.daemon import retention
from orchestrator.daemon import store as store_module
from orchestrator.daemon.client import DaemonClient
from orchestrator.daemon.store import RunRow, Store, StoreFailed
from tests.daemon_support import daemon_process, events_until, wait_ended
from tests.test_daemon_process import MAX_TURNS, all_events, write_config

PREVIOUS_RUNS = """
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
CREATE INDEX runs_by_status ON runs (status, cursor);
"""
"""The previous version's ``runs`` table: each run's checkpoint in its row."""


def row(run_id: str) -> RunRow:
    return RunRow(
        id=run_id,
        trace_id=f"trace-{run_id}",
        status="running",
        on_crash="resume",
        request=b'{"task":"x"}',
        request_hash="h",
        created_at=time.time(),
    )


def columns(path: Path) -> set[str]:
    with closing(sqlite3.connect(path)) as db:
        return {found[1] for found in db.execute("PRAGMA table_info(runs)")}


def stored_checkpoints(path: Path) -> dict[str, bytes]:
    with closing(sqlite3.connect(path)) as db:
        found = db.execute(
            "SELECT runs.id, run_checkpoints.data FROM run_checkpoints "
            "JOIN runs ON runs.cursor = run_checkpoints.run"
        ).fetchall()
    return {run_id: bytes(data) for run_id, data in found}


def to_previous_format(path: Path) -> None:
    """Rewrite a store as the previous version kept checkpoints: in the runs rows."""
    with closing(sqlite3.connect(path)) as db:
        db.execute("ALTER TABLE runs ADD COLUMN checkpoint BLOB")
        db.execute(
            "UPDATE runs SET checkpoint = "
            "(SELECT data FROM run_checkpoints WHERE run = runs.cursor)"
        )
        db.execute("DROP TABLE run_checkpoints")
        db.commit()


@pytest.mark.asyncio
async def test_checkpoints_have_a_table_of_their_own(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    store = Store(path)
    async with anyio.create_task_group() as tg:
        await tg.start(store.run)
        for run_id in ("a", "b", "c"):
            store.insert_run(row(run_id))
        store.save_checkpoint("a", b"a1")  # in the commit that inserts its run
        await store.flush()
        store.save_checkpoint("a", b"a2")
        store.save_checkpoint("a", b"a3")  # the newest queued one wins
        store.save_checkpoint("b", b"b1")
        await store.flush()
        store.save_checkpoint("b", b"b2")  # its run ends in the same commit: not written
        store.update_run("b", status="ended", ended_at=2.0)
        await store.flush()
        found = {run_id: await store.checkpoint(run_id) for run_id in ("a", "b", "c", "none")}
        with pytest.raises(ValueError, match="checkpoint"):
            store.update_run("a", checkpoint=b"x")
        store.close()
    assert found == {"a": b"a3", "b": b"b1", "c": None, "none": None}
    assert stored_checkpoints(path) == {"a": b"a3", "b": b"b1"}
    assert "checkpoint" not in columns(path)


@pytest.mark.asyncio
async def test_a_store_with_checkpoints_in_its_rows_is_moved_over_when_opened(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.db"
    with closing(sqlite3.connect(path)) as db:
        db.executescript(PREVIOUS_RUNS)
        for cursor, run_id, checkpoint in ((1, "a", b"a-old"), (2, "b", None), (5, "c", b"c")):
            db.execute(
                "INSERT INTO runs (cursor, id, trace_id, status, on_crash, request, "
                "request_hash, created_at, checkpoint) VALUES (?, ?, 't', 'running', 'resume', "
                "?, 'h', 1.0, ?)",
                (cursor, run_id, b"{}", checkpoint),
            )
        db.commit()
    for opening in range(2):  # moved once; a second opening finds nothing to move
        store = Store(path)
        async with anyio.create_task_group() as tg:
            await tg.start(store.run)
            found = {run_id: await store.checkpoint(run_id) for run_id in ("a", "b", "c")}
            unfinished = [r.id for r in await store.unfinished()]
            if opening == 0:
                store.save_checkpoint("a", b"a-new")
                await store.flush()
            store.close()
        expected_a = b"a-old" if opening == 0 else b"a-new"
        assert found == {"a": expected_a, "b": None, "c": b"c"}
        assert unfinished == ["a", "b", "c"]
    assert "checkpoint" not in columns(path)
    assert stored_checkpoints(path) == {"a": b"a-new", "c": b"c"}


@pytest.mark.asyncio
async def test_checkpoints_of_pruned_runs_go_with_them(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    store = Store(path)
    async with anyio.create_task_group() as tg:
        await tg.start(store.run)
        for run_id in ("old", "new", "live"):
            store.insert_run(row(run_id))
            store.save_checkpoint(run_id, run_id.encode())
        await store.flush()
        store.update_run("old", status="ended", ended_at=10.0)
        store.update_run("new", status="ended", ended_at=1e12)
        await store.flush()
        await retention.prune(store, ended_before=100.0, keep=10)
        assert await store.checkpoint("old") is None
        store.close()
    assert stored_checkpoints(path) == {"new": b"new", "live": b"live"}


@pytest.mark.asyncio
async def test_a_failed_commit_wakes_whoever_waits_and_the_store_takes_no_more(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_module, "MAX_PENDING_EVENTS", 1)  # one queued event is "full"
    path = tmp_path / "s.db"
    store = Store(path)
    entered, release = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def broken(conn: sqlite3.Connection) -> None:  # the commit fails, late (a full disk)
        entered.set()
        release.wait(10)
        raise sqlite3.OperationalError("database or disk is full")

    async def writer() -> None:
        try:
            await store.run()
        except sqlite3.OperationalError as exc:
            errors.append(exc)

    async def flush_expecting_failure() -> None:
        with pytest.raises(StoreFailed, match="disk is full"):
            await store.flush()

    async def room_expecting_failure() -> None:  # a writer held back by a full queue
        with pytest.raises(StoreFailed, match="disk is full"):
            await store.wait_for_room()

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(writer)
            store.insert_run(row("kept"))
            await store.flush()
            store.insert_run(row("lost"))
            store.execute(broken)
            async with anyio.create_task_group() as waiters:
                waiters.start_soon(flush_expecting_failure)  # waits for the failing commit
                await anyio.to_thread.run_sync(entered.wait, 10)
                store.insert_run(row("next"))  # queued for the commit after it
                store.append_event("next", 1, "RunStarted", b"{}")
                waiters.start_soon(flush_expecting_failure)
                waiters.start_soon(room_expecting_failure)
                await anyio.wait_all_tasks_blocked()
                release.set()
            with pytest.raises(StoreFailed):
                store.insert_run(row("after"))
            with pytest.raises(StoreFailed):
                await store.flush()
    assert [type(e) for e in errors] == [sqlite3.OperationalError]
    with closing(sqlite3.connect(path)) as db:
        assert db.execute("SELECT id FROM runs").fetchall() == [("kept",)]


@pytest.mark.parametrize("previous_format", [False, True], ids=["table", "previous-format"])
@pytest.mark.asyncio
async def test_kill_9_then_the_run_resumes_from_its_stored_checkpoint(
    tmp_path: Path, previous_format: bool
) -> None:
    config, log = write_config(tmp_path), tmp_path / "daemon.log"
    store = tmp_path / "daemon.db"
    with daemon_process(config, log) as (process, url):
        async with DaemonClient(url) as client:
            run_id = (await client.submit({"scenario": "slow"}))["id"]
            with anyio.fail_after(30):
                seen = await events_until(
                    client, run_id, lambda e: e["type"] == "TurnEnded" and e["turn"] >= 2
                )
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=10)

    checkpoint: dict[str, Any] = json.loads(stored_checkpoints(store)[run_id])
    assert checkpoint["turn"] >= 2
    if previous_format:
        to_previous_format(store)
        assert "checkpoint" in columns(store)

    with daemon_process(config, log) as (_, url):
        async with DaemonClient(url) as client:
            with anyio.fail_after(60):
                run = await wait_ended(client, run_id)
            events = await all_events(client, run_id)

    assert events[: len(seen)] == seen
    restarts = [e for e in events if e["type"] == "RunStarted"]
    assert [e.get("resumed_from_turn") for e in restarts] == [None, checkpoint["turn"]]
    assert run["exit_reason"] == "max_turns"
    assert run["result"]["turns"] == MAX_TURNS
    assert "checkpoint" not in columns(store)
