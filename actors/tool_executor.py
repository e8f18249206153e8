"""The tool executor actor: runs approved tool calls and answers with one result per call.

It observes (never answers, so settling publishes do not wait for it) four messages:

* :class:`~bus.RunStarted` sets up the run: its folder and the tools it enables.
* :class:`~bus.ToolExecute` runs the calls of one reply concurrently (at most
  ``max_parallel_calls`` at a time) and publishes their :class:`~bus.ToolResult` in call
  order, so a fast second call waits for the first's result to go out.
* :class:`~bus.ToolsCancel` starts no more calls of that turn, gives running ones
  ``grace_seconds``, then cancels them. Every call still gets exactly one result: finished
  ones keep theirs, the others are ``aborted`` with ``executed=False``.
* :class:`~bus.RunFinished` cancels what the run still has running, silently, and drops its
  state.

Errors are results, never exceptions (see :mod:`actors.tools.invoke`). Every call runs in
the executor's task group; when the bus closes, running calls are aborted and
:meth:`ToolExecutor.run` returns with no task left behind.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Final, NamedTuple, assert_never

import anyio
from anyio.abc import TaskGroup, TaskStatus

from actors.fingerprint import fingerprint_call, fingerprint_result
from actors.tools.context import ToolContext
from actors.tools.invoke import Outcome, invoke, unknown_tool
from actors.tools.limits import ToolExecutorSettings
from actors.tools.registry import ToolRegistry
from bus import Bus, RunFinished, RunStarted, ToolCall, ToolExecute, ToolResult, ToolsCancel

__all__ = ["ToolExecutor", "ToolExecutorStatistics"]

SUBSCRIBER_NAME: Final = "tool_executor"

_Handled = RunStarted | ToolExecute | ToolsCancel | RunFinished


class ToolExecutorStatistics(NamedTuple):
    """How busy the executor is (exported as gauges)."""

    runs: int
    batches: int
    calls_running: int


class _Slot:
    """One call of a batch: its result once known, and its cancel scope while running."""

    __slots__ = ("call", "done", "fingerprint", "result", "scope")

    def __init__(self, call: ToolCall, fingerprint: str) -> None:
        self.call = call
        self.fingerprint = fingerprint
        self.done = anyio.Event()
        self.result: ToolResult | None = None
        self.scope: anyio.CancelScope | None = None


class _Batch:
    """The calls of one :class:`~bus.ToolExecute`."""

    __slots__ = ("abort_deadline", "grace", "limiter", "reason", "silent", "slots", "turn")

    def __init__(self, msg: ToolExecute, max_parallel: int) -> None:
        self.turn = msg.turn
        prints = msg.fingerprints
        self.slots = tuple(
            _Slot(
                call, prints[i] if i < len(prints) else fingerprint_call(call.name, call.arguments)
            )
            for i, call in enumerate(msg.calls)
        )
        self.limiter = anyio.CapacityLimiter(max_parallel)
        self.abort_deadline = math.inf
        self.reason: str | None = None
        self.grace = 0.0
        self.silent = False

    def cancel(self, grace: float, reason: str) -> None:
        """Start nothing more; cancel running calls after ``grace`` seconds (idempotent)."""
        if self.reason is None:
            self.reason, self.grace = reason, max(grace, 0.0)
        deadline = anyio.current_time() + max(grace, 0.0)
        if deadline >= self.abort_deadline:
            return
        self.abort_deadline = deadline
        for slot in self.slots:
            if slot.scope is not None:
                slot.scope.deadline = min(slot.scope.deadline, deadline)


class _Run:
    __slots__ = ("batches", "ctx", "enabled")

    def __init__(self, ctx: ToolContext, enabled: frozenset[str]) -> None:
        self.ctx = ctx
        self.enabled = enabled
        self.batches: list[_Batch] = []


class ToolExecutor:
    """Runs tool calls for every run of a runtime; per-run state keyed by ``run_id``.

    :param bus: where calls arrive and results go.
    :param registry: the tools; a run may call those of them it enables in ``RunStarted``.
    :param settings: deadlines, result cap, parallelism and file limits.
    """

    def __init__(
        self,
        bus: Bus,
        registry: ToolRegistry,
        settings: ToolExecutorSettings | None = None,
    ) -> None:
        self._bus = bus
        self._registry = registry
        self._settings = settings or ToolExecutorSettings()
        self._runs: dict[str, _Run] = {}
        self._tg: TaskGroup | None = None

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Serve until the bus closes; ``task_status.started()`` once subscribed."""
        sub = self._bus.subscribe(
            RunStarted, ToolExecute, ToolsCancel, RunFinished, name=SUBSCRIBER_NAME
        )
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                task_status.started()
                await sub.serve(self._handle)
                for run in self._runs.values():
                    for batch in run.batches:
                        batch.cancel(0.0, "the tool executor stopped")
        finally:
            self._tg = None
            self._runs.clear()
            self._bus.unsubscribe(sub)

    def statistics(self) -> ToolExecutorStatistics:
        """Runs known, batches in flight, calls running now."""
        batches = [batch for run in self._runs.values() for batch in run.batches]
        running = sum(slot.scope is not None for batch in batches for slot in batch.slots)
        return ToolExecutorStatistics(len(self._runs), len(batches), running)

    # ------------------------------------------------------------------ messages

    def _handle(self, msg: _Handled) -> None:
        match msg:
            case RunStarted():
                if msg.run_id not in self._runs:
                    ctx = ToolContext(
                        msg.run_id,
                        Path(msg.folder) if msg.folder else None,
                        self._settings.limits,
                    )
                    self._runs[msg.run_id] = _Run(ctx, frozenset(msg.tools))
            case ToolExecute():
                self._execute(msg)
            case ToolsCancel():
                if run := self._runs.get(msg.run_id):
                    for batch in run.batches:
                        if batch.turn == msg.turn:
                            batch.cancel(msg.grace_seconds, msg.reason)
            case RunFinished():
                if run := self._runs.pop(msg.run_id, None):
                    for batch in run.batches:
                        batch.silent = True
                        batch.cancel(0.0, "the run finished")
            case _:
                assert_never(msg)

    def _execute(self, msg: ToolExecute) -> None:
        batch = _Batch(msg, self._settings.max_parallel_calls)
        run = self._runs.get(msg.run_id)
        if run is None or self._tg is None:
            for slot in batch.slots:
                outcome = Outcome(
                    f"run {msg.run_id!r} is not known to the tool executor",
                    is_error=True,
                    error_kind="unknown_run",
                    executed=False,
                )
                self._bus.publish_nowait(self._result(msg.run_id, batch, slot, outcome, 0.0))
            return
        run.batches.append(batch)
        self._tg.start_soon(self._run_batch, run, batch)

    # ------------------------------------------------------------------ calls

    async def _run_batch(self, run: _Run, batch: _Batch) -> None:
        try:
            async with anyio.create_task_group() as tg:
                for slot in batch.slots:
                    tg.start_soon(self._run_call, run, batch, slot)
                for slot in batch.slots:
                    await slot.done.wait()
                    if slot.result is not None and not batch.silent:
                        await self._bus.publish(slot.result)
        finally:
            if batch in run.batches:
                run.batches.remove(batch)

    async def _run_call(self, run: _Run, batch: _Batch, slot: _Slot) -> None:
        started = anyio.current_time()
        try:
            async with batch.limiter:
                started = anyio.current_time()
                outcome = await self._outcome(run, batch, slot)
            duration = anyio.current_time() - started
            slot.result = self._result(run.ctx.run_id, batch, slot, outcome, duration)
        finally:
            # Cancelled from outside (the executor's task group): the call still gets
            # its one result, so nothing that reads the slot waits forever.
            if slot.result is None:
                outcome = _aborted(slot.call, "because its task was cancelled")
                duration = anyio.current_time() - started
                slot.result = self._result(run.ctx.run_id, batch, slot, outcome, duration)
            slot.done.set()

    async def _outcome(self, run: _Run, batch: _Batch, slot: _Slot) -> Outcome:
        call = slot.call
        if batch.reason is not None:
            return _aborted(call, f"before it started: {batch.reason}")
        tool = self._registry.get(call.name) if call.name in run.enabled else None
        if tool is None:
            return unknown_tool(call.name, (n for n in run.enabled if n in self._registry))
        outcome: Outcome | None = None
        timeout = tool.timeout_seconds or self._settings.default_timeout_seconds
        with anyio.CancelScope(deadline=batch.abort_deadline) as scope:
            slot.scope = scope
            try:
                outcome = await invoke(
                    tool,
                    call.arguments,
                    run.ctx,
                    time_limit=timeout,
                    max_chars=self._settings.max_result_chars,
                )
            finally:
                slot.scope = None
        if outcome is None:
            return _aborted(call, f"cancelled after a grace of {batch.grace:g} s: {batch.reason}")
        return outcome

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
            executed=outcome.executed,
        )


def _aborted(call: ToolCall, why: str) -> Outcome:
    return Outcome(
        f"tool call {call.name} aborted {why}", is_error=True, error_kind="aborted", executed=False
    )
