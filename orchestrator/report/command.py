"""``loopfuse report DIR --goal TEXT``: the report workflow from the command line.

With no ``model.base_url`` configured the embedded simulator plays every stage (its
``report`` scenario, whatever the folder holds); otherwise every stage asks the configured
model.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import msgspec

from actors.tools.figure import warn_about_figure_sandbox
from bus import Progress
from orchestrator.config import Config
from orchestrator.pipeline.progress_view import ProgressView
from orchestrator.report.run import start_report
from orchestrator.report.workflow import ReportOptions, simulated_models
from orchestrator.result import RunResult, describe_ending, result_summary
from orchestrator.runtime import RunHandle, Runtime

__all__ = ["run_report_command"]

logger = logging.getLogger("loopfuse.report")


async def run_report_command(
    config: Config,
    args: argparse.Namespace,
    follow: Callable[[RunHandle], Awaitable[RunResult]],
) -> int:
    """Run the report workflow for the parsed ``args``; returns the exit status."""
    folder = Path(args.folder)
    if not await anyio.Path(folder).is_dir():
        print(f"loopfuse report: {args.folder!r} is not a directory", file=sys.stderr)
        return 2
    if args.reflect < 0:
        print("loopfuse report: --reflect must be 0 or more", file=sys.stderr)
        return 2
    suffix = "tex" if args.format == "latex" else "md"
    options = ReportOptions(
        goal=args.goal,
        out=str(Path(args.out) if args.out else Path(f"report.{suffix}")),
        format=args.format,
        reflect_rounds=args.reflect,
        models=simulated_models("report") if config.model.base_url is None else {},
    )
    view = ProgressView(sys.stderr, live=sys.stderr.isatty())
    async with Runtime(config) as runtime:
        await warn_about_figure_sandbox(logger, runtime.tools, config.tools.figure_sandbox)
        handle = await start_report(runtime, folder, options)
        async with anyio.create_task_group() as tg:

            async def show() -> None:
                async for event in handle.events():
                    if isinstance(event, Progress):
                        view.show(event)

            tg.start_soon(show)
            result = await follow(handle)
        view.close()
    if args.json:
        sys.stdout.write(msgspec.json.encode(result_summary(result)).decode() + "\n")
    else:
        if result.output:
            print(f"Report written to {options.out}")
        print(describe_ending(result))
    return 0 if result.exit_reason == "completed" else 1
