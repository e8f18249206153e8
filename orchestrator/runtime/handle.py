"""A run that was started (:class:`RunHandle`): its status, result, events and abort.
The :class:`~orchestrator.runtime.Runtime` that started it sets its result and ends it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Literal

from bus import AbortRequested, Message, aio_seam
from orchestrator.result import RunResult

if TYPE_CHECKING:
    from orchestrator.runtime.runtime import Runtime

__all__ = ["HandleStatus", "RunHandle"]

HandleStatus = Literal["queued", "running", "finished"]
"""Where a :class:`RunHandle` is (the daemon's API says ``ended`` for ``finished``)."""


class _Done:
    """Set once when a run ends. Each waiter waits on a future of its own (cancelling one
    waiter cancels nothing else), made only when someone waits: an event would cost every
    run in flight a deque."""

    __slots__ = ("_callbacks", "_set", "_waiters")

    def __init__(self) -> None:
        self._set = False
        self._waiters: list[aio_seam.Future[None]] | None = None
        self._callbacks: list[Callable[[], object]] | None = None

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        self._set = True
        waiters, self._waiters = self._waiters, None
        for waiter in waiters or ():
            if not waiter.done():
                waiter.set_result(None)
        callbacks, self._callbacks = self._callbacks, None
        for callback in callbacks or ():
            callback()

    def on_set(self, callback: Callable[[], object]) -> None:
        """Call ``callback`` when the run ends (now, if it has)."""
        if self._set:
            callback()
        elif self._callbacks is None:
            self._callbacks = [callback]
        else:
            self._callbacks.append(callback)

    async def wait(self) -> None:
        if self._set:
            return
        waiter: aio_seam.Future[None] = aio_seam.Future()
        if self._waiters is None:
            self._waiters = []
        self._waiters.append(waiter)
        try:
            await waiter
        finally:
            if self._waiters is not None and waiter in self._waiters:
                self._waiters.remove(waiter)


class RunHandle:
    """A run that was started: follow its events, abort it, await its result."""

    __slots__ = ("_abort", "_done", "_result", "_runtime", "run_id", "status", "trace_id")

    def __init__(self, runtime: Runtime, run_id: str, trace_id: str) -> None:
        self._runtime = runtime
        self.run_id = run_id
        self.trace_id = trace_id
        self.status: HandleStatus = "queued"
        self._result: RunResult | None = None
        self._done = _Done()
        self._abort: AbortRequested | None = None

    @property
    def done(self) -> bool:
        return self._done.is_set()

    @property
    def abort_requested(self) -> AbortRequested | None:
        """The abort asked for this run, if any (a pipeline checks it between stages)."""
        return self._abort

    async def result(self) -> RunResult:
        """Wait for the run to end and return its result (never raises for run failures)."""
        await self._done.wait()
        assert self._result is not None
        return self._result

    def events(self, *, after: int = 0) -> AsyncIterator[Message]:
        """Every bus message of this run, in order, from position ``after``, live until
        the run ends (the same events the daemon streams)."""
        return self._runtime.event_log.follow(self.run_id, after=after)

    async def abort(
        self, detail: str = "", *, source: Literal["caller", "api", "shutdown"] = "caller"
    ) -> None:
        """Ask the run to stop now; idempotent. Streaming is cut and tools get a grace
        period; everything done so far is kept in the result."""
        await self._runtime._abort(self, source, detail)
