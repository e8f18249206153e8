"""Traces against a real backend: Arize Phoenix (``phoenix serve``) on loopback receives the
daemon's spans over OTLP/HTTP, and the test reads them back through Phoenix's own REST API:
names, parents, attributes, events, durations, trace ids.

Phoenix runs from its own virtualenv (``.venv-phoenix``, made by ``scripts/test``: its
dependencies would change the project's), or from ``$LOOPFUSE_PHOENIX``, or a ``phoenix`` on
the PATH. Skipped, with the reason, where none is installed or it cannot start.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any, Final

import anyio
import httpx
import pytest

from orchestrator.config import Config, DaemonSettings, TracingSettings
from orchestrator.daemon import open_daemon
from orchestrator.daemon.client import DaemonClient
from tests.daemon_support import wait_ended

ROOT: Final = Path(__file__).resolve().parent.parent
START_SECONDS: Final = 120.0
"""Phoenix answers /healthz about 18 s after start on 2 cores; a bound, not a target."""
WAIT: Final = 120.0
CALLER: Final = ("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331")


def phoenix_command() -> str | None:
    for found in (
        os.environ.get("LOOPFUSE_PHOENIX"),
        str(ROOT / ".venv-phoenix" / "bin" / "phoenix"),
        shutil.which("phoenix"),
    ):
        if found and os.access(found, os.X_OK):
            return found
    return None


def free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as sock:
        port: int = sock.getsockname()[1]
        return port


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/healthz", timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


@pytest.fixture(scope="module")
def phoenix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Phoenix on free loopback ports with a working directory of its own; its URL."""
    command = phoenix_command()
    if command is None:
        pytest.skip("Arize Phoenix is not installed (scripts/test puts it in .venv-phoenix)")
    work = tmp_path_factory.mktemp("phoenix")
    port = free_port()
    env = {
        **os.environ,
        "PHOENIX_WORKING_DIR": str(work),
        "PHOENIX_HOST": "127.0.0.1",
        "PHOENIX_PORT": str(port),
        "PHOENIX_GRPC_PORT": str(free_port()),
        "PHOENIX_TELEMETRY_ENABLED": "false",
    }
    log = work / "phoenix.log"
    url = f"http://127.0.0.1:{port}"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [command, "serve"], stdout=out, stderr=subprocess.STDOUT, env=env, cwd=work
        )
    try:
        deadline = time.monotonic() + START_SECONDS
        while not _healthy(url):  # a bounded poll of the event itself: /healthz answering
            if process.poll() is not None or time.monotonic() > deadline:
                tail = log.read_text(errors="replace")[-1500:]
                pytest.skip(f"Phoenix did not start ({command}): {tail}")
            time.sleep(0.25)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


async def phoenix_spans(url: str) -> list[dict[str, Any]]:
    """Every span of Phoenix's default project, page by page."""
    spans: list[dict[str, Any]] = []
    cursor: str | None = None
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        while True:
            params: dict[str, Any] = {"limit": 1000}
            if cursor:
                params["cursor"] = cursor
            response = await http.get("/v1/projects/default/spans", params=params)
            response.raise_for_status()
            page = response.json()
            spans.extend(page["data"])
            cursor = page.get("next_cursor")
            if not cursor:
                return spans


async def wait_for_spans(url: str, trace_ids: set[str], count: int) -> list[dict[str, Any]]:
    """Poll Phoenix until ``count`` spans of ``trace_ids`` are stored (it ingests
    asynchronously); bounded by :data:`WAIT`."""
    with anyio.fail_after(WAIT):
        while True:
            spans = [s for s in await phoenix_spans(url) if s["context"]["trace_id"] in trace_ids]
            if len(spans) >= count:
                return spans
            await anyio.sleep(0.25)


def duration(span: dict[str, Any]) -> float:
    start = datetime.fromisoformat(span["start_time"])
    return (datetime.fromisoformat(span["end_time"]) - start).total_seconds()


@pytest.mark.asyncio
async def test_runs_through_the_daemon_read_back_from_phoenix(phoenix: str, tmp_path: Path) -> None:
    config = Config(
        daemon=DaemonSettings(store_path=str(tmp_path / "daemon.db"), port=0),
        tracing=TracingSettings(
            enabled=True,
            endpoint=f"{phoenix}/v1/traces",
            service_name="loopfuse-test",
            export_delay_seconds=0.1,
        ),
    )
    runs: dict[str, dict[str, Any]] = {}
    with anyio.fail_after(WAIT):
        async with open_daemon(config) as daemon, DaemonClient(daemon.url) as client:
            for name in ("dead_loop", "ping_pong", "api_down"):
                accepted = await client.submit({"scenario": name})
                runs[name] = await wait_ended(client, accepted["id"])
            async with httpx.AsyncClient(base_url=daemon.url) as http:
                header = {"traceparent": f"00-{CALLER[0]}-{CALLER[1]}-01"}
                response = await http.post(
                    "/v1/runs", json={"scenario": "completed"}, headers=header
                )
                assert response.status_code == 202, response.text
            runs["completed"] = await wait_ended(client, response.json()["id"])
        # The daemon has stopped: its spans are flushed to Phoenix.

    assert runs["completed"]["trace_id"] == CALLER[0]
    expected = {
        name: 1 + run["result"]["llm_requests"] + run["result"]["tool_calls"]
        for name, run in runs.items()
    }
    trace_ids = {run["trace_id"]: name for name, run in runs.items()}
    spans = await wait_for_spans(phoenix, set(trace_ids), sum(expected.values()))

    for name, run in runs.items():
        result = run["result"]
        mine = [s for s in spans if s["context"]["trace_id"] == run["trace_id"]]
        assert len(mine) == expected[name], (name, [s["name"] for s in mine])
        (agent,) = [s for s in mine if s["name"] == "invoke_agent loopfuse"]
        attributes = agent["attributes"]
        assert attributes["gen_ai.operation.name"] == "invoke_agent"
        assert attributes["loopfuse.run_id"] == run["id"]
        assert attributes["loopfuse.exit_reason"] == result["exit_reason"]
        assert attributes["loopfuse.cause"] == result["cause"]
        assert attributes["gen_ai.usage.output_tokens"] == result["usage"]["completion_tokens"]
        assert agent["span_kind"] == "AGENT"  # Phoenix read the GenAI conventions
        assert duration(agent) > 0
        if name == "completed":
            assert agent["parent_id"] == CALLER[1]  # the caller's span
        else:
            assert agent["parent_id"] is None
        children = [s for s in mine if s is not agent]
        for span in children:
            assert span["parent_id"] == agent["context"]["span_id"], span["name"]
            assert duration(span) > 0, span["name"]
            assert agent["start_time"] <= span["start_time"] <= span["end_time"]
            assert span["end_time"] <= agent["end_time"]
        chats = [s for s in children if s["name"].startswith("chat ")]
        assert len(chats) == result["llm_requests"]
        for chat in chats:
            assert chat["name"] == f"chat {name}"
            assert chat["span_kind"] == "LLM"
            assert chat["attributes"]["gen_ai.request.model"] == name
            assert chat["attributes"]["gen_ai.provider.name"] == "loopfuse.simulator"
            if name == "api_down":  # its faults go over HTTP: the simulator was contacted
                assert chat["attributes"]["server.address"] == "127.0.0.1"
            else:  # played in process: no server address on the span
                assert "server.address" not in chat["attributes"]
        tools = [s for s in children if s["name"].startswith("execute_tool ")]
        assert len(tools) == result["tool_calls"]
        for tool in tools:
            tool_name = tool["attributes"]["gen_ai.tool.name"]
            assert tool["name"] == f"execute_tool {tool_name}"
            assert tool["attributes"]["gen_ai.tool.call.id"]
        events = [e["name"] for e in agent["events"]]
        if name in ("dead_loop", "ping_pong"):  # a loop: verdicts, a nudge, then the stop
            assert "loopfuse.verdict" in events
            assert "loopfuse.nudge" in events
            assert events[-1] == "loopfuse.stop"
            assert agent["status_code"] == "ERROR"
            stop = agent["events"][-1]["attributes"]
            assert stop["loopfuse.cause"] == result["cause"]
        if name == "api_down":
            assert chats
            assert chats[-1]["status_code"] == "ERROR"
            assert chats[-1]["attributes"]["error.type"]
        if name != "api_down":
            used = sum(c["attributes"]["gen_ai.usage.input_tokens"] for c in chats)
            assert used == result["usage"]["prompt_tokens"]
