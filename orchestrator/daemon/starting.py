"""Starting what ``POST /v1/runs`` asked for on a runtime: a task, a scenario or a pipeline.

Shared by the single daemon and by fleet members, so both run a request the same way. The
request passes the operator's policy again here (:func:`~orchestrator.daemon.policy.admit`):
a stored request runs only as the policy of the daemon that starts it allows, with its
folder resolved at that moment. A request admitted a moment before (the daemon's submit
path, no await between) is started from that :class:`~orchestrator.daemon.policy.Admitted`
instead of being checked twice.

With no model configured (``model.base_url``), the embedded simulator answers a task or a
pipeline too (:func:`answered_by_simulator`, decided once when the run starts): the daemon
marks such a run's result (:func:`~orchestrator.result.simulator_answered`: ``simulated``
and :data:`~orchestrator.result.SIMULATOR_NOTE`), and its report file starts with the note.
Scenario runs are the simulator's own work and stay unmarked.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

import anyio

from orchestrator.config import Config
from orchestrator.daemon.policy import Admitted, admit
from orchestrator.daemon.schemas import RunRequest
from orchestrator.report import ReportOptions, simulated_models, start_report
from orchestrator.result import SIMULATOR_NOTE
from orchestrator.runtime import RunHandle, RunSpec, Runtime
from orchestrator.scenarios.runs import start_scenario
from orchestrator.sim import Scenario

__all__ = ["answered_by_simulator", "report_path", "start_request", "warn_without_model"]


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


def report_path(reports: Path, run_id: str, request: RunRequest) -> Path:
    """Where a pipeline run's report is written: ``<reports>/<run id>.md`` (or ``.tex``)."""
    assert request.pipeline is not None
    suffix = ".tex" if request.pipeline.format == "latex" else ".md"
    return reports / f"{run_id}{suffix}"


async def start_request(
    runtime: Runtime,
    request: RunRequest,
    *,
    run_id: str,
    config: Config,
    scenarios: Mapping[str, Scenario],
    reports: Path,
    admitted: Admitted | None = None,
) -> RunHandle:
    """Start ``request`` as run ``run_id``. ``admitted`` is what :func:`admit` made of
    ``request`` with ``config`` just before (no await between); without it (a stored
    request started again), the request passes the policy here.

    :raises ApiError: 422, the request does not pass ``config``'s policy (any more).
    """
    if admitted is None:
        admitted = admit(request, config, scenarios)
    assert admitted.request is request
    if admitted.scenario is not None:
        return await start_scenario(runtime, admitted.scenario, run_id=run_id)
    if request.pipeline is not None:
        assert admitted.folder is not None
        pipeline = request.pipeline
        await anyio.Path(reports).mkdir(parents=True, exist_ok=True)
        options = ReportOptions(
            goal=pipeline.goal,
            out=str(report_path(reports, run_id, request)),
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
