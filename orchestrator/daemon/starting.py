"""Starting what ``POST /v1/runs`` asked for on a runtime: a task, a scenario or a pipeline.

Shared by the single daemon and by fleet members, so both run a request the same way. The
request passes the operator's policy again here (:func:`~orchestrator.daemon.policy.admit`):
a stored request runs only as the policy of the daemon that starts it allows, with its
folder resolved at that moment.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import anyio

from orchestrator.config import Config
from orchestrator.daemon.policy import admit
from orchestrator.daemon.schemas import RunRequest
from orchestrator.report import ReportOptions, simulated_models, start_report
from orchestrator.runtime import RunHandle, RunSpec, Runtime
from orchestrator.scenarios.runs import start_scenario
from orchestrator.sim import Scenario

__all__ = ["report_path", "start_request"]


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
) -> RunHandle:
    """Start ``request`` as run ``run_id``.

    :raises ApiError: 422, the request does not pass ``config``'s policy (any more).
    """
    admitted = admit(request, config, scenarios)
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
