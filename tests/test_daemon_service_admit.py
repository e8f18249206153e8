"""The operator's policy checks a submitted request once (the submit path starts the run from
what it admitted) and a stored request again when a restart starts it, through a real
daemon: a refusal is still a 422 naming the key, and a stored request gets only what
today's policy allows."""

from __future__ import annotations

from pathlib import Path

import anyio
import httpx
import msgspec
import pytest

from orchestrator.config import ClientOverrides, Config
from orchestrator.daemon import open_daemon
from orchestrator.daemon.client import DaemonClient
from orchestrator.daemon.errors import ApiError
from orchestrator.daemon.policy import Admitted, Policy, admit
from orchestrator.daemon.schemas import RunRequest
from orchestrator.sim import shipped_scenarios
from tests.daemon_support import daemon_config, store_queued, wait_ended


@pytest.fixture
def admitted(monkeypatch: pytest.MonkeyPatch) -> list[RunRequest]:
    """The requests the policy checked (the submit path's and a start's checks alike)."""
    checked: list[RunRequest] = []
    check = Policy.admit

    def counted(self: Policy, request: RunRequest) -> Admitted:
        checked.append(request)
        return check(self, request)

    monkeypatch.setattr(Policy, "admit", counted)
    return checked


@pytest.mark.asyncio
async def test_a_submitted_run_passes_the_policy_once_and_runs(
    tmp_path: Path, admitted: list[RunRequest]
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
    assert [request.config for request in admitted] == [{"max_turns": 5}]


@pytest.mark.asyncio
async def test_a_refused_request_gets_its_422_and_starts_nothing(
    tmp_path: Path, admitted: list[RunRequest]
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
    assert len(admitted) == 1


@pytest.mark.asyncio
async def test_a_stored_request_is_checked_against_today_s_policy_at_restart(
    tmp_path: Path, admitted: list[RunRequest]
) -> None:
    """Stored when ``max_turns`` was allowed; today's operator allows no key: the restart
    refuses it by name (the run ends ``abort.crash``), and the daemon serves on."""
    request = RunRequest(scenario="completed", config={"max_turns": 5})
    await store_queued(tmp_path / "daemon.db", "stored-before", request, on_crash="abort")
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
    assert admitted == [request]


def test_a_policy_kept_for_many_requests_admits_as_a_fresh_check_does() -> None:
    """The daemon keeps one :class:`Policy` (a scenario's settings worked out once): every
    request gets what :func:`admit` gives it alone, in any order, refusals included."""
    scenarios = {s.name: s for s in shipped_scenarios()}
    config = msgspec.structs.replace(
        Config(), budget=msgspec.structs.replace(Config().budget, max_turns=7)
    )
    requests = [
        RunRequest(scenario="completed"),
        RunRequest(scenario="completed", config={"max_turns": 3}),
        RunRequest(scenario="completed", config={"max_turns": 500}),
        RunRequest(task="Say hello."),
        RunRequest(task="Say hello.", config={"max_tool_calls": 2}),
        RunRequest(scenario="completed"),
        RunRequest(task="Say hello."),
    ]
    kept = Policy(config, scenarios)
    for request in requests * 2:
        try:
            fresh: Admitted | ApiError = admit(request, config, scenarios)
        except ApiError as exc:
            fresh = exc
        if isinstance(fresh, ApiError):
            with pytest.raises(ApiError) as refused:
                kept.admit(request)
            assert (refused.value.code, refused.value.key) == (fresh.code, fresh.key)
        else:
            assert kept.admit(request) == fresh
    # The scenario's own limit, the operator's for a task: each its own settings.
    assert kept.admit(requests[0]).settings.max_turns == scenarios["completed"].config["max_turns"]
    assert kept.admit(requests[3]).settings.max_turns == 7
