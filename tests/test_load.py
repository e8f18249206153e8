"""Load: 1,000 runs of mixed scenarios at once through one daemon.

Every run ends as its scenario expects, each run's event stream holds only its own events
(numbered 1…n without a gap), and the counts ``/metrics`` reports equal those in the store.
"""

from __future__ import annotations

import collections
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from orchestrator.daemon import open_daemon
from orchestrator.daemon.client import DaemonClient
from orchestrator.sim import shipped_scenarios
from tests.daemon_support import daemon_config

RUNS = 1_000
MIX = ["completed", "max_turns", "path_escape", "max_tool_calls", "api_down", "dead_loop"]
EXPECT = {s.name: s.expect for s in shipped_scenarios() if s.name in MIX}


async def _stream(client: DaemonClient, run_id: str) -> list[dict[str, Any]]:
    """The run's whole stream (it ends with ``end`` once the result is stored)."""
    events: list[dict[str, Any]] = []
    async for event in client.events(run_id):
        if event.event == "message":
            events.append({"id": event.id, **json.loads(event.data)})
        last = event.event
    assert last == "end", (run_id, last)
    return events


def _finished_counts(metrics: str) -> collections.Counter[tuple[str, str]]:
    counts: collections.Counter[tuple[str, str]] = collections.Counter()
    for family in text_string_to_metric_families(metrics):
        if family.name == "loopfuse_runs_finished":
            for sample in family.samples:
                if sample.name == "loopfuse_runs_finished_total" and sample.value:
                    key = (sample.labels["exit_reason"], sample.labels["cause"])
                    counts[key] += int(sample.value)
    return counts


async def _stored_counts(client: DaemonClient) -> collections.Counter[tuple[str, str]]:
    counts: collections.Counter[tuple[str, str]] = collections.Counter()
    cursor: str | None = None
    while True:
        query: dict[str, str | int] = {"limit": 500, "status": "ended"}
        if cursor is not None:
            query["cursor"] = cursor
        page = await client.runs(**query)
        counts.update((run["exit_reason"], run["cause"]) for run in page["runs"])
        cursor = page["next_cursor"]
        if cursor is None:
            return counts


@pytest.fixture
def store_dir(tmp_path: Path) -> Iterator[Path]:
    """A RAM-backed folder for the store when there is one: this test is about isolation
    and accounting under load, not about the disk's fsync latency (seconds per 100 commits
    on some CI disks); crash safety on a real file is tests/test_crash.py's job."""
    shm = Path("/dev/shm")
    if not shm.is_dir() or not os.access(shm, os.W_OK):
        yield tmp_path
        return
    with tempfile.TemporaryDirectory(dir=shm, prefix="loopfuse-load-") as folder:
        yield Path(folder)


@pytest.mark.asyncio
async def test_a_thousand_concurrent_runs_end_as_expected_and_stay_apart(
    store_dir: Path,
) -> None:
    config = daemon_config(store_dir, concurrent=200, queue_size=RUNS, event_cap=5_000)
    streams: dict[str, list[dict[str, Any]]] = {}
    async with open_daemon(config) as running, DaemonClient(running.url, timeout=120) as client:
        with anyio.fail_after(150):
            submitted: dict[str, str] = {}
            limiter = anyio.CapacityLimiter(90)  # under httpx's 100 connections

            # A pooled connection the server closed as idle fails the next request on it
            # (httpx.ReadError): retry, safely, with an idempotency key (reads are safe).
            async def submit(index: int) -> None:
                name, key = MIX[index % len(MIX)], f"load-{index}"
                async with limiter:
                    for attempt in range(3):
                        try:
                            accepted = await client.submit(
                                {"scenario": name, "idempotency_key": key}
                            )
                            break
                        except httpx.TransportError:
                            if attempt == 2:
                                raise
                    submitted[accepted["id"]] = name

            async def follow(run_id: str) -> None:
                async with limiter:
                    for attempt in range(3):
                        try:
                            streams[run_id] = await _stream(client, run_id)
                            return
                        except httpx.TransportError:
                            if attempt == 2:
                                raise

            async with anyio.create_task_group() as tg:
                for index in range(RUNS):
                    tg.start_soon(submit, index)
            async with anyio.create_task_group() as tg:
                for run_id in submitted:
                    tg.start_soon(follow, run_id)
            runs = {run_id: await client.run(run_id) for run_id in submitted}
            async with httpx.AsyncClient(base_url=running.url) as http:
                metrics = (await http.get("/metrics")).text
            stored = await _stored_counts(client)

    assert len(submitted) == RUNS
    for run_id, name in submitted.items():
        run, events = runs[run_id], streams[run_id]
        assert run["status"] == "ended", run
        assert run["exit_reason"] == EXPECT[name].exit_reason, (name, run["result"]["detail"])
        if EXPECT[name].cause is not None:
            assert run["cause"] == EXPECT[name].cause, (name, run)
        assert {event["run_id"] for event in events} == {run_id}  # nobody else's events
        assert [event["id"] for event in events] == list(range(1, len(events) + 1))
        assert events[0]["type"] == "RunStarted"
        assert events[-1]["type"] == "RunFinished"
        assert run["events"] == len(events)
    finished = _finished_counts(metrics)
    assert sum(stored.values()) == RUNS
    assert finished == stored
    expected = collections.Counter(EXPECT[name].exit_reason for name in submitted.values())
    by_reason: collections.Counter[str] = collections.Counter()
    for (reason, _), count in stored.items():
        by_reason[reason] += count
    assert by_reason == expected
