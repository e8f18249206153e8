"""The store (WAL, group commit, retention), the authenticator and the JSON log lines."""

from __future__ import annotations

import io
import json
import logging
import sqlite3
import time
from contextlib import closing
from pathlib import Path

import anyio
import pytest

from orchestrator.daemon.auth import Authenticator
from orchestrator.daemon.logs import JsonFormatter, configure_logging
from orchestrator.daemon.retention import prune
from orchestrator.daemon.store import RunRow, Store


def row(run_id: str, *, status: str = "queued") -> RunRow:
    return RunRow(
        id=run_id,
        trace_id=f"trace-{run_id}",
        status=status,
        on_crash="resume",
        request=b'{"task":"x"}',
        request_hash="h",
        created_at=time.time(),
    )


@pytest.mark.asyncio
async def test_wal_and_group_commit(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    async with anyio.create_task_group() as tg:
        await tg.start(store.run)
        store.insert_run(row("r1"))
        await store.flush()
        commits_before = store.statistics().commits
        for seq in range(1, 1001):
            store.append_event("r1", seq, "Progress", b'{"n":%d}' % seq)
        await store.flush()
        stats = store.statistics()
        events = await store.events("r1", after=0, limit=2000)
        tail = await store.tail("r1", 3)
        stored = await store.get_run("r1")
        with closing(sqlite3.connect(tmp_path / "s.db")) as db:
            mode = db.execute("PRAGMA journal_mode").fetchone()[0]
        store.close()
    assert mode == "wal"
    assert stats.events_written == 1000
    assert stats.commits - commits_before == 1  # a thousand events, one transaction
    assert [e.seq for e in events] == list(range(1, 1001))
    assert [e.seq for e in tail] == [998, 999, 1000]
    assert stored is not None
    assert stored.last_event == 1000
    with closing(sqlite3.connect(tmp_path / "s.db")) as db:  # durable: another connection sees it
        assert db.execute("SELECT count(*) FROM events").fetchone() == (1000,)


@pytest.mark.asyncio
async def test_a_commit_updates_only_the_columns_given_and_keeps_the_last_event(
    tmp_path: Path,
) -> None:
    store = Store(tmp_path / "s.db")
    async with anyio.create_task_group() as tg:
        await tg.start(store.run)
        for name in ("a", "b", "c"):
            store.insert_run(row(name))
        store.update_run("a", status="running", started_at=5.0)
        store.update_run("b", cause="x")
        store.save_checkpoint("b", b"cp")
        for seq in (1, 2, 3):
            store.append_event("c", seq, "Progress", b"{}")
        await store.flush()
        store.update_run("a", status="ended", ended_at=6.0, cause=None, result=b'{"r":1}')
        store.update_run("b", cause=None)  # a column set to NULL is set, not left
        store.append_event("c", 4, "Progress", b"{}")
        store.update_run("c", events_dropped=2)
        await store.flush()
        a, b, c = [await store.get_run(name) for name in ("a", "b", "c")]
        checkpoint = await store.checkpoint("b")
        store.append_event("b", 1, "Progress", b"{}")
        store.append_event("b", 2, "Progress", b"{}")
        await store.flush()
        b_events = await store.get_run("b")
        store.close()
    with closing(sqlite3.connect(tmp_path / "s.db")) as db:  # events alone leave the row be
        row_b = db.execute("SELECT last_event FROM runs WHERE id = 'b'").fetchone()[0]
        row_c = db.execute("SELECT last_event FROM runs WHERE id = 'c'").fetchone()[0]
    assert (row_b, row_c) == (0, 4)
    assert b_events is not None
    assert b_events.last_event == 2
    assert a is not None
    assert b is not None
    assert c is not None
    assert (a.status, a.started_at, a.ended_at, a.cause, a.result) == (
        "ended",
        5.0,
        6.0,
        None,
        b'{"r":1}',
    )
    assert (a.trace_id, a.request, a.last_event) == ("trace-a", b'{"task":"x"}', 0)
    assert (b.status, b.cause, checkpoint) == ("queued", None, b"cp")
    assert (c.status, c.last_event, c.events_dropped) == ("queued", 4, 2)


@pytest.mark.asyncio
async def test_commits_of_any_size_store_each_event_once(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    sizes = [1, 3, 5, 4, 9, 200, 7_600, 2, 70]  # 7,600 events: more than one statement holds
    seq = 0
    async with anyio.create_task_group() as tg:
        await tg.start(store.run)
        for index in range(300):
            store.insert_run(row(f"r{index}"))
        await store.flush()
        for size in sizes:
            for _ in range(size):
                seq += 1
                store.append_event(f"r{seq % 300}", seq, "Progress", b'{"n":%d}' % seq)
            await store.flush()
        stored = [await store.get_run(f"r{index}") for index in range(300)]
        store.close()
    with closing(sqlite3.connect(tmp_path / "s.db")) as db:
        count, low, high = db.execute("SELECT count(*), min(seq), max(seq) FROM events").fetchone()
        runs = db.execute("SELECT count(*) FROM runs").fetchone()[0]
    assert (count, low, high, runs) == (seq, 1, seq, 300)  # no padding row stored
    last = {f"r{index}": max(range(index, seq + 1, 300)) for index in range(300)}
    assert {r.id: r.last_event for r in stored if r is not None} == last


@pytest.mark.asyncio
async def test_retention_prunes_old_and_surplus_ended_runs_only(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    now = time.time()
    async with anyio.create_task_group() as tg:
        await tg.start(store.run)
        for name in ("old", "mid", "new", "live"):
            store.insert_run(row(name))
            store.append_event(name, 1, "RunStarted", b"{}")
        for name, age in (("old", 1000), ("mid", 50), ("new", 10)):
            store.update_run(name, status="ended", ended_at=now - age)
        await store.flush()
        await prune(store, ended_before=now - 500, keep=1)  # age drops old, count mid
        left = {r.id for r in await store.list_runs()}
        orphans = [await store.events(name) for name in ("old", "mid")]
        store.close()
    assert left == {"new", "live"}
    assert orphans == [[], []]


@pytest.mark.asyncio
async def test_list_runs_filters_and_pages(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    async with anyio.create_task_group() as tg:
        await tg.start(store.run)
        for index in range(5):
            store.insert_run(row(f"r{index}"))
        store.update_run("r1", status="ended", exit_reason="completed", ended_at=1.0)
        await store.flush()
        newest = await store.list_runs(limit=2)
        older = await store.list_runs(limit=10, before=newest[-1].cursor)
        completed = await store.list_runs(exit_reason="completed")
        unfinished = await store.unfinished()
        store.close()
    assert [r.id for r in newest] == ["r4", "r3"]
    assert [r.id for r in older] == ["r2", "r1", "r0"]
    assert [r.id for r in completed] == ["r1"]
    assert [r.id for r in unfinished] == ["r0", "r2", "r3", "r4"]


def test_authenticator() -> None:
    auth = Authenticator.from_environment("T", metrics_auth=False, environ={"T": " one , two ,,"})
    assert auth.enabled
    assert auth.accepts("Bearer one")
    assert auth.accepts("bearer two")
    assert not auth.accepts("Bearer three")
    assert not auth.accepts("Basic one")
    assert not auth.accepts(None)
    assert not auth.needs_token("/healthz")
    assert not auth.needs_token("/metrics")
    assert auth.needs_token("/v1/runs")
    open_auth = Authenticator.from_environment("T", metrics_auth=True, environ={})
    assert not open_auth.enabled
    assert not open_auth.needs_token("/v1/runs")


def test_json_log_lines_carry_run_and_trace_ids() -> None:
    out = io.StringIO()
    configure_logging("info", out)
    logger = logging.getLogger("loopfuse.daemon")
    try:
        logger.info("run accepted", extra={"run_id": "r1", "trace_id": "t1"})
        logger.debug("not at info")
        try:
            raise ValueError("boom")
        except ValueError:
            logger.exception("failed", extra={"run_id": "r2"})
    finally:
        for name in ("loopfuse", "uvicorn.error"):
            logging.getLogger(name).handlers.clear()
            logging.getLogger(name).propagate = True
            logging.getLogger(name).setLevel(logging.NOTSET)
        logging.getLogger("uvicorn.access").disabled = False
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert len(lines) == 2
    first, second = lines
    assert first["message"] == "run accepted"
    assert (first["run_id"], first["trace_id"], first["level"]) == ("r1", "t1", "info")
    assert first["ts"].endswith("Z")
    assert second["level"] == "error"
    assert "ValueError: boom" in second["exception"]
    assert JsonFormatter().format(logging.makeLogRecord({"msg": "x"})).startswith("{")
