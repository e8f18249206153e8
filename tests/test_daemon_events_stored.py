"""What the daemon stores of a run, read back over HTTP: each tool schema and each prompt
message once, and every request the model endpoint received rebuilds exactly from the
events (``bus.LogReader``), a request without the run's tools included."""

from __future__ import annotations

import contextlib
import functools
import json
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
import uvicorn
from starlette.types import Message as AsgiMessage
from starlette.types import Receive, Scope, Send

from actors.llm.wire import WireTools, wire_messages
from bus import DECODER, LogReader, Message, ModelRequest, RunFinished, RunStarted
from orchestrator.config import BudgetSettings, Config, ModelSettings
from orchestrator.daemon import open_daemon
from orchestrator.daemon.client import DaemonClient
from orchestrator.sim import shipped_scenarios
from orchestrator.sim.app import make_app
from orchestrator.web.serving import serve_on
from tests.daemon_support import daemon_config

_json = msgspec.json.Encoder()


@contextlib.asynccontextmanager
async def recording_endpoint(received: list[dict[str, Any]]) -> AsyncIterator[str]:
    """The shipped simulator on loopback, keeping every chat request body it is sent; its
    base URL."""
    app = make_app(shipped_scenarios())

    async def recording(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].endswith("/chat/completions"):
            await app(scope, receive, send)
            return
        body, more = b"", True
        while more:
            part = await receive()
            body += part.get("body", b"")
            more = part.get("more_body", False)
        received.append(json.loads(body))
        replayed = False

        async def again() -> AsgiMessage:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await app(scope, again, send)

    sock = socket.create_server(("127.0.0.1", 0))
    with sock:
        config = uvicorn.Config(recording, log_config=None, log_level="warning", lifespan="off")
        async with anyio.create_task_group() as tg:
            server = await tg.start(functools.partial(serve_on, name="recording"), config, sock)
            try:
                yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
            finally:
                server.should_exit = True


async def stored_run(
    tmp_path: Path, task: str, model: str, budget: BudgetSettings
) -> tuple[list[str], list[dict[str, Any]]]:
    """Run ``task`` on a daemon whose ``model`` (a shipped scenario) is played by the
    recording endpoint: the run's stored events (the ``data`` of its event stream) and the
    request bodies the endpoint got."""
    received: list[dict[str, Any]] = []
    folder = tmp_path / "work"
    folder.mkdir()
    (folder / "README.txt").write_text("Yeast growth curves at 30 C.\n", encoding="utf-8")
    (folder / "log.txt").write_text("line 0\nline 1\nline 2\nline 3\n", encoding="utf-8")
    async with recording_endpoint(received) as base_url:
        config = Config(
            model=ModelSettings(base_url=base_url, model=model, max_attempts=1),
            budget=budget,
            daemon=daemon_config(tmp_path, folder_roots=(str(tmp_path),)).daemon,
        )
        async with open_daemon(config) as running, DaemonClient(running.url) as client:
            run_id = (await client.submit({"task": task, "folder": str(folder)}))["id"]
            data: list[str] = []
            with anyio.fail_after(30):
                async for event in client.events(run_id):
                    if event.event != "message":  # the end, after RunFinished
                        break
                    data.append(event.data)
    assert isinstance(DECODER.decode(data[-1]), RunFinished)
    return data, received


def rebuilt_requests(data: list[str]) -> list[ModelRequest]:
    reader = LogReader()
    read: list[Message] = [reader.read(DECODER.decode(one)) for one in data]
    return [message for message in read if isinstance(message, ModelRequest)]


def as_sent(request: ModelRequest) -> dict[str, Any]:
    """The parts of the request body that the prompt and tools make, as JSON."""
    wire: dict[str, Any] = {"messages": wire_messages(request.messages)}
    if request.tools:
        wire["tools"] = WireTools()(request.tools)
    sent: dict[str, Any] = json.loads(_json.encode(wire))
    return sent


def sent_part(body: dict[str, Any]) -> dict[str, Any]:
    part: dict[str, Any] = {key: body[key] for key in ("messages", "tools") if key in body}
    return part


@pytest.mark.asyncio
async def test_a_multi_turn_run_stores_its_tool_schemas_once(tmp_path: Path) -> None:
    data, received = await stored_run(
        tmp_path, "Look at the folder.", "completed", BudgetSettings()
    )
    started = DECODER.decode(data[0])
    assert isinstance(started, RunStarted)
    assert started.tool_specs
    requests = rebuilt_requests(data)
    assert len(requests) == len(received) == 2
    assert [as_sent(request) for request in requests] == [sent_part(b) for b in received]
    for spec in started.tool_specs:
        schema = _json.encode(spec.parameters).decode()  # JSON text inside the JSON
        assert sum(schema in one for one in data) == 1, spec.name
    for message in requests[-1].messages:  # the task, the call, its result: each once
        encoded = _json.encode(message).decode()
        assert sum(encoded in one for one in data) == 1, message


@pytest.mark.asyncio
async def test_a_request_without_the_run_tools_stores_that(tmp_path: Path) -> None:
    # The turn budget stops the run; one last request asks for an answer without tools.
    budget = BudgetSettings(max_turns=3, on_stop="answer")
    data, received = await stored_run(tmp_path, "Summarise log.txt.", "answer_on_stop", budget)
    requests = rebuilt_requests(data)
    assert len(requests) == len(received) == 4
    assert [as_sent(request) for request in requests] == [sent_part(b) for b in received]
    assert [bool(body.get("tools")) for body in received] == [True, True, True, False]
    stored = [json.loads(one) for one in data if one.startswith('{"type":"ModelRequest"')]
    assert [(r["run_tools"], r["tools"]) for r in stored] == [(True, [])] * 3 + [(False, [])]
