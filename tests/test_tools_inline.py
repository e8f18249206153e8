"""Plain-``def`` tools: answered inside the executor's handler (no worker, no task switch)
with the same results, cache behaviour and errors as ``async def`` tools."""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import msgspec
import pytest

from actors.fingerprint import fingerprint_call
from actors.tools import Tool, ToolContext, ToolError, ToolExecutorSettings, ToolRegistry
from actors.tools.executor import LOOP_CAUSE, ToolExecutor
from bench.scripted_model import ScriptedModel
from bus import (
    Bus,
    Inbox,
    Message,
    ModelReply,
    ModelRequest,
    StopSignal,
    ToolCall,
    ToolExecute,
    ToolResult,
)
from orchestrator.config import Config
from orchestrator.result import RunResult
from orchestrator.runtime import RunSpec, Runtime
from tests.harness import serving
from tests.started import run_started

WAIT = 5.0


class Text(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    text: str = ""


# The same behaviours, once as a plain def and once as an async def.


def _echo(p: Text) -> str:
    return p.text


def _long(p: Text) -> str:
    return "x" * 250


def _refuses(p: Text) -> str:
    raise ToolError("quota", f"quota exceeded for {p.text}")


def _raises(p: Text) -> str:
    raise ValueError(f"boom {p.text}")


def _not_text(p: Text) -> str:
    return 42  # type: ignore[return-value]


def _raises_cancel(p: Text) -> str:
    raise anyio.get_cancelled_exc_class()()


BEHAVIOURS: dict[str, Callable[[Text], str]] = {
    "echo": _echo,
    "long": _long,
    "refuses": _refuses,
    "raises": _raises,
    "not_text": _not_text,
    "raises_cancel": _raises_cancel,
}


def sync_tool(name: str, fn: Callable[[Text], str], **kwargs: Any) -> Tool[Text]:
    def call(params: Text, ctx: ToolContext) -> str:
        return fn(params)

    return Tool(name, f"The {name} tool.", Text, call, **kwargs)


def async_tool(name: str, fn: Callable[[Text], str], **kwargs: Any) -> Tool[Text]:
    async def call(params: Text, ctx: ToolContext) -> str:
        return fn(params)

    return Tool(name, f"The {name} tool.", Text, call, **kwargs)


@asynccontextmanager
async def open_executor(
    registry: ToolRegistry, settings: ToolExecutorSettings | None = None
) -> AsyncIterator[tuple[Bus, ToolExecutor]]:
    bus = Bus()
    executor = ToolExecutor(bus, registry, settings)
    async with serving(bus, executor):
        yield bus, executor


async def start(bus: Bus, run_id: str, tools: tuple[str, ...], **settings: Any) -> None:
    await bus.publish(
        run_started(run_id=run_id, trace_id="t", task="t", model="m", tools=tools, **settings)
    )


def execute(run_id: str, turn: int, *calls: tuple[str, str]) -> ToolExecute:
    tool_calls = tuple(
        ToolCall(id=f"c{turn}-{i}", name=name, arguments=args)
        for i, (name, args) in enumerate(calls)
    )
    prints = tuple(fingerprint_call(c.name, c.arguments) for c in tool_calls)
    return ToolExecute(run_id=run_id, turn=turn, calls=tool_calls, fingerprints=prints)


async def results(inbox: Inbox, count: int) -> list[Message]:
    received = []
    with anyio.fail_after(WAIT):
        for _ in range(count):
            received.append(await inbox.receive())
    return received


def comparable(result: Message) -> dict[str, Any]:
    assert isinstance(result, ToolResult)
    fields = msgspec.structs.asdict(result)
    del fields["duration_seconds"]
    return fields


# ---------------------------------------------------------------------------- the tool


def test_a_plain_def_is_inline_an_async_def_is_not() -> None:
    class AsyncCallable:
        async def __call__(self, params: Text, ctx: ToolContext) -> str:
            return ""

    async def with_prefix(prefix: str, params: Text, ctx: ToolContext) -> str:
        return prefix + params.text

    assert sync_tool("s", _echo).inline
    assert not async_tool("a", _echo).inline
    assert not Tool("p", "", Text, functools.partial(with_prefix, ">")).inline
    assert not Tool("o", "", Text, AsyncCallable()).inline
    schema = {"type": "object"}
    assert Tool.from_json_schema("js", "", schema, lambda args, ctx: "").inline
    assert not Tool.from_json_schema("ja", "", schema, AsyncCallable()).inline  # type: ignore[arg-type]


def test_a_plain_def_takes_no_time_limit() -> None:
    with pytest.raises(ValueError, match="timeout_seconds needs an async def"):
        sync_tool("s", _echo, timeout_seconds=1.0)
    with pytest.raises(ValueError, match="timeout_seconds needs an async def"):
        Tool.from_json_schema("js", "", {"type": "object"}, lambda a, c: "", timeout_seconds=1.0)
    assert async_tool("a", _echo, timeout_seconds=1.0).timeout_seconds == 1.0


# ---------------------------------------------------------------------------- the executor


@pytest.mark.asyncio
async def test_results_and_errors_are_the_async_tools_own() -> None:
    """Every behaviour (text, a cut, ToolError, an exception, not text, a rogue cancel,
    bad arguments, an unknown tool) gives the same ToolResult as a plain def as an async
    def; only the plain defs' batch is answered before the publish returns."""
    settings = ToolExecutorSettings(max_result_chars=100)
    arguments = ['{"text": "hi"}', '{"text": 3}', '{"text": "', '{"other": 1}', ""]
    calls = [(name, args) for name in BEHAVIOURS for args in arguments]
    calls.append(("ghost", "{}"))
    answers: dict[str, list[dict[str, Any]]] = {}
    for kind, make in (("sync", sync_tool), ("async", async_tool)):
        registry = ToolRegistry([make(name, fn) for name, fn in BEHAVIOURS.items()])
        async with open_executor(registry, settings) as (bus, executor):
            with bus.open_inbox("r1") as inbox:
                await start(bus, "r1", tuple(BEHAVIOURS))
                await bus.publish(execute("r1", 1, *calls))
                if kind == "sync":
                    assert inbox.pending() == len(calls)  # answered inside the handler
                received = await results(inbox, len(calls))
            assert executor.workers_started() == (0 if kind == "sync" else 1)
        answers[kind] = [comparable(result) for result in received]
    assert answers["sync"] == answers["async"]
    kinds = Counter(fields["error_kind"] for fields in answers["sync"])
    assert kinds == {
        None: 4,  # echo and long, with "hi" and with no arguments
        "invalid_arguments": 6 * 3,
        "quota": 2,
        "exception": 3 * 2,
        "unknown_tool": 1,
    }
    assert "150 of 250 characters left out" in answers["sync"][5]["content"]


def counted_lookup() -> tuple[ToolRegistry, Counter[str]]:
    """An idempotent plain-def ``lookup`` tool, and how often it ran per argument."""
    ran: Counter[str] = Counter()

    def lookup(params: Text, ctx: ToolContext) -> str:
        ran[params.text] += 1
        return f"order {params.text}"

    return ToolRegistry([Tool("lookup", "", Text, lookup, idempotent=True)]), ran


@pytest.mark.asyncio
async def test_the_cache_answers_plain_defs_the_same_way() -> None:
    """miss, hit, hit, loop: the stop precedes the refused call's result; no worker."""
    registry, ran = counted_lookup()
    call = ("lookup", '{"text": "A1"}')
    async with open_executor(registry) as (bus, executor):
        with bus.open_inbox("r1") as inbox:
            await start(bus, "r1", ("lookup",), cache_max_entries=16)
            for turn in (1, 2, 3, 4):
                await bus.publish(execute("r1", turn, call))
            received = await results(inbox, 5)
        assert executor.workers_started() == 0
        assert executor.cache_statistics()[1:] == (2, 1, 1)  # hits, misses, loops
    kinds = [type(msg).__name__ for msg in received]
    assert kinds == ["ToolResult"] * 3 + ["StopSignal", "ToolResult"]
    answers = [msg for msg in received if isinstance(msg, ToolResult)]
    assert [r.cache for r in answers] == ["miss", "hit", "hit", "none"]
    assert [r.content for r in answers[:3]] == ["order A1"] * 3
    assert (answers[3].error_kind, answers[3].executed) == ("loop", False)
    stop = received[3]
    assert isinstance(stop, StopSignal)
    assert stop.cause == LOOP_CAUSE
    assert ran == {"A1": 1}


@pytest.mark.asyncio
async def test_identical_plain_def_calls_in_one_reply_share_one_execution() -> None:
    """The second waits for the first (the normal path), then hits."""
    registry, ran = counted_lookup()
    call = ("lookup", '{"text": "A1"}')
    async with open_executor(registry) as (bus, executor):
        with bus.open_inbox("r1") as inbox:
            await start(bus, "r1", ("lookup",), cache_max_entries=16)
            await bus.publish(execute("r1", 1, call, call))
            first, second = await results(inbox, 2)
        assert executor.workers_started() == 1
    assert isinstance(first, ToolResult)
    assert isinstance(second, ToolResult)
    assert (first.cache, second.cache) == ("miss", "hit")
    assert first.content == second.content == "order A1"
    assert ran == {"A1": 1}


@pytest.mark.asyncio
async def test_a_mixed_reply_takes_the_normal_path_in_call_order() -> None:
    release = anyio.Event()

    async def slow(params: Text, ctx: ToolContext) -> str:
        await release.wait()
        return f"slow {params.text}"

    registry = ToolRegistry([sync_tool("quick", _echo), Tool("slow", "", Text, slow)])
    async with open_executor(registry) as (bus, executor):
        with bus.open_inbox("r1") as inbox:
            await start(bus, "r1", ("quick", "slow"))
            await bus.publish(
                execute("r1", 1, ("slow", '{"text": "b"}'), ("quick", '{"text": "a"}'))
            )
            with anyio.fail_after(WAIT):
                await anyio.wait_all_tasks_blocked()
            assert inbox.pending() == 0  # the quick result waits for the slow one
            release.set()
            slow_result, quick = await results(inbox, 2)
        assert executor.workers_started() == 1
    assert isinstance(quick, ToolResult)
    assert isinstance(slow_result, ToolResult)
    assert (quick.content, slow_result.content) == ("a", "slow b")
    assert (quick.executed, slow_result.executed) == (True, True)


@pytest.mark.asyncio
async def test_a_plain_callable_returning_a_coroutine_is_an_error() -> None:
    async def later(args: dict[str, Any], ctx: ToolContext) -> str:
        return "later"

    wrapped = Tool.from_json_schema("wrapped", "", {"type": "object"}, lambda a, c: later(a, c))
    assert wrapped.inline
    async with open_executor(ToolRegistry([wrapped])) as (bus, _):
        with bus.open_inbox("r1") as inbox:
            await start(bus, "r1", ("wrapped",))
            await bus.publish(execute("r1", 1, ("wrapped", "{}")))
            (result,) = await results(inbox, 1)
    assert isinstance(result, ToolResult)
    assert result.error_kind == "exception"
    assert result.content == "wrapped failed: it returned coroutine, not text"


# ---------------------------------------------------------------------------- a real run


def scripted(*turns: tuple[tuple[str, str], ...]) -> Callable[[ModelRequest], ModelReply]:
    """Reply ``turns[i]``'s calls at turn ``i + 1``, then end the turn in text."""

    def script(request: ModelRequest) -> ModelReply:
        if request.turn > len(turns):
            return ModelReply(run_id=request.run_id, turn=request.turn, text="done")
        calls = tuple(
            ToolCall(id=f"call_{request.turn}_{i}", name=name, arguments=args)
            for i, (name, args) in enumerate(turns[request.turn - 1])
        )
        return ModelReply(
            run_id=request.run_id,
            turn=request.turn,
            text="",
            tool_calls=calls,
            finish_reason="tool_calls",
        )

    return script


@pytest.mark.asyncio
async def test_a_run_with_plain_def_tools_starts_no_worker() -> None:
    ran: Counter[str] = Counter()

    def upper(params: Text, ctx: ToolContext) -> str:
        ran[params.text] += 1
        return params.text.upper()

    registry = ToolRegistry(
        [
            Tool("upper", "Upper-cases.", Text, upper, idempotent=True),
            sync_tool("refuses", _refuses),
            sync_tool("raises", _raises),
        ]
    )
    script = scripted(
        (("upper", '{"text": "abc"}'),),
        (("upper", '{"text": "abc"}'),),  # a hit
        (("refuses", '{"text": "q"}'), ("raises", '{"text": "r"}'), ("upper", '{"text": 1}')),
    )
    runtime = Runtime(Config(), tools=registry, model_actor=lambda bus: ScriptedModel(bus, script))
    async with runtime:
        with anyio.fail_after(20):
            result: RunResult = await runtime.run(
                RunSpec(task="t", overrides={"tools": ["upper", "refuses", "raises"]})
            )
        assert runtime.tool_executor.workers_started() == 0
    assert (result.cause, result.turns) == ("model.end_turn", 4)
    answers = [m.content for m in result.transcript if m.role == "tool"]
    assert answers[:2] == ["ABC", "ABC"]
    assert answers[2] == "quota exceeded for q"
    assert answers[3] == "raises failed: ValueError: boom r"
    assert (answers[4] or "").startswith("invalid arguments for upper: Expected `str`")
    log = [(e.tool, e.cache, e.is_error, e.error_kind) for e in result.call_log]
    assert log == [
        ("upper", "miss", False, None),
        ("upper", "hit", False, None),
        ("refuses", "none", True, "quota"),
        ("raises", "none", True, "exception"),
        ("upper", "miss", True, "invalid_arguments"),  # as for an async def
    ]
    assert all(e.duration_seconds >= 0 for e in result.call_log)
    assert ran == {"abc": 1}
    assert result.tool_calls == 4  # the invalid call did not execute


@pytest.mark.asyncio
async def test_a_run_mixing_plain_and_async_tools() -> None:
    async def later(params: Text, ctx: ToolContext) -> str:
        await anyio.lowlevel.checkpoint()
        return f"later {params.text}"

    registry = ToolRegistry([sync_tool("now", _echo), Tool("later", "", Text, later)])
    script = scripted(
        (("later", '{"text": "1"}'), ("now", '{"text": "2"}')),
        (("now", '{"text": "3"}'),),
    )
    runtime = Runtime(Config(), tools=registry, model_actor=lambda bus: ScriptedModel(bus, script))
    async with runtime:
        with anyio.fail_after(20):
            result = await runtime.run(RunSpec(task="t", overrides={"tools": ["now", "later"]}))
        assert runtime.tool_executor.workers_started() == 1  # the mixed reply only
    answers = [m.content for m in result.transcript if m.role == "tool"]
    assert answers == ["later 1", "2", "3"]
    assert [e.is_error for e in result.call_log] == [False, False, False]
