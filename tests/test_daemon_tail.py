"""Event streams served from the memory tail: exact resumption across the memory/SQLite
boundary, the operator's bounds, and a follower that keeps up reading no SQLite."""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any, NamedTuple

import anyio
import httpx
import pytest

from orchestrator.config import Config, load_config
from orchestrator.daemon import open_daemon
from orchestrator.daemon.client import DaemonClient
from orchestrator.daemon.tail import ENTRY_OVERHEAD_BYTES, EVENT_OVERHEAD_BYTES, EventTail
from orchestrator.errors import ConfigError
from tests.daemon_support import daemon_config, events_until, wait_ended, write_slow


def _events(n: int, run_id: str = "r", *, start: int = 1, size: int = 10) -> list[Any]:
    return [(run_id, seq, "E", b"x" * size) for seq in range(start, start + n)]


def _seqs(events: list[Any] | None) -> list[int] | None:
    return None if events is None else [e.seq for e in events]


class _Stats(NamedTuple):
    runs: int
    events: int
    bytes: int
    evicted_events: int


def _statistics(tail: EventTail) -> _Stats:
    """The tail at a glance: its runs, events and bytes held, and events evicted."""
    held = sum(len(run.events) for run in tail._runs.values())
    return _Stats(len(tail._runs), held, tail._bytes, tail._evicted)


# ---------------------------------------------------------------------- the tail alone


def test_memory_answers_only_when_it_holds_every_event_after_the_id() -> None:
    tail = EventTail(per_run=3, total_bytes=1 << 20)
    tail.committed(["r"], [], {})
    assert tail.after("r", 0) == []  # a new run: memory holds all of it (nothing yet)
    tail.committed([], _events(5), {})
    assert _seqs(tail.after("r", 2)) == [3, 4, 5]
    assert _seqs(tail.after("r", 4)) == [5]
    assert tail.after("r", 5) == []
    assert tail.after("r", 1) is None  # event 2 has left memory: read the store
    assert tail.after("unknown", 0) is None


def test_a_run_memory_never_saw_from_its_start_is_read_from_the_store_up_to_there() -> None:
    tail = EventTail(per_run=10, total_bytes=1 << 20)
    tail.committed([], _events(2, start=40), {})  # resumed after a restart at event 40
    assert tail.after("r", 38) is None
    assert _seqs(tail.after("r", 39)) == [40, 41]
    # An event that does not follow (rewritten): the range starts again there.
    tail.committed([], _events(1, start=7), {})
    assert tail.after("r", 5) is None
    assert _seqs(tail.after("r", 6)) == [7]


def test_total_bytes_evict_the_oldest_events_of_the_least_recently_written_run() -> None:
    per_event = 10 + EVENT_OVERHEAD_BYTES
    tail = EventTail(per_run=100, total_bytes=2 * ENTRY_OVERHEAD_BYTES + 6 * per_event)
    tail.committed([], _events(4, "old"), {})
    tail.committed([], _events(4, "new"), {})
    stats = _statistics(tail)
    assert stats.bytes <= tail.total_bytes
    assert stats.evicted_events == 2
    assert _seqs(tail.after("old", 2)) == [3, 4]
    assert tail.after("old", 1) is None
    assert _seqs(tail.after("new", 0)) == [1, 2, 3, 4]
    tail.committed([], _events(4, "new", start=5), {})
    assert not tail.knows("old")  # its last event went: so did its entry
    assert _statistics(tail).bytes <= tail.total_bytes


def test_zero_keeps_nothing_and_forget_drops_a_run() -> None:
    off = EventTail(per_run=0, total_bytes=1 << 20)
    off.committed(["r"], _events(3), {})
    assert off.after("r", 0) is None
    assert _statistics(off).events == 0
    tail = EventTail(per_run=10, total_bytes=1 << 20)
    tail.committed([], _events(3), {"r": {"events_dropped": 2}})
    tail.committed([], [], {"r": {"status": "ended", "exit_reason": "completed"}})
    assert tail.ended("r") == ("completed", 3, 2)
    tail.forget(["r"])
    assert tail.after("r", 0) is None
    assert _statistics(tail) == (0, 0, 0, 3)


def test_one_commit_of_interleaved_runs_counts_each_event_and_orders_runs_by_last_write() -> None:
    per_event = 10 + EVENT_OVERHEAD_BYTES
    tail = EventTail(per_run=2, total_bytes=2 * ENTRY_OVERHEAD_BYTES + 3 * per_event)
    # a 1-2, b 1-2, a 3: a was written last; a keeps its newest two (per run)
    tail.committed([], [*_events(2, "a"), *_events(2, "b"), *_events(1, "a", start=3)], {})
    assert _seqs(tail.after("a", 1)) == [2, 3]
    assert tail.after("a", 0) is None
    # 4 events kept, room for 3: the oldest of b (written to least recently) goes
    assert tail.after("b", 0) is None
    assert _seqs(tail.after("b", 1)) == [2]
    assert _statistics(tail) == (2, 3, 2 * ENTRY_OVERHEAD_BYTES + 3 * per_event, 2)


def test_an_event_that_does_not_follow_in_the_same_commit_starts_the_range_there() -> None:
    tail = EventTail(per_run=10, total_bytes=1 << 20)
    tail.committed(["r"], [*_events(3), *_events(2, start=7)], {})
    assert tail.after("r", 5) is None
    assert _seqs(tail.after("r", 6)) == [7, 8]
    assert _statistics(tail) == (1, 2, ENTRY_OVERHEAD_BYTES + 2 * (10 + EVENT_OVERHEAD_BYTES), 3)


def test_the_bounds_are_operator_keys_with_ranges(tmp_path: Path) -> None:
    path = tmp_path / "loopfuse.toml"
    path.write_text("[daemon]\nmemory_tail_events = -1\n", encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert "memory_tail_events" in str(caught.value)
    path.write_text("[daemon]\nmemory_tail_bytes = 1\nmemory_tail_events = 0\n", encoding="utf-8")
    daemon = load_config(path).daemon
    assert (daemon.memory_tail_bytes, daemon.memory_tail_events) == (1, 0)


# ---------------------------------------------------------------------- through the daemon


def _stored(tmp_path: Path, run_id: str) -> list[dict[str, Any]]:
    with closing(sqlite3.connect(tmp_path / "daemon.db")) as db:
        rows = db.execute(
            "SELECT seq, data FROM events WHERE run_id = ? ORDER BY seq", (run_id,)
        ).fetchall()
    return [{"id": seq, **json.loads(data)} for seq, data in rows]


async def _stream(http: httpx.AsyncClient, run_id: str, after: int) -> list[int]:
    response = await http.get(f"/v1/runs/{run_id}/events", headers={"Last-Event-ID": str(after)})
    assert "event: end" in response.text
    return [int(line[4:]) for line in response.text.splitlines() if line.startswith("id: ")]


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("events", "total"), [(3, 64 * 1024 * 1024), (1000, 0), (1000, 64 * 1024 * 1024)]
)
async def test_every_resume_point_is_exact_across_memory_and_the_store(
    tmp_path: Path, events: int, total: int
) -> None:
    config = daemon_config(tmp_path, memory_tail_events=events, memory_tail_bytes=total)
    async with open_daemon(config) as running, DaemonClient(running.url) as client:
        run_id = (await client.submit({"scenario": "max_turns"}))["id"]
        with anyio.fail_after(30):
            last = (await wait_ended(client, run_id))["events"]
            async with httpx.AsyncClient(base_url=running.url) as http:
                resumed = {after: await _stream(http, run_id, after) for after in range(last + 1)}
    stored = _stored(tmp_path, run_id)
    assert [e["id"] for e in stored] == list(range(1, last + 1))
    for after, ids in resumed.items():
        assert ids == list(range(after + 1, last + 1)), after


@pytest.mark.asyncio
async def test_a_live_follower_that_falls_behind_memory_resumes_from_the_store(
    tmp_path: Path,
) -> None:
    slow = write_slow(tmp_path, max_turns=6, latency=0.05)
    config = daemon_config(tmp_path, scenarios=(slow,), memory_tail_events=2)
    async with open_daemon(config) as running, DaemonClient(running.url) as client:
        run_id = (await client.submit({"scenario": "slow"}))["id"]
        with anyio.fail_after(30):
            first = await events_until(client, run_id, lambda e: e["type"] == "ModelRequest")
            # Gone while more than two events are committed: they are in the store only.
            await events_until(
                client, run_id, lambda e: e["type"] == "TurnStarted" and e["turn"] == 4
            )
            rest = await events_until(
                client, run_id, lambda e: e["type"] == "RunFinished", after=first[-1]["id"]
            )
            await wait_ended(client, run_id)
    whole = first + rest
    assert [e["id"] for e in whole] == list(range(1, len(whole) + 1))
    assert whole == _stored(tmp_path, run_id)


@pytest.mark.asyncio
async def test_a_follower_that_keeps_up_reads_nothing_from_the_store(tmp_path: Path) -> None:
    slow = write_slow(tmp_path, max_turns=5, latency=0.02)
    async with open_daemon(daemon_config(tmp_path, scenarios=(slow,))) as running:
        store = running.daemon.store
        async with DaemonClient(running.url) as client:
            run_id = (await client.submit({"scenario": "slow"}))["id"]
            reads = store.reads
            with anyio.fail_after(30):
                followed = await events_until(client, run_id, lambda e: e["type"] == "RunFinished")
            assert store.reads == reads  # the stream, its end frame: all from memory
            with anyio.fail_after(30):
                await wait_ended(client, run_id)
    assert followed == _stored(tmp_path, run_id)
    assert len(followed) > 20


def test_daemon_config_takes_the_tail_keys(tmp_path: Path) -> None:
    config: Config = daemon_config(tmp_path, memory_tail_events=7, memory_tail_bytes=9)
    assert (config.daemon.memory_tail_events, config.daemon.memory_tail_bytes) == (7, 9)
