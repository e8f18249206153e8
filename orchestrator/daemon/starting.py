"""A run's lifecycle, the same for the single daemon and a fleet's member wherever its state
is kept (the daemon's SQLite store, the fleet's KV bucket): :class:`LiveRuns` starts what
``POST /v1/runs`` asked for (a task, a scenario or a pipeline) and holds it while it runs;
:func:`request_digest` tells a repeated request from a conflicting one; :func:`restart_point`
says where a run a crash left unfinished starts again; :func:`ending` is a run's stored end.

A request passes the operator's policy again when it starts (:func:`~.policy.admit`): a
stored request runs only as the policy of the daemon that starts it allows, its folder
resolved then; one admitted a moment before (the submit path, no await between) is started
from that :class:`~orchestrator.daemon.policy.Admitted` instead of being checked twice.

With no model configured (``model.base_url``), the embedded simulator answers a task or a
pipeline too (:func:`answered_by_simulator`, decided once when the run starts): the daemon
marks such a run's result (:func:`~orchestrator.result.simulator_answered`: ``simulated``
and :data:`~orchestrator.result.SIMULATOR_NOTE`), and its report file starts with the note.
Scenario runs are the simulator's own work and stay unmarked.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final, Literal, Protocol

import anyio
import msgspec

from bus import RunFinished
from orchestrator.conductor import RunCheckpoint
from orchestrator.config import Config
from orchestrator.daemon.policy import Admitted, admit
from orchestrator.daemon.schemas import RunRequest
from orchestrator.report import ReportOptions, simulated_models, start_report
from orchestrator.result import SIMULATOR_NOTE, RunResult, result_summary, simulator_answered
from orchestrator.runtime import RunHandle, RunSpec, Runtime, StartPoint
from orchestrator.scenarios.runs import start_scenario
from orchestrator.sim import Scenario

__all__ = [
    "FINISHED_DECODER",
    "SORTED_JSON",
    "LiveRuns",
    "answered_by_simulator",
    "ending",
    "request_digest",
    "restart_point",
    "warn_without_model",
]

SORTED_JSON: Final = msgspec.json.Encoder(order="sorted")
"""How requests and results are stored and hashed: one value, one encoding."""
FINISHED_DECODER: Final = msgspec.json.Decoder(RunFinished)
Source = Literal["caller", "api", "shutdown"]


class Tracker(Protocol):  # the recorder or publisher of a run's events; also the journal
    def forget(self, run_id: str) -> None: ...


class Journal(Tracker, Protocol):
    def expect(self, run_id: str, point: StartPoint) -> None: ...


def answered_by_simulator(config: Config, request: RunRequest) -> bool:
    """Whether the embedded simulator answers ``request`` though it names no scenario: no
    model is configured and the request is a task or a pipeline on a folder."""
    return config.model.base_url is None and request.scenario is None


def warn_without_model(config: Config, logger: logging.Logger) -> None:
    """Warn once at start-up when no model is configured: task and pipeline runs will be
    answered by the embedded simulator (and marked so), not by a model."""
    if config.model.base_url is None:
        logger.warning(
            "no model is configured (model.base_url and model.model): the embedded simulator "
            "answers task and pipeline runs, not a model; their results say so (simulated: "
            "true). docs/servers.md shows how to point loopfuse at a server"
        )


def request_digest(request: RunRequest, encoded: bytes | None = None) -> str:
    """The hash of ``request`` without its idempotency key; ``encoded``: ``request`` as
    :data:`SORTED_JSON` encodes it, if done already (spares an encoding without a key)."""
    if encoded is None or request.idempotency_key is not None:
        encoded = SORTED_JSON.encode(msgspec.structs.replace(request, idempotency_key=None))
    return hashlib.blake2b(encoded, digest_size=16).hexdigest()


def ending(result: RunResult) -> dict[str, Any]:
    """A run's end as the fields of its stored state: ``status``, ``ended_at``,
    ``exit_reason``, ``cause`` and ``result`` (its summary, without the transcript)."""
    # The transcript is left out before the summary: it is not made into builtins first.
    summary = result_summary(msgspec.structs.replace(result, transcript=()))
    return {
        "status": "ended",
        "ended_at": time.time(),
        "exit_reason": result.exit_reason.value,
        "cause": result.cause,
        "result": summary,
    }


def restart_point(
    run_id: str, trace_id: str, queued: bool, on_crash: str, checkpoint: RunCheckpoint | None
) -> StartPoint | None:
    """Where a run a crash left unfinished starts again: from the start if it was queued,
    from ``checkpoint`` (or turn 0) if its ``on_crash`` is ``resume``; ``None``: it ends
    with ``abort.crash``."""
    if queued:
        return StartPoint(trace_id=trace_id)
    if on_crash != "resume":
        return None
    resume = checkpoint or RunCheckpoint(
        run_id=run_id, trace_id=trace_id, turn=0, elapsed_seconds=0.0, transcript=()
    )
    return StartPoint(trace_id=trace_id, resume=resume)


class LiveRuns:
    """The runs one daemon runs, by id: started with the journal told of their start point
    (the tracker already tracking them; both forget a run that fails to start), held while
    they run, aborted on request."""

    def __init__(
        self,
        config: Config,
        scenarios: Mapping[str, Scenario],
        reports: Path,
        journal: Journal,
        tracker: Tracker,
    ) -> None:
        self._config, self._scenarios, self._reports = config, scenarios, reports
        self._journal, self._tracker = journal, tracker
        self.handles: dict[str, RunHandle] = {}

    async def start(
        self,
        runtime: Runtime,
        run_id: str,
        request: RunRequest,
        point: StartPoint,
        admitted: Admitted | None = None,
    ) -> None:
        """Start ``request`` as ``run_id`` at ``point``. ``admitted`` is what :func:`admit`
        made of ``request`` just before (no await between); without it (a stored request
        started again), the request passes the policy here.

        :raises ApiError: 422, the request does not pass the policy (any more).
        """
        self._journal.expect(run_id, point)
        try:
            if admitted is None:
                admitted = admit(request, self._config, self._scenarios)
            self.handles[run_id] = await self._start(runtime, run_id, admitted)
        except BaseException:
            self._journal.forget(run_id)
            self._tracker.forget(run_id)
            raise

    async def _start(self, runtime: Runtime, run_id: str, admitted: Admitted) -> RunHandle:
        request, config, reports = admitted.request, self._config, self._reports
        if admitted.scenario is not None:
            return await start_scenario(runtime, admitted.scenario, run_id=run_id)
        if request.pipeline is not None:
            assert admitted.folder is not None
            pipeline = request.pipeline
            await anyio.Path(reports).mkdir(parents=True, exist_ok=True)
            options = ReportOptions(
                goal=pipeline.goal,
                out=str(reports / f"{run_id}{'.tex' if pipeline.format == 'latex' else '.md'}"),
                format=pipeline.format,
                reflect_rounds=pipeline.reflect_rounds,
                # With no endpoint configured, the simulator plays each stage's script.
                models=simulated_models("report") if config.model.base_url is None else {},
                notice=SIMULATOR_NOTE if answered_by_simulator(config, request) else "",
            )
            return await start_report(runtime, admitted.folder, options, run_id=run_id)
        assert request.task is not None
        spec = RunSpec(
            task=request.task,
            system=request.system,
            folder=admitted.folder,
            overrides=dict(request.config),
            run_id=run_id,
        )
        return await runtime.start(spec)

    async def result(self, run_id: str, request: RunRequest) -> RunResult:
        """``run_id``'s result once it ends (it is no longer held then, and the journal has
        forgotten it), marked as the simulator's answer where the simulator answered a task
        or a pipeline."""
        try:
            result = await self.handles[run_id].result()
        finally:
            self.handles.pop(run_id, None)
            self._journal.forget(run_id)
        if answered_by_simulator(self._config, request):
            return simulator_answered(result)
        return result

    async def abort(
        self, run_id: str, message: str = "Aborted through the API.", source: Source = "api"
    ) -> bool:
        """Ask ``run_id`` to stop if it runs here and has not ended; whether it did."""
        handle = self.handles.get(run_id)
        if handle is None or handle.done:
            return False
        await handle.abort(message, source=source)
        return True
