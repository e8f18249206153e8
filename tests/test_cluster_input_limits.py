"""A fleet member's API refuses the same hostile inputs as a single daemon (they share
``orchestrator.daemon.http``): a process on a real nats-server, over loopback HTTP."""

from __future__ import annotations

from pathlib import Path

import anyio
import httpx
import pytest

from orchestrator.cluster.testing import NatsServer
from orchestrator.daemon.limits import MAX_INTEGER
from tests.daemon_support import JSON
from tests.fleet_support import NEEDS_NATS_SERVER
from tests.test_cluster_http import sse_ids, start_daemon, stop

pytestmark = NEEDS_NATS_SERVER


@pytest.mark.asyncio
async def test_a_fleet_member_refuses_hostile_inputs(server: NatsServer, tmp_path: Path) -> None:
    daemon, url = start_daemon(server, "limits", tmp_path, "[daemon]\nmax_task_chars = 100\n")
    try:
        with anyio.fail_after(60):
            async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                assert (await client.get("/readyz")).status_code == 200
                deep = b'{"task": "x", "config": ' + b"[" * 2_000 + b"]" * 2_000 + b"}"
                too_deep = await client.post("/v1/runs", content=deep, headers=JSON)
                long_task = await client.post("/v1/runs", json={"task": "x" * 101})
                cursor = await client.get("/v1/runs", params={"cursor": str(MAX_INTEGER + 1)})
                limit = await client.get("/v1/runs", params={"limit": "1_0"})
                posted = await client.post("/v1/runs", json={"scenario": "completed"})
                run_id = posted.json()["id"]
                _, ending = await sse_ids(client, f"{url}/v1/runs/{run_id}/events")
                bogus = await client.get(
                    f"/v1/runs/{run_id}/events", headers={"Last-Event-ID": "99999999999999999999"}
                )
                largest, last = await sse_ids(
                    client, f"{url}/v1/runs/{run_id}/events", **{"Last-Event-ID": str(MAX_INTEGER)}
                )
                missing = await client.get("/v1/nope")
                plain = await client.post(  # a cross-site form's POST
                    "/v1/runs",
                    content=b'{"scenario": "completed"}',
                    headers={"Content-Type": "text/plain"},
                )
                rebound = await client.get("/healthz", headers={"Host": "evil.example"})
    finally:
        stop(daemon)
    answers = {
        "too_deep": (too_deep, 400, None),
        "too_long": (long_task, 422, "task"),
        "bad_query": (cursor, 400, "cursor"),
        "not_found": (missing, 404, None),
        "unsupported_media_type": (plain, 415, "Content-Type"),
        "bad_host": (rebound, 400, "Host"),
    }
    for code, (response, status, key) in answers.items():
        assert response.status_code == status, response.text
        assert response.json()["error"]["code"] == code
        assert response.json()["error"].get("key") == key
    assert limit.json()["error"]["key"] == "limit"
    assert bogus.status_code == 400
    assert bogus.json()["error"]["key"] == "Last-Event-ID"
    assert ending == "end"
    assert (largest, last) == ([], "end")
