"""What an API request may ask of a run (``docs/security.md``), through a real daemon.

The hostile probes of issue #16 are refused with a 4xx naming the key, and nothing they
asked for happens; what the operator allows works; the library keeps full control.
"""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Any

import anyio
import httpx
import msgspec
import pytest

from orchestrator.config import (
    BudgetSettings,
    ClientCeilings,
    ClientKey,
    ClientOverrides,
    Config,
    DaemonSettings,
    ModelPrice,
    load_config,
)
from orchestrator.daemon import open_daemon
from orchestrator.daemon.client import DaemonClient
from orchestrator.daemon.policy import allowed_models
from orchestrator.daemon.schemas import RunRequest
from orchestrator.errors import ConfigError
from orchestrator.runtime import Runtime
from orchestrator.scenarios.runs import run_scenario
from orchestrator.sim import find_scenario
from tests.daemon_support import daemon_config, events_until, store_queued, wait_ended

EVERY_CLIENT_KEY: tuple[ClientKey, ...] = typing.get_args(ClientKey)


def hook(marker: Path) -> dict[str, Any]:
    """The issue's hook probe: a shell command that leaves ``marker`` behind if it runs."""
    return {
        "name": "x",
        "kind": "command",
        "command": ["/bin/sh", "-c", f"id > {marker}; exit 2"],
    }


def config(tmp_path: Path, *, budget: BudgetSettings | None = None, **daemon: Any) -> Config:
    base = daemon_config(tmp_path, **daemon)
    return msgspec.structs.replace(base, budget=budget or BudgetSettings())


def refusal(response: httpx.Response) -> dict[str, str]:
    assert 400 <= response.status_code < 500, (response.status_code, response.text)
    error: dict[str, str] = response.json()["error"]
    assert error["message"]
    return error


async def stored_runs(http: httpx.AsyncClient) -> list[dict[str, Any]]:
    runs: list[dict[str, Any]] = (await http.get("/v1/runs")).json()["runs"]
    return runs


@pytest.mark.asyncio
async def test_a_hook_from_a_request_is_refused_and_never_runs(tmp_path: Path) -> None:
    marker = tmp_path / "owned.txt"
    probes = [
        {"scenario": "completed", "config": {"hooks": [hook(marker)]}},
        {"task": "List the folder.", "config": {"hooks": [hook(marker)]}},
        {
            "pipeline": {"name": "report", "goal": "g"},
            "folder": str(tmp_path),
            "config": {"hooks": [hook(marker)]},
        },
    ]
    # Even a policy that allows every key a policy can allow does not allow hooks.
    everything = ClientOverrides(allowed=EVERY_CLIENT_KEY)
    settings = config(tmp_path, client_overrides=everything, folder_roots=(str(tmp_path),))
    async with open_daemon(settings) as running, httpx.AsyncClient(base_url=running.url) as http:
        responses = [await http.post("/v1/runs", json=body) for body in probes]
        runs = await stored_runs(http)
        health = await http.get("/healthz")
    for response in responses:
        error = refusal(response)
        assert response.status_code == 422
        assert (error["code"], error["key"]) == ("override_not_allowed", "config.hooks")
        assert "only the operator" in error["message"]
    assert runs == []
    assert health.status_code == 200
    assert not marker.exists()

    # The same hook from the operator (the library) runs: the probe was a real one.
    completed = find_scenario("completed")
    hooked = msgspec.structs.replace(
        completed, config={**completed.config, "hooks": [hook(marker)]}
    )
    async with Runtime() as runtime:
        with anyio.fail_after(30):
            await run_scenario(runtime, hooked)
    assert marker.exists()


def test_no_policy_lets_a_request_set_hooks_or_prices(tmp_path: Path) -> None:
    path = tmp_path / "loopfuse.toml"
    for key in ("hooks", "input_price_per_million", "tool_timeout_seconds"):
        path.write_text(f'[daemon.client_overrides]\nallowed = ["max_turns", "{key}"]\n')
        with pytest.raises(ConfigError) as caught:
            load_config(path, environ={})
        assert caught.value.key == "daemon.client_overrides.allowed.1"
        assert f"Invalid enum value '{key}'" in caught.value.reason
        assert "'max_turns'" in caught.value.reason  # and what may be allowed
    path.write_text('[daemon]\nfolder_roots = ["srv/data"]\n')
    with pytest.raises(ConfigError) as caught:
        load_config(path, environ={})
    assert caught.value.key == "daemon.folder_roots.0"


@pytest.mark.asyncio
async def test_a_request_picks_a_model_only_among_the_operator_s(tmp_path: Path) -> None:
    async with (
        open_daemon(config(tmp_path)) as running,
        httpx.AsyncClient(base_url=running.url) as http,
    ):
        scripted = await http.post(
            "/v1/runs", json={"task": "Read it.", "config": {"model": "path_escape"}}
        )
        with_root = await http.post(
            "/v1/runs",
            json={"task": "Read it.", "folder": "/", "config": {"model": "path_escape"}},
        )
        same = await http.post("/v1/runs", json={"task": "Hi.", "config": {"model": "completed"}})
        runs = await stored_runs(http)
    error = refusal(scripted)
    assert (scripted.status_code, error["code"], error["key"]) == (
        422,
        "override_not_allowed",
        "config.model",
    )
    assert "'path_escape' is not a model this daemon offers" in error["message"]
    assert "completed" in error["message"]  # the one it offers
    assert refusal(with_root)["key"] in {"folder", "config.model"}
    assert same.status_code == 202
    assert [run["id"] for run in runs] == [same.json()["id"]]

    allowed = ClientOverrides(models=("max_turns",))
    async with (
        open_daemon(config(tmp_path / "b", client_overrides=allowed)) as running,
        DaemonClient(running.url) as client,
    ):
        # (max_turns lowered: the model reads a file this folder lacks at ever new offsets,
        # which the default loop preset stops as no new information at its 11th call)
        accepted = await client.submit(
            {"task": "Go.", "config": {"model": "max_turns", "max_turns": 3}}
        )
        with anyio.fail_after(30):
            run = await wait_ended(client, accepted["id"])
    assert run["exit_reason"] == "max_turns"


def test_the_offered_models_are_the_operator_s() -> None:
    settings = Config(
        prices={"priced": ModelPrice(input_per_million=1, output_per_million=2)},
        daemon=DaemonSettings(client_overrides=ClientOverrides(models=("listed",))),
    )
    assert allowed_models(settings) == {"completed", "priced", "listed"}


@pytest.mark.asyncio
async def test_budgets_stay_under_the_operator_s_values_and_ceilings(tmp_path: Path) -> None:
    budget = BudgetSettings(max_turns=20, max_output_tokens=1000)
    async with (
        open_daemon(config(tmp_path, budget=budget)) as running,
        httpx.AsyncClient(base_url=running.url) as http,
        DaemonClient(running.url) as client,
    ):
        lowered = await client.submit({"scenario": "max_turns", "config": {"max_turns": 2}})
        refused = {
            "above the scenario's": await http.post(
                "/v1/runs", json={"scenario": "max_turns", "config": {"max_turns": 4}}
            ),
            "above the config's": await http.post(
                "/v1/runs", json={"task": "x", "config": {"max_turns": 21}}
            ),
            "a longer deadline": await http.post(
                "/v1/runs", json={"task": "x", "config": {"deadline_seconds": 601}}
            ),
            "lifting a budget": await http.post(
                "/v1/runs", json={"task": "x", "config": {"output_token_budget": None}}
            ),
            "above a budget": await http.post(
                "/v1/runs", json={"task": "x", "config": {"output_token_budget": 1001}}
            ),
        }
        under = await http.post(
            "/v1/runs", json={"task": "x", "config": {"output_token_budget": 5}}
        )
        with anyio.fail_after(30):
            run = await wait_ended(client, lowered["id"])
    assert (run["exit_reason"], run["result"]["turns"]) == ("max_turns", 2)
    assert under.status_code == 202
    for why, response in refused.items():
        assert response.status_code == 422, why
        assert refusal(response)["code"] == "override_not_allowed", why
    assert "above the operator's ceiling of 3" in refused["above the scenario's"].text
    assert "above the operator's ceiling of 20" in refused["above the config's"].text
    assert refused["a longer deadline"].json()["error"]["key"] == "config.deadline_seconds"
    assert "limit of 1000" in refused["lifting a budget"].text

    ceilings = ClientOverrides(ceilings=ClientCeilings(max_turns=50))
    async with (
        open_daemon(config(tmp_path / "b", client_overrides=ceilings)) as running,
        httpx.AsyncClient(base_url=running.url) as http,
    ):
        at_ceiling = await http.post("/v1/runs", json={"task": "x", "config": {"max_turns": 50}})
        above = await http.post("/v1/runs", json={"task": "x", "config": {"max_turns": 51}})
    assert at_ceiling.status_code == 202
    assert "daemon.client_overrides.ceilings.max_turns" in refusal(above)["message"]


@pytest.mark.asyncio
async def test_settings_outside_the_policy_are_refused_by_name(tmp_path: Path) -> None:
    refused = {
        "tool_timeout_seconds": 1e6,
        "escalated_max_tokens": 10**9,
        "context_window": 10**9,
        "input_price_per_million": 0,
        "tools": ["list_dir"],  # a policy may allow it; the default does not
        "loop_preset": "off",  # allowed key, but not this preset
    }
    async with (
        open_daemon(config(tmp_path)) as running,
        httpx.AsyncClient(base_url=running.url) as http,
    ):
        answers = {
            key: await http.post("/v1/runs", json={"task": "x", "config": {key: value}})
            for key, value in refused.items()
        }
        unknown = await http.post("/v1/runs", json={"task": "x", "config": {"max_turn": 3}})
        preset = await http.post(
            "/v1/runs", json={"task": "x", "config": {"loop_preset": "gemini"}}
        )
        runs = await stored_runs(http)
    for key, response in answers.items():
        error = refusal(response)
        assert (response.status_code, error["code"], error["key"]) == (
            422,
            "override_not_allowed",
            f"config.{key}",
        )
    assert "daemon.client_overrides.allowed" in answers["tool_timeout_seconds"].text
    assert "daemon.client_overrides.loop_presets" in answers["loop_preset"].text
    assert (refusal(unknown)["code"], refusal(unknown)["key"]) == (
        "invalid_config",
        "config.max_turn",
    )
    assert preset.status_code == 202
    assert [run["id"] for run in runs] == [preset.json()["id"]]


@pytest.mark.asyncio
async def test_an_operator_may_allow_more_but_never_tools_it_did_not_give(
    tmp_path: Path,
) -> None:
    wider = ClientOverrides(
        allowed=(*ClientOverrides().allowed, "tools"), loop_presets=("strict", "off")
    )
    async with (
        open_daemon(config(tmp_path, client_overrides=wider)) as running,
        httpx.AsyncClient(base_url=running.url) as http,
    ):
        fewer = await http.post("/v1/runs", json={"task": "x", "config": {"tools": ["list_dir"]}})
        more = await http.post(
            "/v1/runs", json={"task": "x", "config": {"tools": ["list_dir", "make_figure"]}}
        )
        off = await http.post("/v1/runs", json={"task": "x", "config": {"loop_preset": "off"}})
    assert fewer.status_code == off.status_code == 202
    error = refusal(more)
    assert (more.status_code, error["key"]) == (422, "config.tools")
    assert "make_figure not among the run's tools" in error["message"]


@pytest.mark.asyncio
async def test_no_folder_roots_no_folder_runs(tmp_path: Path) -> None:
    async with (
        open_daemon(config(tmp_path)) as running,
        httpx.AsyncClient(base_url=running.url) as http,
    ):
        task = await http.post("/v1/runs", json={"task": "List it.", "folder": "/etc"})
        report = await http.post(
            "/v1/runs", json={"pipeline": {"name": "report", "goal": "g"}, "folder": "/etc"}
        )
        runs = await stored_runs(http)
    for response in (task, report):
        error = refusal(response)
        assert (response.status_code, error["code"], error["key"]) == (
            422,
            "folder_not_allowed",
            "folder",
        )
        assert "daemon.folder_roots" in error["message"]
    assert runs == []


@pytest.mark.asyncio
async def test_a_folder_must_resolve_inside_a_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "data").mkdir(parents=True)
    (root / "data" / "plate-reader-notes.txt").write_text("calibrate first\n")
    (root / "file.txt").write_text("not a folder\n")
    (root / "escape").symlink_to("/etc")
    alias = tmp_path / "alias"
    alias.symlink_to(root)  # a root may itself be a symlink
    outside = {
        "/etc": "/etc",
        "/": "/",
        "a symlink out": str(root / "escape"),
        "dot-dot": f"{root}/data/../..",
        "relative": "data",
        "missing outside": "/no/such/place",
        "a NUL": f"{root}/\0",
    }
    settings = config(tmp_path, folder_roots=(str(alias),))
    async with (
        open_daemon(settings) as running,
        httpx.AsyncClient(base_url=running.url) as http,
        DaemonClient(running.url) as client,
    ):
        answers = {
            why: await http.post("/v1/runs", json={"task": "List it.", "folder": folder})
            for why, folder in outside.items()
        }
        report = await http.post(
            "/v1/runs",
            json={"pipeline": {"name": "report", "goal": "g"}, "folder": str(root / "escape")},
        )
        not_a_dir = await http.post(
            "/v1/runs", json={"task": "x", "folder": str(root / "file.txt")}
        )
        pipeline_budget = await http.post(
            "/v1/runs",
            json={
                "pipeline": {"name": "report", "goal": "g"},
                "folder": str(root / "data"),
                "config": {"max_turns": 3},
            },
        )
        inside = await client.submit({"task": "Look at the folder.", "folder": str(root / "data")})
        with anyio.fail_after(30):
            events = await events_until(client, inside["id"], lambda e: e["type"] == "ToolResult")
            run = await wait_ended(client, inside["id"])
        runs = await stored_runs(http)
    bodies = set()
    for why, response in {**answers, "report": report}.items():
        error = refusal(response)
        assert (response.status_code, error["code"], error["key"]) == (
            422,
            "folder_not_allowed",
            "folder",
        ), why
        bodies.add(response.text)
    assert len(bodies) == 1  # one answer for all: nothing learnt about what exists outside
    assert (refusal(not_a_dir)["code"], not_a_dir.status_code) == ("invalid_folder", 422)
    assert refusal(pipeline_budget)["key"] == "config.max_turns"
    assert "plate-reader-notes.txt" in events[-1]["content"]
    assert run["exit_reason"] == "completed"
    assert [r["id"] for r in runs] == [inside["id"]]


@pytest.mark.asyncio
async def test_scenarios_are_names_never_paths(tmp_path: Path) -> None:
    mine = tmp_path / "mine.toml"
    mine.write_text(completed_text())
    paths = [str(mine), "/etc/passwd", "../x.toml", "orchestrator/scenarios/completed.toml"]
    paths += ["completed.toml", "./completed", str(tmp_path / "daemon.db")]
    async with (
        open_daemon(config(tmp_path, scenarios=(str(mine),))) as running,
        httpx.AsyncClient(base_url=running.url) as http,
    ):
        answers = [await http.post("/v1/runs", json={"scenario": path}) for path in paths]
        by_name = await http.post("/v1/runs", json={"scenario": "mine"})
        names = (await http.get("/v1/scenarios")).json()["scenarios"]
    for path, response in zip(paths, answers, strict=True):
        error = refusal(response)
        assert (response.status_code, error["code"], error["key"]) == (
            422,
            "unknown_scenario",
            "scenario",
        ), path
    assert by_name.status_code == 202
    assert "mine" in names


def completed_text() -> str:
    shipped = Path(__file__).resolve().parent.parent / "orchestrator" / "scenarios"
    return (shipped / "completed.toml").read_text(encoding="utf-8")


@pytest.mark.asyncio
async def test_a_stored_request_runs_only_as_today_s_policy_allows(tmp_path: Path) -> None:
    """A request stored before the policy (or under a looser one) is checked again when the
    daemon starts it after a restart: its hook never runs."""
    marker = tmp_path / "owned.txt"
    request = RunRequest(scenario="completed", config={"hooks": [hook(marker)]})
    await store_queued(tmp_path / "daemon.db", "stored-hostile", request, on_crash="resume")
    async with (
        open_daemon(config(tmp_path)) as running,
        httpx.AsyncClient(base_url=running.url) as http,
    ):
        run = (await http.get("/v1/runs/stored-hostile")).json()
        health = await http.get("/healthz")
    assert run["status"] == "ended"
    assert health.status_code == 200
    assert not marker.exists()
