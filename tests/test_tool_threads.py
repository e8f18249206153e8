"""The built-in tools' file-system work runs in threads of their own pool, off the loop."""

from __future__ import annotations

import threading

import anyio
import pytest

from actors.tools.threads import POOL, run_in_thread


@pytest.mark.asyncio
async def test_the_work_runs_in_a_pool_thread_and_its_result_comes_back() -> None:
    here = threading.get_ident()
    there, name = await run_in_thread(
        lambda: (threading.get_ident(), threading.current_thread().name)
    )
    assert there != here
    assert name.startswith("loopfuse-tools")


@pytest.mark.asyncio
async def test_an_exception_in_the_thread_is_raised_to_the_caller() -> None:
    def fail() -> None:
        raise PermissionError("denied")

    with pytest.raises(PermissionError, match="denied"):
        await run_in_thread(fail)


@pytest.mark.asyncio
async def test_a_cancelled_caller_is_released_before_the_thread_finishes() -> None:
    started, release, finished = threading.Event(), threading.Event(), threading.Event()

    def blocked() -> str:
        started.set()
        release.wait(30)
        finished.set()
        return "late"

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:

            async def call() -> None:
                await run_in_thread(blocked)

            tg.start_soon(call)
            await anyio.to_thread.run_sync(started.wait, 10)
            tg.cancel_scope.cancel()
    assert not finished.is_set()  # the caller left while the thread still worked
    release.set()
    await anyio.to_thread.run_sync(finished.wait, 10)
    assert POOL.submit(lambda: 1).result(10) == 1  # the pool serves on
