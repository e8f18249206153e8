"""Running a pipeline scenario (``pipeline = "report"``) against the simulator.

A pipeline scenario's ``[pipeline.options]`` holds :class:`PipelineScenarioConfig` keys; each agent
stage asks for model ``SCENARIO/STAGE`` and so plays the scenario's track of that name
(``tracks.explore``, ``tracks.draft``, ``tracks.reflect``).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import anyio.to_thread
import msgspec

from orchestrator.errors import ConfigError
from orchestrator.pipeline import Probes
from orchestrator.report.checks import ReportFormat
from orchestrator.report.run import SAMPLE_FOLDER, start_report
from orchestrator.report.workflow import ReportOptions, simulated_models
from orchestrator.runtime import RunHandle, Runtime
from orchestrator.sim import Scenario

__all__ = ["PipelineScenarioConfig", "start_pipeline_scenario"]


class PipelineScenarioConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The ``[pipeline.options]`` keys of a report scenario."""

    reflect_rounds: int = 1
    format: ReportFormat = "markdown"
    explore_max_turns: int = 20
    explore_loop_preset: str = "strict"
    explore_vision: bool | None = None
    """The explore model reads images (``None``: as the runtime's ``[models]`` says)."""
    sample_files: tuple[str, ...] = ()
    """Files of the shipped sample folder copied into the run's folder (binary files,
    such as ``plate_photo.png``, that ``[folder]`` cannot hold)."""


async def start_pipeline_scenario(
    runtime: Runtime,
    scenario: Scenario,
    folder: Path,
    *,
    run_id: str | None = None,
    on_finished: Callable[[], object] | None = None,
) -> RunHandle:
    """Start ``scenario``'s pipeline on ``folder`` (the report goes to ``folder/report.*``).

    :raises ConfigError: the pipeline is unknown or an option has a bad key or value.
    """
    pipeline = scenario.pipeline
    if pipeline is None or pipeline.name != "report":
        name = pipeline.name if pipeline else None
        raise ConfigError("pipeline.name", f"unknown pipeline {name!r} (known: report)")
    try:
        config = msgspec.convert(pipeline.options, PipelineScenarioConfig)
    except msgspec.ValidationError as exc:
        raise ConfigError("pipeline.options", f"scenario {scenario.name!r}: {exc}") from None
    await anyio.to_thread.run_sync(_copy_samples, scenario.name, config.sample_files, folder)
    suffix = "tex" if config.format == "latex" else "md"
    options = ReportOptions(
        goal=scenario.task,
        out=str(folder / f"report.{suffix}"),
        format=config.format,
        reflect_rounds=config.reflect_rounds,
        models=simulated_models(scenario.name),
        explore_max_turns=config.explore_max_turns,
        explore_loop_preset=config.explore_loop_preset,
        explore_vision=config.explore_vision,
    )
    # Scenarios are deterministic: no compile stage whatever this machine has.
    return await start_report(
        runtime, folder, options, probes=Probes(), run_id=run_id, on_finished=on_finished
    )


def _copy_samples(scenario: str, names: tuple[str, ...], folder: Path) -> None:
    """Copy the named files of :data:`SAMPLE_FOLDER` into ``folder``."""
    shipped = sorted(p.name for p in SAMPLE_FOLDER.iterdir() if p.is_file())
    for name in names:
        if name not in shipped:
            raise ConfigError(
                "pipeline.options.sample_files",
                f"scenario {scenario!r}: {name!r} is not a file of the sample folder "
                f"(one of: {', '.join(shipped)})",
            )
        shutil.copyfile(SAMPLE_FOLDER / name, folder / name)
