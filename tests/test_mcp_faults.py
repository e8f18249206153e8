"""An MCP server that misbehaves (tests/mcp_fault_server.py) through real runs: a tool that
hangs, a server that crashes mid-call, a huge result, tools that cannot be offered, error
results, bad arguments, a model that repeats a call, hooks, and the streamable-HTTP
transport. Every fault comes back to the model as a tool error and the run goes on (or is
stopped by the fuse meant for it)."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import pytest

pytest.importorskip("mcp", reason="needs the mcp extra: pip install 'loopfuse[mcp]'")

from actors.hooks import HookDecision, HookInput
from actors.tools.mcp import McpServer
from bus import ExitReason
from orchestrator.runtime import Runtime
from orchestrator.scenarios.runs import expectation_mismatches
from tests.mcp_support import (
    FAULT_SERVER,
    fault_server,
    mcp_config,
    run_on,
    scripted,
    tool_answers,
)

FAULT_TOOLS = tuple(
    f"faults__{name}" for name in ("echo", "hang", "crash", "huge", "fail", "calls", "header")
)


def then_answer(*calls: str, config: str = "", name: str = "faults_script") -> str:
    """A script: each of ``calls`` (inline TOML tool calls) in its own turn, then an answer."""
    steps = "".join(f"[[steps]]\ntool_calls = [{call}]\n" for call in calls)
    return f"""
task = "Use the tools."
[config]
max_turns = {len(calls) + 2}
{config}
{steps}
[[steps]]
text = "Done."
[expect]
exit_reason = "completed"
"""


@pytest.mark.asyncio
async def test_a_hanging_tool_times_out_and_the_run_goes_on() -> None:
    script = scripted(
        then_answer(
            '{ name = "faults__hang" }',
            '{ name = "faults__calls" }',
            config="tool_timeout_seconds = 1.0",
        )
    )
    config = mcp_config(fault_server(), tools=FAULT_TOOLS)
    async with Runtime(config, scenarios=[script]) as runtime:
        result = await run_on(runtime, script)
        assert runtime.mcp is not None
        assert runtime.mcp.connection("faults").restarts == 0
    assert expectation_mismatches(script, result) == []
    hang, calls = result.call_log
    assert (hang.is_error, hang.error_kind) == (True, "timeout")
    timed_out, counted = tool_answers(result)
    assert timed_out == "faults__hang timed out after 1 s"
    # The same server process answered next: the hung call did not take it down.
    assert counted.endswith(": 2")
    assert not calls.is_error


@pytest.mark.asyncio
async def test_a_server_timeout_overrides_the_runs() -> None:
    script = scripted(then_answer('{ name = "faults__hang" }'))
    config = mcp_config(fault_server(timeout_seconds=0.5), tools=FAULT_TOOLS)
    async with Runtime(config, scenarios=[script]) as runtime:
        result = await run_on(runtime, script)
    assert tool_answers(result) == ["faults__hang timed out after 0.5 s"]


@pytest.mark.asyncio
async def test_a_crash_mid_call_is_a_tool_error_and_the_server_is_restarted() -> None:
    script = scripted(then_answer('{ name = "faults__crash" }', '{ name = "faults__calls" }'))
    config = mcp_config(fault_server(), tools=FAULT_TOOLS)
    async with Runtime(config, scenarios=[script]) as runtime:
        result = await run_on(runtime, script)
        assert runtime.mcp is not None
        connection = runtime.mcp.connection("faults")
        assert (connection.restarts, connection.status) == (1, "up")
    assert expectation_mismatches(script, result) == []
    crash, calls = result.call_log
    assert (crash.is_error, crash.error_kind) == (True, "mcp_unavailable")
    crashed, counted = tool_answers(result)
    assert "MCP server 'faults' went away during the call" in crashed
    assert "fault server: crashing on purpose" in crashed  # its stderr, quoted
    assert "restarting" in crashed
    # A new process answered: its first call.
    assert not calls.is_error
    assert counted.endswith(": 1")


@pytest.mark.asyncio
async def test_a_server_that_may_not_restart_fails_its_next_calls_clearly() -> None:
    script = scripted(
        then_answer(
            '{ name = "faults__crash" }', '{ name = "faults__echo", arguments = { text = "x" } }'
        )
    )
    config = mcp_config(fault_server(max_restarts=0), tools=FAULT_TOOLS)
    async with Runtime(config, scenarios=[script]) as runtime:
        result = await run_on(runtime, script)
        assert runtime.mcp is not None
        assert runtime.mcp.connection("faults").status == "down"
    assert result.exit_reason is ExitReason.COMPLETED
    _, echo = result.call_log
    assert (echo.is_error, echo.error_kind) == (True, "mcp_unavailable")
    _, refused = tool_answers(result)
    assert refused.startswith("MCP server 'faults' is not running (down): ")
    assert "crashing on purpose" in refused


@pytest.mark.asyncio
async def test_a_huge_result_is_cut_with_the_executors_note() -> None:
    script = scripted(then_answer('{ name = "faults__huge", arguments = { chars = 50000 } }'))
    config = mcp_config(fault_server(), tools=FAULT_TOOLS, max_result_chars=1000)
    async with Runtime(config, scenarios=[script]) as runtime:
        result = await run_on(runtime, script)
    (answer,) = tool_answers(result)
    assert answer.startswith("0123456789")
    assert answer.endswith("\n[result cut: 49000 of 50000 characters left out]")
    assert len(answer) < 1100


@pytest.mark.asyncio
async def test_tools_that_cannot_be_offered_are_refused_at_listing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    script = scripted(
        then_answer(
            '{ name = "faults__recursive_schema", arguments = { node = {} } }',
            '{ name = "faults__echo", arguments = { text = "still here" } }',
        )
    )
    config = mcp_config(fault_server(), tools=FAULT_TOOLS)
    with caplog.at_level(logging.WARNING, logger="loopfuse.mcp"):
        async with Runtime(config, scenarios=[script]) as runtime:
            assert runtime.mcp is not None
            refused = {(r.tool, r.reason) for r in runtime.mcp.refused}
            offered = {tool.name for tool in runtime.mcp.tools}
            result = await run_on(runtime, script)
            assert "faults__recursive_schema" not in runtime.tools
    assert refused == {
        ("external_schema", "cannot inline schema reference 'https://example.com/spec.json'"),
        ("recursive_schema", "recursive schema reference '#/$defs/Node' cannot be inlined"),
        ("dotted.name", "tool name 'faults__dotted.name' must match ^[A-Za-z0-9_-]{1,64}$"),
    }
    assert offered == set(FAULT_TOOLS)
    warned = [r.getMessage() for r in caplog.records if r.name == "loopfuse.mcp"]
    for tool in ("external_schema", "recursive_schema", "dotted.name"):
        assert any(f"tool {tool!r} is not offered to the model" in line for line in warned)
    unknown, echo = result.call_log
    assert (unknown.error_kind, echo.is_error) == ("unknown_tool", False)
    assert tool_answers(result)[1] == "echo: still here"


@pytest.mark.asyncio
async def test_an_error_result_is_a_tool_error() -> None:
    script = scripted(then_answer('{ name = "faults__fail", arguments = { why = "no plate" } }'))
    async with Runtime(mcp_config(fault_server(), tools=FAULT_TOOLS), scenarios=[script]) as rt:
        result = await run_on(rt, script)
    (entry,) = result.call_log
    assert (entry.is_error, entry.error_kind) == (True, "mcp_error")
    assert tool_answers(result) == ["Error executing tool fail: failed on purpose: no plate"]
    assert result.exit_reason is ExitReason.COMPLETED


@pytest.mark.asyncio
async def test_bad_arguments_are_refused_before_the_server_sees_them() -> None:
    script = scripted(
        then_answer(
            '{ name = "faults__echo", arguments = { text = 5 } }',
            '{ name = "faults__echo", arguments = { words = "x" } }',
            '{ name = "faults__calls" }',
        )
    )
    async with Runtime(mcp_config(fault_server(), tools=FAULT_TOOLS), scenarios=[script]) as rt:
        result = await run_on(rt, script)
    wrong_type, missing, calls = result.call_log
    assert (wrong_type.error_kind, missing.error_kind) == ("invalid_arguments", "invalid_arguments")
    assert not calls.is_error
    first, second, counted = tool_answers(result)
    assert (
        first
        == "invalid arguments for faults__echo: Expected `string`, got `integer` - at `$.text`"
    )
    assert second == "invalid arguments for faults__echo: Object missing required field `text`"
    assert counted.endswith(": 1")  # the server answered only this call


@pytest.mark.asyncio
async def test_the_loop_monitor_stops_a_model_repeating_an_mcp_call() -> None:
    script = scripted(
        """
task = "Echo."
[config]
loop_preset = "strict"
max_turns = 20
tools = ["faults__echo"]
[[steps]]
tool_calls = [{ name = "faults__echo", arguments = { text = "again" } }]
repeat = true
[expect]
exit_reason = "hook_stopped"
cause = "loop.generic_repeat"
max_llm_requests = 6
""",
        name="mcp_dead_loop",
    )
    async with Runtime(mcp_config(fault_server(), tools=FAULT_TOOLS), scenarios=[script]) as rt:
        result = await run_on(rt, script)
    assert expectation_mismatches(script, result) == []
    assert result.nudges == 1
    ran = [entry for entry in result.call_log if entry.verdict != "not_run"]
    assert {entry.tool for entry in result.call_log} == {"faults__echo"}
    assert all(entry.cache == "none" for entry in ran)  # not idempotent: the monitor stopped it


@pytest.mark.asyncio
async def test_a_pre_tool_hook_blocks_an_mcp_call_before_it_runs() -> None:
    script = scripted(
        then_answer(
            '{ name = "faults__crash" }',
            '{ name = "faults__calls" }',
            config=(
                'hooks = [{ name = "no_crash", kind = "python", function = "no_crash", '
                'tools = ["faults__crash"] }]'
            ),
        )
    )
    judged: list[str | None] = []

    def no_crash(call: HookInput) -> HookDecision:
        judged.append(call.tool)
        return HookDecision(action="block", message="crashing is not allowed here")

    config = mcp_config(fault_server(), tools=FAULT_TOOLS)
    async with Runtime(config, scenarios=[script], hook_functions={"no_crash": no_crash}) as rt:
        result = await run_on(rt, script)
        assert rt.mcp is not None
        assert rt.mcp.connection("faults").restarts == 0
    assert judged == ["faults__crash"]
    blocked, counted = tool_answers(result)
    assert "crashing is not allowed here" in blocked
    assert counted.endswith(": 1")  # the crash never reached the server


@asynccontextmanager
async def http_fault_server(mode: str = "--http") -> AsyncIterator[str]:
    """The fault server over streamable HTTP (``--http-json``: answering with JSON bodies);
    its endpoint's URL."""
    async with await anyio.open_process(
        [sys.executable, str(FAULT_SERVER), mode], stdout=subprocess.PIPE
    ) as process:
        assert process.stdout is not None
        line = b""
        with anyio.fail_after(30):
            while not line.endswith(b"\n"):
                line += await process.stdout.receive(16)
        try:
            yield f"http://127.0.0.1:{int(line)}/mcp"
        finally:
            process.terminate()


@pytest.mark.asyncio
async def test_a_streamable_http_server_gets_its_header_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FAULTS_TOKEN", "Bearer test-token")
    script = scripted(
        then_answer(
            '{ name = "faults__header", arguments = { name = "authorization" } }',
            '{ name = "faults__hang" }',
            '{ name = "faults__echo", arguments = { text = "over http" } }',
            config="tool_timeout_seconds = 1.0",
        )
    )
    async with http_fault_server() as url:
        server = McpServer(
            name="faults",
            transport="http",
            url=url,
            headers_env={"Authorization": "FAULTS_TOKEN"},
        )
        async with Runtime(mcp_config(server, tools=FAULT_TOOLS), scenarios=[script]) as rt:
            result = await run_on(rt, script)
    assert expectation_mismatches(script, result) == []
    header, hang, echo = tool_answers(result)
    assert header == "authorization: Bearer test-token"
    assert hang == "faults__hang timed out after 1 s"
    assert echo == "echo: over http"


@pytest.mark.asyncio
@pytest.mark.parametrize("mode", ["--http-json", "--http"])
async def test_an_http_result_over_max_message_bytes_fails_the_call_while_it_is_read(
    mode: str,
) -> None:
    # A JSON body was read whole by the SDK; an event is bounded by its max_sse_event_size,
    # which loopfuse sets to the same max_message_bytes.
    script = scripted(
        then_answer(
            '{ name = "faults__huge", arguments = { chars = 300000 } }',
            '{ name = "faults__echo", arguments = { text = "still here" } }',
        )
    )
    async with http_fault_server(mode) as url:
        server = McpServer(name="faults", transport="http", url=url, max_message_bytes=100_000)
        async with Runtime(mcp_config(server, tools=FAULT_TOOLS), scenarios=[script]) as rt:
            result = await run_on(rt, script)
            assert rt.mcp is not None
            assert rt.mcp.connection("faults").restarts == 0  # one call failed, not the server
    huge, echo = result.call_log
    assert (huge.is_error, huge.error_kind) == (True, "mcp_error")
    assert not echo.is_error
    refused, answered = tool_answers(result)
    if mode == "--http-json":
        assert "a response longer than max_message_bytes (100000 bytes)" in refused
    else:
        assert "exceeded the 100000 byte limit" in refused
    assert answered == "echo: still here"
