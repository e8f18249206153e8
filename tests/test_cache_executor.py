"""The tool executor's result cache through a real Bus: hits, the loop stop, what is never
cached, TTL with an injected clock, single flight, isolation between runs."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import msgspec
import pytest

from actors.fingerprint import fingerprint_call
from actors.tools import Tool, ToolContext, ToolError, ToolRegistry
from actors.tools.executor import LOOP_CAUSE, ToolCacheStatistics, ToolExecutor
from bus import (
    ActorFailed,
    Bus,
    ExitReason,
    Inbox,
    Message,
    StopSignal,
    ToolCall,
    ToolExecute,
    ToolResult,
)
from tests.harness import serving
from tests.messages_examples import finished
from tests.started import run_started

WAIT = 5.0


class Clock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


class Order(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    order_id: str = "A1001"


class Tools:
    """An idempotent ``query_order`` and a side-effecting ``cancel_order`` that count their
    real executions; ``query_order`` fails while ``failing`` holds the order id."""

    def __init__(self) -> None:
        self.ran: Counter[str] = Counter()
        self.failing: set[str] = set()
        self.release: anyio.Event | None = None
        self.started = anyio.Event()

    async def query(self, params: Order, ctx: ToolContext) -> str:
        self.ran[f"query {params.order_id}"] += 1
        self.started.set()
        if self.release is not None:
            await self.release.wait()
        if params.order_id in self.failing:
            raise ToolError("unavailable", "the order service is down")
        return f"{params.order_id}: delivered (lookup {self.ran[f'query {params.order_id}']})"

    async def cancel(self, params: Order, ctx: ToolContext) -> str:
        self.ran[f"cancel {params.order_id}"] += 1
        return f"{params.order_id}: cancelled"

    def registry(self) -> ToolRegistry:
        return ToolRegistry(
            [
                Tool("query_order", "Look up an order.", Order, self.query, idempotent=True),
                Tool("cancel_order", "Cancel an order.", Order, self.cancel),
            ]
        )


@asynccontextmanager
async def open_executor(
    registry: ToolRegistry, clock: Clock | None = None
) -> AsyncIterator[tuple[Bus, ToolExecutor]]:
    bus = Bus()
    executor = ToolExecutor(bus, registry, clock=clock or Clock())
    async with serving(bus, executor):
        yield bus, executor


async def start(bus: Bus, run_id: str = "r1", **cache: Any) -> None:
    settings = {"cache_max_entries": 16, **cache}
    await bus.publish(
        run_started(
            run_id=run_id,
            trace_id="t",
            task="Has order A1001 arrived?",
            model="m",
            tools=("query_order", "cancel_order"),
            **settings,
        )
    )


class Caller:
    """Sends batches for one run and collects what comes back to its inbox."""

    def __init__(self, bus: Bus, inbox: Inbox, run_id: str = "r1") -> None:
        self.bus, self.inbox, self.run_id = bus, inbox, run_id
        self.turn = 0
        self.stops: list[StopSignal] = []
        self.order: list[str] = []  # "stop" or the call id, as they arrived

    async def batch(self, *calls: tuple[str, str]) -> list[ToolResult]:
        self.turn += 1
        tool_calls = tuple(
            ToolCall(id=f"c{self.turn}-{i}", name=name, arguments=f'{{"order_id": "{order}"}}')
            for i, (name, order) in enumerate(calls)
        )
        prints = tuple(fingerprint_call(c.name, c.arguments) for c in tool_calls)
        await self.bus.publish(
            ToolExecute(run_id=self.run_id, turn=self.turn, calls=tool_calls, fingerprints=prints)
        )
        results: list[ToolResult] = []
        with anyio.fail_after(WAIT):
            while len(results) < len(calls):
                msg: Message = await self.inbox.receive()
                if isinstance(msg, StopSignal):
                    self.stops.append(msg)
                    self.order.append("stop")
                else:
                    assert isinstance(msg, ToolResult)
                    results.append(msg)
                    self.order.append(msg.call_id)
        return results

    async def one(self, name: str = "query_order", order: str = "A1001") -> ToolResult:
        (result,) = await self.batch((name, order))
        return result


# ---------------------------------------------------------------------------- hits and loop


@pytest.mark.asyncio
async def test_one_execution_two_hits_then_the_third_hit_stops_the_run() -> None:
    tools = Tools()
    async with open_executor(tools.registry()) as (bus, executor):
        with bus.open_inbox("r1") as inbox:
            await start(bus)
            caller = Caller(bus, inbox)
            first, second, third = [await caller.one() for _ in range(3)]
            assert [r.cache for r in (first, second, third)] == ["miss", "hit", "hit"]
            assert {r.content for r in (first, second, third)} == {"A1001: delivered (lookup 1)"}
            assert all(r.executed and not r.is_error for r in (first, second, third))
            assert first.result_fingerprint == third.result_fingerprint
            assert caller.stops == []

            fourth = await caller.one()
            assert tools.ran == {"query A1001": 1}
            (stop,) = caller.stops
            assert caller.order[-2:] == ["stop", fourth.call_id]  # the stop comes first
            assert (stop.reason, stop.cause, stop.source) == (
                ExitReason.HOOK_STOPPED,
                LOOP_CAUSE,
                "tool_executor",
            )
            assert "query_order" in stop.detail
            # Not answered from the cache: an error result saying why, nothing executed.
            assert fourth.is_error
            assert (fourth.error_kind, fourth.executed, fourth.cache) == ("loop", False, "none")
            assert "delivered" not in fourth.content
            assert LOOP_CAUSE in fourth.content

            fifth = await caller.one()  # still a loop, but the run needs only one stop
            assert fifth.error_kind == "loop"
            assert len(caller.stops) == 1
            assert executor.cache_statistics() == ToolCacheStatistics(1, 2, 1, 2)


@pytest.mark.asyncio
async def test_max_cache_hits_from_run_started_sets_the_limit() -> None:
    tools = Tools()
    async with open_executor(tools.registry()) as (bus, _):
        with bus.open_inbox("r1") as inbox:
            await start(bus, max_cache_hits=0)
            caller = Caller(bus, inbox)
            assert (await caller.one()).cache == "miss"
            assert (await caller.one()).error_kind == "loop"  # the first hit is already one
            assert len(caller.stops) == 1


@pytest.mark.asyncio
async def test_arguments_are_compared_canonically_and_other_arguments_are_other_entries() -> None:
    tools = Tools()
    async with open_executor(tools.registry()) as (bus, _):
        with bus.open_inbox("r1") as inbox:
            await start(bus)
            caller = Caller(bus, inbox)
            assert (await caller.one(order="A1001")).cache == "miss"
            assert (await caller.one(order="B2002")).cache == "miss"
            # Same call, other spacing: the same fingerprint, so a hit.
            call = ToolCall(id="x", name="query_order", arguments='{ "order_id" :"A1001" }')
            fingerprint = fingerprint_call(call.name, call.arguments)
            await bus.publish(
                ToolExecute(run_id="r1", turn=99, calls=(call,), fingerprints=(fingerprint,))
            )
            with anyio.fail_after(WAIT):
                result = await inbox.receive()
            assert isinstance(result, ToolResult)
            assert result.cache == "hit"
            assert tools.ran == {"query A1001": 1, "query B2002": 1}


# ---------------------------------------------------------------------------- never cached


@pytest.mark.asyncio
async def test_a_tool_that_is_not_idempotent_is_never_cached() -> None:
    tools = Tools()
    async with open_executor(tools.registry()) as (bus, executor):
        with bus.open_inbox("r1") as inbox:
            await start(bus)
            caller = Caller(bus, inbox)
            results = [await caller.one("cancel_order") for _ in range(5)]
            assert [r.cache for r in results] == ["none"] * 5
            assert tools.ran == {"cancel A1001": 5}
            assert caller.stops == []
            assert executor.cache_statistics().entries == 0


@pytest.mark.asyncio
async def test_error_results_are_not_cached() -> None:
    tools = Tools()
    tools.failing.add("A1001")
    async with open_executor(tools.registry()) as (bus, _):
        with bus.open_inbox("r1") as inbox:
            await start(bus)
            caller = Caller(bus, inbox)
            errors = [await caller.one() for _ in range(4)]
            assert all(r.is_error and r.error_kind == "unavailable" for r in errors)
            assert [r.cache for r in errors] == ["miss"] * 4  # looked up, ran, not stored
            assert caller.stops == []  # failing calls are never cache hits
            tools.failing.clear()
            ok, hit = await caller.one(), await caller.one()
            assert (ok.cache, ok.is_error, hit.cache) == ("miss", False, "hit")
            assert tools.ran == {"query A1001": 5}


@pytest.mark.asyncio
async def test_a_batch_with_a_side_effect_clears_the_cache_and_stores_nothing() -> None:
    tools = Tools()
    async with open_executor(tools.registry()) as (bus, executor):
        with bus.open_inbox("r1") as inbox:
            await start(bus)
            caller = Caller(bus, inbox)
            await caller.one()
            assert (await caller.one()).cache == "hit"
            cancel, query = await caller.batch(("cancel_order", "A1001"), ("query_order", "A1001"))
            assert (cancel.cache, query.cache) == ("none", "miss")
            assert query.content == "A1001: delivered (lookup 2)"  # ran again, not stale
            assert executor.cache_statistics().entries == 0  # nothing stored from that batch
            assert (await caller.one()).cache == "miss"
            assert (await caller.one()).cache == "hit"
            assert tools.ran == {"query A1001": 3, "cancel A1001": 1}


@pytest.mark.asyncio
async def test_no_cache_when_run_started_sets_no_entries() -> None:
    tools = Tools()
    async with open_executor(tools.registry()) as (bus, _):
        with bus.open_inbox("r1") as inbox:
            await bus.publish(run_started(run_id="r1", tools=("query_order",), cache_max_entries=0))
            caller = Caller(bus, inbox)
            results = [await caller.one() for _ in range(5)]
            assert [r.cache for r in results] == ["none"] * 5
            assert tools.ran == {"query A1001": 5}
            assert caller.stops == []


# ---------------------------------------------------------------------------- TTL and bound


@pytest.mark.asyncio
async def test_an_expired_entry_runs_the_tool_again_with_a_fresh_hit_count() -> None:
    tools, clock = Tools(), Clock()
    async with open_executor(tools.registry(), clock) as (bus, _):
        with bus.open_inbox("r1") as inbox:
            await start(bus, cache_ttl_seconds=30.0)
            caller = Caller(bus, inbox)
            statuses = [(await caller.one()).cache for _ in range(3)]
            clock.now += 30.0
            statuses += [(await caller.one()).cache for _ in range(3)]
            assert statuses == ["miss", "hit", "hit"] * 2
            assert caller.stops == []
            assert tools.ran == {"query A1001": 2}


@pytest.mark.asyncio
async def test_each_run_keeps_at_most_max_entries_results() -> None:
    tools = Tools()
    async with open_executor(tools.registry()) as (bus, executor):
        with bus.open_inbox("r1") as inbox:
            await start(bus, cache_max_entries=2)
            caller = Caller(bus, inbox)
            for order in ("A", "B", "C"):
                await caller.one(order=order)
            assert executor.cache_statistics().entries == 2
            assert (await caller.one(order="A")).cache == "miss"  # evicted first
            assert (await caller.one(order="C")).cache == "hit"


# ---------------------------------------------------------------------------- concurrency, runs


@pytest.mark.asyncio
async def test_identical_calls_in_flight_share_one_execution() -> None:
    tools = Tools()
    tools.release = anyio.Event()
    async with open_executor(tools.registry()) as (bus, _):
        with bus.open_inbox("r1") as inbox:
            await start(bus)
            caller = Caller(bus, inbox)
            async with anyio.create_task_group() as tg:

                async def release_when_running() -> None:
                    with anyio.fail_after(WAIT):
                        await tools.started.wait()
                        await anyio.wait_all_tasks_blocked()  # the other two are waiting
                    assert tools.release is not None
                    tools.release.set()

                tg.start_soon(release_when_running)
                results = await caller.batch(*[("query_order", "A1001")] * 3)
            assert [r.cache for r in results] == ["miss", "hit", "hit"]
            assert [r.call_id for r in results] == ["c1-0", "c1-1", "c1-2"]  # call order
            assert tools.ran == {"query A1001": 1}
            assert (await caller.one()).error_kind == "loop"


@pytest.mark.asyncio
async def test_a_failed_leader_lets_the_waiting_identical_call_run_itself() -> None:
    tools = Tools()
    tools.failing.add("A1001")
    async with open_executor(tools.registry()) as (bus, _):
        with bus.open_inbox("r1") as inbox:
            await start(bus)
            results = await Caller(bus, inbox).batch(*[("query_order", "A1001")] * 2)
            assert [(r.cache, r.is_error) for r in results] == [("miss", True), ("miss", True)]
            assert tools.ran == {"query A1001": 2}


@pytest.mark.asyncio
async def test_runs_have_their_own_caches_and_finished_runs_drop_theirs() -> None:
    tools = Tools()
    async with open_executor(tools.registry()) as (bus, executor):
        with bus.open_inbox("a") as inbox_a, bus.open_inbox("b") as inbox_b:
            await start(bus, "a")
            await start(bus, "b")
            a, b = Caller(bus, inbox_a, "a"), Caller(bus, inbox_b, "b")
            assert [(await a.one()).cache for _ in range(3)] == ["miss", "hit", "hit"]
            assert (await b.one()).cache == "miss"  # a's hits are not b's
            assert (await a.one()).error_kind == "loop"
            assert (await b.one()).cache == "hit"
            assert (a.stops[0].run_id, b.stops) == ("a", [])
            assert tools.ran == {"query A1001": 2}
            assert executor.cache_statistics().entries == 2
            await bus.publish(finished("a"))
            await bus.publish(finished("b"))
            with anyio.fail_after(WAIT):
                await anyio.wait_all_tasks_blocked()
            assert executor.statistics().runs == 0
            assert executor.cache_statistics().entries == 0


@pytest.mark.asyncio
async def test_out_of_range_cache_settings_fail_the_run_naming_the_key() -> None:
    tools = Tools()
    async with open_executor(tools.registry()) as (bus, executor):
        with bus.open_inbox("r1") as inbox:
            await start(bus, cache_ttl_seconds=0.0)
            with anyio.fail_after(WAIT):
                failed = await inbox.receive()
            assert isinstance(failed, ActorFailed)
            assert failed.actor == "tool_executor"
            assert "ttl_seconds: must be > 0" in failed.error
            assert executor.statistics().runs == 0
