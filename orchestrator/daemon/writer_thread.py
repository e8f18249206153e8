"""One thread of its own that runs blocking calls one after another: the store's commits.

A thread fed by a :class:`queue.SimpleQueue` that hands each result back with
``loop.call_soon_threadsafe`` costs a wake of the thread and a wake of the loop, far less
than ``anyio.to_thread.run_sync`` (``docs/performance.md``); the store makes such a hop per
commit, up to one per run. A single thread also keeps the writer's SQLite connection on
the thread that opened it (``check_same_thread`` holds).

A caller cancelled while it waits is released; the call still runs to its end and its result
is dropped (the store waits for its commits in a shielded scope, so it never is).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from bus import aio_seam

__all__ = ["WriterThread"]

T = TypeVar("T")

_Call = tuple[Callable[[], Any], "aio_seam.Future[Any]"]


class WriterThread:
    """A thread that runs the calls given to :meth:`call` in order, between :meth:`start` and
    :meth:`stop` (both on the event loop the results go back to)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._calls: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._loop: aio_seam.AbstractEventLoop | None = None
        self._stopping = False

    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Start the thread; results of its calls go to the running event loop."""
        if self._thread is not None:
            raise RuntimeError(f"{self.name} was started before")
        self._loop = aio_seam.running_loop()
        self._thread = threading.Thread(target=self._serve, name=self.name, daemon=True)
        self._thread.start()

    async def call(self, function: Callable[[], T]) -> T:
        """``function()`` on the thread, after every call queued before it; its result (or
        exception) returned here."""
        if self._loop is None or self._stopping:
            raise RuntimeError(f"{self.name} is not running")
        future: aio_seam.Future[T] = self._loop.create_future()
        self._calls.put((function, future))
        return await future

    async def stop(self) -> None:
        """Let the calls queued so far finish, then end the thread and wait until it has."""
        thread, loop = self._thread, self._loop
        if thread is None or loop is None or self._stopping:
            return
        self._stopping = True
        ended: aio_seam.Future[None] = loop.create_future()
        self._calls.put((lambda: None, ended))
        self._calls.put(None)
        await ended
        thread.join()  # it has handed its last result back: only its return is left

    def _serve(self) -> None:
        loop = self._loop
        assert loop is not None
        calls = self._calls
        while True:
            item = calls.get()
            if item is None:
                return
            function, future = item
            try:
                result, error = function(), None
            except BaseException as exc:  # handed to the caller, whatever it is
                result, error = None, exc
            try:
                loop.call_soon_threadsafe(_settle, future, result, error)
            except RuntimeError:  # the loop is closed: nobody is left to tell
                pass
            del item, function, future, result, error


def _settle(future: aio_seam.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.cancelled():  # the caller was cancelled and went; the result is dropped
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
