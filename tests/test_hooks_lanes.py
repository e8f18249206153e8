"""``Subscription.serve_per_run`` (the hook runner's way of serving): one run's slow
handling holds up only that run, each run's messages stay in order, settling publishes
wait for the job, failures are isolated and nothing is left waiting when serving stops."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio
import pytest

from bus import ActorFailed, Bus, Job, Message, TurnEnded, TurnStarted


def turn(run_id: str, n: int) -> TurnStarted:
    return TurnStarted(run_id=run_id, turn=n, stage="agent", prompt_messages=1)


class Recorder:
    """Handles messages at once, except those of ``slow`` runs, which wait for ``release``."""

    def __init__(self, slow: set[str]) -> None:
        self.slow = slow
        self.release = anyio.Event()
        self.started = anyio.Event()
        self.done: list[tuple[str, int]] = []

    def handle(self, msg: Message) -> Job | None:
        assert isinstance(msg, TurnStarted)
        if msg.run_id not in self.slow:
            self.done.append((msg.run_id, msg.turn))
            return None

        async def job() -> None:
            self.started.set()
            await self.release.wait()
            self.done.append((msg.run_id, msg.turn))

        return job


async def serving(
    bus: Bus, handler: Callable[[Message], Job | None], body: Callable[[], Awaitable[None]]
) -> None:
    sub = bus.subscribe(TurnStarted, name="lanes", answers=True)
    async with anyio.create_task_group() as tg:
        await tg.start(sub.serve_per_run, handler)
        try:
            with anyio.fail_after(10):
                await body()
        finally:
            bus.close()


@pytest.mark.asyncio
async def test_a_slow_run_holds_up_only_itself_and_keeps_its_order() -> None:
    bus = Bus()
    recorder = Recorder(slow={"slow"})

    async def body() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(bus.publish_settled, turn("slow", 1))
            await recorder.started.wait()
            await bus.publish(turn("slow", 2))  # queued behind the slow job, in order
            await bus.publish_settled(turn("fast", 1))  # settles while "slow" still waits
            assert recorder.done == [("fast", 1)]
            recorder.release.set()
        await bus.publish_settled(turn("slow", 3))
        assert recorder.done == [("fast", 1), ("slow", 1), ("slow", 2), ("slow", 3)]

    await serving(bus, recorder.handle, body)


@pytest.mark.asyncio
async def test_a_settling_publish_waits_for_the_job() -> None:
    bus = Bus()
    recorder = Recorder(slow={"r"})
    settled = anyio.Event()

    async def publish() -> None:
        await bus.publish_settled(turn("r", 1))
        settled.set()

    async def body() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(publish)
            await recorder.started.wait()
            await anyio.wait_all_tasks_blocked()
            assert not settled.is_set()  # the job has not finished
            recorder.release.set()
        assert settled.is_set()
        assert recorder.done == [("r", 1)]

    await serving(bus, recorder.handle, body)


@pytest.mark.asyncio
async def test_failures_are_isolated_to_their_run() -> None:
    bus = Bus()
    handled: list[str] = []

    def handle(msg: Message) -> Job | None:
        if msg.run_id == "bad-now":
            raise RuntimeError("decided badly")
        if msg.run_id == "bad-later":

            async def job() -> None:
                raise RuntimeError("ran badly")

            return job
        handled.append(msg.run_id)
        return None

    async def body() -> None:
        with bus.open_inbox("bad-now") as now, bus.open_inbox("bad-later") as later:
            await bus.publish_settled(turn("bad-now", 1))
            await bus.publish_settled(turn("bad-later", 1))
            await bus.publish_settled(turn("good", 1))
            first, second = now.receive_nowait(), later.receive_nowait()
        assert isinstance(first, ActorFailed)
        assert "decided badly" in first.error
        assert isinstance(second, ActorFailed)
        assert "ran badly" in second.error
        assert handled == ["good"]

    await serving(bus, handle, body)


@pytest.mark.asyncio
async def test_stopping_releases_every_waiting_publisher() -> None:
    bus = Bus()
    recorder = Recorder(slow={"r"})
    sub = bus.subscribe(TurnStarted, TurnEnded, name="lanes", answers=True)
    returned: list[int] = []

    async def publish(n: int) -> None:
        await bus.publish_settled(turn("r", n))
        returned.append(n)

    with anyio.fail_after(10):
        async with (
            anyio.create_task_group() as publishers,
            anyio.create_task_group() as serving_tg,
        ):
            await serving_tg.start(sub.serve_per_run, recorder.handle)
            publishers.start_soon(publish, 1)
            await recorder.started.wait()
            publishers.start_soon(publish, 2)  # queued in the lane
            await anyio.wait_all_tasks_blocked()
            serving_tg.cancel_scope.cancel()  # the job never finishes
    assert sorted(returned) == [1, 2]
    assert recorder.done == []
