"""Orchestration memory per concurrent run: runs parked mid-run on a model that never answers.

Each run is started through the runtime (every monitor on) and parks at its first model
request, waiting for a reply that never comes. Memory is measured twice: the Python heap
growth (``tracemalloc``) and the resident set growth (``/proc/self/statm``), divided by the
runs. The transcript at that point is the task message alone (reported with the rest; it
is about 100 bytes). For comparison, :func:`bare_parked` parks plain asyncio tasks holding
a one-message transcript dict.
"""

from __future__ import annotations

import gc
import os
import tracemalloc
from typing import Any, NamedTuple, assert_never

import anyio
from anyio.abc import TaskStatus

from bench.loops import bench_overrides, bench_runtime
from bus import Bus, ModelCancel, ModelReply, ModelRequest
from orchestrator.runtime import RunSpec

__all__ = ["MemoryFigures", "bare_parked", "loopfuse_parked"]


class MemoryFigures(NamedTuple):
    """Bytes per parked run."""

    runs: int
    heap_bytes_per_run: float
    rss_bytes_per_run: float

    @property
    def kb_per_run(self) -> float:
        return self.heap_bytes_per_run / 1024


def _rss() -> int:
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:  # not Linux: RSS is not reported
        return 0


class _Silent:
    """A model that never answers a request (only a cancellation, with an aborted reply)."""

    def __init__(self, bus: Bus) -> None:
        self._bus = bus
        self.requests = 0
        self._waiting: list[tuple[int, anyio.Event]] = []

    async def parked(self, requests: int) -> None:
        """Wait until ``requests`` requests arrived in all."""
        if self.requests < requests:
            event = anyio.Event()
            self._waiting.append((requests, event))
            await event.wait()

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        sub = self._bus.subscribe(ModelRequest, ModelCancel, name="silent_model")
        try:
            await sub.serve(self._handle, task_status=task_status)
        finally:
            self._bus.unsubscribe(sub)

    def _handle(self, msg: ModelRequest | ModelCancel) -> None:
        match msg:
            case ModelRequest():
                self.requests += 1
                for wanted, event in self._waiting:
                    if self.requests >= wanted:
                        event.set()
            case ModelCancel():
                self._bus.publish_nowait(
                    ModelReply(run_id=msg.run_id, turn=msg.turn, text="", aborted=True)
                )
            case _:
                assert_never(msg)


def _measure_start() -> tuple[int, int]:
    gc.collect()
    return tracemalloc.get_traced_memory()[0], _rss()


def _per_run(start: tuple[int, int], runs: int) -> MemoryFigures:
    gc.collect()
    heap, rss = tracemalloc.get_traced_memory()[0], _rss()
    return MemoryFigures(runs, (heap - start[0]) / runs, (rss - start[1]) / runs)


async def loopfuse_parked(runs: int) -> MemoryFigures:
    """``runs`` loopfuse runs parked at their first model request. One run parks first,
    unmeasured: what the first run loads once (e.g. the tokenizer's ranks, ~50 MB) is
    not memory per run."""
    silent: list[_Silent] = []

    def model(bus: Bus) -> _Silent:
        silent.append(_Silent(bus))
        return silent[0]

    runtime = bench_runtime(runs + 1, 20, model)
    spec = RunSpec(task="Echo the steps.", overrides=bench_overrides(20))
    tracemalloc.start()
    try:
        async with runtime:
            await runtime.start(spec)
            await silent[0].parked(1)
            start = _measure_start()
            for _ in range(runs):
                await runtime.start(spec)
            await silent[0].parked(runs + 1)
            figures = _per_run(start, runs)
    finally:
        tracemalloc.stop()
    return figures


async def bare_parked(runs: int) -> MemoryFigures:
    """``runs`` plain tasks, each holding a one-message transcript, parked on an event."""
    release = anyio.Event()
    parked = 0
    all_parked = anyio.Event()

    async def one() -> None:
        nonlocal parked
        messages: list[dict[str, Any]] = [{"role": "user", "content": "Echo the steps."}]
        parked += 1
        if parked == runs:
            all_parked.set()
        await release.wait()
        messages.clear()

    tracemalloc.start()
    try:
        start = _measure_start()
        async with anyio.create_task_group() as tg:
            for _ in range(runs):
                tg.start_soon(one)
            await all_parked.wait()
            figures = _per_run(start, runs)
            release.set()
    finally:
        tracemalloc.stop()
    return figures
