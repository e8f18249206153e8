"""The tool executor actor: runs approved tool calls and answers with one result per call.

An observer (settling publishes never wait for it) of four messages:

* ``RunStarted`` sets up the run: its folder, the tools it enables, its result cache.
* ``ToolExecute`` runs one reply's calls concurrently (at most ``max_parallel_calls`` at a
  time) and publishes their ``ToolResult`` in call order; a reply whose calls can all be
  answered at once (plain-``def`` tools, cache hits, unknown tools) inside the handler.
* ``ToolsCancel`` starts no more calls of that turn and cancels running ones after
  ``grace_seconds``; finished calls keep their result, the others are ``aborted`` with
  ``executed=False``.
* ``RunFinished`` cancels what the run still has running, silently, and drops its state;
  the folders its tools made on the host (``ToolContext.temporary``) are removed then, or,
  for a pipeline's stage run (``PIPELINE.STAGE``), when ``RunFinished`` of the pipeline
  comes (its last stage uses what the earlier ones made), or when the executor stops.

Idempotent tools' results are cached per run (``docs/truncation-and-cache.md``: what is
stored, calls in flight shared, the ``loop.cache_hits`` stop). Errors are results, never
exceptions (:mod:`actors.tools.invoke`).
"""

from __future__ import annotations

import math
import shutil
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Final, Literal, NamedTuple, assert_never

import anyio
from anyio.abc import TaskStatus

from actors.deadlines import Deadlines
from actors.fingerprint import fingerprint_call, fingerprint_result
from actors.tools.cache import CacheSettings, ResultCache
from actors.tools.context import ToolContext
from actors.tools.invoke import Outcome, invoke, invoke_now, timed_out, unknown_tool
from actors.tools.limits import ToolExecutorSettings
from actors.tools.registry import Tool, ToolRegistry
from actors.workers import Workers
from bus import (
    Bus,
    Message,
    RunFinished,
    RunStarted,
    ToolCall,
    ToolExecute,
    ToolResult,
    ToolsCancel,
    aio_seam,
    stop_signal,
)

__all__ = ["ToolCacheStatistics", "ToolExecutor", "ToolExecutorStatistics"]

SUBSCRIBER_NAME: Final = "tool_executor"

LOOP_CAUSE: Final = "loop.cache_hits"

TOOL_SETS_KEPT: Final = 256
"""Distinct sets of enabled tools kept for runs to share."""


class ToolExecutorStatistics(NamedTuple):
    """How busy the executor is (exported as gauges)."""

    runs: int
    batches: int
    calls_running: int


class ToolCacheStatistics(NamedTuple):
    """The result caches of every run (``entries`` is a gauge, the rest count up)."""

    entries: int
    hits: int
    misses: int
    loops: int


class _Slot:
    """One call of a batch: its result once known, and its cancel scope while running."""

    __slots__ = (
        "_finished",
        "_waiters",
        "cache",
        "call",
        "fingerprint",
        "leader",
        "ready",
        "result",
        "scope",
        "tool",
    )

    def __init__(self, call: ToolCall, fingerprint: str) -> None:
        self.call = call
        self.fingerprint = fingerprint
        self.tool: Tool[Any] | None = None  # None: not registered or not enabled
        self._finished = False
        self._waiters: aio_seam.Event | None = None  # made only if someone waits
        self.result: ToolResult | None = None
        self.scope: anyio.CancelScope | None = None
        self.cache: Literal["hit", "miss", "none"] = "none"
        # Decided by the cache before the call runs: the answer (a hit or a refused loop),
        # or the identical call in flight to wait for.
        self.ready: Outcome | None = None
        self.leader: _Slot | None = None

    def set_done(self) -> None:
        self._finished = True
        if self._waiters is not None:
            self._waiters.set()

    async def wait_done(self) -> None:
        """Until the call has its result (a single call's batch never waits here)."""
        if self._finished:
            return
        if self._waiters is None:
            self._waiters = aio_seam.Event()
        await self._waiters.wait()


class _Batch:
    """The calls of one :class:`~bus.ToolExecute`; a :class:`~actors.workers.Job` of the
    executor's pool when they cannot all be answered at once."""

    __slots__ = (
        "_executor",
        "_for_run",
        "_limiter",
        "_max_parallel",
        "abort_deadline",
        "grace",
        "reason",
        "silent",
        "slots",
        "stores",
        "turn",
    )

    def __init__(self, msg: ToolExecute, max_parallel: int) -> None:
        self._executor: ToolExecutor | None = None  # set by bind(), until run() starts
        self._for_run: _Run | None = None
        self.turn = msg.turn
        calls, prints = msg.calls, msg.fingerprints
        if len(calls) == 1 and prints:  # the common case, without a generator
            self.slots: tuple[_Slot, ...] = (_Slot(calls[0], prints[0]),)
        else:
            self.slots = tuple(
                _Slot(
                    call,
                    prints[i] if i < len(prints) else fingerprint_call(call.name, call.arguments),
                )
                for i, call in enumerate(calls)
            )
        self._max_parallel = max_parallel
        self._limiter: anyio.CapacityLimiter | None = None
        self.abort_deadline = math.inf
        self.reason: str | None = None
        self.grace = 0.0
        self.silent = False
        self.stores = True  # False when a call of the batch may have side effects

    def bind(self, executor: ToolExecutor, run: _Run) -> _Batch:
        """This batch as a job of ``executor``'s pool, for ``run``."""
        self._executor, self._for_run = executor, run
        return self

    def run(self, scope: anyio.CancelScope) -> Awaitable[None]:
        """The pool's entry point (after :meth:`bind`): the calls, in the worker's scope."""
        executor, run = self._executor, self._for_run
        assert executor is not None
        assert run is not None
        self._executor = self._for_run = None  # no cycle through run.batches
        return executor._run_batch(run, self, scope)

    @property
    def limiter(self) -> anyio.CapacityLimiter:
        """At most ``max_parallel_calls`` calls of this batch at a time (made when needed)."""
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(self._max_parallel)
        return self._limiter

    def abort_reason(self, timeout_at: float) -> str | None:
        """The abort's reason when a call's scope that fired was cancelled by the abort, not
        by its timeout; None otherwise (a method: ``docs/performance.md``, "What compiling
        asked of the code")."""
        if self.reason is not None and self.abort_deadline <= timeout_at:
            return self.reason
        return None

    def cancel(self, grace: float, reason: str) -> None:
        """Start nothing more; cancel running calls after ``grace`` seconds (idempotent)."""
        if self.reason is None:
            self.reason, self.grace = reason, max(grace, 0.0)
        deadline = time.monotonic() + max(grace, 0.0)
        if deadline >= self.abort_deadline:
            return
        self.abort_deadline = deadline
        for slot in self.slots:
            if slot.scope is not None:
                slot.scope.deadline = min(slot.scope.deadline, deadline)


def remove_folders(folders: list[Path]) -> None:
    """Remove ``folders`` and what they hold, here and now (a few small files each:
    ``make_figure`` passes back at most :data:`~actors.tools.sandbox.outputs.MAX_FILES`
    per call); one that is gone already is fine."""
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)


class _Run:
    __slots__ = ("batches", "cache", "ctx", "enabled", "in_flight", "loop_stopped", "timeout")

    def __init__(
        self, ctx: ToolContext, enabled: frozenset[str], cache: ResultCache, timeout: float
    ) -> None:
        self.ctx = ctx
        self.enabled = enabled
        self.timeout = timeout  # seconds for tools without a limit of their own; 0: default
        self.batches: list[_Batch] = []
        self.cache = cache
        self.in_flight: dict[str, _Slot] = {}  # fingerprint -> the call that computes it
        self.loop_stopped = False


class ToolExecutor:
    """Runs tool calls for every run of a runtime; per-run state keyed by ``run_id``.

    :param bus: where calls arrive and results go.
    :param registry: the tools; a run may call those of them it enables in ``RunStarted``.
    :param settings: deadlines, result cap, parallelism and file limits.
    :param clock: monotonic seconds for the result caches' TTL (injected by tests).
    """

    def __init__(
        self,
        bus: Bus,
        registry: ToolRegistry,
        settings: ToolExecutorSettings | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._bus = bus
        self._registry = registry
        self._settings = settings or ToolExecutorSettings()
        self._clock = clock
        self._runs: dict[str, _Run] = {}
        self._kept: dict[str, list[Path]] = {}  # pipeline run id -> its stages' folders
        self._tool_sets: dict[tuple[str, ...], frozenset[str]] = {}
        self._workers: Workers | None = None
        self._deadlines: Deadlines | None = None
        self._hits = self._misses = self._loops = 0

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Serve until the bus closes (``task_status.started()`` once subscribed), then abort
        the calls still running: it returns with no task left behind."""
        handlers = self.handlers()
        sub = self._bus.subscribe(*handlers, name=SUBSCRIBER_NAME, inline=True)
        try:
            async with anyio.create_task_group() as tg:
                self._workers = Workers(tg)
                self._deadlines = Deadlines(tg)
                task_status.started()
                try:
                    await sub.serve_by_type(handlers)
                    for run in self._runs.values():
                        for batch in run.batches:
                            batch.cancel(0.0, "the tool executor stopped")
                finally:
                    self._workers.close()
                    self._deadlines.close()
        finally:
            self._workers = None
            self._deadlines = None
            for run in self._runs.values():
                run.ctx.finished = True
                remove_folders(run.ctx.temporary)
            for kept in self._kept.values():
                remove_folders(kept)
            self._runs.clear()
            self._kept.clear()
            self._bus.unsubscribe(sub)

    def statistics(self) -> ToolExecutorStatistics:
        """Runs known, batches in flight, calls running now."""
        batches = [batch for run in self._runs.values() for batch in run.batches]
        running = sum(slot.scope is not None for batch in batches for slot in batch.slots)
        return ToolExecutorStatistics(len(self._runs), len(batches), running)

    def workers_busy(self) -> int:
        """Pool workers running a batch now (idle ones wait for the next batch)."""
        return self._workers.busy() if self._workers is not None else 0

    def workers_started(self) -> int:
        """Pool workers started since :meth:`run` began (batches answered inside the
        handler start none)."""
        return self._workers.started if self._workers is not None else 0

    def cache_statistics(self) -> ToolCacheStatistics:
        """Cached results held now (every run), and hits, misses and loops so far."""
        entries = sum(len(run.cache) for run in self._runs.values())
        return ToolCacheStatistics(entries, self._hits, self._misses, self._loops)

    # ------------------------------------------------------------------ messages

    def handlers(self) -> dict[type[Message], Callable[[Any], None]]:
        """The function of each message type the executor handles (what the bus calls)."""
        return {
            ToolExecute: self._execute,
            RunStarted: self._run_started,
            ToolsCancel: self._cancel,
            RunFinished: self._run_finished,
        }

    def _run_started(self, msg: RunStarted) -> None:
        if msg.run_id in self._runs:
            return
        ctx = ToolContext(
            msg.run_id, Path(msg.folder) if msg.folder else None, self._settings.limits
        )
        enabled = self._tool_sets.get(msg.tools)
        if enabled is None:  # runs with the same tools share one set
            if len(self._tool_sets) >= TOOL_SETS_KEPT:
                self._tool_sets.clear()
            enabled = self._tool_sets[msg.tools] = frozenset(msg.tools)
        # Out-of-range cache settings raise (naming the key), which fails the run as an actor
        # failure; the config loader refuses them long before.
        settings = CacheSettings(msg.max_cache_hits, msg.cache_ttl_seconds, msg.cache_max_entries)
        cache = ResultCache(settings, clock=self._clock)
        self._runs[msg.run_id] = _Run(ctx, enabled, cache, msg.tool_timeout_seconds)

    def _cancel(self, msg: ToolsCancel) -> None:
        if run := self._runs.get(msg.run_id):
            for batch in run.batches:
                if batch.turn == msg.turn:
                    batch.cancel(msg.grace_seconds, msg.reason)

    def _run_finished(self, msg: RunFinished) -> None:
        made = self._kept.pop(msg.run_id, [])
        if run := self._runs.pop(msg.run_id, None):
            run.ctx.finished = True
            for batch in run.batches:
                batch.silent = True
                batch.cancel(0.0, "the run finished")
            made += run.ctx.temporary
        pipeline, dot, _ = msg.run_id.partition(".")
        if dot and made:
            self._kept.setdefault(pipeline, []).extend(made)
        else:
            remove_folders(made)

    def _execute(self, msg: ToolExecute) -> None:
        batch = _Batch(msg, self._settings.max_parallel_calls)
        run = self._runs.get(msg.run_id)
        workers = self._workers
        if run is None or workers is None:
            for slot in batch.slots:
                outcome = Outcome(
                    f"run {msg.run_id!r} is not known to the tool executor",
                    is_error=True,
                    error_kind="unknown_run",
                    executed=False,
                )
                self._bus.publish_nowait(self._result(msg.run_id, batch, slot, outcome, 0.0))
            return
        if self._plan(run, batch):
            self._run_now(run, batch)
            return
        run.batches.append(batch)
        workers.start(batch.bind(self, run))

    # ------------------------------------------------------------------ result cache

    def _plan(self, run: _Run, batch: _Batch) -> bool:
        """Find each call's tool and decide, in call order and before anything runs, which
        calls the cache answers. True when every call can be answered now, without an
        await: a plain-``def`` tool, an answer ready (a hit, a refused loop) or no tool,
        and no call waiting for an identical one in flight."""
        registry, enabled = self._registry, run.enabled
        now = True
        side_effects = False
        for slot in batch.slots:
            name = slot.call.name
            tool = slot.tool = registry.get(name) if name in enabled else None
            if tool is not None:
                side_effects = side_effects or not tool.idempotent
                now = now and tool.inline
        if not run.cache.enabled:
            return now
        if side_effects:
            run.cache.clear()
            batch.stores = False
        now = True
        for slot in batch.slots:
            tool = slot.tool
            if tool is None:
                continue
            if tool.idempotent:
                self._claim(run, batch, slot)
            if slot.leader is not None or (slot.ready is None and not tool.inline):
                now = False
        return now

    def _claim(self, run: _Run, batch: _Batch, slot: _Slot) -> None:
        """Answer ``slot`` from the cache, refuse it as a loop, make it wait for the
        identical call in flight, or make it the one that runs (and fills the cache)."""
        key = slot.fingerprint
        leader = run.in_flight.get(key)
        if leader is not None and leader is not slot:
            slot.leader = leader
            return
        found = run.cache.lookup(key)
        match found.status:
            case "hit":
                self._hits += 1
                slot.cache = "hit"
                slot.ready = Outcome(found.content)
            case "loop":
                self._loops += 1
                slot.cache = "none"
                slot.ready = self._loop(run, slot, found.hits)
            case "miss":
                self._misses += 1
                slot.cache = "miss"
                if batch.stores:
                    run.in_flight[key] = slot
            case _:
                assert_never(found.status)

    def _loop(self, run: _Run, slot: _Slot, hits: int) -> Outcome:
        call = slot.call
        allowed = run.cache.settings.max_hits
        if not run.loop_stopped:
            run.loop_stopped = True
            self._bus.publish_nowait(
                stop_signal(
                    LOOP_CAUSE,
                    run_id=run.ctx.run_id,
                    source=SUBSCRIBER_NAME,
                    detail=(
                        f"{call.name} was called again with the same arguments after its "
                        f"cached result had been returned {allowed} time(s); this call "
                        f"(hit {hits}) was not answered."
                    ),
                )
            )
        return Outcome(
            f"not run: {call.name} already answered these exact arguments "
            f"{allowed + 1} time(s) (once run, then from the cache); asking again is "
            f"treated as a loop ({LOOP_CAUSE}) and the run is stopping.",
            is_error=True,
            error_kind="loop",
            executed=False,
        )

    def _run_now(self, run: _Run, batch: _Batch) -> None:
        """Answer every call of ``batch`` here, in call order (see :meth:`_plan`)."""
        run_id = run.ctx.run_id
        publish = self._bus.publish_nowait
        try:
            for slot in batch.slots:
                started = time.monotonic()
                outcome = slot.ready
                if outcome is None:
                    tool = slot.tool
                    if tool is None:
                        outcome = self._unknown(run, slot.call.name)
                    else:
                        max_chars = self._settings.max_result_chars
                        outcome = invoke_now(
                            tool, slot.call.arguments, run.ctx, max_chars=max_chars
                        )
                    self._fill(run, batch, slot, outcome)
                duration = time.monotonic() - started
                publish(self._result(run_id, batch, slot, outcome, duration))
        except BaseException:  # not from a tool (invoke_now answers those): let no call
            for slot in batch.slots:  # that never ran keep identical later calls waiting
                if run.in_flight.get(slot.fingerprint) is slot:
                    del run.in_flight[slot.fingerprint]
            raise

    def _unknown(self, run: _Run, name: str) -> Outcome:
        return unknown_tool(name, (n for n in run.enabled if n in self._registry))

    def _fill(self, run: _Run, batch: _Batch, slot: _Slot, outcome: Outcome) -> None:
        if run.in_flight.get(slot.fingerprint) is slot:
            del run.in_flight[slot.fingerprint]
            if batch.stores and outcome.executed and not outcome.is_error:
                run.cache.store(slot.fingerprint, outcome.content)

    # ------------------------------------------------------------------ calls

    async def _run_batch(self, run: _Run, batch: _Batch, scope: anyio.CancelScope) -> None:
        """The batch's calls; a single call runs in this task under ``scope`` (the pool
        worker's), several in tasks of their own."""
        try:
            if len(batch.slots) == 1:  # the common case: no task group, no scope of its own
                slot = batch.slots[0]
                await self._run_call(run, batch, slot, scope)
                if slot.result is not None and not batch.silent:
                    self._bus.publish_nowait(slot.result)  # one answer: never held back
                return
            async with anyio.create_task_group() as tg:
                for slot in batch.slots:
                    tg.start_soon(self._run_scoped_call, run, batch, slot)
                for slot in batch.slots:
                    await slot.wait_done()
                    if slot.result is not None and not batch.silent:
                        await self._bus.publish(slot.result)
        finally:
            if batch in run.batches:
                run.batches.remove(batch)

    async def _run_scoped_call(self, run: _Run, batch: _Batch, slot: _Slot) -> None:
        with anyio.CancelScope() as scope:
            await self._run_call(run, batch, slot, scope)

    async def _run_call(
        self, run: _Run, batch: _Batch, slot: _Slot, scope: anyio.CancelScope
    ) -> None:
        """The call's result into ``slot.result``; ``scope`` (entered by the caller, this
        call's alone while it runs) carries the tool's time limit and the batch's abort."""
        started = time.monotonic()
        try:
            while slot.leader is not None:  # the identical call in flight, then the cache
                await slot.leader.wait_done()
                slot.leader = None
                self._claim(run, batch, slot)
            outcome = slot.ready
            if outcome is None:
                if len(batch.slots) == 1:  # max_parallel_calls >= 1: the limiter never waits
                    started = time.monotonic()
                    outcome = await self._outcome(run, batch, slot, scope)
                else:
                    async with batch.limiter:
                        started = time.monotonic()
                        outcome = await self._outcome(run, batch, slot, scope)
                self._fill(run, batch, slot, outcome)
            duration = time.monotonic() - started
            slot.result = self._result(run.ctx.run_id, batch, slot, outcome, duration)
        finally:
            # Cancelled from outside (the executor's task group): the call still gets
            # its one result, so nothing that reads the slot waits forever.
            if slot.result is None:
                outcome = _aborted(slot.call, "because its task was cancelled")
                duration = time.monotonic() - started
                slot.result = self._result(run.ctx.run_id, batch, slot, outcome, duration)
            if run.in_flight.get(slot.fingerprint) is slot:
                del run.in_flight[slot.fingerprint]
            slot.set_done()

    async def _outcome(
        self, run: _Run, batch: _Batch, slot: _Slot, scope: anyio.CancelScope
    ) -> Outcome:
        call = slot.call
        if batch.reason is not None:
            return _aborted(call, f"before it started: {batch.reason}")
        tool = slot.tool
        if tool is None:
            return self._unknown(run, call.name)
        max_chars = self._settings.max_result_chars
        if tool.inline:  # nothing to cancel or time out
            return invoke_now(tool, call.arguments, run.ctx, max_chars=max_chars)
        timeout = tool.timeout_seconds or run.timeout or self._settings.default_timeout_seconds
        # One scope for both limits: the tool's time limit, kept by the shared deadlines
        # (no timer per call), and the batch's abort deadline, which cancel() lowers.
        deadlines = self._deadlines
        assert deadlines is not None  # a call runs in a worker of run()
        timeout_at = deadlines.watch(scope, timeout)
        slot.scope = scope
        try:
            return await invoke(tool, call.arguments, run.ctx, max_chars=max_chars)
        except anyio.get_cancelled_exc_class():
            if not scope.cancel_called:
                raise  # from outside: _run_call's finally answers
            # The call's own limit or its abort (what a `with scope:` would catch). Nothing
            # awaits in the cancelled scope after this: the result is published at once, and
            # the worker (or _run_scoped_call) leaves the scope.
        finally:
            slot.scope = None
            deadlines.forget(scope, timeout)
        reason = batch.abort_reason(timeout_at)
        if reason is not None:
            return _aborted(call, f"cancelled after a grace of {batch.grace:g} s: {reason}")
        return timed_out(tool.name, timeout)

    @staticmethod
    def _result(
        run_id: str, batch: _Batch, slot: _Slot, outcome: Outcome, duration: float
    ) -> ToolResult:
        return ToolResult(
            run_id=run_id,
            turn=batch.turn,
            call_id=slot.call.id,
            tool=slot.call.name,
            content=outcome.content,
            is_error=outcome.is_error,
            error_kind=outcome.error_kind,
            duration_seconds=duration,
            fingerprint=slot.fingerprint,
            result_fingerprint=fingerprint_result(outcome.content, is_error=outcome.is_error),
            cache=slot.cache,
            executed=outcome.executed,
        )


def _aborted(call: ToolCall, why: str) -> Outcome:
    return Outcome(
        f"tool call {call.name} aborted {why}", is_error=True, error_kind="aborted", executed=False
    )
