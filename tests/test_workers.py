"""The worker pool: a job costs a wake-up of an idle worker, never waits for another job."""

from __future__ import annotations

import anyio
import pytest

from actors.workers import Workers


@pytest.mark.asyncio
async def test_sequential_jobs_reuse_one_worker() -> None:
    done: list[int] = []
    async with anyio.create_task_group() as tg:
        pool = Workers(tg)
        for index in range(50):
            finished = anyio.Event()

            async def job(index: int = index, finished: anyio.Event = finished) -> None:
                done.append(index)
                finished.set()

            pool.submit(job)
            with anyio.fail_after(5):
                await finished.wait()
            await anyio.wait_all_tasks_blocked()  # the worker is parked again
        assert pool.started == 1
        assert pool.idle() == 1
        pool.close()
    assert done == list(range(50))


@pytest.mark.asyncio
async def test_a_slow_job_never_delays_another() -> None:
    release = anyio.Event()
    fast_done = anyio.Event()
    async with anyio.create_task_group() as tg:
        pool = Workers(tg)

        async def slow() -> None:
            await release.wait()

        async def fast() -> None:
            fast_done.set()

        pool.submit(slow)
        pool.submit(fast)
        with anyio.fail_after(5):
            await fast_done.wait()  # finished while the slow job still runs
        assert pool.busy() == 1
        release.set()
        pool.close()
    assert pool.busy() == 0


@pytest.mark.asyncio
async def test_idle_workers_beyond_the_limit_end() -> None:
    release = anyio.Event()
    async with anyio.create_task_group() as tg:
        pool = Workers(tg, max_idle=2)
        for _ in range(5):
            pool.submit(release.wait)
        await anyio.wait_all_tasks_blocked()
        assert (pool.started, pool.busy()) == (5, 5)
        release.set()
        with anyio.fail_after(5):
            while pool.busy():
                await anyio.wait_all_tasks_blocked()
        assert pool.idle() == 2
        pool.close()


@pytest.mark.asyncio
async def test_close_ends_idle_workers_and_refuses_new_jobs() -> None:
    async def nothing() -> None:
        return None

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            pool = Workers(tg)
            pool.submit(nothing)
            await anyio.wait_all_tasks_blocked()
            assert pool.idle() == 1
            pool.close()  # without this, the task group would wait forever
    with pytest.raises(RuntimeError, match="closed"):
        pool.submit(nothing)
