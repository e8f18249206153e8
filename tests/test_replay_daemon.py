"""``POST /v1/replay`` (operator token only, bounded) and ``loopfuse replay`` on a real
daemon's SQLite store."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import httpx
import pytest

from orchestrator.cli import main
from orchestrator.daemon import open_daemon
from orchestrator.daemon.client import DaemonClient
from orchestrator.daemon.replay_route import MAX_REPLAY_RUNS
from tests.daemon_support import daemon_config, wait_ended

OPERATOR = "operator-secret"
API = "api-secret"


@pytest.mark.asyncio
async def test_replay_endpoint_is_the_operators_and_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("REPLAY_TEST_TOKENS", API)
    monkeypatch.setenv("REPLAY_TEST_OPERATORS", OPERATOR)
    config = daemon_config(
        tmp_path, token_env="REPLAY_TEST_TOKENS", operator_token_env="REPLAY_TEST_OPERATORS"
    )
    async with (
        open_daemon(config) as running,
        httpx.AsyncClient(base_url=running.url, timeout=60) as http,
        DaemonClient(running.url, token=API) as client,
    ):
        run_id = (await client.submit({"scenario": "dead_loop"}))["id"]
        with anyio.fail_after(20):
            run = await wait_ended(client, run_id)
        events = [json.loads(e.data) async for e in client.events(run_id) if e.event == "message"]
        body = {"runs": [{"name": "stuck", "events": events}], "presets": ["strict", "off"]}
        none = await http.post("/v1/replay", json=body)
        wrong = await http.post("/v1/replay", json=body, headers={"Authorization": "Bearer nope"})
        api = await http.post("/v1/replay", json=body, headers={"Authorization": f"Bearer {API}"})
        operator = {"Authorization": f"Bearer {OPERATOR}"}
        ok = await http.post("/v1/replay", json=body, headers=operator)
        huge = await http.post(
            "/v1/replay",
            content=b'{"runs": [' + b'{"messages": []},' * 70_000 + b"{}]}",
            headers=operator,
        )
        many = await http.post(
            "/v1/replay", json={"runs": [{}] * (MAX_REPLAY_RUNS + 1)}, headers=operator
        )
    assert run["cause"] == "loop.generic_repeat"
    assert (none.status_code, wrong.status_code, api.status_code) == (401, 401, 403)
    assert ok.status_code == 200, ok.text
    rows = {row["config"]: row for row in ok.json()["rows"]}
    # the run's events carry no overrides (JSON events): strict keeps the recorded stop
    # but the result cache (on by default) stops the same read one request earlier
    assert rows["strict"]["recorded_cause"] == "loop.generic_repeat"
    assert rows["off"]["cause"] != "loop.generic_repeat"
    assert (huge.status_code, many.status_code) == (413, 413)
    # the daemon's store itself, read by the command line (the run's request names its
    # scenario, so the scenario's settings apply: its own verdicts again)
    store = Path(config.daemon.store_path or "")
    assert await anyio.to_thread.run_sync(main, ["replay", str(store), "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)["rows"]
    assert (row["change"], row["verdicts_match"]) == ("same", True)
