"""Starting what ``POST /v1/runs`` asked for on a runtime: a task, a scenario or a pipeline.

Shared by the single daemon and by fleet members, so both run a request the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import anyio
import msgspec

from orchestrator.config import Config
from orchestrator.daemon.errors import ApiError
from orchestrator.daemon.schemas import RunRequest
from orchestrator.report import ReportOptions, simulated_models, start_report
from orchestrator.runtime import RunHandle, RunSpec, Runtime
from orchestrator.scenario_runs import start_scenario
from orchestrator.sim import Scenario

__all__ = ["check_pipeline", "report_path", "start_request"]


def check_pipeline(request: RunRequest) -> None:
    """Refuse a pipeline request that cannot run: it needs a ``folder`` that is a directory
    here, and no ``task``.

    :raises ApiError: 422 naming the field.
    """
    if request.task is not None:
        raise ApiError(
            422, "conflicting_fields", "`task` cannot be combined with `pipeline`", key="task"
        )
    if request.folder is None:
        raise ApiError(422, "missing_field", "a `pipeline` needs a `folder`", key="folder")
    if not Path(request.folder).is_dir():
        raise ApiError(
            422, "invalid_folder", f"{request.folder!r} is not a directory here", key="folder"
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
) -> RunHandle:
    """Start ``request`` as run ``run_id`` (it was validated when it was accepted)."""
    if request.scenario is not None:
        scenario = scenarios[request.scenario]
        if request.config:
            scenario = msgspec.structs.replace(
                scenario, config={**scenario.config, **request.config}
            )
        return await start_scenario(runtime, scenario, run_id=run_id)
    if request.pipeline is not None:
        assert request.folder is not None
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
        return await start_report(runtime, request.folder, options, run_id=run_id)
    assert request.task is not None
    spec = RunSpec(
        task=request.task,
        system=request.system,
        folder=request.folder,
        overrides=dict(request.config),
        run_id=run_id,
    )
    return await runtime.start(spec)
