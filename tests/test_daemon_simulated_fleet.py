"""A fleet member (``loopfuse serve --nats``) without a model marks a task run the embedded
simulator answered, as a single daemon does, and not a scenario run (issue #18, item 10)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from orchestrator.result import SIMULATOR_NOTE
from tests.fleet_support import NEEDS_NATS_SERVER
from tests.nats_server import NatsServer
from tests.test_cluster_http import sse_ids, start_daemon, stop

pytestmark = NEEDS_NATS_SERVER


@pytest.mark.asyncio
async def test_a_fleet_task_without_a_model_is_marked(server: NatsServer, tmp_path: Path) -> None:
    daemon, url = start_daemon(server, "s", tmp_path)
    try:
        with anyio.fail_after(90):
            async with httpx.AsyncClient(base_url=url, timeout=30) as http:
                assert (await http.get("/readyz")).status_code == 200
                views: dict[str, dict[str, Any]] = {}
                for name, body in {
                    "task": {"task": "Summarise my notes.", "config": {"model": "completed"}},
                    "scenario": {"scenario": "completed"},
                }.items():
                    run_id = (await http.post("/v1/runs", json=body)).json()["id"]
                    _, ending = await sse_ids(http, f"{url}/v1/runs/{run_id}/events")
                    assert ending == "end"
                    views[name] = (await http.get(f"/v1/runs/{run_id}")).json()
                listed = (await http.get("/v1/runs")).json()["runs"]
    finally:
        stop(daemon)
    task, scenario = views["task"], views["scenario"]
    assert (task["status"], scenario["status"]) == ("ended", "ended")
    assert task["simulated"] is True
    assert (task["result"]["simulated"], task["result"]["note"]) == (True, SIMULATOR_NOTE)
    assert scenario["simulated"] is False
    assert (scenario["result"]["simulated"], scenario["result"]["note"]) == (False, "")
    assert {run["id"]: run["simulated"] for run in listed} == {
        task["id"]: True,
        scenario["id"]: False,
    }
