"""The operator's policy checks a submitted request once (the submit path starts the run from
what it admitted) and a stored request again when a restart starts it, through a real
daemon: a refusal is still a 422 naming the key, and a stored request gets only what
today's policy allows."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from pathlib import Path

import anyio
import httpx
import msgspec
import pytest

from orchestrator.config import ClientOverrides, Config
from orchestrator.daemon import open_daemon, policy, service, starting
from orchestrator.daemon.client import DaemonClient
from orchestrator.daemon.policy import Admitted
from orchestrator.daemon.schemas import RunRequest
from orchestrator.daemon.store import RunRow, Store
from orchestrator.sim import Scenario
from tests.daemon_support import daemon_config, wait_ended


@pytest.fixture
def admitted(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """How often the submit path (``service``) and the start (``starting``) ran the policy."""
    calls: Counter[str] = Counter()
    for module in (service, starting):

        def counted(
            request: RunRequest,
            config: Config,
            scenarios: Mapping[str, Scenario],
            *,
            name: str = module.__name__.rsplit(".", 1)[-1],
        ) -> Admitted:
            calls[name] += 1
            return policy.admit(request, config, scenarios)

        monkeypatch.setattr(module, "admit", counted)
    return calls


@pytest.mark.asyncio
async def test_a_submitted_run_passes_the_policy_once_and_runs(
    tmp_path: Path, admitted: Counter[str]
) -> None:
    async with open_daemon(daemon_config(tmp_path)) as running, DaemonClient(running.url) as client:
        async with httpx.AsyncClient(base_url=running.url) as http:
            response = await http.post(
                "/v1/runs", json={"scenario": "completed", "config": {"max_turns": 5}}
            )
        assert response.status_code == 202, response.text
        with anyio.fail_after(60):
            run = await wait_ended(client, response.json()["id"])
    assert run["exit_reason"] == "completed", run
    assert admitted == {"service": 1}


@pytest.mark.asyncio
async def test_a_refused_request_gets_its_422_and_starts_nothing(
    tmp_path: Path, admitted: Counter[str]
) -> None:
    async with (
        open_daemon(daemon_config(tmp_path)) as running,
        httpx.AsyncClient(base_url=running.url) as http,
    ):
        refused = await http.post(
            "/v1/runs", json={"scenario": "completed", "config": {"input_price_per_million": 0}}
        )
        runs = (await http.get("/v1/runs")).json()["runs"]
    assert refused.status_code == 422, refused.text
    assert refused.json()["error"]["key"] == "config.input_price_per_million"
    assert runs == []
    assert admitted == {"service": 1}


async def _store_queued(path: Path, run_id: str, request: RunRequest) -> None:
    store = Store(path)
    async with anyio.create_task_group() as tg:
        await tg.start(store.run)
        store.insert_run(
            RunRow(
                id=run_id,
                trace_id="a" * 32,
                status="queued",
                on_crash="abort",
                request=json.dumps(msgspec.to_builtins(request)).encode(),
                request_hash="h",
                created_at=0.0,
            )
        )
        await store.flush()
        tg.cancel_scope.cancel()
    store.close()


@pytest.mark.asyncio
async def test_a_stored_request_is_checked_against_today_s_policy_at_restart(
    tmp_path: Path, admitted: Counter[str]
) -> None:
    """Stored when ``max_turns`` was allowed; today's operator allows no key: the restart
    refuses it by name (the run ends ``abort.crash``), and the daemon serves on."""
    request = RunRequest(scenario="completed", config={"max_turns": 5})
    await _store_queued(tmp_path / "daemon.db", "stored-before", request)
    strict = daemon_config(tmp_path)
    strict = msgspec.structs.replace(
        strict,
        daemon=msgspec.structs.replace(strict.daemon, client_overrides=ClientOverrides(allowed=())),
    )
    async with open_daemon(strict) as running, DaemonClient(running.url) as client:
        with anyio.fail_after(60):
            run = await wait_ended(client, "stored-before")
        async with httpx.AsyncClient(base_url=running.url) as http:
            health = await http.get("/healthz")
    assert run["cause"] == "abort.crash", run
    detail = run["result"]["detail"]
    assert "its stored request was refused" in detail, detail
    assert "config.max_turns" in detail, detail
    assert health.status_code == 200
    assert admitted == {"starting": 1}
