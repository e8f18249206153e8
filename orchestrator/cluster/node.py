"""One daemon of a fleet: takes runs from the work queue, runs them, answers for any run.

:meth:`ClusterNode.running` joins the fleet for its body. Meanwhile the node pulls
submissions only while it has a free run slot (``runtime.max_concurrent_runs``), takes a
run by compare-and-set on its ``runstate`` entry (a dead owner's run is taken over and
resumed or ended as its ``on_crash`` says), keeps its message in progress, stores its end
and only then acknowledges it, and aborts its runs on ``<prefix>.run.<id>.abort`` or when
its progress beat reads ``aborting`` in their entries (only its own runs' entries: its work
does not grow with the fleet). A run's whole life: ``docs/scale-out.md``.

:meth:`submit`, :meth:`abort`, :meth:`state` and :meth:`events` work for any run of the
fleet, wherever it runs.
"""

from __future__ import annotations

import hashlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager, suppress
from functools import partial
from pathlib import Path
from typing import Final, NamedTuple

import anyio
import msgspec
import nats.errors
from anyio.abc import TaskGroup
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig
from nats.js.errors import KeyWrongLastSequenceError, NotFoundError

from bus import ExitReason
from orchestrator.cluster.events import ClusterEvent, last_event, run_events
from orchestrator.cluster.jetstream import Buckets, bucket_keys, connect, ensure_layout, retrying
from orchestrator.cluster.publisher import EventPublisher, KvJournal
from orchestrator.cluster.settings import ClusterSettings
from orchestrator.cluster.state import STATE_DECODER, STATE_ENCODER, RunState
from orchestrator.conductor import RunCheckpoint
from orchestrator.config import Config
from orchestrator.daemon import starting
from orchestrator.daemon.errors import ApiError
from orchestrator.daemon.lifespan import KEEP_FINISHED_IN_MEMORY, default_store_path
from orchestrator.daemon.policy import admit
from orchestrator.daemon.recovery import CHECKPOINT_DECODER, crash_detail, crash_ending, phase_of
from orchestrator.daemon.schemas import REQUEST_DECODER, RunRequest
from orchestrator.daemon.store import StoredEvent
from orchestrator.result import RunResult, end_result, finished_result
from orchestrator.runtime import Runtime, StartPoint
from orchestrator.sim import Scenario, shipped_scenarios

__all__ = ["ClusterError", "ClusterNode", "NodeStatistics"]

logger = logging.getLogger("loopfuse.cluster")

RUN_HEADER: Final = "Loopfuse-Run-Id"
CONSUMER: Final = "workers"
FETCH_SECONDS: Final = 0.5
ACK_ATTEMPTS: Final = 20


class ClusterError(ApiError):
    """A fleet operation refused: ``status`` is the HTTP status that fits, ``code`` a word,
    ``key`` the request's offending field if there is one (the API answers it as any
    :class:`ApiError`)."""


class NodeStatistics(NamedTuple):
    """One daemon's share of the fleet's work (exported as its own metrics)."""

    in_flight: int
    slots: int
    submitted: int
    duplicates: int
    taken: int
    finished: int
    resumed: int
    crash_ended: int
    redelivered: int
    ownership_conflicts: int


class ClusterNode:
    """A daemon's membership of a fleet (see the module docstring)."""

    def __init__(
        self,
        config: Config,
        settings: ClusterSettings,
        *,
        name: str | None = None,
        scenarios: Sequence[Scenario] = (),
        pull: bool = True,
    ) -> None:
        self.config = config
        self.settings = settings
        self.name = name or f"node-{uuid.uuid4().hex[:8]}"
        self.slots = config.runtime.max_concurrent_runs
        self._extra_scenarios = tuple(scenarios)
        self._scenarios = (
            {s.name: s for s in (*shipped_scenarios(), *scenarios)}
            if config.model.base_url is None
            else {}
        )
        self._pull = pull
        store = config.daemon.store_path
        self._reports = (Path(store) if store else default_store_path()).parent / "reports"
        self._nc: Client | None = None
        self._js: JetStreamContext | None = None
        self._buckets: Buckets | None = None
        self._runtime: Runtime | None = None
        self._publisher: EventPublisher | None = None
        self._runs: starting.LiveRuns | None = None
        # Deliveries of each run this daemon is running: a run delivered again while it
        # runs here (its ack lost to a NATS restart) is not started twice, and every
        # delivery is kept in progress and acknowledged at its end.
        self._deliveries: dict[str, list[Msg]] = {}
        self._in_flight = 0
        self._slot_freed = anyio.Event()
        self._idle = anyio.Event()
        self._idle.set()
        self._stopping = False
        # The counters: every field of NodeStatistics after ``in_flight`` and ``slots``.
        self._counts: dict[str, int] = dict.fromkeys(NodeStatistics._fields[2:], 0)

    # ------------------------------------------------------------------ lifetime

    @property
    def nc(self) -> Client:
        assert self._nc is not None, "the node is not running"
        return self._nc

    @property
    def js(self) -> JetStreamContext:
        assert self._js is not None, "the node is not running"
        return self._js

    @property
    def buckets(self) -> Buckets:
        assert self._buckets is not None, "the node is not running"
        return self._buckets

    @property
    def runtime(self) -> Runtime:
        assert self._runtime is not None, "the node is not running"
        return self._runtime

    @asynccontextmanager
    async def running(self) -> AsyncIterator[ClusterNode]:
        """Be a member of the fleet for the ``async with`` body. On leaving, stop pulling and
        hand the runs still active back to the queue (another daemon resumes them)."""
        nc = await connect(self.settings, name=self.name)
        self._nc, self._js = nc, nc.jetstream()
        try:
            self._buckets = await ensure_layout(self._js, self.settings)
            journal = KvJournal(self._buckets.checkpoints)
            async with Runtime(
                self.config,
                scenarios=self._extra_scenarios,
                journal=journal,
                keep_finished_runs=KEEP_FINISHED_IN_MEMORY,
            ) as runtime:
                self._runtime = runtime
                self._publisher = EventPublisher(runtime.bus, self._js, self.settings)
                self._runs = starting.LiveRuns(
                    self.config, self._scenarios, self._reports, journal, self._publisher
                )
                async with anyio.create_task_group() as tg:
                    await tg.start(self._publisher.run)
                    await tg.start(journal.run)
                    await self._beat()
                    tg.start_soon(self._heartbeat)
                    await self.nc.subscribe(self.settings.abort_subject("*"), cb=self._on_abort)
                    if self._pull:
                        await tg.start(self._work, tg)
                    logger.info("joined the fleet", extra={"node": self.name})
                    yield self
                    self._stopping = True
                    # The runs still held go back to the queue at once (they resume elsewhere;
                    # a failed nak: delivered again after ack_wait anyway).
                    with anyio.CancelScope(shield=True), anyio.move_on_after(5):
                        for deliveries in list(self._deliveries.values()):
                            for delivery in deliveries:
                                with suppress(nats.errors.Error):
                                    await delivery.nak()
                    tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(5):
                if self._buckets is not None and nc.is_connected:
                    with suppress(nats.errors.Error):
                        await self._buckets.nodes.delete(self.name)
                await nc.close()
            logger.info("left the fleet", extra={"node": self.name})

    async def _beat(self) -> None:
        await retrying("heartbeat", lambda: self.buckets.nodes.put(self.name, b"alive"))

    async def _heartbeat(self) -> None:
        while True:
            await anyio.sleep(self.settings.node_ttl_seconds / 3)
            await self._beat()

    async def _alive(self, node: str) -> bool:
        try:
            await retrying("liveness", lambda: self.buckets.nodes.get(node))
        except NotFoundError:
            return False
        return True

    # ------------------------------------------------------------------ any run of the fleet

    async def submit(self, request: RunRequest) -> tuple[RunState, bool]:
        """Queue ``request`` for whichever daemon has room; its state and whether it is new
        (``False``: a run with that ``idempotency_key`` exists already, and is returned).

        :raises ClusterError: 422 bad request or refused by the operator's policy
            (:mod:`~orchestrator.daemon.policy`), 409 key reused for a different request.
        """
        try:  # the operator's policy
            on_crash = admit(request, self.config, self._scenarios).settings.on_crash
        except ApiError as exc:
            raise ClusterError(exc.status, exc.code, exc.message, key=exc.key) from None
        digest = starting.request_digest(request)
        key = request.idempotency_key
        run_id = (
            hashlib.blake2b(key.encode(), digest_size=16).hexdigest()
            if key is not None
            else uuid.uuid4().hex
        )
        state = RunState(
            run_id=run_id,
            trace_id=uuid.uuid4().hex,
            status="queued",
            on_crash=on_crash,
            request=msgspec.to_builtins(request),
            request_hash=digest,
            created_at=time.time(),
        )
        new = True
        try:
            await retrying(
                "submit", lambda: self.buckets.state.create(run_id, STATE_ENCODER.encode(state))
            )
        except KeyWrongLastSequenceError:
            existing = await self.state(run_id)
            if existing.request_hash != digest:
                raise ClusterError(
                    409,
                    "idempotency_conflict",
                    "this idempotency key was used for a different request",
                ) from None
            self._counts["duplicates"] += 1
            if existing.status != "queued":
                return existing, False
            state, new = existing, False  # publish again: the first publish may have been lost
        payload = starting.SORTED_JSON.encode(request)
        headers = {"Nats-Msg-Id": run_id, RUN_HEADER: run_id}
        subject, stream = self.settings.submit_subject, self.settings.runs_stream
        publish = partial(self.js.publish, subject, payload, stream=stream, headers=headers)
        await retrying("submit", publish)
        if new:
            self._counts["submitted"] += 1
            logger.info("run queued", extra={"run_id": run_id, "node": self.name})
        return state, new

    async def states(self) -> list[RunState]:
        """Every run the fleet knows (the ``runstate`` bucket), in no particular order.

        The keys are the bucket's stream's subjects (:func:`bucket_keys`); each entry is read:
        fine for the runs a retention window keeps; a fleet with very many runs should list
        from its own index instead.
        """
        states: list[RunState] = []
        for key in await retrying("keys", lambda: bucket_keys(self.nc, self.settings.state_bucket)):
            with suppress(ClusterError):  # deleted, or pruned between the listing and the read
                states.append(await self.state(key))
        return states

    async def state(self, run_id: str) -> RunState:
        """``run_id``'s fleet-wide state.

        :raises ClusterError: 404 no such run.
        """
        return (await self._entry(run_id))[0]

    async def _entry(self, run_id: str) -> tuple[RunState, int]:
        try:
            entry = await retrying("state", lambda: self.buckets.state.get(run_id))
        except NotFoundError:
            raise ClusterError(404, "unknown_run", f"no run {run_id!r}") from None
        assert entry.value is not None
        assert entry.revision is not None
        return STATE_DECODER.decode(entry.value), entry.revision

    async def _update(self, what: str, state: RunState, revision: int) -> int:
        """Store ``state`` over revision ``revision`` of its entry; the new revision.

        :raises KeyWrongLastSequenceError: the entry changed since ``revision``.
        """
        encoded = STATE_ENCODER.encode(state)
        update = partial(self.buckets.state.update, state.run_id, encoded, last=revision)
        return await retrying(what, update)

    async def abort(self, run_id: str) -> RunState:
        """Ask ``run_id`` to stop, wherever it runs: its entry becomes ``aborting`` (the
        owner reads it on its next progress beat) and ``<prefix>.run.<id>.abort`` tells the
        owner at once.

        :raises ClusterError: 404 unknown run, 409 it already ended.
        """
        while True:
            state, revision = await self._entry(run_id)
            if state.status == "ended":
                raise ClusterError(409, "run_ended", f"run {run_id!r} has already ended")
            aborting = msgspec.structs.replace(state, status="aborting")
            with suppress(KeyWrongLastSequenceError):  # changed meanwhile: read again
                await self._update("abort", aborting, revision)
                break
        await retrying("abort", lambda: self.nc.publish(self.settings.abort_subject(run_id), b""))
        logger.info("run abort requested", extra={"run_id": run_id, "node": self.name})
        return aborting

    def events(self, run_id: str, *, after: int = 0) -> AsyncIterator[ClusterEvent]:
        """``run_id``'s events after id ``after``, live until its end (see :mod:`.events`)."""
        return run_events(self.js, self.settings, run_id, after=after)

    async def wait_idle(self) -> None:
        """Return once this daemon holds no message (every run it took is stored and acked)."""
        await self._idle.wait()

    def scenario_names(self) -> list[str]:
        """The scenarios a request may name: the shipped ones and the operator's (none when
        a real endpoint serves the runs)."""
        return sorted(self._scenarios)

    def statistics(self) -> NodeStatistics:
        return NodeStatistics(in_flight=self._in_flight, slots=self.slots, **self._counts)

    # ------------------------------------------------------------------ aborts

    async def _on_abort(self, msg: Msg) -> None:
        assert self._runs is not None  # subscribed once the runs are
        await self._runs.abort(msg.subject.split(".")[-2])

    # ------------------------------------------------------------------ taking runs

    async def _work(
        self, tg: TaskGroup, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        config = ConsumerConfig(
            durable_name=CONSUMER,
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=self.settings.ack_wait_seconds,
            max_deliver=self.settings.max_deliver,
            max_ack_pending=-1,
        )
        sub = await self.js.pull_subscribe(
            self.settings.submit_subject,
            durable=CONSUMER,
            stream=self.settings.runs_stream,
            config=config,
        )
        task_status.started()
        while not self._stopping:
            free = self.slots - self._in_flight
            if free <= 0:
                await self._slot_freed.wait()
                self._slot_freed = anyio.Event()
                continue
            try:
                messages = await sub.fetch(free, timeout=FETCH_SECONDS)
            except TimeoutError:  # nothing queued (nats-py raises the builtin here)
                continue
            except nats.errors.Error as exc:  # reconnecting: try again shortly
                logger.info("fetch failed: %s", type(exc).__name__, extra={"node": self.name})
                await anyio.sleep(FETCH_SECONDS)
                continue
            for msg in messages:
                self._in_flight += 1
                self._idle = anyio.Event() if self._idle.is_set() else self._idle
                tg.start_soon(self._take, msg, tg)

    async def _take(self, msg: Msg, tg: TaskGroup) -> None:
        run_id = (msg.headers or {}).get(RUN_HEADER, "")
        try:
            if msg.metadata.num_delivered > 1:
                self._counts["redelivered"] += 1
            if (deliveries := self._deliveries.get(run_id)) is not None:  # running here already
                deliveries.append(msg)
                return
            self._deliveries[run_id] = [msg]
            try:
                await self._claim_and_run(run_id, msg, tg)
            finally:
                del self._deliveries[run_id]
        except Exception:
            logger.exception("run could not be taken", extra={"run_id": run_id})
            with anyio.CancelScope(shield=True), suppress(nats.errors.Error):
                await msg.nak(delay=self.settings.ack_wait_seconds)
        finally:
            self._in_flight -= 1
            self._slot_freed.set()
            if self._in_flight == 0:
                self._idle.set()

    async def _claim_and_run(self, run_id: str, msg: Msg, tg: TaskGroup) -> None:
        try:
            state, revision = await self._entry(run_id)
        except ClusterError:
            logger.error("a submission without a state entry", extra={"run_id": run_id})
            await retrying("term", msg.term)
            return
        if state.status == "ended":  # its end was stored; only the ack was lost
            await retrying("ack", msg.ack_sync)
            return
        if state.owner is not None and state.owner != self.name and await self._alive(state.owner):
            self._counts["ownership_conflicts"] += 1
            await retrying("nak", lambda: msg.nak(delay=self.settings.ack_wait_seconds))
            return
        took_over = state.owner is not None
        mine = msgspec.structs.replace(
            state,
            status="aborting" if state.status == "aborting" else "running",
            owner=self.name,
            attempts=state.attempts + 1,
        )
        try:
            revision = await self._update("claim", mine, revision)
        except KeyWrongLastSequenceError:
            self._counts["ownership_conflicts"] += 1
            await retrying("nak", lambda: msg.nak())
            return
        self._counts["taken"] += 1
        logger.info(
            "run taken over" if took_over else "run taken",
            extra={"run_id": run_id, "node": self.name, "attempt": mine.attempts},
        )
        progress = anyio.CancelScope()
        tg.start_soon(self._keep_in_progress, run_id, progress)
        try:
            ended = await self._run(mine, took_over)
        except ApiError as exc:  # this daemon's policy refuses it: another delivery would too
            logger.error("run refused at start: %s", exc, extra={"run_id": run_id})
            ended = _failed_to_start(mine, exc, msg.metadata.num_delivered)
        except Exception as exc:
            if msg.metadata.num_delivered < self.settings.max_deliver:
                raise  # NAK'd: another delivery may start it
            # The last delivery: end it for good rather than leave it "running" forever.
            logger.exception("run could not be started; ending it", extra={"run_id": run_id})
            ended = _failed_to_start(mine, exc, msg.metadata.num_delivered)
        finally:
            progress.cancel()
        if await self._store_end(run_id, ended):
            self._counts["finished"] += 1
            for delivery in self._deliveries[run_id]:
                with suppress(nats.errors.Error, TimeoutError):  # else acked when delivered again
                    await retrying("ack", delivery.ack_sync, attempts=ACK_ATTEMPTS)
        with suppress(NotFoundError):
            await retrying("checkpoint delete", lambda: self.buckets.checkpoints.purge(run_id))

    async def _keep_in_progress(self, run_id: str, scope: anyio.CancelScope) -> None:
        beat = self.settings.ack_wait_seconds / 3
        with scope:
            while True:
                await anyio.sleep(beat)
                for delivery in self._deliveries.get(run_id, ()):
                    with suppress(nats.errors.Error):  # NATS is away; the next beat tries again
                        await delivery.in_progress()
                # Catch an abort whose message was missed: the run's entry says ``aborting``.
                with anyio.move_on_after(beat), suppress(ClusterError):
                    if (await self.state(run_id)).status == "aborting":
                        assert self._runs is not None
                        await self._runs.abort(run_id)

    async def _run(self, state: RunState, took_over: bool) -> RunState:
        """Run ``state``'s run to its end; its final state (not yet stored)."""
        assert self._publisher is not None
        assert self._runs is not None
        run_id = state.run_id
        request = REQUEST_DECODER.decode(starting.SORTED_JSON.encode(state.request))
        point = StartPoint(trace_id=state.trace_id)
        if took_over:
            newest = await last_event(self.js, self.settings, run_id)
            if newest is not None and newest.type == "RunFinished":
                finished = starting.FINISHED_DECODER.decode(newest.data)
                return _ended(state, finished_result(finished, state.trace_id))
            try:
                entry = await retrying("checkpoint", lambda: self.buckets.checkpoints.get(run_id))
                checkpoint = CHECKPOINT_DECODER.decode(entry.value) if entry.value else None
            except NotFoundError:
                checkpoint = None
            restart = starting.restart_point(
                run_id, state.trace_id, False, state.on_crash, checkpoint
            )
            if restart is None:
                return await self._crash_end(state, newest, checkpoint)
            point = restart
            self._counts["resumed"] += 1
        published = self._publisher.track(run_id, state.attempts)
        await self._runs.start(self.runtime, run_id, request, point)
        if state.status == "aborting":
            await self._runs.abort(run_id)
        result = await self._runs.result(run_id, request)
        await published.wait()
        return _ended(state, result)

    async def _crash_end(
        self, state: RunState, newest: ClusterEvent | None, checkpoint: RunCheckpoint | None
    ) -> RunState:
        assert self._publisher is not None
        tail = [StoredEvent(newest.seq, newest.type, newest.data)] if newest is not None else []
        events, result = crash_ending(
            state.run_id, state.trace_id, phase_of(tail), checkpoint, crash_detail()
        )
        for n, event in enumerate(events, 1):
            await self._publisher.publish(event, msg_id=f"{state.run_id}:{state.attempts}:crash{n}")
        self._counts["crash_ended"] += 1
        return _ended(state, result)

    async def _store_end(self, run_id: str, ended: RunState) -> bool:
        """Store ``ended`` if this node still owns the run; whether it did."""
        while True:
            current, revision = await self._entry(run_id)
            if current.owner != self.name or current.status == "ended":
                self._counts["ownership_conflicts"] += 1
                logger.warning(
                    "run lost to another daemon before its end was stored",
                    extra={"run_id": run_id, "node": self.name, "owner": current.owner},
                )
                return False
            with suppress(KeyWrongLastSequenceError):  # changed meanwhile: read again
                await self._update("end", ended, revision)
                logger.info(
                    "run ended",
                    extra={"run_id": run_id, "node": self.name, "exit_reason": ended.exit_reason},
                )
                return True


def _ended(state: RunState, result: RunResult) -> RunState:
    return msgspec.structs.replace(state, **starting.ending(result))


def _failed_to_start(state: RunState, exc: Exception, deliveries: int) -> RunState:
    detail = f"The run could not be started in {deliveries} deliveries: {exc!r}"
    reason = ExitReason.HOOK_STOPPED
    return _ended(state, end_result(state.run_id, state.trace_id, reason, "internal.error", detail))
