"""The tool executor through a real Bus: concurrency, order, errors, cancel, isolation."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import msgspec
import pytest

from actors.fingerprint import fingerprint_call, fingerprint_result
from actors.tools import (
    PATH_ERROR,
    Tool,
    ToolContext,
    ToolError,
    ToolExecutorSettings,
    ToolRegistry,
    default_registry,
)
from actors.tools.executor import ToolExecutor
from bus import (
    Bus,
    Inbox,
    ToolCall,
    ToolExecute,
    ToolResult,
    ToolsCancel,
)
from tests.harness import serving
from tests.messages_examples import finished
from tests.scripted_tools import scripted_tool
from tests.started import run_started

WAIT = 5.0


class Named(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    key: str = ""
    n: int = 0


def _tool(name: str, fn: Callable[[Named], Awaitable[str]], **kwargs: Any) -> Tool[Named]:
    async def call(params: Named, ctx: ToolContext) -> str:
        return await fn(params)

    return Tool(name, f"The {name} tool.", Named, call, **kwargs)


@asynccontextmanager
async def open_executor(
    registry: ToolRegistry, settings: ToolExecutorSettings | None = None
) -> AsyncIterator[tuple[Bus, ToolExecutor]]:
    bus = Bus()
    executor = ToolExecutor(bus, registry, settings)
    async with serving(bus, executor):
        yield bus, executor


async def _start(bus: Bus, run_id: str, tools: tuple[str, ...], folder: Path | None = None) -> None:
    await bus.publish(
        run_started(
            run_id=run_id,
            trace_id="t",
            task="task",
            model="m",
            tools=tools,
            folder=str(folder) if folder else None,
        )
    )


async def _execute(bus: Bus, run_id: str, turn: int, *calls: tuple[str, str]) -> list[ToolCall]:
    tool_calls = [
        ToolCall(id=f"c{turn}-{i}", name=name, arguments=args)
        for i, (name, args) in enumerate(calls)
    ]
    prints = tuple(fingerprint_call(c.name, c.arguments) for c in tool_calls)
    await bus.publish(
        ToolExecute(run_id=run_id, turn=turn, calls=tuple(tool_calls), fingerprints=prints)
    )
    return tool_calls


async def _results(inbox: Inbox, count: int) -> list[ToolResult]:
    results = []
    with anyio.fail_after(WAIT):
        for _ in range(count):
            msg = await inbox.receive()
            assert isinstance(msg, ToolResult)
            results.append(msg)
    return results


# ---------------------------------------------------------------------------- order


@pytest.mark.asyncio
async def test_calls_run_concurrently_and_results_come_in_call_order() -> None:
    second_done = anyio.Event()
    release = anyio.Event()

    async def first(p: Named) -> str:
        await second_done.wait()  # finishes only if the second call runs meanwhile
        await release.wait()
        return "first"

    async def second(p: Named) -> str:
        second_done.set()
        return "second"

    registry = ToolRegistry([_tool("first", first), _tool("second", second)])
    async with open_executor(registry) as (bus, _):
        with bus.open_inbox("r1") as inbox:
            await _start(bus, "r1", ("first", "second"))
            calls = await _execute(bus, "r1", 1, ("first", "{}"), ("second", '{"n": 2}'))
            with anyio.fail_after(WAIT):
                await second_done.wait()
                await anyio.wait_all_tasks_blocked()
            assert inbox.pending() == 0  # the fast second result waits for the first
            release.set()
            results = await _results(inbox, 2)

    assert [r.content for r in results] == ["first", "second"]
    assert [r.call_id for r in results] == [c.id for c in calls]
    for result, call in zip(results, calls, strict=True):
        assert result.turn == 1
        assert result.tool == call.name
        assert result.fingerprint == fingerprint_call(call.name, call.arguments)
        assert result.result_fingerprint == fingerprint_result(result.content)
        assert result.executed
        assert not result.is_error
        assert result.error_kind is None
        assert result.duration_seconds >= 0


# ---------------------------------------------------------------------------- errors


async def _ok(p: Named) -> str:
    return f"ok {p.key}"


async def _boom(p: Named) -> str:
    raise ValueError("boom")


@pytest.mark.asyncio
async def test_errors_are_results_and_the_actor_keeps_going() -> None:
    registry = ToolRegistry([_tool("ok", _ok), _tool("boom", _boom), _tool("hidden", _ok)])
    async with open_executor(registry) as (bus, _):
        with bus.open_inbox("r1") as inbox:
            await _start(bus, "r1", ("ok", "boom", "ghost"))
            await _execute(
                bus,
                "r1",
                1,
                ("nope", "{}"),
                ("hidden", "{}"),
                ("ok", '{"key": '),
                ("ok", '{"n": "three"}'),
                ("ok", '{"zzz": 1}'),
                ("boom", "{}"),
                ("ok", '{"key": "after"}'),
            )
            results = await _results(inbox, 7)

    unknown, hidden, bad_json, bad_type, unknown_field, raised, fine = results
    for result in (unknown, hidden):
        assert result.is_error
        assert result.error_kind == "unknown_tool"
        assert not result.executed
        # names the tool and lists the available ones (enabled and registered)
        assert "Available tools: boom, ok." in result.content
    assert "'nope'" in unknown.content
    assert "'hidden'" in hidden.content
    assert bad_json.error_kind == "invalid_arguments"
    assert "not valid JSON" in bad_json.content
    assert bad_type.error_kind == "invalid_arguments"
    assert "Expected `int`, got `str` - at `$.n`" in bad_type.content
    assert "unknown field `zzz`" in unknown_field.content
    assert raised.is_error
    assert raised.error_kind == "exception"
    assert raised.executed
    assert "ValueError: boom" in raised.content
    assert raised.result_fingerprint == fingerprint_result(raised.content, is_error=True)
    assert fine.content == "ok after"
    assert not fine.is_error


@pytest.mark.asyncio
async def test_misbehaving_tools_cannot_hurt_the_actor() -> None:
    async def rogue_cancel(p: Named) -> str:
        raise anyio.get_cancelled_exc_class()()

    async def not_text(p: Named) -> str:
        return None  # type: ignore[return-value]

    async def refuses(p: Named) -> str:
        raise ToolError("quota", "quota exceeded")

    registry = ToolRegistry(
        [
            _tool("rogue", rogue_cancel),
            _tool("not_text", not_text),
            _tool("refuses", refuses),
            _tool("ok", _ok),
        ]
    )
    async with open_executor(registry) as (bus, _):
        with bus.open_inbox("r1") as inbox:
            await _start(bus, "r1", ("rogue", "not_text", "refuses", "ok"))
            await _execute(bus, "r1", 1, ("rogue", ""), ("not_text", ""), ("refuses", ""))
            rogue, none, refused = await _results(inbox, 3)
            await _execute(bus, "r1", 2, ("ok", '{"key": "still here"}'))
            (fine,) = await _results(inbox, 1)
    assert rogue.error_kind == "exception"
    assert "CancelledError" in rogue.content or "Cancelled" in rogue.content
    assert none.error_kind == "exception"
    assert "not text" in none.content
    assert (refused.error_kind, refused.content) == ("quota", "quota exceeded")
    assert fine.content == "ok still here"


@pytest.mark.asyncio
async def test_a_slow_tool_times_out() -> None:
    never = anyio.Event()

    async def hang(p: Named) -> str:
        await never.wait()
        return "never"

    registry = ToolRegistry([_tool("hang", hang, timeout_seconds=0.05), _tool("ok", _ok)])
    async with open_executor(registry) as (bus, _):
        with bus.open_inbox("r1") as inbox:
            await _start(bus, "r1", ("hang", "ok"))
            await _execute(bus, "r1", 1, ("hang", "{}"), ("ok", "{}"))
            hung, fine = await _results(inbox, 2)
    assert hung.is_error
    assert hung.error_kind == "timeout"
    assert hung.content == "hang timed out after 0.05 s"
    assert fine.content == "ok "


@pytest.mark.asyncio
async def test_default_timeout_comes_from_settings() -> None:
    never = anyio.Event()

    async def hang(p: Named) -> str:
        await never.wait()
        return "never"

    settings = ToolExecutorSettings(default_timeout_seconds=0.05)
    async with open_executor(ToolRegistry([_tool("hang", hang)]), settings) as (bus, _):
        with bus.open_inbox("r1") as inbox:
            await _start(bus, "r1", ("hang",))
            await _execute(bus, "r1", 1, ("hang", "{}"))
            (result,) = await _results(inbox, 1)
    assert result.error_kind == "timeout"


@pytest.mark.asyncio
async def test_a_call_after_one_cut_short_runs_whole_in_the_same_worker() -> None:
    """A single call runs under its pool worker's cancel scope: a call that timed out or was
    aborted cancels it, and the next call gets a fresh scope (not cut), and a grace deadline
    set for an abort ends with its call."""
    never = anyio.Event()
    hang_started = anyio.Event()

    async def hang(p: Named) -> str:
        hang_started.set()
        await never.wait()
        return "never"

    async def pause(p: Named) -> str:
        await anyio.lowlevel.checkpoint()  # suspends: a worker runs it
        return f"paused {p.key}"

    go = anyio.Event()

    async def gate(p: Named) -> str:
        await go.wait()
        return "through"

    tools = [_tool("hang", hang, timeout_seconds=0.05), _tool("pause", pause), _tool("gate", gate)]
    registry = ToolRegistry(tools)
    async with open_executor(registry) as (bus, executor):
        with bus.open_inbox("r1") as inbox:
            await _start(bus, "r1", ("hang", "pause", "gate"))
            await _execute(bus, "r1", 1, ("hang", "{}"))
            (timed_out,) = await _results(inbox, 1)
            await _execute(bus, "r1", 2, ("pause", '{"key": "a"}'))
            (after_timeout,) = await _results(inbox, 1)

            hang_started = anyio.Event()
            await _execute(bus, "r1", 3, ("hang", "{}"))
            with anyio.fail_after(WAIT):
                await hang_started.wait()
            await bus.publish(ToolsCancel(run_id="r1", turn=3, grace_seconds=0.0, reason="stop"))
            (aborted,) = await _results(inbox, 1)
            await _execute(bus, "r1", 4, ("pause", '{"key": "b"}'))
            (after_abort,) = await _results(inbox, 1)

            await _execute(bus, "r1", 5, ("gate", "{}"))
            with anyio.fail_after(WAIT):
                await anyio.wait_all_tasks_blocked()
            await bus.publish(ToolsCancel(run_id="r1", turn=5, grace_seconds=60.0, reason="x"))
            go.set()
            (graced,) = await _results(inbox, 1)  # finished inside its grace
            await _execute(bus, "r1", 6, ("pause", '{"key": "d"}'))
            (after_grace,) = await _results(inbox, 1)
            assert executor.workers_started() == 1
    assert timed_out.error_kind == "timeout"
    assert aborted.error_kind == "aborted"
    assert "grace of 0 s: stop" in aborted.content
    assert not graced.is_error
    assert graced.content == "through"
    for result, key in ((after_timeout, "a"), (after_abort, "b"), (after_grace, "d")):
        assert not result.is_error, result.content
        assert result.content == f"paused {key}"


@pytest.mark.asyncio
async def test_a_big_result_is_capped_with_a_note() -> None:
    async def big(p: Named) -> str:
        return "x" * 250

    settings = ToolExecutorSettings(max_result_chars=100)
    async with open_executor(ToolRegistry([_tool("big", big)]), settings) as (bus, _):
        with bus.open_inbox("r1") as inbox:
            await _start(bus, "r1", ("big",))
            await _execute(bus, "r1", 1, ("big", "{}"))
            (result,) = await _results(inbox, 1)
    assert not result.is_error
    assert result.content.startswith("x" * 100 + "\n")
    assert "x" * 101 not in result.content
    assert "150 of 250 characters left out" in result.content


# ---------------------------------------------------------------------------- cancel


@pytest.mark.asyncio
async def test_cancel_keeps_finished_results_cancels_slow_ones_after_grace() -> None:
    started = {"quick": anyio.Event(), "slow": anyio.Event()}
    go = anyio.Event()
    never = anyio.Event()
    slow_cancelled = anyio.Event()
    ran: list[str] = []

    async def quick(p: Named) -> str:
        started["quick"].set()
        await go.wait()
        return "quick done"

    async def slow(p: Named) -> str:
        started["slow"].set()
        try:
            await never.wait()
        finally:
            slow_cancelled.set()
        return "never"

    async def later(p: Named) -> str:
        ran.append("later")
        return "later"

    registry = ToolRegistry([_tool("quick", quick), _tool("slow", slow), _tool("later", later)])
    settings = ToolExecutorSettings(max_parallel_calls=2)
    async with open_executor(registry, settings) as (bus, executor):
        with bus.open_inbox("r1") as inbox:
            await _start(bus, "r1", ("quick", "slow", "later"))
            await _execute(bus, "r1", 3, ("quick", "{}"), ("slow", "{}"), ("later", "{}"))
            with anyio.fail_after(WAIT):
                await started["quick"].wait()
                await started["slow"].wait()
            assert executor.statistics() == (1, 1, 2)
            for turn in (3, 3, 99):  # idempotent; another turn is a no-op
                await bus.publish(
                    ToolsCancel(run_id="r1", turn=turn, grace_seconds=0.2, reason="stop")
                )
            with anyio.fail_after(WAIT):
                await anyio.wait_all_tasks_blocked()  # the cancel was handled
            go.set()
            results = await _results(inbox, 3)
            with anyio.fail_after(WAIT):
                await slow_cancelled.wait()
            assert executor.statistics() == (1, 0, 0)

    kept, cancelled, not_started = results
    assert kept.content == "quick done"
    assert kept.executed
    assert not kept.is_error
    for result in (cancelled, not_started):
        assert result.is_error
        assert result.error_kind == "aborted"
        assert not result.executed
        assert "aborted" in result.content
        assert "stop" in result.content
    assert "grace of 0.2 s" in cancelled.content
    assert "before it started" in not_started.content
    assert ran == []


@pytest.mark.asyncio
async def test_cancel_with_nothing_running_is_a_no_op() -> None:
    async with open_executor(ToolRegistry([_tool("ok", _ok)])) as (bus, _):
        with bus.open_inbox("r1") as inbox:
            await _start(bus, "r1", ("ok",))
            await bus.publish(ToolsCancel(run_id="r1", turn=1, grace_seconds=0, reason="x"))
            await bus.publish(ToolsCancel(run_id="ghost", turn=1, grace_seconds=0, reason="x"))
            await _execute(bus, "r1", 1, ("ok", '{"key": "k"}'))
            (result,) = await _results(inbox, 1)
    assert result.content == "ok k"


# ---------------------------------------------------------------------------- runs


@pytest.mark.asyncio
async def test_two_runs_are_isolated() -> None:
    a_started = anyio.Event()
    a_cancelled = anyio.Event()
    never = anyio.Event()

    async def block(p: Named) -> str:
        a_started.set()
        try:
            await never.wait()
        finally:
            a_cancelled.set()
        return "never"

    registry = ToolRegistry([_tool("block", block), _tool("ok", _ok)])
    async with open_executor(registry) as (bus, executor):
        with bus.open_inbox("a") as inbox_a, bus.open_inbox("b") as inbox_b:
            await _start(bus, "a", ("block",))
            await _start(bus, "b", ("ok",))
            await _execute(bus, "a", 1, ("block", "{}"))
            with anyio.fail_after(WAIT):
                await a_started.wait()
            await _execute(bus, "b", 1, ("ok", '{"key": "b"}'), ("block", "{}"))
            ok, not_enabled = await _results(inbox_b, 2)
            assert ok.content == "ok b"
            assert ok.run_id == "b"
            assert not_enabled.error_kind == "unknown_tool"  # enabled per run
            assert executor.statistics().runs == 2

            await bus.publish(ToolsCancel(run_id="b", turn=1, grace_seconds=0, reason="b only"))
            await bus.publish(finished("b"))
            with anyio.fail_after(WAIT):
                await anyio.wait_all_tasks_blocked()
            assert not a_cancelled.is_set()
            assert executor.statistics() == (1, 1, 1)

            await bus.publish(finished("a"))  # drops a's state and cancels its call quietly
            with anyio.fail_after(WAIT):
                await a_cancelled.wait()
                await anyio.wait_all_tasks_blocked()
            assert executor.statistics() == (0, 0, 0)
            assert inbox_a.pending() == 0


@pytest.mark.asyncio
async def test_scripted_tools_count_per_run() -> None:
    schema = {"type": "object", "properties": {"order_id": {"type": "string"}}}
    registry = ToolRegistry([scripted_tool("query_order", "Q.", schema, ["pending", "shipped"])])
    async with open_executor(registry) as (bus, _):
        with bus.open_inbox("r1") as one, bus.open_inbox("r2") as two:
            await _start(bus, "r1", ("query_order",))
            await _start(bus, "r2", ("query_order",))
            args = '{"order_id": "A1001"}'
            for turn in (1, 2, 3):
                await _execute(bus, "r1", turn, ("query_order", args))
            await _execute(bus, "r2", 1, ("query_order", args))
            assert [r.content for r in await _results(one, 3)] == ["pending", "shipped", "shipped"]
            assert [r.content for r in await _results(two, 1)] == ["pending"]
            await _execute(bus, "r1", 4, ("query_order", '{"order_id": 1}'))
            (bad,) = await _results(one, 1)
            assert bad.error_kind == "invalid_arguments"


@pytest.mark.asyncio
async def test_file_tools_use_the_runs_folder(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hello\n")
    async with open_executor(default_registry()) as (bus, _):
        with bus.open_inbox("r1") as inbox:
            await _start(bus, "r1", ("list_dir", "read_file"), folder=tmp_path)
            await _execute(
                bus,
                "r1",
                1,
                ("list_dir", ""),
                ("read_file", '{"path": "notes.txt"}'),
                ("read_file", '{"path": "../../etc/passwd"}'),
            )
            listing, text, outside = await _results(inbox, 3)
    assert listing.content == "notes.txt  (6 bytes)"
    assert text.content == "hello\n"
    assert outside.content == PATH_ERROR
    assert outside.error_kind == "path"
    assert outside.is_error


@pytest.mark.asyncio
async def test_calls_for_an_unknown_run_still_get_results() -> None:
    async with open_executor(ToolRegistry([_tool("ok", _ok)])) as (bus, _):
        with bus.open_inbox("ghost") as inbox:
            await _execute(bus, "ghost", 1, ("ok", "{}"), ("ok", "{}"))
            results = await _results(inbox, 2)
    assert [r.error_kind for r in results] == ["unknown_run", "unknown_run"]
    assert not any(r.executed for r in results)


@pytest.mark.asyncio
async def test_closing_the_bus_aborts_running_calls_and_stops_the_actor() -> None:
    started = anyio.Event()
    never = anyio.Event()

    async def hang(p: Named) -> str:
        started.set()
        await never.wait()
        return "never"

    bus = Bus()
    executor = ToolExecutor(bus, ToolRegistry([_tool("hang", hang)]))
    with bus.open_inbox("r1") as inbox:
        with anyio.fail_after(WAIT):
            async with anyio.create_task_group() as tg:
                await tg.start(executor.run)
                await _start(bus, "r1", ("hang",))
                await _execute(bus, "r1", 1, ("hang", "{}"))
                await started.wait()
                bus.close()
        (result,) = await _results(inbox, 1)
    assert result.error_kind == "aborted"
    assert "the tool executor stopped" in result.content
    assert executor.statistics() == (0, 0, 0)
    assert bus.statistics() == ()  # unsubscribed
