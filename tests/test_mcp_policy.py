"""Which MCP tools a run gets is the operator's choice, through a real daemon over HTTP: a
request may leave tools out (when the operator lets it set ``tools`` at all) but can never
add an MCP tool the run was not given, nor bring a server of its own."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import msgspec
import pytest

pytest.importorskip("mcp", reason="needs the mcp extra: pip install 'loopfuse[mcp]'")

from orchestrator.config import ClientOverrides, McpSettings, ToolSettings
from orchestrator.daemon import open_daemon
from orchestrator.daemon.client import DaemonClient
from tests.daemon_support import daemon_config, wait_ended
from tests.mcp_support import fault_server, scripted

ECHO_TWICE = scripted(
    """
task = "Echo twice."
[config]
max_turns = 4
tools = ["faults__echo"]
[[steps]]
tool_calls = [{ name = "faults__echo", arguments = { text = "operator's tool" } }]
[[steps]]
text = "Done."
[expect]
exit_reason = "completed"
""",
    name="echo_once",
)


@pytest.mark.asyncio
async def test_a_request_cannot_add_an_mcp_tool(tmp_path: Path) -> None:
    base = daemon_config(
        tmp_path,
        client_overrides=ClientOverrides(allowed=(*ClientOverrides().allowed, "tools")),
    )
    config = msgspec.structs.replace(
        base,
        mcp=McpSettings(servers=(fault_server(),)),
        tools=msgspec.structs.replace(ToolSettings(), enabled=("list_dir", "faults__echo")),
    )
    async with (
        open_daemon(config, scenarios=[ECHO_TWICE]) as running,
        httpx.AsyncClient(base_url=running.url) as http,
        DaemonClient(running.url) as client,
    ):
        added = await http.post(
            "/v1/runs",
            json={"task": "x", "config": {"tools": ["list_dir", "faults__crash"]}},
        )
        added_to_scenario = await http.post(
            "/v1/runs",
            json={"scenario": "echo_once", "config": {"tools": ["faults__echo", "faults__hang"]}},
        )
        server = await http.post(
            "/v1/runs",
            json={"task": "x", "config": {"mcp": {"servers": [{"name": "mine", "command": "sh"}]}}},
        )
        fewer = await http.post("/v1/runs", json={"task": "x", "config": {"tools": ["list_dir"]}})
        operators = await http.post("/v1/runs", json={"scenario": "echo_once"})
        assert fewer.status_code == operators.status_code == 202
        await wait_ended(client, fewer.json()["id"])
        run = await wait_ended(client, operators.json()["id"])
        results = [
            json.loads(event.data)
            async for event in client.events(run["id"])
            if event.event == "message" and json.loads(event.data)["type"] == "ToolResult"
        ]
        stored = (await http.get("/v1/runs")).json()["runs"]
    for response, tool in ((added, "faults__crash"), (added_to_scenario, "faults__hang")):
        error = response.json()["error"]
        assert (response.status_code, error["code"], error["key"]) == (
            422,
            "override_not_allowed",
            "config.tools",
        )
        assert f"{tool} not among the run's tools" in error["message"]
    error = server.json()["error"]
    assert (server.status_code, error["key"]) == (422, "config.mcp")
    assert {run["id"] for run in stored} == {fewer.json()["id"], operators.json()["id"]}
    assert run["exit_reason"] == "completed"
    assert [(r["tool"], r["content"]) for r in results] == [
        ("faults__echo", "echo: operator's tool")
    ]
