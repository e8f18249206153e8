"""The daemon's HTTP API on a real uvicorn (loopback): submit, poll, stream, abort, refuse."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import anyio
import httpx
import pytest

from bus import ExitReason
from orchestrator.daemon import open_daemon
from orchestrator.daemon.client import DaemonClient, DaemonError
from tests.daemon_support import daemon_config, events_until, wait_ended, write_slow

SECRET_TOKEN = "tok-RECOGNISABLE-4242"
SECRET_KEY = "sk-RECOGNISABLE-KEY-777"


@pytest.mark.asyncio
async def test_submit_poll_stream_and_result(tmp_path: Path) -> None:
    async with (
        open_daemon(daemon_config(tmp_path)) as running,
        DaemonClient(running.url) as client,
    ):
        accepted = await client.submit({"scenario": "max_turns"})
        assert accepted["status"] == "queued"
        with anyio.fail_after(20):
            events = await events_until(
                client, accepted["id"], lambda e: e["type"] == "RunFinished"
            )
            run = await wait_ended(client, accepted["id"])
    assert [e["id"] for e in events] == list(range(1, len(events) + 1))
    assert events[0]["type"] == "RunStarted"
    assert events[-1]["type"] == "RunFinished"
    assert {e["run_id"] for e in events} == {accepted["id"]}
    assert run["exit_reason"] == "max_turns"
    assert run["cause"] == "budget.max_turns"
    assert run["events"] == len(events)
    assert run["result"]["turns"] == 3
    assert run["result"]["trace_id"] == accepted["trace_id"] == run["trace_id"]
    assert "transcript" not in run["result"]


@pytest.mark.asyncio
async def test_a_task_run_with_overrides(tmp_path: Path) -> None:
    # Every shipped scenario goes through the daemon in `loopfuse demo` (tests/test_cli.py).
    async with open_daemon(daemon_config(tmp_path)) as running, DaemonClient(running.url) as client:
        body = {"task": "Say hello.", "system": "Be brief.", "config": {"model": "completed"}}
        task = await client.submit(body)
        with anyio.fail_after(20):
            run = await wait_ended(client, task["id"])
    assert run["exit_reason"] == "completed"
    assert run["request"]["task"] == "Say hello."
    assert run["request"]["config"] == {"model": "completed"}
    assert run["on_crash"] == "resume"


@pytest.mark.asyncio
async def test_abort_a_running_run(tmp_path: Path) -> None:
    config = daemon_config(tmp_path, scenarios=(write_slow(tmp_path),))
    async with open_daemon(config) as running, DaemonClient(running.url) as client:
        run_id = (await client.submit({"scenario": "slow"}))["id"]
        with anyio.fail_after(20):
            await events_until(client, run_id, lambda e: e["type"] == "ModelRequest")
            aborted = await client.abort(run_id)
            run = await wait_ended(client, run_id)
            with pytest.raises(DaemonError) as again:
                await client.abort(run_id)
    assert aborted["id"] == run_id
    assert run["exit_reason"] in ("aborted_streaming", "aborted_tools")
    assert run["cause"] == "abort.caller"
    assert again.value.status == 409


@pytest.mark.asyncio
async def test_a_full_queue_is_a_429_with_retry_after(tmp_path: Path) -> None:
    config = daemon_config(
        tmp_path,
        concurrent=1,
        queue_size=1,
        retry_after_seconds=3,
        scenarios=(write_slow(tmp_path),),
    )
    async with open_daemon(config) as running, httpx.AsyncClient(base_url=running.url) as http:
        first = await http.post("/v1/runs", json={"scenario": "slow"})
        second = await http.post("/v1/runs", json={"scenario": "slow"})
        refused = await http.post("/v1/runs", json={"scenario": "slow"})
        queued = (await http.get(f"/v1/runs/{second.json()['id']}")).json()
        for response in (first, second):
            await http.post(f"/v1/runs/{response.json()['id']}/abort")
        metrics = (await http.get("/metrics")).text
    assert (first.status_code, second.status_code) == (202, 202)
    assert queued["status"] == "queued"
    assert refused.status_code == 429
    assert refused.headers["retry-after"] == "3"
    assert refused.json()["error"]["code"] == "queue_full"
    assert 'loopfuse_daemon_runs_rejected_total{reason="queue_full"} 1.0' in metrics


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("body", "status", "code", "key"),
    [
        (b"{not json", 400, "bad_json", None),
        (b'{"task": "x", "tsk": 1}', 422, "unknown_field", "tsk"),
        (b'{"task": 42}', 422, "invalid_field", "task"),
        (
            b'{"task": "x", "config": {"max_turns": "many"}}',
            422,
            "invalid_config",
            "config.max_turns",
        ),
        (
            b'{"task": "x", "config": {"no_such_key": 1}}',
            422,
            "invalid_config",
            "config.no_such_key",
        ),
        (b"{}", 422, "missing_field", "task"),
        (b'{"scenario": "nope"}', 422, "unknown_scenario", "scenario"),
        (b'{"scenario": "completed", "task": "x"}', 422, "conflicting_fields", "task"),
        (b"[1, 2]", 422, "invalid_field", None),
        (b'{"task": "' + b"x" * 600 + b'"}', 413, "body_too_large", None),
    ],
)
async def test_each_bad_request_gets_a_clear_4xx(
    tmp_path: Path, body: bytes, status: int, code: str, key: str | None
) -> None:
    async with (
        open_daemon(daemon_config(tmp_path, max_body_bytes=512)) as running,
        httpx.AsyncClient(base_url=running.url) as http,
    ):
        response = await http.post(
            "/v1/runs", content=body, headers={"Content-Type": "application/json"}
        )
        listed = (await http.get("/v1/runs")).json()
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code
    assert error.get("key") == key
    assert error["message"]
    assert listed["runs"] == []  # nothing was stored


@pytest.mark.asyncio
async def test_unknown_runs_and_bad_queries(tmp_path: Path) -> None:
    async with (
        open_daemon(daemon_config(tmp_path)) as running,
        httpx.AsyncClient(base_url=running.url) as http,
    ):
        responses = {
            "get": await http.get("/v1/runs/nope"),
            "events": await http.get("/v1/runs/nope/events"),
            "abort": await http.post("/v1/runs/nope/abort"),
            "status": await http.get("/v1/runs?status=sleeping"),
            "limit": await http.get("/v1/runs?limit=0"),
            "reason": await http.get("/v1/runs?exit_reason=bored"),
        }
    for name in ("get", "events", "abort"):
        assert responses[name].status_code == 404, name
        assert responses[name].json()["error"]["code"] == "unknown_run"
    for name in ("status", "limit", "reason"):
        assert responses[name].status_code == 400, name
        assert responses[name].json()["error"]["code"] == "bad_query"


@pytest.mark.asyncio
async def test_tokens_are_required_and_never_leak(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("LOOPFUSE_TEST_TOKENS", f"other-token, {SECRET_TOKEN}")
    monkeypatch.setenv("OPENAI_API_KEY", SECRET_KEY)
    caplog.set_level(logging.DEBUG, logger="loopfuse")
    config = daemon_config(tmp_path, token_env="LOOPFUSE_TEST_TOKENS", metrics_auth=True)
    async with (
        open_daemon(config) as running,
        httpx.AsyncClient(base_url=running.url) as http,
    ):
        missing = await http.post("/v1/runs", json={"scenario": "completed"})
        wrong = await http.get("/v1/runs", headers={"Authorization": "Bearer nope"})
        metrics = await http.get("/metrics")
        health = await http.get("/healthz")
        ready = await http.get("/readyz")
        openapi = await http.get("/v1/openapi.json")
        async with DaemonClient(running.url, token=SECRET_TOKEN) as client:
            run_id = (await client.submit({"scenario": "completed"}))["id"]
            with anyio.fail_after(20):
                run = await wait_ended(client, run_id)
            events = [e.data async for e in client.events(run_id)]
    assert missing.status_code == wrong.status_code == metrics.status_code == 401
    assert missing.headers["www-authenticate"] == "Bearer"
    assert (health.status_code, ready.status_code, openapi.status_code) == (200, 200, 200)
    assert run["exit_reason"] == "completed"
    stored = b"".join([await p.read_bytes() async for p in anyio.Path(tmp_path).iterdir()])
    everything = json.dumps(run) + "".join(events) + caplog.text + stored.decode("latin-1")
    for secret in (SECRET_TOKEN, SECRET_KEY):
        assert secret not in everything


@pytest.mark.asyncio
async def test_idempotency_key_returns_the_first_run(tmp_path: Path) -> None:
    async with (
        open_daemon(daemon_config(tmp_path)) as running,
        httpx.AsyncClient(base_url=running.url) as http,
    ):
        body = {"scenario": "completed", "idempotency_key": "order-17"}
        first = await http.post("/v1/runs", json=body)
        again = await http.post("/v1/runs", json=body)
        other = await http.post(
            "/v1/runs", json={"scenario": "max_turns", "idempotency_key": "order-17"}
        )
        listed = (await http.get("/v1/runs")).json()
    assert (first.status_code, again.status_code, other.status_code) == (202, 200, 409)
    assert again.json()["id"] == first.json()["id"]
    assert other.json()["error"]["key"] == "idempotency_key"
    assert len(listed["runs"]) == 1


@pytest.mark.asyncio
async def test_listing_filters_and_pages(tmp_path: Path) -> None:
    async with (
        open_daemon(daemon_config(tmp_path)) as running,
        DaemonClient(running.url) as client,
    ):
        ids = [
            (await client.submit({"scenario": name}))["id"]
            for name in ("completed", "max_turns", "completed")
        ]
        with anyio.fail_after(30):
            for run_id in ids:
                await wait_ended(client, run_id)
        first = await client.runs(limit=2)
        second = await client.runs(limit=2, cursor=first["next_cursor"])
        completed = await client.runs(exit_reason="completed")
        ended = await client.runs(status="ended")
        queued = await client.runs(status="queued")
    assert [r["id"] for r in first["runs"] + second["runs"]] == ids[::-1]
    assert second["next_cursor"] is None
    assert {r["id"] for r in completed["runs"]} == {ids[0], ids[2]}
    assert len(ended["runs"]) == 3
    assert queued["runs"] == []
    assert all(r["result"] is None for r in first["runs"])  # GET one run for its result


@pytest.mark.asyncio
async def test_draining_refuses_new_runs_and_readyz_says_so(tmp_path: Path) -> None:
    async with (
        open_daemon(daemon_config(tmp_path)) as running,
        httpx.AsyncClient(base_url=running.url) as http,
    ):
        assert (await http.get("/readyz")).status_code == 200
        await running.daemon.shutdown(0.0)
        ready = await http.get("/readyz")
        refused = await http.post("/v1/runs", json={"scenario": "completed"})
        health = await http.get("/healthz")
    assert ready.status_code == 503
    assert ready.json()["status"] == "draining"
    assert refused.status_code == 503
    assert "retry-after" in refused.headers
    assert health.status_code == 200


@pytest.mark.asyncio
async def test_openapi_describes_the_api_from_the_schemas(tmp_path: Path) -> None:
    async with (
        open_daemon(daemon_config(tmp_path)) as running,
        httpx.AsyncClient(base_url=running.url) as http,
    ):
        document = (await http.get("/v1/openapi.json")).json()
    assert document["openapi"].startswith("3.")
    assert {"/v1/runs", "/v1/runs/{id}", "/v1/runs/{id}/events", "/v1/runs/{id}/abort"} <= set(
        document["paths"]
    )
    replay = document["paths"]["/v1/replay"]["post"]  # the operator's route (issue #29)
    assert {"200", "401", "403", "413", "422"} <= set(replay["responses"])
    replay_request = document["components"]["schemas"]["ReplayRequest"]
    assert replay_request["properties"]["runs"]["maxItems"] == 50
    assert "verdicts_match" in document["components"]["schemas"]["ReplayRow"]["properties"]
    request = document["components"]["schemas"]["RunRequest"]
    assert request["additionalProperties"] is False
    assert {"task", "scenario", "config", "idempotency_key"} <= set(request["properties"])
    assert "RunFinished" in document["components"]["schemas"]


@pytest.mark.asyncio
async def test_metrics_text_and_openmetrics(tmp_path: Path) -> None:
    async with (
        open_daemon(daemon_config(tmp_path)) as running,
        DaemonClient(running.url) as client,
    ):
        run_id = (await client.submit({"scenario": "completed"}))["id"]
        with anyio.fail_after(20):
            await wait_ended(client, run_id)
        async with httpx.AsyncClient(base_url=running.url) as http:
            text = await http.get("/metrics")
            open_metrics = await http.get(
                "/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"}
            )
    assert text.headers["content-type"].startswith("text/plain")
    assert "loopfuse_daemon_runs_accepted_total 1.0" in text.text
    assert 'loopfuse_daemon_runs_ended_total{exit_reason="completed"} 1.0' in text.text
    for reason in ExitReason:  # every series exists from the start
        assert f'loopfuse_daemon_runs_ended_total{{exit_reason="{reason.value}"}}' in text.text
    assert open_metrics.headers["content-type"].startswith("application/openmetrics-text")
    assert open_metrics.text.rstrip().endswith("# EOF")


@pytest.mark.asyncio
async def test_retention_prunes_ended_runs_beyond_the_limit_at_start(tmp_path: Path) -> None:
    async with open_daemon(daemon_config(tmp_path)) as running, DaemonClient(running.url) as client:
        ids = [(await client.submit({"scenario": "completed"}))["id"] for _ in range(3)]
        with anyio.fail_after(20):
            ended = {run_id: (await wait_ended(client, run_id))["ended_at"] for run_id in ids}
    newest = max(ids, key=ended.__getitem__)  # runs end in any order, not as submitted
    config = daemon_config(tmp_path, retention_max_runs=1)
    async with open_daemon(config) as running, httpx.AsyncClient(base_url=running.url) as http:
        # The daemon answers once its start-up pruning is committed.
        statuses = {run_id: (await http.get(f"/v1/runs/{run_id}")).status_code for run_id in ids}
    assert statuses == {run_id: 200 if run_id == newest else 404 for run_id in ids}


@pytest.mark.asyncio
async def test_store_commits_feed_the_write_latency_histogram(tmp_path: Path) -> None:
    async with (
        open_daemon(daemon_config(tmp_path)) as running,
        DaemonClient(running.url) as client,
        httpx.AsyncClient(base_url=running.url) as http,
    ):
        accepted = await client.submit({"scenario": "completed"})
        with anyio.fail_after(20):
            await wait_ended(client, accepted["id"])
        text = (await http.get("/metrics")).text
    counts = [
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith("loopfuse_store_write_duration_seconds_count")
    ]
    assert counts
    assert counts[0] >= 1


SAMPLE = Path(__file__).resolve().parent.parent / "orchestrator" / "report" / "sample"


@pytest.mark.asyncio
async def test_a_pipeline_run_writes_its_report(tmp_path: Path) -> None:
    request = {
        "pipeline": {"name": "report", "goal": "Summarise the growth measurements"},
        "folder": str(SAMPLE),
    }
    config = daemon_config(tmp_path, folder_roots=(str(SAMPLE.parent),))
    async with (
        open_daemon(config) as running,
        DaemonClient(running.url) as client,
    ):
        accepted = await client.submit(request)
        with anyio.fail_after(60):
            events = await events_until(
                client, accepted["id"], lambda e: e["type"] == "RunFinished"
            )
            run = await wait_ended(client, accepted["id"])
    assert run["exit_reason"] == "completed"
    # The trace id the daemon answered with is the pipeline's (its stages' runs' too).
    assert run["trace_id"] == accepted["trace_id"] == run["result"]["trace_id"]
    stages = {e["stage"] for e in events if e["type"] == "Progress"}
    assert {"scan", "explore", "draft", "finalize"} <= stages
    report = tmp_path / "reports" / f"{accepted['id']}.md"
    assert report.read_text(encoding="utf-8").strip()
    assert (tmp_path / "reports" / f"{accepted['id']}.summary.json").exists()


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("body", "key"),
    [
        ({"pipeline": {"name": "report", "goal": "g"}}, "folder"),
        ({"pipeline": {"name": "report", "goal": "g"}, "folder": "/no/such/dir"}, "folder"),
        ({"pipeline": {"name": "report", "goal": "g"}, "folder": ".", "task": "x"}, "task"),
        ({"pipeline": {"name": "poem", "goal": "g"}, "folder": "."}, None),
        ({"pipeline": {"name": "report", "goal": "g"}, "scenario": "completed"}, "pipeline"),
    ],
)
async def test_a_bad_pipeline_request_is_a_422_naming_the_field(
    tmp_path: Path, body: dict[str, object], key: str | None
) -> None:
    async with (
        open_daemon(daemon_config(tmp_path)) as running,
        httpx.AsyncClient(base_url=running.url) as http,
    ):
        response = await http.post("/v1/runs", json=body)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["message"]
    if key is not None:
        assert error["key"] == key
