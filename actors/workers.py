"""A pool of long-lived tasks in an actor's task group, so a job costs a wake-up, not a task.

:class:`Workers` hands each job to an idle worker of the pool (one future resolved) and
starts a new worker only when none is idle: a slow job never delays another. Idle workers
beyond ``max_idle`` end, so the pool shrinks after a burst. A worker runs its jobs inside a
cancel scope of its own, handed to the :class:`Job` while it runs: the job's owner cancels
the job by cancelling that scope (or by setting its deadline). The scope is replaced only
after a job cancelled it, and a deadline a job set is lifted when it ends. What this saves:
``docs/performance.md``.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import Final, Protocol

import anyio
from anyio.abc import TaskGroup

from bus import aio_seam

__all__ = ["DEFAULT_MAX_IDLE", "Job", "Workers"]

DEFAULT_MAX_IDLE: Final = 1024
"""Idle workers kept for the next jobs (each holds a parked task). Runs in
lockstep need as many workers at once as runs in their tool phase, so the pool keeps
enough for a busy runtime; only the excess beyond a burst ends."""


class Job(Protocol):
    """Work for a worker of the pool."""

    def run(self, scope: anyio.CancelScope) -> Awaitable[None]:
        """The job, awaited inside ``scope``, the worker's cancel scope (already entered).

        Cancelling ``scope`` or setting its deadline concerns this job only, and only while
        it runs: its owner must drop ``scope`` before the job returns. A cancellation of
        ``scope`` that the job lets through ends the job quietly (the scope catches it);
        one from outside (the pool's task group) ends the worker."""
        ...


class _Plain:
    """A coroutine function of no arguments as a job: run outside any scope of the pool."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[[], Awaitable[None]]) -> None:
        self.fn = fn

    def run(self, scope: anyio.CancelScope) -> Awaitable[None]:
        return self.fn()


class Workers:
    """Runs jobs in long-lived tasks of ``task_group``; call :meth:`close` before the task
    group exits, or its idle workers keep it open."""

    def __init__(self, task_group: TaskGroup, *, max_idle: int = DEFAULT_MAX_IDLE) -> None:
        self._tg = task_group
        self._max_idle = max_idle
        self._idle: list[aio_seam.Future[Job | None]] = []
        self._closed = False
        self._busy = 0
        self.started = 0
        """Workers started so far (a task each)."""

    def submit(self, job: Callable[[], Awaitable[None]]) -> None:
        """Run ``job()`` now in an idle worker, or in a new one (outside the worker's
        scope: nothing can cancel it but the pool's task group)."""
        self.start(_Plain(job))

    def start(self, job: Job) -> None:
        """Run ``job.run(scope)`` now in an idle worker, or in a new one."""
        if self._closed:
            raise RuntimeError("the worker pool is closed")
        idle = self._idle
        while idle:
            waiting = idle.pop()
            if not waiting.done():  # a worker cancelled while idle left its future behind
                waiting.set_result(job)
                return
        self.started += 1
        self._tg.start_soon(self._work, job)

    def idle(self) -> int:
        """Workers waiting for a job."""
        return len(self._idle)

    def busy(self) -> int:
        """Workers running a job now."""
        return self._busy

    def close(self) -> None:
        """Let every idle worker end; workers running a job end after it."""
        self._closed = True
        for waiting in self._idle:
            if not waiting.done():
                waiting.set_result(None)
        self._idle.clear()

    def _park(self) -> aio_seam.Future[Job | None]:
        """A future the next job arrives by; resolved with None at once when this worker
        should end (the pool is closed, or has idle workers enough)."""
        waiting: aio_seam.Future[Job | None] = aio_seam.Future()  # of the running loop
        if self._closed or len(self._idle) >= self._max_idle:
            waiting.set_result(None)
        else:
            self._idle.append(waiting)
        return waiting

    async def _work(self, first: Job) -> None:
        job: Job | None = first
        while job is not None:
            if isinstance(job, _Plain):  # needs no scope, so none is made (the runtime's runs)
                self._busy += 1
                try:
                    await job.fn()
                finally:
                    self._busy -= 1
                job = None  # an idle worker keeps nothing of its last job alive
                job = await self._park()
                continue
            with anyio.CancelScope() as scope:  # until a job cancels it
                while job is not None and not isinstance(job, _Plain):
                    self._busy += 1
                    try:
                        await job.run(scope)
                    finally:
                        self._busy -= 1
                        job = None
                    if scope.cancel_called:
                        break
                    if scope.deadline != math.inf:
                        scope.deadline = math.inf
                    job = await self._park()
            if job is None:
                if not scope.cancel_called:
                    return  # told to end while idle
                # The scope was cancelled for a job that has ended: a new one for the next.
                job = await self._park()
