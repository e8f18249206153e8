"""The worker pool: a job costs a wake-up of an idle worker, never waits for another job."""

from __future__ import annotations

import math
from collections.abc import Awaitable

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


class _Recorded:
    """A job that records the scope it ran in, then waits for ``release`` (or its scope's
    cancellation, which it lets through)."""

    def __init__(self, release: anyio.Event | None = None) -> None:
        self.release = release
        self.scope: anyio.CancelScope | None = None
        self.started = anyio.Event()
        self.finished = anyio.Event()
        self.cancelled = False

    async def run(self, scope: anyio.CancelScope) -> None:
        self.scope = scope
        self.started.set()
        try:
            if self.release is not None:
                await self.release.wait()
        except anyio.get_cancelled_exc_class():
            self.cancelled = True
            raise
        finally:
            self.finished.set()


@pytest.mark.asyncio
async def test_jobs_share_the_workers_scope_until_one_cancels_it() -> None:
    async with anyio.create_task_group() as tg:
        pool = Workers(tg)
        first, second = _Recorded(), _Recorded()
        for job in (first, second):
            pool.start(job)
            with anyio.fail_after(5):
                await job.finished.wait()
            await anyio.wait_all_tasks_blocked()
        assert first.scope is second.scope  # one worker, one scope: nothing made per job
        assert pool.started == 1

        stuck = _Recorded(anyio.Event())
        pool.start(stuck)
        with anyio.fail_after(5):
            await stuck.started.wait()
        assert stuck.scope is not None
        assert stuck.scope is first.scope
        stuck.scope.cancel()  # what an owner does to cancel its job
        with anyio.fail_after(5):
            await stuck.finished.wait()
        await anyio.wait_all_tasks_blocked()
        assert stuck.cancelled
        assert (pool.busy(), pool.idle()) == (0, 1)  # the worker caught it and lives on

        after = _Recorded()
        pool.start(after)
        with anyio.fail_after(5):
            await after.finished.wait()
        assert after.scope is not None
        assert after.scope is not stuck.scope
        assert not after.scope.cancel_called  # a fresh scope, not the cancelled one
        assert not after.cancelled
        assert pool.started == 1
        pool.close()


@pytest.mark.asyncio
async def test_a_deadline_a_job_set_ends_with_it() -> None:
    async with anyio.create_task_group() as tg:
        pool = Workers(tg)
        release = anyio.Event()
        timed = _Recorded(release)

        async def set_deadline_then_finish(scope: anyio.CancelScope) -> None:
            scope.deadline = anyio.current_time() + 3600
            await timed.run(scope)

        class Timed:
            def run(self, scope: anyio.CancelScope) -> Awaitable[None]:
                return set_deadline_then_finish(scope)

        pool.start(Timed())
        with anyio.fail_after(5):
            await timed.started.wait()
        assert timed.scope is not None
        assert timed.scope.deadline < math.inf
        release.set()
        with anyio.fail_after(5):
            await timed.finished.wait()
        await anyio.wait_all_tasks_blocked()
        assert timed.scope.deadline == math.inf  # lifted: the next job is not cut by it
        assert not timed.scope.cancel_called
        pool.close()


@pytest.mark.asyncio
async def test_a_cancellation_from_outside_still_ends_the_workers() -> None:
    job = _Recorded(anyio.Event())
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            pool = Workers(tg)
            pool.start(job)
            await job.started.wait()
            tg.cancel_scope.cancel()
    assert job.cancelled
    assert pool.busy() == 0


@pytest.mark.asyncio
async def test_plain_and_scoped_jobs_take_turns_in_one_worker() -> None:
    ran: list[str] = []

    async def plain() -> None:
        ran.append("plain")

    async with anyio.create_task_group() as tg:
        pool = Workers(tg)
        scoped = [_Recorded(), _Recorded()]
        for job in (plain, scoped[0], plain, scoped[1], plain):
            if isinstance(job, _Recorded):
                pool.start(job)
                with anyio.fail_after(5):
                    await job.finished.wait()
            else:
                pool.submit(job)
            await anyio.wait_all_tasks_blocked()
        assert ran == ["plain"] * 3
        assert all(job.scope is not None and not job.cancelled for job in scoped)
        assert pool.started == 1
        pool.close()
