"""actors.deadlines: scopes of one time limit cancelled at their deadlines by a shared watcher."""

from __future__ import annotations

import asyncio
import math

import anyio
import anyio.lowlevel
import pytest

from actors.deadlines import Deadlines

pytestmark = pytest.mark.anyio

SHORT = 0.05


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_a_watched_scope_is_cancelled_at_its_deadline_as_by_its_own() -> None:
    async with anyio.create_task_group() as tg:
        deadlines = Deadlines(tg)
        with anyio.fail_after(5):
            with anyio.CancelScope() as scope:
                deadline = deadlines.watch(scope, SHORT)
                await anyio.sleep_forever()
        deadlines.forget(scope, SHORT)
        assert scope.cancelled_caught
        assert anyio.current_time() >= deadline
        assert deadlines.watched() == 0
        deadlines.close()


async def test_a_forgotten_scope_is_not_cancelled_and_the_next_one_still_is() -> None:
    async with anyio.create_task_group() as tg:
        deadlines = Deadlines(tg)
        with anyio.CancelScope() as first:
            deadlines.watch(first, SHORT)
            await anyio.lowlevel.checkpoint()  # a call that ends at once
        deadlines.forget(first, SHORT)
        with anyio.fail_after(5):
            with anyio.CancelScope() as second:
                deadlines.watch(second, SHORT)
                await anyio.sleep_forever()
        deadlines.forget(second, SHORT)
        assert not first.cancel_called
        assert second.cancelled_caught
        deadlines.close()


async def test_scopes_of_two_limits_each_end_at_their_own() -> None:
    ended: list[str] = []

    async def call(deadlines: Deadlines, name: str, seconds: float) -> None:
        with anyio.CancelScope() as scope:
            deadlines.watch(scope, seconds)
            await anyio.sleep_forever()
        deadlines.forget(scope, seconds)
        ended.append(name)

    async with anyio.create_task_group() as tg:
        deadlines = Deadlines(tg)
        with anyio.fail_after(5):
            async with anyio.create_task_group() as calls:
                calls.start_soon(call, deadlines, "long", SHORT * 4)
                calls.start_soon(call, deadlines, "short", SHORT)
        deadlines.close()
    assert ended == ["short", "long"]


async def test_close_ends_the_watchers_and_leaves_each_scope_its_deadline() -> None:
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            deadlines = Deadlines(tg)
            scope = anyio.CancelScope()
            deadline = deadlines.watch(scope, 3600.0)
            deadlines.close()  # the task group must not wait an hour for the watcher
    assert scope.deadline == deadline
    assert deadlines.watched() == 0


async def test_an_endless_limit_watches_nothing() -> None:
    async with anyio.create_task_group() as tg:
        deadlines = Deadlines(tg)
        scope = anyio.CancelScope()
        assert deadlines.watch(scope, math.inf) == math.inf
        assert deadlines.watched() == 0
        assert scope.deadline == math.inf
        deadlines.close()


def _runs_watcher(task: asyncio.Task[object]) -> bool:
    coro: object = task.get_coro()  # under anyio's wrapper coroutine
    while coro is not None:
        if getattr(coro, "__qualname__", "") == "Deadlines._watch":
            return True
        coro = getattr(coro, "cr_await", None)
    return False


def _watchers() -> list[asyncio.Task[object]]:
    """The deadline watcher tasks alive now."""
    return [task for task in asyncio.all_tasks() if _runs_watcher(task)]


async def test_calls_that_end_before_the_watcher_runs_share_one_watcher() -> None:
    # An async tool that returns at once: each call is forgotten before the watcher's first
    # step. The watcher lingers instead of ending, so calls start no task each.
    async with anyio.create_task_group() as tg:
        deadlines = Deadlines(tg)
        seen: set[asyncio.Task[object]] = set()
        for _ in range(5):
            scope = anyio.CancelScope()  # a call that ends at once
            deadlines.watch(scope, 60.0)
            deadlines.forget(scope, 60.0)
            await anyio.lowlevel.checkpoint()  # the watcher runs (and finds nothing)
            await anyio.lowlevel.checkpoint()
            seen.update(_watchers())
            assert len(_watchers()) == 1
        assert len(seen) == 1
        assert not scope.cancel_called
        deadlines.close()


async def test_an_idle_watcher_ends_after_one_limit_and_a_late_call_is_still_cancelled() -> None:
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:  # exits once the watcher has ended
            deadlines = Deadlines(tg)
            first = anyio.CancelScope()  # a call that ends at once
            deadlines.watch(first, SHORT)
            deadlines.forget(first, SHORT)
            await anyio.lowlevel.checkpoint()  # the watcher starts idle, lingering
            with anyio.CancelScope() as second:  # watched while the watcher lingers
                deadlines.watch(second, SHORT)
                await anyio.sleep_forever()
            deadlines.forget(second, SHORT)
            assert second.cancelled_caught
            assert not first.cancel_called
    assert deadlines.watched() == 0
