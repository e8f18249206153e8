"""The runtime's run slots: a free slot is taken at once, waiters are served in order, and
a waiter cancelled while waiting holds no slot."""

from __future__ import annotations

import anyio
import pytest

from orchestrator.runtime.slots import RunSlots


@pytest.mark.asyncio
async def test_waiters_get_freed_slots_in_the_order_they_came() -> None:
    slots = RunSlots(2)
    await slots.acquire()
    await slots.acquire()
    order: list[int] = []

    async def wait(n: int) -> None:
        await slots.acquire()
        order.append(n)

    async with anyio.create_task_group() as tg:
        for n in range(3):
            tg.start_soon(wait, n)
            await anyio.wait_all_tasks_blocked()
        assert slots.borrowed == 2
        for _ in range(3):
            slots.release()
            await anyio.wait_all_tasks_blocked()
    assert order == [0, 1, 2]
    assert slots.borrowed == 2


@pytest.mark.asyncio
async def test_a_cancelled_waiter_holds_no_slot() -> None:
    slots = RunSlots(1)
    await slots.acquire()
    got: list[str] = []
    scopes: dict[str, anyio.CancelScope] = {}

    async def wait(name: str) -> None:
        with anyio.CancelScope() as scope:
            scopes[name] = scope
            await slots.acquire()
            got.append(name)

    async with anyio.create_task_group() as tg:
        for name in ("first", "second", "third"):
            tg.start_soon(wait, name)
            await anyio.wait_all_tasks_blocked()
        for name in ("first", "third"):  # cancelled while waiting: they leave the queue
            scopes[name].cancel()
        await anyio.wait_all_tasks_blocked()
        slots.release()  # to "second", the one still waiting
        await anyio.wait_all_tasks_blocked()
    assert got == ["second"]
    assert slots.borrowed == 1
    slots.release()
    assert slots.borrowed == 0
