"""``loopfuse serve --nats URL``: two daemons as processes, one fleet, one HTTP API."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import anyio
import httpx
import pytest

from tests.fleet_support import NEEDS_NATS_SERVER
from tests.nats_server import NatsServer

pytestmark = NEEDS_NATS_SERVER


def start_daemon(
    server: NatsServer, name: str, tmp_path: Path, extra: str = ""
) -> tuple[subprocess.Popen[str], str]:
    config = tmp_path / f"{name}.toml"
    config.write_text(f'[cluster]\nnode_name = "{name}"\n{extra}')
    env = {**os.environ, "LOOPFUSE_API_TOKENS": ""}
    process = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "loopfuse"),
            "serve",
            "--config",
            str(config),
            "--port",
            "0",
            "--nats",
            server.url,
        ],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    match = re.search(r"listening on (http://\S+)", line)
    assert match, line
    return process, match[1]


def stop(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    if process.stdout is not None:
        process.stdout.close()


async def sse_ids(client: httpx.AsyncClient, url: str, **headers: str) -> tuple[list[int], str]:
    """The event ids of a stream and the name of its last event."""
    ids: list[int] = []
    last = ""
    async with client.stream("GET", url, headers=headers) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("id: "):
                ids.append(int(line[4:]))
            elif line.startswith("event: "):
                last = line[7:]
                if last in {"end", "shutdown"}:
                    break
    return ids, last


@pytest.mark.asyncio
async def test_submit_on_one_daemon_stream_and_resume_on_the_other(
    server: NatsServer, tmp_path: Path
) -> None:
    a, url_a = start_daemon(server, "a", tmp_path)
    b, url_b = start_daemon(server, "b", tmp_path)
    try:
        with anyio.fail_after(60):
            async with httpx.AsyncClient(timeout=30) as client:
                # the socket listens at once; uvicorn answers once the daemon has joined
                assert (await client.get(f"{url_a}/readyz")).status_code == 200
                body = {"scenario": "max_turns", "idempotency_key": "http-1"}
                first = await client.post(f"{url_a}/v1/runs", json=body)
                assert first.status_code == 202, first.text
                again = await client.post(f"{url_b}/v1/runs", json=body)
                assert again.status_code == 200
                run_id = first.json()["id"]
                assert again.json()["id"] == run_id
                whole, ending = await sse_ids(client, f"{url_b}/v1/runs/{run_id}/events")
                assert ending == "end"
                rest, _ = await sse_ids(
                    client, f"{url_a}/v1/runs/{run_id}/events", **{"Last-Event-ID": str(whole[3])}
                )
                assert whole[:4] + rest == whole
                view = (await client.get(f"{url_a}/v1/runs/{run_id}")).json()
                assert (view["status"], view["exit_reason"]) == ("ended", "max_turns")
                refused = await client.post(f"{url_b}/v1/runs/{run_id}/abort")
                assert refused.status_code == 409
                assert refused.json()["error"]["code"] == "run_ended"
                missing = await client.get(f"{url_b}/v1/runs/nope")
                assert missing.status_code == 404
                # any daemon lists the fleet's runs, filtered and paged like a single daemon
                second = await client.post(f"{url_a}/v1/runs", json={"scenario": "completed"})
                other_id = second.json()["id"]
                await sse_ids(client, f"{url_a}/v1/runs/{other_id}/events")
                listed = (await client.get(f"{url_b}/v1/runs")).json()
                assert [run["id"] for run in listed["runs"]] == [other_id, run_id]
                assert all(run["result"] is None for run in listed["runs"])
                page = (await client.get(f"{url_b}/v1/runs", params={"limit": 1})).json()
                assert [run["id"] for run in page["runs"]] == [other_id]
                rest_page = await client.get(
                    f"{url_a}/v1/runs", params={"limit": 1, "cursor": page["next_cursor"]}
                )
                assert [run["id"] for run in rest_page.json()["runs"]] == [run_id]
                ended_max = await client.get(
                    f"{url_a}/v1/runs", params={"exit_reason": "max_turns"}
                )
                assert [run["id"] for run in ended_max.json()["runs"]] == [run_id]
                bad = await client.get(f"{url_a}/v1/runs", params={"status": "lost"})
                assert bad.status_code == 400
                names = (await client.get(f"{url_b}/v1/scenarios")).json()["scenarios"]
                assert "max_turns" in names
                metrics = (await client.get(f"{url_a}/metrics")).text
                assert "loopfuse_cluster_node_submitted_runs_total" in metrics
    finally:
        stop(a)
        stop(b)


@pytest.mark.asyncio
async def test_a_quiet_fleet_stream_sends_heartbeats(server: NatsServer, tmp_path: Path) -> None:
    daemon, url = start_daemon(server, "h", tmp_path, "[daemon]\nheartbeat_seconds = 0.1\n")
    try:
        with anyio.fail_after(60):
            async with httpx.AsyncClient(timeout=30) as client:
                assert (await client.get(f"{url}/readyz")).status_code == 200
                # "deadline" waits 0.3 s before every reply: quiet gaps longer than 0.1 s
                posted = await client.post(f"{url}/v1/runs", json={"scenario": "deadline"})
                run_id = posted.json()["id"]
                lines: list[str] = []
                async with client.stream("GET", f"{url}/v1/runs/{run_id}/events") as response:
                    async for line in response.aiter_lines():
                        lines.append(line)
                        if line == "event: end":
                            break
    finally:
        stop(daemon)
    assert ": ping" in lines
    assert lines.index(": ping") < lines.index("event: end")
