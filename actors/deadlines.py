"""Time limits for many cancel scopes on one sleeping task per limit length (instead of a
timer per scope: ``docs/performance.md``, "Shared deadlines").

:class:`Deadlines` keeps the scopes of one limit length in the order they were watched (so
in deadline order) and one watcher task (in the actor's task group) asleep until the
earliest; a call that ends drops its entry. With none left the watcher lingers one limit
length (a call watched meanwhile is due no earlier than that) and ends only if still none
came. A scope cancelled this way looks as one cancelled by its own deadline does
(``cancelled_caught``, no reason given by the caller).
"""

from __future__ import annotations

import math
import time

import anyio
from anyio.abc import TaskGroup

__all__ = ["Deadlines"]


class _Limit:
    __slots__ = ("scopes", "watcher")

    def __init__(self) -> None:
        self.scopes: dict[anyio.CancelScope, float] = {}  # in deadline order
        self.watcher: anyio.CancelScope | None = None  # the watcher task's, while it runs


class Deadlines:
    """Cancels each watched scope ``seconds`` after :meth:`watch` unless :meth:`forget` came
    first; the watchers run in ``task_group``: call :meth:`close` before it exits."""

    __slots__ = ("_closed", "_limits", "_tg")

    def __init__(self, task_group: TaskGroup) -> None:
        self._tg = task_group
        self._limits: dict[float, _Limit] = {}
        self._closed = False

    def watch(self, scope: anyio.CancelScope, seconds: float) -> float:
        """Cancel ``scope`` in ``seconds`` (anyio's clock); returns that deadline."""
        # The event loop's clock is time.monotonic() (uvloop's, to the millisecond), read
        # here without anyio.current_time()'s look-up of the running backend (per call).
        deadline = time.monotonic() + seconds
        if deadline == math.inf:
            return deadline
        if self._closed:  # the watchers are gone: the scope's own timer
            scope.deadline = min(scope.deadline, deadline)
            return deadline
        limit = self._limits.get(seconds)
        if limit is None:
            limit = self._limits[seconds] = _Limit()
        limit.scopes[scope] = deadline
        if limit.watcher is None:
            limit.watcher = anyio.CancelScope()
            self._tg.start_soon(self._watch, seconds, limit)
        return deadline

    def forget(self, scope: anyio.CancelScope, seconds: float) -> None:
        """``scope`` has ended and needs no cancelling (the watcher stays asleep, so a steady
        stream of calls costs no timer and no task per call)."""
        limit = self._limits.get(seconds)
        if limit is not None:
            limit.scopes.pop(scope, None)

    def watched(self) -> int:
        """Scopes waiting for their deadline now."""
        return sum(len(limit.scopes) for limit in self._limits.values())

    def close(self) -> None:
        """End the watchers; scopes still watched get their own deadline instead."""
        self._closed = True
        for limit in self._limits.values():
            if limit.watcher is not None:
                limit.watcher.cancel()
            for scope, deadline in limit.scopes.items():
                scope.deadline = min(scope.deadline, deadline)
        self._limits.clear()

    async def _watch(self, seconds: float, limit: _Limit) -> None:
        scopes = limit.scopes
        assert limit.watcher is not None
        try:
            with limit.watcher:
                while True:
                    now = anyio.current_time()
                    if not scopes:
                        # Linger: a scope watched from now on is due at now + seconds or
                        # later, so waking then is never late for it.
                        await anyio.sleep_until(now + seconds)
                        if not scopes:
                            break
                        continue
                    scope = next(iter(scopes))
                    deadline = scopes[scope]
                    if deadline > now:
                        await anyio.sleep_until(deadline)
                        continue
                    del scopes[scope]
                    scope.cancel()
        finally:
            limit.watcher = None
            if not scopes and self._limits.get(seconds) is limit:
                del self._limits[seconds]
