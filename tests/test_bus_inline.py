"""Inline subscribers: handlers called during the publish, in one FIFO order, with the
barrier rule, failure isolation and per-run lanes of the queued ones."""

from __future__ import annotations

from functools import partial

import anyio
import pytest

from bus import (
    ActorFailed,
    Bus,
    Message,
    Nudge,
    StopSignal,
    TurnEnded,
    TurnStarted,
)
from bus.bus import Job
from bus.exit import ExitReason


def turn(run_id: str, number: int) -> TurnStarted:
    return TurnStarted(run_id=run_id, turn=number, stage="agent", prompt_messages=1)


def nudge(run_id: str, text: str) -> Nudge:
    return Nudge(run_id=run_id, kind="k", text=text, source="test")


@pytest.mark.asyncio
async def test_an_inline_handler_runs_inside_the_publish() -> None:
    bus = Bus()
    sub = bus.subscribe(TurnStarted, name="monitor", answers=True, inline=True)
    seen: list[int] = []
    async with anyio.create_task_group() as tg:
        await tg.start(sub.serve, lambda m: seen.append(m.turn))
        for number in range(1, 4):
            bus.publish_nowait(turn("r", number))
            assert seen == list(range(1, number + 1))  # handled before publish returned
        assert sub.statistics().depth == 0
        bus.close()
    assert sub.statistics().handled == 3


@pytest.mark.asyncio
async def test_answers_from_inline_handlers_keep_one_order_for_everyone() -> None:
    """A monitor's answer is delivered after the message it answers reached every
    subscriber, so an observer never sees the answer before the question."""
    bus = Bus()
    monitor = bus.subscribe(TurnStarted, name="monitor", answers=True, inline=True)
    observer = bus.subscribe(name="observer", inline=True)
    order: list[str] = []

    def answer(msg: TurnStarted) -> None:
        order.append(f"monitor:{msg.turn}")
        bus.publish_nowait(nudge(msg.run_id, f"after {msg.turn}"))

    def observe(msg: Message) -> None:
        order.append(f"observer:{type(msg).__name__}")

    with bus.open_inbox("r") as inbox:
        async with anyio.create_task_group() as tg:
            await tg.start(monitor.serve, answer)  # subscribed first: handles first
            await tg.start(observer.serve, observe)
            await bus.publish_settled(turn("r", 1))
            bus.close()
        received = inbox.receive_nowait()
    assert order == ["monitor:1", "observer:TurnStarted", "observer:Nudge"]
    assert isinstance(received, Nudge)
    assert received.text == "after 1"


@pytest.mark.asyncio
async def test_a_settled_publish_with_inline_monitors_never_yields() -> None:
    bus = Bus()
    sub = bus.subscribe(TurnStarted, name="monitor", answers=True, inline=True)
    other_ran = False

    async def other() -> None:
        nonlocal other_ran
        other_ran = True

    async with anyio.create_task_group() as tg:
        await tg.start(sub.serve, lambda m: None)
        tg.start_soon(other)
        for number in range(50):
            await bus.publish_settled(turn("r", number))
        assert not other_ran  # no checkpoint: the other task never got a turn
        bus.close()
    assert other_ran


@pytest.mark.asyncio
async def test_messages_before_serving_are_queued_then_handled_in_order() -> None:
    bus = Bus()
    sub = bus.subscribe(TurnStarted, name="late", answers=True, inline=True)
    for number in range(3):
        bus.publish_nowait(turn("r", number))
    assert sub.statistics().depth == 3
    seen: list[int] = []
    async with anyio.create_task_group() as tg:
        await tg.start(sub.serve, lambda m: seen.append(m.turn))
        assert seen == [0, 1, 2]
        bus.publish_nowait(turn("r", 3))
        bus.close()
    assert seen == [0, 1, 2, 3]


@pytest.mark.asyncio
async def test_a_failing_inline_handler_fails_only_that_run() -> None:
    bus = Bus()
    sub = bus.subscribe(TurnStarted, name="flaky", answers=True, inline=True)

    def handler(msg: TurnStarted) -> None:
        if msg.run_id == "bad":
            raise RuntimeError("boom")

    with bus.open_inbox("bad") as bad, bus.open_inbox("good") as good:
        async with anyio.create_task_group() as tg:
            await tg.start(sub.serve, handler)
            with anyio.fail_after(5):
                await bus.publish_settled(turn("bad", 1))
                await bus.publish_settled(turn("good", 1))
            bus.close()
        failure = bad.receive_nowait()
        assert isinstance(failure, ActorFailed)
        assert "boom" in failure.error
        assert good.receive_nowait() is None
    assert sub.statistics().failed == 1


@pytest.mark.asyncio
async def test_an_inline_handler_must_be_synchronous() -> None:
    bus = Bus()
    sub = bus.subscribe(TurnStarted, name="async", inline=True)

    async def handler(msg: TurnStarted) -> None:
        return None

    with pytest.raises(TypeError, match="must be synchronous"):
        await sub.serve(handler)


@pytest.mark.asyncio
async def test_inline_per_run_lanes_hold_only_their_run_and_keep_the_barrier() -> None:
    """A run whose handling must wait gets a lane; its settled publish waits for the lane,
    other runs' publishes settle at once, and the waiting run's later messages follow in
    order."""
    bus = Bus()
    sub = bus.subscribe(TurnStarted, TurnEnded, name="hooks", answers=True, inline=True)
    release = anyio.Event()
    handled: list[tuple[str, str]] = []

    def decide(msg: TurnStarted | TurnEnded) -> Job | None:
        if msg.run_id == "slow" and isinstance(msg, TurnStarted):

            async def job() -> None:
                await release.wait()
                handled.append((msg.run_id, "TurnStarted"))

            return job
        handled.append((msg.run_id, type(msg).__name__))
        return None

    settled: list[str] = []

    async def publisher() -> None:
        await bus.publish_settled(turn("slow", 1))
        settled.append("slow")

    async with anyio.create_task_group() as tg:
        await tg.start(sub.serve_per_run, decide)
        tg.start_soon(publisher)
        await anyio.wait_all_tasks_blocked()
        bus.publish_nowait(TurnEnded(run_id="slow", turn=1, tool_calls=0))  # queued in lane
        with anyio.fail_after(5):
            await bus.publish_settled(turn("fast", 1))  # not held by the slow run
        assert settled == []
        assert handled == [("fast", "TurnStarted")]
        release.set()
        with anyio.fail_after(5):
            while not settled:
                await anyio.wait_all_tasks_blocked()
        bus.close()
    assert handled == [("fast", "TurnStarted"), ("slow", "TurnStarted"), ("slow", "TurnEnded")]


@pytest.mark.asyncio
async def test_a_stop_from_an_inline_monitor_is_in_the_inbox_when_the_publish_settles() -> None:
    bus = Bus()
    sub = bus.subscribe(TurnStarted, name="budget", answers=True, inline=True)

    def stop_at_three(msg: TurnStarted) -> None:
        if msg.turn == 3:
            bus.publish_nowait(
                StopSignal(
                    run_id=msg.run_id,
                    reason=ExitReason.MAX_TURNS,
                    cause="budget.max_turns",
                    source="budget",
                    detail="three turns",
                )
            )

    with bus.open_inbox("r") as inbox:
        async with anyio.create_task_group() as tg:
            await tg.start(sub.serve, stop_at_three)
            for number in (1, 2):
                await bus.publish_settled(turn("r", number))
                assert inbox.receive_nowait() is None
            await bus.publish_settled(turn("r", 3))
            stop = inbox.receive_nowait()
            bus.close()
    assert isinstance(stop, StopSignal)
    assert stop.cause == "budget.max_turns"


@pytest.mark.asyncio
async def test_unsubscribing_an_inline_subscriber_stops_its_deliveries() -> None:
    bus = Bus()
    sub = bus.subscribe(TurnStarted, name="gone", inline=True)
    seen: list[int] = []
    async with anyio.create_task_group() as tg:
        await tg.start(sub.serve, lambda m: seen.append(m.turn))
        bus.publish_nowait(turn("r", 1))
        bus.unsubscribe(sub)
        await anyio.wait_all_tasks_blocked()  # serve() returns once closed
        bus.publish_nowait(turn("r", 2))
    assert seen == [1]


@pytest.mark.asyncio
async def test_serve_by_type_calls_each_types_function_in_order() -> None:
    """One function per type: a queued backlog first, then live messages; a type without
    a function is not delivered; a failure is isolated and reported; settling publishes
    wait for none of them (they are done when they return)."""
    bus = Bus()
    sub = bus.subscribe(name="monitor", answers=True, inline=True)
    seen: list[str] = []
    failures: list[Message] = []
    watcher = bus.subscribe(ActorFailed, name="watcher", inline=True)

    def on_turn(msg: TurnStarted) -> None:
        seen.append(f"started {msg.turn}")

    def on_end(msg: TurnEnded) -> None:
        if msg.turn == 3:
            raise RuntimeError("boom")
        seen.append(f"ended {msg.turn}")

    bus.publish_nowait(turn("r", 1))  # before serving: queued, then handled in order
    async with anyio.create_task_group() as tg:
        await tg.start(watcher.serve, failures.append)
        await tg.start(partial(sub.serve_by_type, {TurnStarted: on_turn, TurnEnded: on_end}))
        assert seen == ["started 1"]
        await bus.publish_settled(TurnEnded(run_id="r", turn=2, tool_calls=0))
        await bus.publish_settled(nudge("r", "no function for Nudge"))
        await bus.publish_settled(TurnEnded(run_id="r", turn=3, tool_calls=0))
        bus.close()
    assert seen == ["started 1", "ended 2"]
    assert [type(m) for m in failures] == [ActorFailed]
    stats = sub.statistics()
    assert (stats.handled, stats.failed) == (3, 1)


@pytest.mark.asyncio
async def test_serve_by_type_refuses_a_queued_subscription_and_async_functions() -> None:
    bus = Bus()
    queued = bus.subscribe(TurnStarted, name="queued")
    with pytest.raises(TypeError, match="inline=True"):
        await queued.serve_by_type({TurnStarted: lambda m: None})

    async def handler(msg: TurnStarted) -> None:
        pass

    inline = bus.subscribe(TurnStarted, name="inline", inline=True)
    with pytest.raises(TypeError, match="TurnStarted handler must be synchronous"):
        await inline.serve_by_type({TurnStarted: handler})  # type: ignore[dict-item]  # the mistake under test
