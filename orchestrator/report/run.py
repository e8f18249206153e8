"""Starting a report run on a runtime."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Final

import anyio
import msgspec

from orchestrator.config import model_reads_images
from orchestrator.pipeline import Probes, probe, run_pipeline
from orchestrator.report.workflow import ReportOptions, report_handlers, report_pipeline
from orchestrator.result import RunResult
from orchestrator.runtime import RunHandle, Runtime

__all__ = ["SAMPLE_FOLDER", "start_report"]

SAMPLE_FOLDER: Final = Path(__file__).parent / "sample"
"""A made-up lab measurement shipped with loopfuse (CSV data, parameters, notes, an image)."""


async def start_report(
    runtime: Runtime,
    folder: str | Path,
    options: ReportOptions,
    *,
    probes: Probes | None = None,
    run_id: str | None = None,
    on_finished: Callable[[], object] | None = None,
) -> RunHandle:
    """Start the report workflow on ``folder``; the plan is fixed before this returns.

    ``probes`` is probed once here when not given, and the same answer decides the plan
    and the run. With ``options.explore_vision`` unset, the runtime's config decides
    whether the explore model reads images (``[models."<name>"] vision``).

    :raises NotADirectoryError: ``folder`` is not a directory.
    """
    if not await anyio.Path(folder).is_dir():
        raise NotADirectoryError(f"report folder {str(folder)!r} is not a directory")
    probes = probes if probes is not None else probe()
    if options.explore_vision is None:
        model = options.models.get("explore") or runtime.config.model.model
        vision = model_reads_images(runtime.config, model)
        options = msgspec.structs.replace(options, explore_vision=vision)
    config = report_pipeline(options, probes)
    handlers = report_handlers(options, probes)

    async def body(run_id: str, trace_id: str) -> RunResult:
        return await run_pipeline(
            runtime, config, handlers, run_id=run_id, trace_id=trace_id, folder=str(folder)
        )

    return await runtime.start_pipeline(body, run_id=run_id, on_finished=on_finished)
