"""Secrets: a recognisable API key and daemon token appear nowhere loopfuse writes.

The endpoint is a loopback server that echoes the key (and the whole Authorization header)
back in its 401 error body, as some servers do. The run fails on it; then every log line,
event, stored byte, result, metric and HTTP error the daemon produced is searched.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import anyio
import httpx
import pytest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from orchestrator.config import Config, DaemonSettings, ModelSettings, RuntimeSettings
from orchestrator.daemon import open_daemon
from orchestrator.daemon.client import DaemonClient
from tests.daemon_support import wait_ended
from tests.test_llm_caller import FakeServer, open_fake_server

KEY = "sk-LOOPFUSE-FAKE-KEY-5e1b7c"
TOKEN = "tok-LOOPFUSE-FAKE-TOKEN-93d2"


class EchoingServer(FakeServer):
    """Answers every request with a 401 whose message repeats the credentials it got."""

    def __init__(self) -> None:
        super().__init__([])

    async def chat(self, request: Request) -> Response:
        authorization = request.headers.get("authorization", "")
        self.requests.append((dict(request.headers), await request.json()))
        message = f"Incorrect API key provided: {authorization.removeprefix('Bearer ')}"
        body = {
            "error": {
                "message": f"{message} (header {authorization!r})",
                "type": "invalid_request_error",
                "code": "invalid_api_key",
            }
        }
        return JSONResponse(body, status_code=401)


@pytest.mark.asyncio
async def test_the_key_and_token_appear_in_no_log_event_result_metric_or_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("LOOPFUSE_SECRET_TEST_KEY", KEY)
    monkeypatch.setenv("LOOPFUSE_SECRET_TEST_TOKENS", TOKEN)
    caplog.set_level(logging.DEBUG)
    fake = EchoingServer()
    async with open_fake_server(fake) as url:
        config = Config(
            model=ModelSettings(
                base_url=url,
                model="m",
                api_key_env="LOOPFUSE_SECRET_TEST_KEY",
                backoff_base_seconds=0.01,
                backoff_cap_seconds=0.02,
            ),
            runtime=RuntimeSettings(max_concurrent_runs=4),
            daemon=DaemonSettings(
                store_path=str(tmp_path / "daemon.db"),
                port=0,
                token_env="LOOPFUSE_SECRET_TEST_TOKENS",
                metrics_auth=True,
            ),
        )
        async with (
            open_daemon(config) as running,
            httpx.AsyncClient(base_url=running.url) as http,
            DaemonClient(running.url, token=TOKEN) as client,
        ):
            run_id = (await client.submit({"task": "Say hi."}))["id"]
            with anyio.fail_after(30):
                run = await wait_ended(client, run_id)
            events = [e.data async for e in client.events(run_id)]
            listing = await client.runs()
            headers = {"Authorization": f"Bearer {TOKEN}"}
            metrics = (await http.get("/metrics", headers=headers)).text
            refusals = [
                await http.get("/v1/runs", headers={"Authorization": f"Bearer {KEY}"}),
                await http.get("/v1/runs", headers={"Authorization": f"Bearer {TOKEN}x"}),
                await http.post("/v1/runs", json={"task": "x"}),
                await http.get("/metrics", headers={"Authorization": f"Bearer {KEY}"}),
            ]
    # The endpoint really got the key and really echoed it: the test would see a leak.
    assert fake.requests[0][0]["authorization"] == f"Bearer {KEY}"
    assert TOKEN not in json.dumps(fake.requests)  # the daemon's token never goes upstream
    assert run["status"] == "ended"
    assert run["exit_reason"] != "completed"
    assert "Incorrect API key" in run["result"]["detail"], run
    assert [r.status_code for r in refusals] == [401, 401, 401, 401]
    stored = b"".join(
        [await p.read_bytes() async for p in anyio.Path(tmp_path).iterdir() if await p.is_file()]
    )
    everything = "\n".join(
        [
            json.dumps(run),
            *events,
            json.dumps(listing),
            metrics,
            *(f"{r.status_code} {dict(r.headers)} {r.text}" for r in refusals),
            caplog.text,
            *(str(record.__dict__) for record in caplog.records),
            stored.decode("latin-1"),
        ]
    )
    for secret in (KEY, TOKEN):
        assert secret not in everything, _context(everything, secret)
        assert secret[:-3] not in everything  # not even most of it


def _context(text: str, secret: str) -> str:
    at = text.index(secret)
    return text[max(at - 200, 0) : at + 100]
