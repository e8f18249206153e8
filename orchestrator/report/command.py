"""``loopfuse report DIR --goal TEXT``: the report workflow from the command line.

Every stage asks the configured model. The command line refuses to start without one
(``orchestrator.cli.NO_MODEL``): the embedded simulator would play its scripted ``report``
scenario whatever the folder holds (``loopfuse run --scenario report`` plays that).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Awaitable, Mapping
from pathlib import Path
from typing import Protocol

import anyio
import msgspec

from actors.tools.figure import warn_about_figure_sandbox
from bus import Progress
from orchestrator.config import Config
from orchestrator.pipeline.progress_view import ProgressView
from orchestrator.report.run import start_report
from orchestrator.report.workflow import ReportOptions
from orchestrator.result import ExitStatus, RunResult, describe_ending, exit_status, result_summary
from orchestrator.runtime import RunHandle, Runtime

__all__ = ["run_report_command"]

logger = logging.getLogger("loopfuse.report")


class Follow(Protocol):
    """Waits for a run from the terminal (``orchestrator.cli.Follower``)."""

    interrupted: bool
    """Ctrl-C was pressed while it waited."""

    def __call__(self, handle: RunHandle) -> Awaitable[RunResult]: ...


async def run_report_command(
    config: Config,
    args: argparse.Namespace,
    follow: Follow,
    *,
    models: Mapping[str, str] | None = None,
) -> int:
    """Run the report workflow for the parsed ``args``; returns the exit status
    (:class:`ExitStatus`). Every stage asks ``config``'s model, which must have a
    ``model.base_url``, unless ``models`` names each stage's (``simulated_models``: the
    simulator's scripted tracks, for tests)."""
    if config.model.base_url is None and not models:
        raise ValueError("loopfuse report needs a configured model (model.base_url)")
    folder = Path(args.folder)
    if not await anyio.Path(folder).is_dir():
        print(f"loopfuse report: {args.folder!r} is not a directory", file=sys.stderr)
        return ExitStatus.USAGE
    if args.reflect < 0:
        print("loopfuse report: --reflect must be 0 or more", file=sys.stderr)
        return ExitStatus.USAGE
    suffix = "tex" if args.format == "latex" else "md"
    options = ReportOptions(
        goal=args.goal,
        out=str(Path(args.out) if args.out else Path(f"report.{suffix}")),
        format=args.format,
        reflect_rounds=args.reflect,
        models=dict(models or {}),
    )
    # On a terminal the command line's live line shows the stages (Follower); elsewhere
    # a plain line per stage event.
    view = None if sys.stderr.isatty() else ProgressView(sys.stderr)
    async with Runtime(config) as runtime:
        await warn_about_figure_sandbox(logger, runtime.tools, config.tools.figure_sandbox)
        handle = await start_report(runtime, folder, options)
        async with anyio.create_task_group() as tg:

            async def show() -> None:
                async for event in handle.events():
                    if isinstance(event, Progress) and view is not None:
                        view.show(event)

            tg.start_soon(show)
            result = await follow(handle)
    if args.json:
        sys.stdout.write(msgspec.json.encode(result_summary(result)).decode() + "\n")
    else:
        if result.output:
            print(f"Report written to {options.out}")
        print(describe_ending(result))
    return exit_status(result, interrupted=follow.interrupted)
