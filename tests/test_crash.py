"""Crash safety: kill -9 a loaded daemon at random points, restart it, check the store.

A bounded loop (``CYCLES``): start ``loopfuse serve``, submit runs, wait until a randomly
chosen run has streamed a randomly chosen number of events, ``kill -9``, then check the
SQLite file (``PRAGMA integrity_check``) and restart. After each restart every accepted
run is found, and each run's event log is a prefix of a whole one: numbered 1…n without a
gap or a duplicate, every record whole JSON, starting with ``RunStarted`` and holding what
was streamed before the kill. At the end every run ends.
"""

from __future__ import annotations

import json
import random
import signal
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import anyio
import pytest

from orchestrator.daemon.client import DaemonClient
from tests.daemon_support import daemon_process, events_until, wait_ended
from tests.test_daemon_process import write_config

CYCLES = 5
SEED = 20261202


def _integrity(store: Path) -> str:
    with closing(sqlite3.connect(store)) as conn:
        return str(conn.execute("PRAGMA integrity_check").fetchone()[0])


def _stored_events(store: Path) -> dict[str, list[tuple[int, str, bytes]]]:
    """Every run's stored events straight from the file: (seq, type, raw data)."""
    with closing(sqlite3.connect(store)) as conn:
        rows = conn.execute("SELECT run_id, seq, type, data FROM events").fetchall()
    found: dict[str, list[tuple[int, str, bytes]]] = {}
    for run_id, seq, kind, data in rows:
        found.setdefault(run_id, []).append((seq, kind, bytes(data)))
    return found


def _check_log(run_id: str, events: list[dict[str, Any]]) -> None:
    assert [e["id"] for e in events] == list(range(1, len(events) + 1)), run_id
    assert all(e["run_id"] == run_id for e in events)
    if events:
        assert events[0]["type"] == "RunStarted", events[0]
    finished = [i for i, e in enumerate(events) if e["type"] == "RunFinished"]
    assert finished in ([], [len(events) - 1]), (run_id, finished)


async def _all_events(client: DaemonClient, run_id: str) -> list[dict[str, Any]]:
    """The run's stored events now: up to its end, or up to the stream's heartbeat wait."""
    run = await client.run(run_id)
    count = int(run.get("events") or 0)
    if count == 0:
        return []
    return await events_until(client, run_id, lambda e: e["id"] >= count)


@pytest.mark.asyncio
async def test_kill_9_in_a_loop_loses_no_run_and_tears_no_log(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    config, log = write_config(tmp_path, concurrent=4), tmp_path / "daemon.log"
    store = tmp_path / "daemon.db"
    accepted: list[str] = []
    seen: dict[str, list[dict[str, Any]]] = {}
    for cycle in range(CYCLES):
        with daemon_process(config, log) as (process, url):
            async with DaemonClient(url) as client:
                with anyio.fail_after(60):
                    for run_id in accepted:  # every accepted run is still there
                        run = await client.run(run_id)
                        assert run["id"] == run_id
                        stored = await _all_events(client, run_id)
                        _check_log(run_id, stored)
                        assert stored[: len(seen.get(run_id, []))] == seen.get(run_id, [])
                        seen[run_id] = stored
                    for name in ("slow", "quick", "slow"):
                        accepted.append((await client.submit({"scenario": name}))["id"])
                    victim = rng.choice(accepted[-3:])
                    point = rng.randint(1, 12)
                    seen[victim] = await events_until(
                        client,
                        victim,
                        lambda e, n=point: e["id"] >= n or e["type"] == "RunFinished",
                    )
            process.send_signal(signal.SIGKILL)
            process.wait(timeout=10)
        assert _integrity(store) == "ok", f"cycle {cycle}"
        for run_id, records in _stored_events(store).items():
            seqs = sorted(seq for seq, _, _ in records)
            assert seqs == list(range(1, len(seqs) + 1)), (cycle, run_id, seqs[:20])
            for _, _, raw in records:
                json.loads(raw)  # no torn record

    with daemon_process(config, log) as (_, url):
        async with DaemonClient(url) as client:
            with anyio.fail_after(120):
                runs = {run_id: await wait_ended(client, run_id) for run_id in accepted}
                logs = {run_id: await _all_events(client, run_id) for run_id in accepted}
    assert _integrity(store) == "ok"
    assert len(runs) == CYCLES * 3
    for run_id, events in logs.items():
        _check_log(run_id, events)
        assert events[: len(seen.get(run_id, []))] == seen.get(run_id, [])
        assert events[-1]["type"] == "RunFinished"
        assert runs[run_id]["exit_reason"] == "max_turns", runs[run_id]
