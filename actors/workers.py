"""A pool of long-lived tasks in an actor's task group, so a job costs a wake-up, not a task.

Starting a task in an anyio task group costs tens of microseconds, more than everything
else an actor does for a tool call that returns at once. :class:`Workers` hands each job to
an idle worker of the pool (one future resolved) and starts a new worker only when none is
idle. Every job gets a worker of its own at once: a slow job never delays another.
Idle workers beyond ``max_idle`` end, so the pool shrinks after a burst.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Final

from anyio.abc import TaskGroup

__all__ = ["DEFAULT_MAX_IDLE", "Workers"]

DEFAULT_MAX_IDLE: Final = 1024
"""Idle workers kept for the next jobs (each holds a parked task: 2-3 KB). Runs in
lockstep need as many workers at once as runs in their tool phase, so the pool keeps
enough for a busy runtime; only the excess beyond a burst ends."""

Job = Callable[[], Awaitable[None]]


class Workers:
    """Runs jobs in long-lived tasks of ``task_group``; call :meth:`close` before the task
    group exits, or its idle workers keep it open."""

    def __init__(self, task_group: TaskGroup, *, max_idle: int = DEFAULT_MAX_IDLE) -> None:
        self._tg = task_group
        self._max_idle = max_idle
        self._idle: list[asyncio.Future[Job | None]] = []
        self._closed = False
        self._busy = 0
        self.started = 0
        """Workers started so far (a task each)."""

    def submit(self, job: Job) -> None:
        """Run ``job`` now in an idle worker, or in a new one."""
        if self._closed:
            raise RuntimeError("the worker pool is closed")
        while self._idle:
            waiting = self._idle.pop()
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

    async def _work(self, first: Job) -> None:
        job: Job | None = first
        while job is not None:
            self._busy += 1
            try:
                await job()
            finally:
                self._busy -= 1
            if self._closed or len(self._idle) >= self._max_idle:
                return
            job = None  # an idle worker keeps nothing of its last job alive
            waiting: asyncio.Future[Job | None] = asyncio.Future()  # of the running loop
            self._idle.append(waiting)
            job = await waiting
