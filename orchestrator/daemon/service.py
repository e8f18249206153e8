"""The run service: what the API does to runs, on top of the runtime and the store.

* :meth:`RunService.submit` checks a request against the operator's policy
  (:mod:`~orchestrator.daemon.policy`), admits it (at most ``runtime.max_concurrent_runs``
  running plus ``daemon.queue_size`` waiting; beyond that a 429), starts it, and returns
  only once its row is committed: a run answered with 202 is never lost. Concurrent
  requests with one idempotency key all get the run the first one creates.
* :meth:`RunService.recover` runs at start-up, before the API answers: every run the store
  says was queued or running is started again, resumed from its last completed turn, or
  ended with ``abort.crash``, as its ``on_crash`` says.
* :meth:`RunService.drain` stops admissions, lets running runs finish within a timeout,
  then aborts the rest (``abort.shutdown``).
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, Final

import anyio
import msgspec
from anyio.abc import TaskGroup

from actors.workers import Workers
from bus import ENCODER, ExitReason
from orchestrator.conductor import RunCheckpoint
from orchestrator.config import Config
from orchestrator.daemon import starting
from orchestrator.daemon.errors import ApiError
from orchestrator.daemon.ids import new_id
from orchestrator.daemon.policy import Admitted, Policy
from orchestrator.daemon.recorder import EventRecorder
from orchestrator.daemon.recovery import (
    CHECKPOINT_DECODER,
    StoreJournal,
    crash_detail,
    crash_ending,
    phase_of,
    refused_detail,
)
from orchestrator.daemon.schemas import REQUEST_DECODER, RunRequest
from orchestrator.daemon.store import RunRow, Store
from orchestrator.errors import ConfigError
from orchestrator.result import RunResult, finished_result
from orchestrator.runtime import Runtime, StartPoint
from orchestrator.sim import Scenario
from orchestrator.tracing import TraceParent

__all__ = ["RunService", "ServiceStatistics"]

logger = logging.getLogger("loopfuse.daemon")

# How long aborted runs get to end during a drain before the runtime's own shutdown.
ABORT_WAIT_SECONDS: Final = 15.0
# Events read back from a crashed run to tell what it was doing.
CRASH_TAIL: Final = 32


@dataclass
class ServiceStatistics:
    """What the service did since start-up (exported as metrics)."""

    accepted: int = 0
    rejected_full: int = 0
    rejected_draining: int = 0
    resumed: int = 0
    crash_aborted: int = 0


def _log(message: str, run_id: str, trace_id: str, **fields: Any) -> None:
    # The record is made directly: the JSON line names no source line, so logger.info's
    # search of the stack for its caller (twice per run) would be wasted.
    if logger.isEnabledFor(logging.INFO):
        extra = {"run_id": run_id, "trace_id": trace_id, **fields}
        logger.handle(
            logger.makeRecord(logger.name, logging.INFO, "", 0, message, (), None, None, extra)
        )


class RunService:
    """Submits, aborts, recovers and drains the daemon's runs."""

    def __init__(
        self,
        config: Config,
        runtime: Runtime,
        store: Store,
        recorder: EventRecorder,
        journal: StoreJournal,
        scenarios: Mapping[str, Scenario],
        task_group: TaskGroup,
    ) -> None:
        self._config = config
        self._runtime = runtime
        self._store = store
        self._recorder = recorder
        self._scenarios = dict(scenarios)
        self._policy = Policy(config, self._scenarios)
        # The tasks that see runs end, reused: a task started per run would cost more than
        # the rest of its work. Parked ones end when the daemon cancels ``task_group``.
        self._finishers = Workers(task_group)
        self._runs = starting.LiveRuns(
            config, self._scenarios, store.path.parent / "reports", journal, recorder
        )
        self.capacity = config.runtime.max_concurrent_runs + config.daemon.queue_size
        self.draining = False
        self.in_flight = 0
        self._idle = anyio.Event()
        self._idle.set()
        self._claims: dict[str, anyio.Event] = {}
        """Idempotency keys being submitted, each with the event set when its request is done."""
        self.statistics = ServiceStatistics()
        self._ended: collections.Counter[str] = collections.Counter()

    def ended(self, reason: ExitReason) -> int:
        """Runs that ended with ``reason`` since start-up."""
        return self._ended[reason.value]

    # ------------------------------------------------------------------ submitting

    async def submit(
        self, request: RunRequest, *, traceparent: TraceParent | None = None
    ) -> tuple[RunRow, bool]:
        """Store and start ``request``; returns its row and whether it is new (``False``:
        an earlier run with the same idempotency key). A new run continues the trace of
        ``traceparent`` (the caller's span) if given: its trace id is that trace's.

        Requests with a key that another request is submitting wait for its outcome: every
        concurrent repeat gets the same run.

        :raises ApiError: 422 bad request or refused by the operator's policy, 409 key
            reused differently, 429 full, 503 draining.
        """
        self._check_open()
        encoded = starting.SORTED_JSON.encode(request)
        key = request.idempotency_key
        digest = starting.request_digest(request, encoded)
        if key is None:
            return await self._create(request, encoded, digest, None, traceparent), True
        # The key is claimed before it is looked up: a lookup made while another request
        # held it could read the store before that request's run was committed and return
        # after its claim was gone, and a second row with the key would fail the commit.
        while (claim := self._claims.get(key)) is not None:
            await claim.wait()  # then its row is committed, or it was refused
        claim = self._claims[key] = anyio.Event()
        try:
            earlier = await self._store.find_key(key)
            if earlier is not None:
                if earlier.request_hash != digest:
                    raise ApiError(
                        409,
                        "idempotency_conflict",
                        "this idempotency key was used for a different request",
                        key="idempotency_key",
                    )
                return earlier, False
            self._check_open()
            return await self._create(request, encoded, digest, key, traceparent), True
        finally:
            del self._claims[key]
            claim.set()

    async def _create(
        self,
        request: RunRequest,
        encoded: bytes,
        digest: str,
        key: str | None,
        parent: TraceParent | None,
    ) -> RunRow:
        admitted = self._policy.admit(request)
        on_crash = admitted.settings.on_crash
        if self.in_flight >= self.capacity:
            self.statistics.rejected_full += 1
            logger.warning("run refused: queue full", extra={"in_flight": self.in_flight})
            raise ApiError(
                429,
                "queue_full",
                f"{self.in_flight} runs are running or queued, the limit "
                "(runtime.max_concurrent_runs + daemon.queue_size); retry later",
                headers={"Retry-After": str(self._config.daemon.retry_after_seconds)},
            )
        run_id = new_id()
        trace_id = parent.trace_id if parent is not None else new_id()
        row = RunRow(
            id=run_id,
            trace_id=trace_id,
            status="queued",
            on_crash=on_crash,
            request=encoded,
            request_hash=digest,
            idempotency_key=key,
            created_at=time.time(),
        )
        point = StartPoint(trace_id=trace_id, traceparent=parent.header() if parent else None)
        finished = await self._launch(row, request, point, admitted)
        self._store.insert_run(row)  # queued before any of its events can be
        self._finishers.submit(partial(self._finish, row, finished, request))
        with anyio.CancelScope(shield=True):  # a started run's row is committed, always
            await self._store.flush()  # committed before the 202
        self.statistics.accepted += 1
        _log("run accepted", run_id, trace_id, on_crash=on_crash)
        return row

    def _check_open(self) -> None:
        if self.draining:
            self.statistics.rejected_draining += 1
            raise ApiError(
                503,
                "draining",
                "the daemon is shutting down and accepts no new runs",
                headers={"Retry-After": str(self._config.daemon.retry_after_seconds)},
            )

    def scenario_names(self) -> list[str]:
        return sorted(self._scenarios)

    # ------------------------------------------------------------------ running

    async def _launch(
        self,
        row: RunRow,
        request: RunRequest,
        point: StartPoint,
        admitted: Admitted | None = None,
    ) -> anyio.Event:
        """Start ``row``'s run now (it waits for a slot in the runtime); the returned event is
        set once its last event is queued in the store. ``admitted``: ``request`` as the policy
        let it through just now (a submission); without it, the policy checks it again."""
        recorded = self._recorder.track(row.id, last_seq=row.last_event, dropped=row.events_dropped)
        try:
            await self._runs.start(self._runtime, row.id, request, point, admitted)
        except ConfigError as exc:
            raise ApiError(422, "invalid_config", exc.reason, key=exc.key) from None
        self.in_flight += 1
        self._idle = anyio.Event() if self._idle.is_set() else self._idle
        return recorded

    async def _finish(self, row: RunRow, recorded: anyio.Event, request: RunRequest) -> None:
        result = await self._runs.result(row.id, request)
        # RunFinished is queued in the store before the row says "ended", so a row that
        # says "ended" always has its stream's last event. (anyio's wait on a set event
        # would yield to the loop once more, for nothing.)
        if not recorded.is_set():
            await recorded.wait()
        self._end(row, result)
        self.in_flight -= 1
        if self.in_flight == 0:
            self._idle.set()
        _log(
            "run ended",
            row.id,
            row.trace_id,
            exit_reason=result.exit_reason.value,
            cause=result.cause,
            turns=result.turns,
        )

    def _end(self, row: RunRow, result: RunResult, *, count: bool = True) -> None:
        columns = starting.ending(result)
        columns["result"] = starting.SORTED_JSON.encode(columns["result"])
        self._store.update_run(row.id, **columns)
        if count:  # not a run that had ended before a restart
            self._ended[result.exit_reason.value] += 1

    async def abort(self, run_id: str) -> RunRow:
        """Ask a live run to stop (``abort.caller``, source ``api``).

        :raises ApiError: 404 unknown run, 409 it already ended.
        """
        row = await self._store.get_run(run_id)
        if row is None:
            raise ApiError(404, "unknown_run", f"no run {run_id!r}")
        if row.status == "ended" or not await self._runs.abort(run_id):
            raise ApiError(409, "run_ended", f"run {run_id!r} has already ended")
        _log("run abort requested", row.id, row.trace_id)
        return row

    # ------------------------------------------------------------------ restart and shutdown

    async def recover(self) -> None:
        """Start again, resume or end every run the store left queued or running. One whose
        stored request this version refuses (a value now out of range) ends ``abort.crash``
        with a detail naming the key; the others are recovered all the same."""
        for row in await self._store.unfinished():
            try:
                await self._recover(row)
            except Exception:  # one bad row must not keep the daemon down
                logger.exception(
                    "run could not be recovered", extra={"run_id": row.id, "trace_id": row.trace_id}
                )
                self._crash_abort(row, ExitReason.ABORTED_STREAMING, None)
        await self._store.flush()

    async def _recover(self, row: RunRow) -> None:
        tail = await self._store.tail(row.id, CRASH_TAIL)
        if tail and tail[-1].type == "RunFinished":
            finished = starting.FINISHED_DECODER.decode(tail[-1].data)
            self._end(row, finished_result(finished, row.trace_id), count=False)
            _log("run had ended before the restart", row.id, row.trace_id)
            return
        raw = await self._store.checkpoint(row.id)
        checkpoint = CHECKPOINT_DECODER.decode(raw) if raw is not None else None
        try:
            request = REQUEST_DECODER.decode(row.request)
        except msgspec.ValidationError as exc:  # stored by a version with other rules
            detail = refused_detail(None, str(exc))
            self._crash_abort(row, phase_of(tail), checkpoint, detail=detail)
            return
        point = starting.restart_point(
            row.id, row.trace_id, row.status == "queued", row.on_crash, checkpoint
        )
        if point is None:
            self._crash_abort(row, phase_of(tail), checkpoint)
            return
        try:
            recorded = await self._launch(row, request, point)
        except ApiError as exc:  # _launch makes a ConfigError a 422
            logger.error(
                "run could not be restarted: %s",
                exc,
                extra={"run_id": row.id, "trace_id": row.trace_id},
            )
            detail = refused_detail(exc.key, exc.message)
            self._crash_abort(row, phase_of(tail), checkpoint, detail=detail)
            return
        if point.resume is None:
            action = "restarted (was queued)"
        else:
            self.statistics.resumed += 1
            action = f"resumed after turn {point.resume.turn}"
        self._finishers.submit(partial(self._finish, row, recorded, request))
        _log(f"run {action}", row.id, row.trace_id)

    def _crash_abort(
        self,
        row: RunRow,
        reason: ExitReason,
        checkpoint: RunCheckpoint | None,
        *,
        detail: str | None = None,
    ) -> None:
        events, result = crash_ending(
            row.id, row.trace_id, reason, checkpoint, detail or crash_detail()
        )
        for seq, event in enumerate(events, row.last_event + 1):
            self._store.append_event(row.id, seq, type(event).__name__, ENCODER.encode(event))
        self._end(row, result)
        self.statistics.crash_aborted += 1
        _log("run ended by the crash", row.id, row.trace_id, exit_reason=result.exit_reason.value)

    async def drain(self, grace_seconds: float) -> None:
        """Accept no more runs; give running ones ``grace_seconds``, then abort the rest
        (``abort.shutdown``) and wait for them to end."""
        if not self.draining:
            self.draining = True
            logger.info(
                "draining", extra={"in_flight": self.in_flight, "grace_seconds": grace_seconds}
            )
        with anyio.move_on_after(grace_seconds):
            await self._idle.wait()
        if self.in_flight:
            logger.info("aborting the runs still active", extra={"in_flight": self.in_flight})
            for run_id in list(self._runs.handles):
                await self._runs.abort(run_id, "The daemon is shutting down.", "shutdown")
            with anyio.move_on_after(ABORT_WAIT_SECONDS):
                await self._idle.wait()
        await self._store.flush()
        logger.info("drained", extra={"in_flight": self.in_flight})
