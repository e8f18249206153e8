"""The store's writer thread: its lifetime, its connection, commits that outlive a cancelled
writer task, failures that reach every waiter; and :class:`WriterThread` itself."""

from __future__ import annotations

import sqlite3
import threading
import time
from contextlib import closing
from pathlib import Path

import anyio
import pytest

from orchestrator.daemon.store import RunRow, Store, StoreFailed
from orchestrator.daemon.writer_thread import WriterThread


def row(run_id: str) -> RunRow:
    return RunRow(
        id=run_id,
        trace_id=f"trace-{run_id}",
        status="queued",
        on_crash="resume",
        request=b"{}",
        request_hash="h",
        created_at=time.time(),
    )


def stored_ids(path: Path) -> list[str]:
    with closing(sqlite3.connect(path)) as db:
        return [r[0] for r in db.execute("SELECT id FROM runs ORDER BY cursor")]


class Seen:
    """What a call inside a commit saw: its thread and its connection."""

    def __init__(self) -> None:
        self.threads: list[threading.Thread] = []
        self.connections: list[sqlite3.Connection] = []

    def __call__(self, conn: sqlite3.Connection) -> None:
        self.threads.append(threading.current_thread())
        self.connections.append(conn)


@pytest.mark.asyncio
async def test_commits_run_on_one_thread_of_the_stores_own_that_ends_with_it(
    tmp_path: Path,
) -> None:
    store, seen = Store(tmp_path / "s.db"), Seen()
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            await tg.start(store.run)
            for name in ("a", "b", "c"):
                store.insert_run(row(name))
                await store.execute(seen).wait()
            writer = seen.threads[0]
            alive_while_running = writer.is_alive()
            store.close()
    assert len(seen.threads) == 3
    assert all(thread is writer for thread in seen.threads)
    assert writer is not threading.current_thread()
    assert writer.name == "loopfuse-store-writer"
    assert alive_while_running
    assert not writer.is_alive()  # joined when run() returned
    assert stored_ids(tmp_path / "s.db") == ["a", "b", "c"]


@pytest.mark.asyncio
async def test_the_writers_connection_refuses_any_other_thread(tmp_path: Path) -> None:
    store, seen = Store(tmp_path / "s.db"), Seen()
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            await tg.start(store.run)
            store.insert_run(row("a"))
            await store.execute(seen).wait()
            with pytest.raises(sqlite3.ProgrammingError, match="same thread"):
                seen.connections[0].execute("SELECT count(*) FROM runs")
            store.insert_run(row("b"))
            await store.execute(seen).wait()  # the refused use left the writer as it was
            store.close()
    assert seen.connections[0] is seen.connections[1]
    assert stored_ids(tmp_path / "s.db") == ["a", "b"]


@pytest.mark.asyncio
async def test_a_commit_in_flight_when_the_writer_is_cancelled_completes(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.db"
    store = Store(path)
    entered, release = threading.Event(), threading.Event()
    seen = Seen()

    def slow(conn: sqlite3.Connection) -> None:
        seen(conn)
        entered.set()
        release.wait(10)

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            await tg.start(store.run)
            store.insert_run(row("in-flight"))
            committed = store.execute(slow)
            await anyio.to_thread.run_sync(entered.wait, 10)
            tg.cancel_scope.cancel()  # while the commit is in the writer thread
            release.set()
    assert committed.is_set()
    assert store.statistics().commits == 1  # counted: the commit's result was recorded
    assert stored_ids(path) == ["in-flight"]
    assert not seen.threads[0].is_alive()
    await store.flush()  # nothing is left waiting


@pytest.mark.asyncio
async def test_a_failed_commit_reaches_its_waiters_and_ends_the_thread(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    store, seen = Store(path), Seen()
    failures: list[BaseException] = []

    def broken(conn: sqlite3.Connection) -> None:
        seen(conn)
        raise sqlite3.OperationalError("disk I/O error")

    async def writer() -> None:
        try:
            await store.run()
        except sqlite3.OperationalError as exc:
            failures.append(exc)

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(writer)
            store.insert_run(row("lost"))
            store.execute(broken)
            with pytest.raises(StoreFailed, match="disk I/O error"):
                await store.flush()
    assert [str(e) for e in failures] == ["disk I/O error"]
    assert not seen.threads[0].is_alive()
    assert stored_ids(path) == []
    with pytest.raises(StoreFailed):
        store.insert_run(row("after"))


@pytest.mark.asyncio
async def test_writer_thread_runs_calls_in_order_and_hands_back_errors() -> None:
    thread = WriterThread("test-writer")
    thread.start()
    try:
        order: list[int] = []
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                for n in range(20):
                    tg.start_soon(thread.call, lambda n=n: order.append(n))
                    await anyio.lowlevel.checkpoint()
            assert order == list(range(20))
            assert await thread.call(threading.current_thread) is not threading.current_thread()
            with pytest.raises(ZeroDivisionError):
                await thread.call(lambda: 1 // 0)
            assert await thread.call(lambda: 42) == 42  # an error does not end the thread
    finally:
        await thread.stop()
    assert not thread.is_alive()
    with pytest.raises(RuntimeError, match="not running"):  # not a wait that never ends
        await thread.call(lambda: 1)


@pytest.mark.asyncio
async def test_a_cancelled_caller_is_released_and_the_call_still_runs() -> None:
    thread = WriterThread("test-writer")
    thread.start()
    entered, release, finished = threading.Event(), threading.Event(), threading.Event()

    def blocking() -> str:
        entered.set()
        release.wait(10)
        finished.set()
        return "dropped"

    try:
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(thread.call, blocking)
                await anyio.to_thread.run_sync(entered.wait, 10)
                tg.cancel_scope.cancel()  # the caller goes at once; the call goes on
            release.set()
            assert await thread.call(lambda: "next") == "next"  # after the blocked call
            assert finished.is_set()
    finally:
        release.set()
        await thread.stop()
    assert not thread.is_alive()


@pytest.mark.asyncio
async def test_bytes_and_none_are_stored_as_blobs_and_nulls(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    store = Store(path)
    async with anyio.create_task_group() as tg:
        await tg.start(store.run)
        store.insert_run(row("a"))
        store.append_event("a", 1, "Progress", b'{"n":1}')
        store.save_checkpoint("a", b"\x00\xffcp")
        store.update_run("a", status="running", cause=None, result=b'{"r":1}')
        await store.flush()
        store.close()
    with closing(sqlite3.connect(path)) as db:
        assert db.execute(
            "SELECT typeof(request), typeof(result), typeof(cause), typeof(started_at), result "
            "FROM runs"
        ).fetchall() == [("blob", "blob", "null", "null", b'{"r":1}')]
        assert db.execute("SELECT typeof(data), data FROM run_events").fetchall() == [
            ("blob", b'{"n":1}')
        ]
        assert db.execute("SELECT data FROM run_checkpoints").fetchall() == [(b"\x00\xffcp",)]


def replace_with_folder(path: Path) -> None:
    for leftover in path.parent.iterdir():
        leftover.unlink()
    path.mkdir()


@pytest.mark.asyncio
async def test_a_writer_that_cannot_open_the_file_fails_to_start_and_leaves_no_thread(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.db"
    store = Store(path)  # made and set up, then the file is gone and a folder is in its place
    replace_with_folder(path)
    with anyio.fail_after(20), pytest.raises(sqlite3.OperationalError, match="unable to open"):
        await store.run()
    assert not [t for t in threading.enumerate() if t.name == "loopfuse-store-writer"]
