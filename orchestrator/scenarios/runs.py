"""Running a scenario file: its folder, its scripted tools, its run config, its expectations.

A scenario names the simulator's script (the run's model is the scenario's name), the
files the run may read (written to a temporary folder that lives as long as the run), the
fake tools it may call, config overrides, and the result it expects. Its ``abort`` trigger
plays the caller who aborts the run (as Ctrl-C would) once enough text streamed or a given
tool's result came back.
"""

from __future__ import annotations

import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bus import ModelTextDelta, ToolResult
from orchestrator.result import RunResult
from orchestrator.runtime import RunHandle, RunSpec, Runtime
from orchestrator.sim import Scenario
from orchestrator.sim.scenario import AbortTrigger

__all__ = ["expectation_mismatches", "run_scenario", "start_scenario"]


def _write_folder(root: Path, files: dict[str, str]) -> None:
    for relative, content in files.items():
        target = (root / relative).resolve()
        if not target.is_relative_to(root.resolve()):
            raise ValueError(f"scenario folder entry {relative!r} points outside the folder")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content, encoding="utf-8")


def _abort_when(trigger: AbortTrigger) -> Callable[[RunHandle], Awaitable[None]]:
    """A run watcher that aborts the run, as its caller, once ``trigger`` fires."""

    async def watch(handle: RunHandle) -> None:
        streamed = 0
        async for event in handle.events():
            if isinstance(event, ModelTextDelta) and trigger.after_text_chars is not None:
                streamed += len(event.text)
                if streamed >= trigger.after_text_chars:
                    why = f"{streamed} characters of text had streamed"
                    break
            elif isinstance(event, ToolResult) and event.tool == trigger.after_tool_result:
                why = f"the result of {event.tool} had come back"
                break
        else:
            return
        await handle.abort(trigger.detail or f"Aborted by the scenario: {why}.")

    return watch


async def start_scenario(
    runtime: Runtime, scenario: Scenario, *, run_id: str | None = None
) -> RunHandle:
    """Start ``scenario`` on ``runtime``; its temporary folder is removed when it ends."""
    folder = tempfile.TemporaryDirectory(prefix=f"loopfuse-{scenario.name}-")
    root = Path(folder.name)
    try:
        _write_folder(root, scenario.folder)
        if scenario.pipeline is not None:
            from orchestrator.report.scenario import start_pipeline_scenario

            return await start_pipeline_scenario(
                runtime, scenario, root, run_id=run_id, on_finished=folder.cleanup
            )
        overrides: dict[str, Any] = {"model": scenario.name, **scenario.config}
        scripted = runtime.add_scenario_tools(scenario)
        if scripted:
            overrides["tools"] = (*overrides.get("tools", runtime.config.tools.enabled), *scripted)
        handle = await runtime.start(
            RunSpec(
                task=scenario.task,
                system=scenario.system,
                folder=str(root),
                overrides=overrides,
                run_id=run_id,
            ),
            on_finished=folder.cleanup,
            watch=_abort_when(scenario.abort) if scenario.abort is not None else None,
        )
    except BaseException:
        folder.cleanup()
        raise
    return handle


async def run_scenario(runtime: Runtime, scenario: Scenario) -> RunResult:
    """Run ``scenario`` to its end."""
    return await (await start_scenario(runtime, scenario)).result()


def expectation_mismatches(scenario: Scenario, result: RunResult) -> list[str]:
    """How ``result`` differs from what ``scenario`` expects (empty when it matches)."""
    expect = scenario.expect
    mismatches: list[str] = []

    def check(name: str, wanted: object, got: object) -> None:
        if wanted is not None and wanted != got:
            mismatches.append(f"{name}: expected {wanted!r}, got {got!r}")

    check("exit_reason", expect.exit_reason, result.exit_reason)
    check("cause", expect.cause, result.cause)
    check("turns", expect.turns, result.turns)
    check("llm_requests", expect.llm_requests, result.llm_requests)
    check("tool_calls", expect.tool_calls, result.tool_calls)
    check("incomplete", expect.incomplete, result.incomplete)
    check("degraded", expect.degraded, result.degraded)
    check("nudges", expect.nudges, result.nudges)
    if expect.max_llm_requests is not None and result.llm_requests > expect.max_llm_requests:
        mismatches.append(
            f"llm_requests: expected at most {expect.max_llm_requests}, got {result.llm_requests}"
        )
    return mismatches
