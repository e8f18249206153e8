"""The fault matrix: every scripted fault of the endpoint or a tool ends the run as expected.

Each row runs one faulty scenario beside a healthy run on the same runtime, through the
real ``openai`` client and the real simulator. It asserts the faulty run's exit reason and
cause (and what the model was told), that the healthy run beside it completed untouched,
and that the runtime still accepts and completes a new run afterwards.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import msgspec
import pytest

from actors.tools import Tool, ToolContext, default_registry
from bus import ExitReason
from orchestrator.config import Config, ModelSettings
from orchestrator.result import RunResult
from orchestrator.runtime import RunSpec, Runtime
from orchestrator.scenarios.runs import run_scenario, start_scenario
from orchestrator.sim import Scenario, parse_scenario, shipped_scenarios
from tests.test_llm_caller import FakeServer, chunk, open_fake_server

COMPLETED = {s.name: s for s in shipped_scenarios()}["completed"]
FAST_RETRIES = ModelSettings(backoff_base_seconds=0.01, backoff_cap_seconds=0.05)
TEN_MB = 10 * 1024 * 1024


class NoArgs(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pass


async def _raises(params: NoArgs, ctx: ToolContext) -> str:
    raise RuntimeError("the tool blew up")


async def _hangs(params: NoArgs, ctx: ToolContext) -> str:
    await anyio.sleep_forever()
    raise AssertionError("unreachable")


async def _huge(params: NoArgs, ctx: ToolContext) -> str:
    return "x" * TEN_MB


async def _not_utf8(params: NoArgs, ctx: ToolContext) -> str:
    # Bytes that are not UTF-8, decoded as Python does for file names: lone surrogates.
    return b"caf\xe9 \xff\xfe data".decode("utf-8", "surrogateescape")


def _registry() -> Any:
    registry = default_registry()
    registry.add(Tool("boom", "Raises.", NoArgs, _raises))
    registry.add(Tool("hang", "Never answers.", NoArgs, _hangs, timeout_seconds=0.3))
    registry.add(Tool("huge", "Returns 10 MB.", NoArgs, _huge))
    registry.add(Tool("bytes", "Returns non-UTF-8 bytes.", NoArgs, _not_utf8))
    return registry


def _tool_row(tool: str, arguments: str = "{}") -> str:
    return f"""
task = "Use the tool."
[config]
max_turns = 3
tools = ["list_dir", "read_file", "{tool}"]
[[steps]]
tool_calls = [{{ name = "{tool}", raw_arguments = '{arguments}' }}]
[[steps]]
text = "Done despite the tool."
[expect]
exit_reason = "completed"
"""


def _answer_after(step: str) -> str:
    return f"""
task = "Answer."
[config]
max_turns = 3
[folder]
"notes.txt" = "hello"
{step}
[[steps]]
text = "Done."
[expect]
exit_reason = "completed"
"""


def _text_with(faults: str) -> str:
    return f"""
task = "Answer."
[config]
max_turns = 2
[[steps]]
text = "The answer after the faults."
faults = [{faults}]
[expect]
exit_reason = "completed"
"""


def _tool_messages(result: RunResult) -> list[str]:
    return [m.content or "" for m in result.transcript if m.role == "tool"]


def _huge_folder() -> str:
    entries = "\n".join(f'"f{index:05}.txt" = "x"' for index in range(2000))
    return _answer_after(
        f"{entries}\n[[steps]]\n"
        'tool_calls = [{ name = "list_dir", arguments = { path = "." } }]'
    )


@dataclass(frozen=True)
class Row:
    """One fault: the scenario, how the run must end, and what else must hold."""

    name: str
    toml: str
    reason: ExitReason = ExitReason.COMPLETED
    cause: str = "model.end_turn"
    check: Callable[[RunResult], None] = field(default=lambda result: None)


def _check_retried(result: RunResult) -> None:
    assert result.output == "The answer after the faults."
    assert result.llm_requests == 1  # retries are attempts of one request, not new turns


def _check_tool_error(
    fragment: str, output: str = "Done despite the tool."
) -> Callable[[RunResult], None]:
    def check(result: RunResult) -> None:
        (message,) = _tool_messages(result)
        assert fragment in message.lower(), message
        assert result.call_log[0].is_error
        assert result.output == output

    return check


def _check_capped(result: RunResult) -> None:
    (message,) = _tool_messages(result)
    assert len(message) < 200_000
    assert "cut" in message.lower() or "truncat" in message.lower(), message[-300:]


def _check_bytes(result: RunResult) -> None:
    (message,) = _tool_messages(result)
    message.encode("utf-8")  # only valid UTF-8 went to the model
    assert "data" in message


def _check_binary(result: RunResult) -> None:
    (message,) = _tool_messages(result)
    assert "binary" in message.lower(), message
    assert "\x00" not in message


def _check_listing(result: RunResult) -> None:
    (message,) = _tool_messages(result)
    assert len(message) < 100_000
    assert "f00000.txt" in message
    assert "f01999.txt" not in message  # more than list_entries: cut, and says so
    assert "500" in message or "more" in message.lower(), message[-300:]


def _check_mixed(result: RunResult) -> None:
    assert result.turns == 2
    assert result.call_log[0].tool == "list_dir"
    assert not result.call_log[0].is_error
    assistant = [m for m in result.transcript if m.role == "assistant"]
    assert assistant[0].content == "Let me look first."


def _check_cut_json(result: RunResult) -> None:
    # JSON cut mid-way reads as a reply cut by the output limit: nothing runs, the model
    # is nudged to continue (truncation recovery), and its next reply ends the run.
    assert result.call_log == ()
    assert result.nudges == 1
    nudges = [m.content or "" for m in result.transcript if m.role == "user"][1:]
    assert nudges[0].startswith("[loopfuse:nudge kind=truncation.recover]")
    assert result.output == "Done."


def _check_duplicate_ids(result: RunResult) -> None:
    # Two different calls under one id both run (actors/llm/accumulator.py): the second gets
    # an id of its own (the server's kept as wire_id, sent back to it); each is answered.
    assert result.turns == 2
    first, second = [c for m in result.transcript if m.role == "assistant" for c in m.tool_calls]
    assert (first.name, first.id, first.wire_id) == ("list_dir", "call_same", None)
    assert (second.name, second.wire_id) == ("read_file", "call_same")
    assert second.id != "call_same"
    tool_ids = [m.tool_call_id for m in result.transcript if m.role == "tool"]
    assert tool_ids == [first.id, second.id]
    assert len(result.call_log) == 2


ROWS = [
    Row(
        "429 with retry-after",
        _text_with("{ status = 429, retry_after = 1 }"),
        check=_check_retried,
    ),
    Row("500 transient", _text_with("{ status = 500, times = 2 }"), check=_check_retried),
    Row("503 transient", _text_with("{ status = 503, times = 2 }"), check=_check_retried),
    Row(
        "500 permanent",
        _text_with("{ status = 500, forever = true }"),
        ExitReason.ABORTED_STREAMING,
        "model.unavailable",
    ),
    Row(
        "503 permanent",
        _text_with("{ status = 503, forever = true }"),
        ExitReason.ABORTED_STREAMING,
        "model.unavailable",
    ),
    Row(
        "connection reset mid-stream",
        _text_with('{ kind = "drop", after_chunks = 2 }'),
        check=_check_retried,
    ),
    Row(
        "error event mid-stream",
        _text_with('{ kind = "stream_error", after_chunks = 2 }'),
        check=_check_retried,
    ),
    Row(
        "413 on every request",
        _text_with("{ status = 413, forever = true }"),
        ExitReason.PROMPT_TOO_LONG,
        "context.prompt_too_long",
    ),
    Row(
        "content and tool calls in one reply",
        _answer_after(
            '[[steps]]\ntext = "Let me look first."\n'
            'tool_calls = [{ name = "list_dir", arguments = { path = "." } }]'
        ),
        check=_check_mixed,
    ),
    Row(
        "arguments that are not JSON",
        _answer_after(
            "[[steps]]\ntool_calls = [{ name = \"read_file\", raw_arguments = 'path: x' }]"
        ),
        check=_check_tool_error("json", "Done."),
    ),
    Row(
        "arguments cut mid-JSON",
        _answer_after(
            '[[steps]]\ntool_calls = [{ name = "read_file", raw_arguments = \'{"path": "no\' }]'
        ),
        check=_check_cut_json,
    ),
    Row(
        "two calls with the same id",
        _answer_after(
            "[[steps]]\ntool_calls = ["
            '{ name = "list_dir", id = "call_same", arguments = { path = "." } },'
            '{ name = "read_file", id = "call_same", arguments = { path = "notes.txt" } }]'
        ),
        check=_check_duplicate_ids,
    ),
    Row(
        "an unknown tool",
        _answer_after('[[steps]]\ntool_calls = [{ name = "rm_rf", arguments = {} }]'),
        check=_check_tool_error("unknown tool", "Done."),
    ),
    Row("a tool that raises", _tool_row("boom"), check=_check_tool_error("blew up")),
    Row("a tool that hangs past its timeout", _tool_row("hang"), check=_check_tool_error("timed")),
    Row("a tool that returns 10 MB", _tool_row("huge"), check=_check_capped),
    Row("a tool that returns non-UTF-8 bytes", _tool_row("bytes"), check=_check_bytes),
    Row(
        "a binary file",
        _answer_after(
            '"blob.bin" = "PK\\u0000\\u0001\\u0002 binary"\n'
            "[[steps]]\n"
            'tool_calls = [{ name = "read_file", arguments = { path = "blob.bin" } }]'
        ),
        check=_check_binary,
    ),
    Row("a huge directory", _huge_folder(), check=_check_listing),
]


def _scenario(row: Row) -> Scenario:
    name = "fault_" + "".join(c if c.isalnum() else "_" for c in row.name)
    return parse_scenario(row.toml, source=f"{name}.toml", name=name)


@pytest.mark.asyncio
@pytest.mark.parametrize("row", ROWS, ids=[row.name for row in ROWS])
async def test_fault_matrix(row: Row) -> None:
    faulty = _scenario(row)
    config = Config(model=FAST_RETRIES)
    async with Runtime(config, tools=_registry(), scenarios=[faulty]) as runtime:
        with anyio.fail_after(30):
            healthy = await start_scenario(runtime, COMPLETED)
            result = await run_scenario(runtime, faulty)
            beside = await healthy.result()
            after = await run_scenario(runtime, COMPLETED)
    assert (result.exit_reason, result.cause) == (row.reason, row.cause), result.detail
    assert result.hint
    row.check(result)
    for other in (beside, after):
        assert (other.exit_reason, other.cause) == (ExitReason.COMPLETED, "model.end_turn")
        assert other.transcript[0].content == COMPLETED.task


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.asyncio
async def test_connect_refused_ends_the_run_as_model_unavailable() -> None:
    endpoint = msgspec.structs.replace(
        FAST_RETRIES, base_url=f"http://127.0.0.1:{_closed_port()}/v1", max_attempts=2
    )
    async with Runtime(Config(model=endpoint)) as runtime:
        with anyio.fail_after(30):
            first = await run_scenario(runtime, COMPLETED)
            second = await run_scenario(runtime, COMPLETED)  # the runtime still runs
    for result in (first, second):
        assert (result.exit_reason, result.cause) == (
            ExitReason.ABORTED_STREAMING,
            "model.unavailable",
        )
        assert "connect" in result.detail.lower(), result.detail


@pytest.mark.asyncio
async def test_read_timeout_is_retried_then_ends_the_run() -> None:
    slow = parse_scenario(
        """
task = "Answer slowly."
[[steps]]
text = "too late"
latency = 5
repeat = true
[expect]
exit_reason = "aborted_streaming"
""",
        source="slow.toml",
        name="slow",
    )
    endpoint = msgspec.structs.replace(FAST_RETRIES, timeout_seconds=0.3, max_attempts=2)
    async with Runtime(Config(model=endpoint), scenarios=[slow]) as runtime:
        with anyio.fail_after(30):
            healthy = await start_scenario(runtime, COMPLETED)
            result = await run_scenario(runtime, slow)
            beside = await healthy.result()
    assert (result.exit_reason, result.cause) == (
        ExitReason.ABORTED_STREAMING,
        "model.unavailable",
    )
    assert "time" in result.detail.lower(), result.detail
    assert beside.exit_reason is ExitReason.COMPLETED


# Rows the simulator cannot script: a loopback server that sends exactly these frames.

ROLE = chunk({"role": "assistant", "content": ""})
USAGE = chunk(usage={"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10})


def _answer(text: str, *, usage: bool = True) -> list[Any]:
    frames: list[Any] = [ROLE, chunk({"content": text}), chunk({}, finish="stop")]
    return [*frames, USAGE] if usage else frames


async def _run_against(fake: FakeServer, runs: int = 2) -> list[RunResult]:
    async with open_fake_server(fake) as url:
        endpoint = msgspec.structs.replace(FAST_RETRIES, base_url=url, model="m")
        async with Runtime(Config(model=endpoint)) as runtime:
            with anyio.fail_after(30):
                return [await runtime.run(RunSpec(task="Say hi.")) for _ in range(runs)]


@pytest.mark.asyncio
async def test_a_malformed_sse_chunk_is_retried() -> None:
    broken = [ROLE, "data: {this is not json\n\n"]
    fake = FakeServer(broken, _answer("Hi there."))
    first, second = await _run_against(fake)
    assert (first.exit_reason, first.cause) == (ExitReason.COMPLETED, "model.end_turn")
    assert first.output == "Hi there."  # nothing of the broken attempt leaked into it
    assert second.exit_reason is ExitReason.COMPLETED
    assert len(fake.requests) == 3  # one broken attempt, then one per run


@pytest.mark.asyncio
async def test_an_empty_choices_list_is_a_broken_stream_retried_then_given_up() -> None:
    """No finish reason before ``[DONE]``: a cut stream (``interrupted``), asked again
    without streaming; a completion without a finish reason either is a broken answer."""
    fake = FakeServer([chunk(), USAGE])
    first, second = await _run_against(fake)
    for result in (first, second):
        assert (result.exit_reason, result.cause) == (
            ExitReason.ABORTED_STREAMING,
            "model.unavailable",
        )
        assert "the completion has no finish reason" in result.detail
        assert result.output == ""
    assert len(fake.requests) == 2 * FAST_RETRIES.max_attempts  # the runtime kept serving


@pytest.mark.asyncio
async def test_an_empty_choices_list_once_then_an_answer_completes() -> None:
    fake = FakeServer([chunk(), USAGE], _answer("Hi there."))
    first, _ = await _run_against(fake)
    assert (first.exit_reason, first.output) == (ExitReason.COMPLETED, "Hi there.")


@pytest.mark.asyncio
async def test_usage_missing_from_the_reply_is_estimated_and_says_so() -> None:
    fake = FakeServer(_answer("Hi there, a few words.", usage=False))
    first, _ = await _run_against(fake)
    assert (first.exit_reason, first.cause) == (ExitReason.COMPLETED, "model.end_turn")
    assert first.usage.estimated
    assert first.usage.completion_tokens > 0
    assert first.usage.prompt_tokens > 0
