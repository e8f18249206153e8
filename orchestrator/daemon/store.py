"""The durable store: runs and their events in SQLite (WAL), written by group commit
(``docs/daemon.md``, "Durability").

Writes are queued by plain calls that never block the event loop (:meth:`Store.insert_run`,
:meth:`Store.append_event`, :meth:`Store.update_run` …) and committed by one writer task
(:meth:`Store.run`): each commit takes everything queued so far and writes it in one
transaction on the store's own writer thread (:mod:`~orchestrator.daemon.writer_thread`), at
most one commit beginning per :data:`COMMIT_INTERVAL_SECONDS`. :meth:`Store.flush` awaits
durability (the API does, before it answers 202) and starts the next commit at once.

Reads run in worker threads on their own connections. :meth:`Store.watch` hands out an event
that is set after the next commit touching a run, so a reader that registers before it reads
never misses a commit. Every commit's events also go to :attr:`Store.memory`
(:mod:`~orchestrator.daemon.tail`) before the watchers are woken.
"""

from __future__ import annotations

import functools
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, NamedTuple

import anyio
from anyio.abc import TaskStatus

from orchestrator.daemon.store_rows import (
    COLUMNS,
    SUMMARY_CHARS_PARAMETERS,
    SUMMARY_COLUMNS,
    RunRow,
    read_row,
)
from orchestrator.daemon.store_schema import SCHEMA, connect, migrate
from orchestrator.daemon.store_writes import (
    INSERT_HEAD,
    UPDATE_HEAD,
    UPDATE_TAIL,
    UPDATED,
    execute_rows,
    inserted_row,
    row_updates,
)
from orchestrator.daemon.tail import EventTail, StoredEvent
from orchestrator.daemon.writer_thread import WriterThread

__all__ = [
    "MAX_PENDING_EVENTS",
    "RunRow",
    "Store",
    "StoreFailed",
    "StoreStatistics",
    "StoredEvent",
]

MAX_PENDING_EVENTS: Final = 20_000
"""Queued, uncommitted events above which :meth:`Store.wait_for_room` makes writers wait."""

COMMIT_INTERVAL_SECONDS: Final = 0.005
"""At most one commit begins per interval (a write that finds the writer idle for longer is
committed at once): durability, and live events to the streams, wait at most this long."""

DEFAULT_TAIL_EVENTS: Final = 512
DEFAULT_TAIL_BYTES: Final = 64 * 1024 * 1024
"""The memory tail's bounds when none is given (``daemon.memory_tail_*``'s defaults)."""

READERS: Final = 4
"""Worker threads (and connections) that serve reads."""


class StoreFailed(RuntimeError):
    """A commit failed (a full disk, a broken constraint …): what it held is not stored, and
    the store takes no more writes. :meth:`Store.flush` raises it to whoever waits, and
    :meth:`Store.run` ends with the commit's own error."""


class StoreStatistics(NamedTuple):
    """The writer at a glance (exported as metrics)."""

    commits: int
    events_written: int
    pending_events: int


@dataclass
class _Batch:
    runs: list[RunRow] = field(default_factory=list)
    events: list[tuple[str, int, str, bytes]] = field(default_factory=list)
    updates: dict[str, dict[str, Any]] = field(default_factory=dict)
    last_event: dict[str, int] = field(default_factory=dict)
    checkpoints: dict[str, bytes] = field(default_factory=dict)
    calls: list[Callable[[sqlite3.Connection], None]] = field(default_factory=list)
    committed: anyio.Event = field(default_factory=anyio.Event)
    failure: BaseException | None = None
    """Why this batch was not committed (the store is then failed: :class:`StoreFailed`)."""

    def __bool__(self) -> bool:
        return bool(self.runs or self.events or self.updates or self.checkpoints or self.calls)


class Store:
    """Runs and events in one SQLite file; see the module docstring for the write path."""

    def __init__(self, path: str | Path, *, tail: EventTail | None = None) -> None:
        self.path = Path(path)
        self.memory = tail or EventTail(per_run=DEFAULT_TAIL_EVENTS, total_bytes=DEFAULT_TAIL_BYTES)
        """The newest committed events of each run, for the event streams."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        setup = connect(self.path)
        try:
            mode = setup.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise RuntimeError(f"{self.path}: SQLite refused WAL mode (got {mode!r})")
            setup.executescript(SCHEMA)
            migrate(setup)
            # The next run's cursor: above every one ever given (AUTOINCREMENT's
            # ``sqlite_sequence`` remembers those of deleted runs).
            given = setup.execute("SELECT coalesce(max(cursor), 0) FROM runs").fetchone()[0]
            seq = setup.execute("SELECT seq FROM sqlite_sequence WHERE name = 'runs'").fetchone()
            self._next_cursor = int(max(given, seq[0] if seq else 0)) + 1
        finally:
            setup.close()
        self._thread = WriterThread("loopfuse-store-writer")
        self._writer: sqlite3.Connection | None = None
        self._writer_cursor: sqlite3.Cursor | None = None
        """The writer's connection, opened and used on :attr:`_thread` only."""
        self._cursors: dict[str, int] = {}
        """Run id → cursor (the events' key) of the runs being written."""
        self._readers: list[sqlite3.Connection] = []
        self._read_limiter = anyio.CapacityLimiter(READERS)
        self.reads = 0
        """Reads so far (each one a worker-thread hop)."""
        self._batch = _Batch()
        self._inflight: _Batch | None = None
        self._wake = anyio.Event()
        self._closed = False
        self._failure: StoreFailed | None = None
        self._stopped = anyio.Event()
        self._watchers: dict[str, anyio.Event] = {}
        self._before_commit: list[Callable[[], None]] = []
        self._began = 0.0
        self._urgent = anyio.Event()
        self._commits = 0
        self._events_written = 0
        self.on_commit: Callable[[float], None] | None = None
        """Called with each commit's duration in seconds (the store-write-latency metric)."""

    # ------------------------------------------------------------------ writer

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Commit queued writes until :meth:`close`, then commit the rest and close the file.

        The writer thread lives as long as this call: started (and the writer's connection
        opened on it) before the task counts as started, ended when it returns."""
        self._thread.start()
        try:
            await self._thread.call(self._open_writer)
            task_status.started()
            while True:
                for hook in self._before_commit:
                    hook()
                if not self._batch:
                    if self._closed:
                        return
                    await self._wake.wait()
                    self._wake = anyio.Event()
                    continue
                pause = self._began + COMMIT_INTERVAL_SECONDS - time.perf_counter()
                # Let more writes join this commit, unless someone waits for it (a 202).
                if pause > 0 and not self._closed and not self._urgent.is_set():
                    with anyio.move_on_after(pause):
                        await self._urgent.wait()
                    for hook in self._before_commit:
                        hook()
                if self._urgent.is_set():
                    self._urgent = anyio.Event()
                batch, self._batch = self._batch, _Batch()
                self._inflight = batch
                began = self._began = time.perf_counter()
                with anyio.CancelScope(shield=True):  # a commit begun ends, and is recorded
                    try:
                        await self._thread.call(functools.partial(self._commit, batch))
                    except Exception as exc:
                        self._fail(batch, exc)
                        raise
                if self.on_commit is not None:
                    self.on_commit(time.perf_counter() - began)
                self._inflight = None
                self._commits += 1
                self._events_written += len(batch.events)
                self.memory.committed((r.id for r in batch.runs), batch.events, batch.updates)
                for run_id, columns in batch.updates.items():
                    if columns.get("status") == "ended":
                        self._cursors.pop(run_id, None)
                batch.committed.set()
                touched = {r.id for r in batch.runs} | set(batch.last_event) | set(batch.updates)
                for run_id in touched:
                    watcher = self._watchers.pop(run_id, None)
                    if watcher is not None:
                        watcher.set()
        finally:
            self._stopped.set()
            with anyio.CancelScope(shield=True):
                try:
                    await self._thread.call(self._close_connections)
                finally:
                    await self._thread.stop()

    def close(self) -> None:
        """Let the writer commit what is queued, then stop (:meth:`run` returns)."""
        self._closed = True
        self._wake.set()

    def _fail(self, batch: _Batch, exc: Exception) -> None:
        """``batch``'s commit raised ``exc``: wake everyone who waits for it or for the
        next one (they get :class:`StoreFailed`, nobody waits forever) and take no more."""
        failure = StoreFailed(f"{self.path}: a commit failed, nothing more is stored: {exc!r}")
        failure.__cause__ = exc
        self._failure = failure
        self._inflight = None
        for waiting in (batch, self._batch):
            waiting.failure = failure
            waiting.committed.set()
        self.wake_all()

    def _commit(self, batch: _Batch) -> None:
        # One statement per kind, each writing many rows, through one cursor: sqlite3 takes
        # the GIL back after every step (docs/performance.md). A statement's text depends only
        # on its size class (:func:`execute_rows`): the statement cache prepares each once.
        conn, cursor = self._writer, self._writer_cursor
        assert conn is not None, "the writer's connection is opened by Store.run"
        assert cursor is not None
        updates = batch.updates
        cursor.execute("BEGIN IMMEDIATE")
        try:
            # A run inserted by this commit is inserted with its queued changes (no UPDATE
            # of the row just written).
            execute_rows(
                cursor,
                INSERT_HEAD,
                [
                    inserted_row(r, updates.get(r.id), batch.last_event.get(r.id, 0))
                    for r in batch.runs
                ],
            )
            # A run's events and checkpoint are keyed by its cursor. Those of a run with no
            # row are not stored (nothing could read them), nor the checkpoint of a run this
            # commit ends (an ended run is never resumed: it would not be read).
            cursors = self._cursors  # a cursor is never 0: ``or`` looks up only unknown runs
            execute_rows(
                cursor,
                "INSERT OR REPLACE INTO run_events (run, seq, type, data) SELECT * FROM (VALUES ",
                [
                    (key, seq, kind, data)
                    for run_id, seq, kind, data in batch.events
                    if (key := cursors.get(run_id) or self._cursor(conn, run_id)) is not None
                ],
            )
            inserted = {r.id for r in batch.runs} if batch.runs and updates else set()
            execute_rows(
                cursor,
                UPDATE_HEAD,
                row_updates(updates, batch.last_event, inserted),
                tail=UPDATE_TAIL,
            )
            execute_rows(
                cursor,
                "INSERT OR REPLACE INTO run_checkpoints (run, data) SELECT * FROM (VALUES ",
                [
                    (key, data)
                    for run_id, data in batch.checkpoints.items()
                    if updates.get(run_id, {}).get("status") != "ended"
                    and (key := self._cursor(conn, run_id)) is not None
                ],
            )
            for call in batch.calls:
                call(conn)
            cursor.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:  # a failed COMMIT may have rolled back already
                cursor.execute("ROLLBACK")
            raise

    def _cursor(self, conn: sqlite3.Connection, run_id: str) -> int | None:
        """The cursor of ``run_id`` (looked up once for a run this process did not insert:
        one recovered after a restart); ``None``: no such run."""
        cursor = self._cursors.get(run_id)
        if cursor is None:
            found = conn.execute("SELECT cursor FROM runs WHERE id = ?", (run_id,)).fetchone()
            if found is None:
                return None
            cursor = self._cursors[run_id] = found[0]
        return cursor

    def _open_writer(self) -> None:
        self._writer = connect(self.path, same_thread=True)
        self._writer_cursor = self._writer.cursor()

    def _close_connections(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = self._writer_cursor = None
        for conn in self._readers:
            conn.close()
        self._readers.clear()

    def _queued(self) -> _Batch:
        if self._failure is not None:
            raise self._failure
        if self._closed and self._stopped.is_set():
            raise RuntimeError("the store is closed")
        self._wake.set()
        return self._batch

    # ------------------------------------------------------------------ queued writes

    def insert_run(self, row: RunRow) -> None:
        """Queue a new run (its ``cursor`` is given here)."""
        row.cursor = self._next_cursor
        self._next_cursor += 1
        self._cursors[row.id] = row.cursor
        self._queued().runs.append(row)

    def append_event(self, run_id: str, seq: int, kind: str, data: bytes) -> None:
        """Queue event ``seq`` of ``run_id``."""
        batch = self._queued()
        batch.events.append((run_id, seq, kind, data))
        batch.last_event[run_id] = max(seq, batch.last_event.get(run_id, 0))

    def update_run(self, run_id: str, **columns: Any) -> None:
        """Queue new values for some of a run's columns (later updates win)."""
        unknown = set(columns).difference(UPDATED)
        if unknown:
            raise ValueError(f"not updatable: {sorted(unknown)}")
        self._queued().updates.setdefault(run_id, {}).update(columns)

    def save_checkpoint(self, run_id: str, data: bytes) -> None:
        """Queue ``data`` as the newest checkpoint of ``run_id`` (it replaces the one before;
        one that reaches a commit together with the run's end is not written)."""
        self._queued().checkpoints[run_id] = data

    def execute(self, call: Callable[[sqlite3.Connection], None]) -> anyio.Event:
        """Queue ``call`` to run inside the next commit's transaction; the returned event is
        set once that commit is durable."""
        batch = self._queued()
        batch.calls.append(call)
        return batch.committed

    async def flush(self) -> None:
        """Wait until everything queued so far is committed (at once: no commit interval).

        :raises StoreFailed: a commit failed; what it held is not stored."""
        if self._batch:
            self._urgent.set()
            batch = self._queued()
        elif self._inflight is not None:
            batch = self._inflight
        elif self._failure is not None:
            raise self._failure
        else:
            return
        await batch.committed.wait()
        if batch.failure is not None:
            raise batch.failure

    def has_room(self) -> bool:
        """Whether a writer may queue more events now (else await :meth:`wait_for_room`)."""
        return len(self._batch.events) < MAX_PENDING_EVENTS

    async def wait_for_room(self) -> None:
        """Wait while too many events are queued (how a slow disk slows writers down).

        :raises StoreFailed: a commit failed (the queue will never drain)."""
        while len(self._batch.events) >= MAX_PENDING_EVENTS:
            batch = self._batch
            await batch.committed.wait()
            if batch.failure is not None:
                raise batch.failure

    def watch(self, run_id: str) -> anyio.Event:
        """An event set after the next commit that touches ``run_id``."""
        watcher = self._watchers.get(run_id)
        if watcher is None:
            watcher = self._watchers[run_id] = anyio.Event()
        return watcher

    def before_commit(self, hook: Callable[[], None]) -> None:
        """Call ``hook`` before each commit takes the queued writes (a writer that holds
        writes back to merge them queues them then)."""
        self._before_commit.append(hook)

    def poke(self) -> None:
        """Wake the writer although nothing is queued (a hook holds writes)."""
        self._wake.set()

    def wake_all(self) -> None:
        """Set every watcher now (the daemon is closing: streams look and end)."""
        watchers, self._watchers = self._watchers, {}
        for watcher in watchers.values():
            watcher.set()

    def statistics(self) -> StoreStatistics:
        return StoreStatistics(self._commits, self._events_written, len(self._batch.events))

    # ------------------------------------------------------------------ reads

    async def _rows(self, sql: str, *args: object) -> list[Any]:
        """The rows ``sql`` (with ``args``) reads, on a worker thread and a reader's connection."""
        self.reads += 1

        def work() -> list[Any]:
            conn = self._readers.pop() if self._readers else connect(self.path)
            try:
                return conn.execute(sql, args).fetchall()
            finally:
                self._readers.append(conn)

        return await anyio.to_thread.run_sync(work, limiter=self._read_limiter)

    async def get_run(self, run_id: str) -> RunRow | None:
        rows = await self._rows(f"SELECT {COLUMNS} FROM runs WHERE id = ?", run_id)
        return read_row(rows[0]) if rows else None

    async def find_key(self, key: str) -> RunRow | None:
        """The run created with idempotency key ``key``."""
        rows = await self._rows(f"SELECT {COLUMNS} FROM runs WHERE idempotency_key = ?", key)
        return read_row(rows[0]) if rows else None

    async def list_runs(
        self,
        *,
        status: str | None = None,
        exit_reason: str | None = None,
        before: int | None = None,
        limit: int = 50,
        preview_chars: int | None = None,
    ) -> list[RunRow]:
        """Runs newest first, filtered, with ``cursor < before``; at most ``limit``.

        With ``preview_chars``, each row is a summary read so by SQLite (the whole request
        and result never reach Python): the request's free texts cut to ``preview_chars``
        characters and its ``config`` empty, the result only ``{"simulated": true}`` or
        ``{}``.
        """
        where, args = ["1 = 1"], list[Any]()
        for test, value in (
            ("status = ?", status),
            ("exit_reason = ?", exit_reason),
            ("cursor < ?", before),
        ):
            if value is not None:
                where.append(test)
                args.append(value)
        columns = COLUMNS if preview_chars is None else SUMMARY_COLUMNS
        sql = f"SELECT {columns} FROM runs WHERE {' AND '.join(where)} ORDER BY cursor DESC LIMIT ?"
        if preview_chars is not None:
            args = [preview_chars] * SUMMARY_CHARS_PARAMETERS + args
        rows = await self._rows(sql, *args, limit)
        return [read_row(row) for row in rows]

    async def events(self, run_id: str, *, after: int = 0, limit: int = 500) -> list[StoredEvent]:
        """Committed events of ``run_id`` with ``seq > after``, in order."""
        rows = await self._rows(
            "SELECT seq, type, data FROM run_events "
            "WHERE run = (SELECT cursor FROM runs WHERE id = ?) AND seq > ? ORDER BY seq LIMIT ?",
            run_id,
            after,
            limit,
        )
        return [StoredEvent(seq, kind, bytes(data)) for seq, kind, data in rows]

    async def tail(self, run_id: str, count: int) -> list[StoredEvent]:
        """The last ``count`` committed events of ``run_id``, in order."""
        rows = await self._rows(
            "SELECT seq, type, data FROM run_events "
            "WHERE run = (SELECT cursor FROM runs WHERE id = ?) ORDER BY seq DESC LIMIT ?",
            run_id,
            count,
        )
        return [StoredEvent(seq, kind, bytes(data)) for seq, kind, data in reversed(rows)]

    async def checkpoint(self, run_id: str) -> bytes | None:
        """The newest committed checkpoint of ``run_id`` (``None``: it has none)."""
        rows = await self._rows(
            "SELECT data FROM run_checkpoints WHERE run = (SELECT cursor FROM runs WHERE id = ?)",
            run_id,
        )
        return bytes(rows[0][0]) if rows else None

    async def unfinished(self) -> list[RunRow]:
        """Runs that were queued or running when the store was last written, oldest first."""
        rows = await self._rows(
            f"SELECT {COLUMNS} FROM runs WHERE status != 'ended' ORDER BY cursor"
        )
        return [read_row(row) for row in rows]
