"""``POST /v1/runs`` is served on bare ASGI (the guard routes it past Starlette): the same
answers as Starlette's route gave, for bodies sent in one piece, in chunks, too large, or
never finished, through the real daemon over loopback HTTP."""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import httpx
import pytest
from starlette.types import Message

from orchestrator.daemon import open_daemon
from orchestrator.daemon.http import receive_body
from tests.daemon_support import JSON, daemon_config


async def _chunks(*parts: bytes) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


@pytest.mark.asyncio
async def test_a_202_carries_the_run_its_location_and_a_json_type(tmp_path: Path) -> None:
    async with (
        open_daemon(daemon_config(tmp_path)) as running,
        httpx.AsyncClient(base_url=running.url) as http,
    ):
        response = await http.post("/v1/runs", json={"scenario": "completed"})
        run = (await http.get(response.headers["location"])).json()
    assert response.status_code == 202, response.text
    body = response.json()
    assert body["status"] == "queued"
    assert response.headers["location"] == f"/v1/runs/{body['id']}"
    assert response.headers["content-type"] == "application/json"
    assert int(response.headers["content-length"]) == len(response.content)
    assert run["id"] == body["id"]
    assert run["trace_id"] == body["trace_id"]


@pytest.mark.asyncio
async def test_a_chunked_body_is_read_whole_and_bounded_as_it_arrives(tmp_path: Path) -> None:
    """No Content-Length: the body is read chunk by chunk, and refused once it passes the
    limit (nothing stored); under the limit it is one request however it was cut."""
    request = json.dumps({"scenario": "completed"}).encode()
    async with (
        open_daemon(daemon_config(tmp_path, max_body_bytes=512)) as running,
        httpx.AsyncClient(base_url=running.url, headers=JSON) as http,
    ):
        accepted = await http.post("/v1/runs", content=_chunks(request[:7], request[7:]))
        too_large = await http.post("/v1/runs", content=_chunks(b'{"task": "', b"x" * 600, b'"}'))
        listed = (await http.get("/v1/runs")).json()
    assert "content-length" not in accepted.request.headers
    assert accepted.status_code == 202, accepted.text
    assert too_large.status_code == 413
    assert too_large.json()["error"]["code"] == "body_too_large"
    assert [run["id"] for run in listed["runs"]] == [accepted.json()["id"]]


@pytest.mark.asyncio
async def test_a_body_never_finished_starts_nothing_and_the_daemon_serves_on(
    tmp_path: Path,
) -> None:
    async with (
        open_daemon(daemon_config(tmp_path)) as running,
        httpx.AsyncClient(base_url=running.url) as http,
    ):
        with socket.create_connection((running.host, running.port)) as raw:
            raw.sendall(
                b"POST /v1/runs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                b'Content-Length: 100\r\n\r\n{"scenario": '
            )
        after = await http.post("/v1/runs", json={"scenario": "completed"})
        listed = (await http.get("/v1/runs")).json()
    assert after.status_code == 202, after.text
    assert [run["id"] for run in listed["runs"]] == [after.json()["id"]]


@pytest.mark.asyncio
async def test_receive_body_says_when_the_client_left() -> None:
    messages: list[Message] = [
        {"type": "http.request", "body": b"{", "more_body": True},
        {"type": "http.disconnect"},
    ]

    async def receive() -> Message:
        return messages.pop(0)

    with anyio.fail_after(5):
        assert await receive_body(receive, "", 100) is None
