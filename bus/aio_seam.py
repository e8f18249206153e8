"""The one module of the packages that uses asyncio directly: ruff bans ``import asyncio``
everywhere else (``pyproject.toml``), so what anyio does not offer is found here.

loopfuse runs on anyio's asyncio backend. anyio has no future, no loop-thread hand-off that
returns at once, and no protocol classes, and its event is dearer (figures:
``docs/performance.md``, "Figures behind the code"):

* :class:`Future`: a one-shot waiter settled by a plain callback, with no task of its own
  (the bus's mailboxes, the runtime's slots and waiters, the tool workers' idle queue, the
  writer thread's results). anyio has none.
* :class:`Event`: made lazily for a wait that rarely happens (a run's followers, a tool
  call waiting for its twin, a mailbox's reader). ``anyio.Event`` looks up its backend per
  construction and yields to the loop on a wait that is already set.
* :func:`running_loop` and :func:`run_in_executor`: a thread's result handed back with
  ``loop.call_soon_threadsafe`` (the store's writer thread) and the tools' own pool
  (a hop cheaper than ``anyio.to_thread.run_sync``). ``anyio.from_thread`` blocks the
  thread until the loop has run the call.
* :class:`Protocol`, :class:`Transport`, :class:`TimerHandle`, :class:`AbstractEventLoop`:
  the types of uvicorn's asyncio protocol, which the daemon's connection limits subclass.

The one other asyncio-bound code is the model client, ``aiohttp``'s session, which only
``actors/llm/transport.py`` imports (ruff bans ``aiohttp`` elsewhere; ``bus`` may not hold
it: it imports no HTTP package).
"""

from __future__ import annotations

import asyncio
from asyncio import AbstractEventLoop, Event, Future, Protocol, TimerHandle, Transport
from collections.abc import Callable
from concurrent.futures import Executor
from typing import TypeVar

__all__ = [
    "AbstractEventLoop",
    "Event",
    "Future",
    "Protocol",
    "TimerHandle",
    "Transport",
    "run_in_executor",
    "running_loop",
]

T = TypeVar("T")


def running_loop() -> AbstractEventLoop:
    """The running event loop (anyio's asyncio backend's)."""
    return asyncio.get_running_loop()


async def run_in_executor(executor: Executor, function: Callable[[], T]) -> T:
    """``function()`` in a thread of ``executor``; its result (or exception) returned here.
    A caller cancelled meanwhile is released at once; the call's result is dropped."""
    return await asyncio.get_running_loop().run_in_executor(executor, function)
