"""Blocking file-system work of the built-in tools, in threads of a pool of their own.

``anyio.to_thread.run_sync`` (a capacity limiter, a checkpoint, a cancel scope, a context
copy, its worker's queue) costs several times a :class:`concurrent.futures.ThreadPoolExecutor`
hop (``docs/performance.md``), and every ``list_dir``, ``read_file`` and ``read_image``
call makes one, so the tools hand their work to :data:`POOL` instead.

A caller cancelled meanwhile (a tool timeout, an abort) is released at once; the thread
finishes the call (a bounded directory listing or file read) and its result is dropped.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Final, TypeVar

from bus import aio_seam

__all__ = ["POOL", "run_in_thread"]

T = TypeVar("T")

POOL: Final = ThreadPoolExecutor(thread_name_prefix="loopfuse-tools")
"""The tools' threads (``concurrent.futures``' default size: CPUs + 4, at most 32), started
as calls need them."""


async def run_in_thread(function: Callable[[], T]) -> T:
    """``function()`` in a thread of :data:`POOL`, its result (or exception) returned here
    (the loop's own executor hand-off: :mod:`bus.aio_seam`)."""
    return await aio_seam.run_in_executor(POOL, function)
