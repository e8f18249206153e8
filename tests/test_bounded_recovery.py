"""A stored run whose config is now out of range ends at restart with a clear cause.

An older version accepted ``max_period = 10**30`` for the cycle detector; resuming that run
froze the daemon's event loop at every start. Here such rows are written into a real
SQLite store, and ``loopfuse serve`` (a real process) is started over it: it must come up,
answer ``/healthz``, end those runs naming the key and the range, and recover the others.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from orchestrator.daemon.client import DaemonClient
from orchestrator.daemon.store import RunRow, Store
from tests.daemon_support import daemon_process, wait_ended

PROBE: dict[str, Any] = {
    "scenario": "dead_loop",
    "config": {"loop": {"cycle": {"enabled": True, "max_period": 10**30}}},
}

STORED: dict[str, tuple[str, dict[str, Any]]] = {
    # run id: (status when the old daemon stopped, the request it had accepted)
    "frozen": ("running", PROBE),
    "queued": ("queued", {"scenario": "completed", "config": {"deadline_seconds": 1e30}}),
    "old_shape": ("running", {"task": "x", "priority": 3}),  # a field since removed
    "good": ("queued", {"scenario": "completed"}),
}


def _row(run_id: str, status: str, request: dict[str, Any]) -> RunRow:
    return RunRow(
        id=run_id,
        trace_id=f"trace-{run_id}",
        status=status,
        on_crash="resume",
        request=json.dumps(request).encode(),
        request_hash=f"hash-{run_id}",
        created_at=time.time(),
    )


async def _seed(path: Path) -> None:
    store = Store(path)
    async with anyio.create_task_group() as tg:
        await tg.start(store.run)
        for run_id, (status, request) in STORED.items():
            store.insert_run(_row(run_id, status, request))
        await store.flush()
        store.close()


@pytest.mark.asyncio
async def test_a_stored_run_with_an_out_of_range_config_ends_clearly_at_restart(
    tmp_path: Path,
) -> None:
    store = tmp_path / "daemon.db"
    await _seed(store)
    config = tmp_path / "loopfuse.toml"
    config.write_text(f"[daemon]\nstore_path = {json.dumps(str(store))}\n", encoding="utf-8")

    with daemon_process(config, tmp_path / "daemon.log") as (_, url):
        async with httpx.AsyncClient(base_url=url) as http, DaemonClient(url) as client:
            health = await http.get("/healthz")
            assert health.status_code == 200, health.text
            with anyio.fail_after(60):
                runs = {run_id: await wait_ended(client, run_id) for run_id in STORED}
            listed = await http.get("/v1/runs")
            table = await anyio.run_process(
                [sys.executable, "-m", "orchestrator", "runs", "--url", url], check=False
            )
            # The probe itself, sent now, is refused naming the key; the daemon stays up.
            refused = await http.post("/v1/runs", json=PROBE)
            health_after = await http.get("/healthz")
    # A request in a shape this version no longer reads is shown as such, not a 500.
    assert runs["old_shape"]["request"] is None
    assert "no longer matches" in runs["old_shape"]["request_error"]
    assert listed.status_code == 200, listed.text
    assert {run["id"] for run in listed.json()["runs"]} == set(STORED)
    assert table.returncode == 0, table.stderr
    assert "(unreadable stored request)" in table.stdout.decode()

    expected = {
        "frozen": ("config.loop.cycle.max_period", "at most 100"),
        "queued": ("config.deadline_seconds", "at most 86,400"),
        "old_shape": ("priority", "unknown field"),
    }
    for run_id, (key, reason) in expected.items():
        run = runs[run_id]
        assert run["cause"] == "abort.crash", run
        assert run["exit_reason"] == "aborted_streaming", run
        detail = run["result"]["detail"]
        assert "its stored request was refused" in detail, detail
        assert key in detail, detail
        assert reason in detail, detail
    assert runs["good"]["exit_reason"] == "completed"
    assert runs["good"]["cause"] == "model.end_turn"

    assert refused.status_code == 422, refused.text
    assert refused.json()["error"]["key"] == "config.loop.cycle.max_period"
    assert "at most 100" in refused.json()["error"]["message"]
    assert health_after.status_code == 200
