"""The realistic shape of the overhead benchmark: what a deployment's turn looks like.

The cheap shape (``bench.loops.loopfuse_loop``) answers each model request inside its bus
handler and runs a plain-``def`` ``echo``. Here, as in a deployment and as the frameworks
are measured: the model actor hands each request to a pooled worker task whose cancel
scope carries its deadline, as the LLM caller does (:mod:`actors.llm.caller`), the worker
yields to the event loop once (the reply's I/O) and publishes the reply; ``echo`` is an
``async def``. Beside the CPU per turn: the share of wall time the cyclic garbage collector
takes (:class:`GcClock`), and the resident memory per run parked after a few turns
(:func:`parked_after`).
"""

from __future__ import annotations

import gc
import time
import tracemalloc
from collections.abc import Awaitable, Callable
from typing import Any, Final, NamedTuple

import anyio
import anyio.lowlevel
from anyio.abc import TaskStatus

from actors.deadlines import Deadlines
from actors.workers import Workers
from bench.loops import Sample, _Clock, bench_overrides, bench_runtime
from bench.memory import _rss
from bench.scripted_model import Script, echo_script
from bus import Bus, Message, ModelCancel, ModelReply, ModelRequest
from orchestrator.runtime import RunSpec

__all__ = [
    "GcClock",
    "ParkedFigures",
    "RealisticSample",
    "WorkerModel",
    "parked_after",
    "realistic_loop",
]

CALL_DEADLINE_SECONDS: Final = 600.0


class _Request:
    """A request in flight, as the LLM caller's ``_Call``: the pool's job."""

    __slots__ = ("cancelled", "model", "request", "scope")

    def __init__(self, model: WorkerModel | None, request: ModelRequest) -> None:
        self.model = model  # until the job starts
        self.request = request
        self.scope: anyio.CancelScope | None = None  # the worker's, while the job runs
        self.cancelled = False

    def cancel(self) -> None:
        """Cancel the request (before it started too: it then answers at once)."""
        self.cancelled = True
        if self.scope is not None:
            self.scope.cancel()

    def run(self, scope: anyio.CancelScope) -> Awaitable[None]:
        model = self.model
        assert model is not None
        self.model = None
        return model._serve(self, scope)


class WorkerModel:
    """A model actor shaped like the LLM caller: each request runs in a pooled worker task
    under the worker's cancel scope (its deadline kept as the caller keeps it, cancelled by
    :class:`bus.ModelCancel`), waits once on the event loop, then publishes its reply.
    ``answers`` limits how many requests of a run get a reply (the rest park until
    cancelled)."""

    def __init__(self, bus: Bus, script: Script, *, answers: int | None = None) -> None:
        self._bus = bus
        self._script = script
        self._answers = answers
        self._active: dict[tuple[str, int], _Request] = {}
        self._workers: Workers | None = None
        self._deadlines: Deadlines | None = None
        self.requests = 0
        self._parked = 0
        self._waiting: list[tuple[int, anyio.Event]] = []

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        handlers = self.handlers()
        sub = self._bus.subscribe(*handlers, name="worker_model", inline=True)
        try:
            async with anyio.create_task_group() as tg:
                self._workers = Workers(tg)
                self._deadlines = Deadlines(tg)
                try:
                    await sub.serve_by_type(handlers, task_status=task_status)
                    for job in list(self._active.values()):
                        job.cancel()
                finally:
                    self._workers.close()
                    self._deadlines.close()
        finally:
            self._bus.unsubscribe(sub)

    def handlers(self) -> dict[type[Message], Callable[[Any], None]]:
        return {ModelRequest: self._start, ModelCancel: self._cancel}

    async def parked(self, runs: int) -> None:
        """Wait until ``runs`` requests are parked (never to be answered)."""
        if self._parked < runs:
            event = anyio.Event()
            self._waiting.append((runs, event))
            await event.wait()

    def _start(self, request: ModelRequest) -> None:
        self.requests += 1
        assert self._workers is not None
        job = _Request(self, request)
        self._active[(request.run_id, request.turn)] = job
        self._workers.start(job)

    def _cancel(self, msg: ModelCancel) -> None:
        job = self._active.get((msg.run_id, msg.turn))
        if job is not None:
            job.cancel()

    async def _serve(self, job: _Request, scope: anyio.CancelScope) -> None:
        request = job.request
        deadlines = self._deadlines
        assert deadlines is not None
        deadlines.watch(scope, CALL_DEADLINE_SECONDS)
        job.scope = scope
        reply: ModelReply | None = None
        try:
            if job.cancelled:  # before it started
                return
            if self._answers is not None and request.turn > self._answers:
                self._park()
                await anyio.sleep_forever()
            await anyio.lowlevel.checkpoint()  # the reply's I/O
            reply = self._script(request)
            self._bus.publish_nowait(reply)
        finally:
            job.scope = None
            deadlines.forget(scope, CALL_DEADLINE_SECONDS)
            del self._active[(request.run_id, request.turn)]
            if reply is None:  # cancelled (the worker's scope catches it)
                aborted = ModelReply(
                    run_id=request.run_id, turn=request.turn, text="", aborted=True
                )
                self._bus.publish_nowait(aborted)

    def _park(self) -> None:
        self._parked += 1
        for wanted, event in self._waiting:
            if self._parked >= wanted:
                event.set()


class GcClock:
    """Wall time spent in the cyclic garbage collector while it is installed."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.collections = 0
        self._began = 0.0

    def __enter__(self) -> GcClock:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc_info: object) -> None:
        gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._began
            self.collections += 1


class RealisticSample(NamedTuple):
    """One repetition of a shape, with the garbage collector's share of its wall time."""

    sample: Sample
    gc_share: float
    collections: int


async def realistic_loop(
    runs: int, turns: int, *, realistic: bool = True, events: bool = False
) -> RealisticSample:
    """``runs`` concurrent runs of ``turns`` turns in the realistic shape (``realistic=False``:
    the cheap one), with the collector's share of the wall time."""
    script = echo_script(turns)
    model = (lambda bus: WorkerModel(bus, script)) if realistic else None
    runtime = bench_runtime(runs, turns, model, async_tool=realistic)
    overrides = bench_overrides(turns)
    async with runtime:
        with GcClock() as collector:
            clock = _Clock()
            handles = [
                await runtime.start(RunSpec(task="Echo the steps.", overrides=overrides))
                for _ in range(runs)
            ]
            results = [await handle.result() for handle in handles]
            sample = clock.sample(sum(result.llm_requests for result in results))
    for result in results:
        if result.cause != "model.end_turn" or result.turns != turns:
            raise RuntimeError(f"bench run ended {result.cause} after {result.turns} turns")
    share = collector.seconds / sample.wall_seconds if sample.wall_seconds else 0.0
    return RealisticSample(sample, share, collector.collections)


class ParkedFigures(NamedTuple):
    """Memory per run parked after ``turns`` answered turns: the Python heap's growth
    (``tracemalloc``) and the resident set's (which pages freed earlier in the process can
    hide: read it from a fresh process)."""

    runs: int
    turns: int
    heap_bytes_per_run: float
    rss_bytes_per_run: float


async def parked_after(runs: int, turns: int, *, realistic: bool = True) -> ParkedFigures:
    """``runs`` runs of the shape, each parked at its model request after ``turns`` answered
    turns (a transcript of ``turns`` tool calls and results); RSS growth per run. One run
    parks first, unmeasured (what the first run loads once is not memory per run)."""
    models: list[WorkerModel] = []
    script = echo_script(turns + 10)

    def model(bus: Bus) -> WorkerModel:
        models.append(WorkerModel(bus, script, answers=turns))
        return models[0]

    runtime = bench_runtime(runs + 1, turns + 10, model, async_tool=realistic)
    spec = RunSpec(task="Echo the steps.", overrides=bench_overrides(turns + 10))
    tracemalloc.start()
    try:
        async with runtime:
            await runtime.start(spec)
            await models[0].parked(1)
            gc.collect()
            heap, rss = tracemalloc.get_traced_memory()[0], _rss()
            for _ in range(runs):
                await runtime.start(spec)
            await models[0].parked(runs + 1)
            gc.collect()
            heap_after, rss_after = tracemalloc.get_traced_memory()[0], _rss()
    finally:
        tracemalloc.stop()
    return ParkedFigures(runs, turns, (heap_after - heap) / runs, (rss_after - rss) / runs)
