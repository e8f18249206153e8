"""What a misbehaving MCP server can take, bounded: restarts of a server that exits right
after each start, a line of invalid UTF-8 on its output, a tool list or a result larger
than ``max_message_bytes``.

The servers are small scripts written here that speak JSON-RPC over stdio by hand (the
SDK's server would not send what they send); each appends a line to its log per start,
so the test counts starts.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

pytest.importorskip("mcp", reason="needs the mcp extra: pip install 'loopfuse[mcp]'")

from actors.tools.errors import ToolError
from actors.tools.mcp import McpServer, McpStartError
from actors.tools.mcp.connection import McpConnection, McpStatus
from actors.tools.mcp.servers import open_mcp_servers

FAKE_SERVER = r"""
import json, sys
mode, log = sys.argv[1], sys.argv[2]
with open(log, "a") as f:
    f.write("start\n")
with open(log) as f:
    starts = f.read().count("start\n")
out = sys.stdout.buffer

def send(message):
    out.write(json.dumps(message).encode() + b"\n")
    out.flush()

def result(id, value):
    send({"jsonrpc": "2.0", "id": id, "result": value})

def stream_huge(head, tail, size):
    # write one line of `size` bytes a MiB at a time, logging how much went out
    out.write(head)
    written = len(head)
    chunk = b"x" * (1 << 20)
    try:
        while written < size:
            out.write(chunk)
            out.flush()
            written += len(chunk)
            with open(log, "a") as f:
                f.write(f"wrote {written}\n")
        out.write(tail)
        out.flush()
    except BrokenPipeError:
        with open(log, "a") as f:
            f.write("broken pipe\n")
        sys.exit(0)

for line in sys.stdin.buffer:
    message = json.loads(line)
    id, method = message.get("id"), message.get("method")
    if id is None:
        continue  # a notification
    if method == "initialize":
        result(id, {
            "protocolVersion": message["params"]["protocolVersion"],
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "fake", "version": "1"},
        })
    elif method == "tools/list":
        if mode == "huge_list":
            head = b'{"jsonrpc": "2.0", "id": %d, "result": {"tools": [], "x": "' % id
            stream_huge(head, b'"}}\n', 64 << 20)
        if mode == "endless_pages":  # 10 kB a page, and a next one always
            padding = "x" * 10_000
            page = [{"name": "echo", "description": padding, "inputSchema": {"type": "object"}}]
            result(id, {"tools": page, "nextCursor": "more"})
            continue
        result(id, {"tools": [{"name": "echo", "inputSchema": {"type": "object"}}]})
        if mode == "exit_after_start":
            sys.exit(0)
    elif method == "tools/call":
        if mode == "bad_utf8_once" and starts == 1:
            out.write(b"\xff\xfe not UTF-8\n")
            out.flush()
        elif mode == "huge_result":
            head = b'{"jsonrpc": "2.0", "id": %d, "result": {"content": [{"type": "text", ' % id
            head += b'"text": "'
            stream_huge(head, b'"}]}}\n', 64 << 20)
        else:
            result(id, {"content": [{"type": "text", "text": f"ok from start {starts}"}]})
"""


def fake_server(tmp_path: Path, mode: str, **settings: Any) -> tuple[McpServer, Path]:
    script, log = tmp_path / "fake_server.py", tmp_path / f"{mode}.log"
    script.write_text(FAKE_SERVER)
    values: dict[str, Any] = {"restart_backoff_seconds": 0.0, **settings}
    spec = McpServer(
        name="fake", command=sys.executable, args=(str(script), mode, str(log)), **values
    )
    return spec, log


def starts(log: Path) -> int:
    return log.read_text().count("start\n")


async def wait_until(connection: McpConnection, *statuses: McpStatus, restarts: int = 0) -> None:
    while connection.status not in statuses or connection.restarts < restarts:
        await connection.wait_changed()


@pytest.mark.asyncio
async def test_a_server_that_exits_after_each_start_is_given_up_after_max_restarts(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Each start succeeds (handshake, tool list), then the server exits: only a bound on
    # restarts that counts such short lives stops it being started again forever.
    spec, log = fake_server(tmp_path, "exit_after_start", max_restarts=3)
    with caplog.at_level(logging.WARNING, logger="loopfuse.mcp"):
        async with open_mcp_servers([spec]) as servers:
            connection = servers.connection("fake")
            with anyio.fail_after(30):
                await wait_until(connection, "down")
            with pytest.raises(ToolError) as refused:
                await connection.call_tool("echo", {})
    assert starts(log) == 4  # the first start and max_restarts restarts
    assert connection.restarts == 3
    assert refused.value.kind == "mcp_unavailable"
    assert refused.value.message.startswith("MCP server 'fake' is not running (down): ")
    given_up = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert given_up == [
        "MCP server 'fake': given up after 3 restart(s) in a row, none of which stayed up "
        "for 60 s: the server process closed its output or exited; its stderr is empty"
    ]


@pytest.mark.asyncio
async def test_a_server_up_long_enough_is_restarted_again(tmp_path: Path) -> None:
    # min_uptime_seconds = 0: every session counts as having stayed up, so the count of
    # restarts in a row starts again after each (what a server that ran for long gets).
    spec, log = fake_server(tmp_path, "exit_after_start", max_restarts=1, min_uptime_seconds=0)
    async with open_mcp_servers([spec]) as servers:
        connection = servers.connection("fake")
        with anyio.fail_after(30):
            await wait_until(connection, "up", restarts=5)
    assert starts(log) >= 6


@pytest.mark.asyncio
async def test_invalid_utf8_fails_the_call_at_once_is_logged_and_the_server_restarts(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spec, log = fake_server(tmp_path, "bad_utf8_once")
    with caplog.at_level(logging.WARNING, logger="loopfuse.mcp"):
        async with open_mcp_servers([spec]) as servers:
            connection = servers.connection("fake")
            with anyio.fail_after(20):  # before: the call waited for its deadline, forever
                with pytest.raises(ToolError) as broke:
                    await connection.call_tool("echo", {})
                await wait_until(connection, "up", restarts=1)
                answer = await connection.call_tool("echo", {})
    assert broke.value.kind == "mcp_error"
    assert broke.value.message == (
        "MCP server 'fake' broke the protocol (line 3 of its output is not valid UTF-8 "
        "(byte 0xff at offset 0): '\ufffd\ufffd not UTF-8'); loopfuse is restarting it"
    )
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert errors == [
        "MCP server 'fake' broke the protocol: line 3 of its output is not valid UTF-8 "
        "(byte 0xff at offset 0): '\ufffd\ufffd not UTF-8'"
    ]
    assert answer.content[0].text == "ok from start 2"  # type: ignore[union-attr]
    assert starts(log) == 2


def most_written(log: Path) -> int:
    return max(
        (int(line.split()[1]) for line in log.read_text().splitlines() if line.startswith("wrote")),
        default=0,
    )


@pytest.mark.asyncio
async def test_a_huge_result_is_refused_while_it_is_read(tmp_path: Path) -> None:
    spec, log = fake_server(tmp_path, "huge_result", max_message_bytes=64 * 1024)
    async with open_mcp_servers([spec]) as servers:
        connection = servers.connection("fake")
        with anyio.fail_after(20):
            with pytest.raises(ToolError) as refused:
                await connection.call_tool("echo", {})
    assert refused.value.kind == "mcp_error"
    assert "line 3 of its output is longer than max_message_bytes (65536 bytes)" in (
        refused.value.message
    )
    # The server got no further than the pipe's buffer past the cap: 64 MiB were never read.
    assert most_written(log) < 8 << 20


@pytest.mark.asyncio
async def test_a_huge_tool_list_fails_the_start_while_it_is_read(tmp_path: Path) -> None:
    spec, log = fake_server(tmp_path, "huge_list", max_message_bytes=64 * 1024)
    with anyio.fail_after(20), pytest.raises(McpStartError) as failed:
        async with open_mcp_servers([spec]):
            pass
    assert failed.value.reason.startswith(
        "it went away during start-up: it broke the protocol: line 2 of its output is longer "
        "than max_message_bytes (65536 bytes)"
    )
    assert most_written(log) < 8 << 20


@pytest.mark.asyncio
async def test_a_paginated_tool_list_is_bounded_in_all(tmp_path: Path) -> None:
    # Each page fits max_message_bytes; before, 100 of them were read (1 MB here).
    spec, _ = fake_server(tmp_path, "endless_pages", max_message_bytes=64 * 1024)
    with anyio.fail_after(20), pytest.raises(McpStartError) as failed:
        async with open_mcp_servers([spec]):
            pass
    assert failed.value.key == "max_message_bytes"
    assert failed.value.reason == (
        "its tool list is longer than max_message_bytes (65536 bytes) after 7 pages"
    )
