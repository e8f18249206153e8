"""Running a scenario file: its folder, its scripted tools, its run config, its expectations.

A scenario names the simulator's script (the run's model is the scenario's name), the
files the run may read (written once per runtime, shared read-only by its runs), the
fake tools it may call, config overrides, and the result it expects. Its ``abort`` trigger
plays the caller who aborts the run (as Ctrl-C would) once enough text streamed or a given
tool's result came back.
"""

from __future__ import annotations

import enum
import tempfile
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import anyio

from bus import ModelTextDelta, ToolResult
from orchestrator.result import RunResult
from orchestrator.runtime import RunHandle, RunSpec, Runtime
from orchestrator.runtime.folders import write_folder
from orchestrator.sim import Scenario
from orchestrator.sim.scenario import AbortTrigger, CallExpectation

__all__ = ["call_mismatches", "expectation_mismatches", "run_scenario", "start_scenario"]


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
    """Start ``scenario`` on ``runtime``. An agent run reads the scenario's folder that
    every run of it shares (read-only, :mod:`orchestrator.runtime.folders`); a pipeline,
    which writes its report into its folder, gets one of its own, removed when it ends."""
    if scenario.pipeline is not None:
        return await _start_pipeline(runtime, scenario, run_id)
    folder = await runtime.scenario_folders.folder(scenario.name, scenario.folder)
    overrides: dict[str, Any] = {"model": scenario.name, **scenario.config}
    scripted = runtime.add_scenario_tools(scenario)
    if scripted:
        overrides["tools"] = (*overrides.get("tools", runtime.config.tools.enabled), *scripted)
    return await runtime.start(
        RunSpec(
            task=scenario.task,
            system=scenario.system,
            folder=folder,
            overrides=overrides,
            run_id=run_id,
        ),
        watch=_abort_when(scenario.abort) if scenario.abort is not None else None,
        scenario=True,
    )


async def _start_pipeline(runtime: Runtime, scenario: Scenario, run_id: str | None) -> RunHandle:
    from orchestrator.report.scenario import start_pipeline_scenario

    folder = tempfile.TemporaryDirectory(prefix=f"loopfuse-{scenario.name}-")
    try:
        root = Path(folder.name)
        await anyio.to_thread.run_sync(write_folder, root, scenario.folder)
        return await start_pipeline_scenario(
            runtime, scenario, root, run_id=run_id, on_finished=folder.cleanup
        )
    except BaseException:
        folder.cleanup()
        raise


async def run_scenario(runtime: Runtime, scenario: Scenario) -> RunResult:
    """Run ``scenario`` to its end."""
    return await (await start_scenario(runtime, scenario)).result()


def expectation_mismatches(scenario: Scenario, result: RunResult) -> list[str]:
    """How ``result`` differs from what ``scenario`` expects (empty when it matches)."""
    expect = scenario.expect
    mismatches: list[str] = []

    def check(name: str, wanted: object, got: object) -> None:
        if wanted is not None and wanted != got:
            mismatches.append(f"{name}: expected {_shown(wanted)}, got {_shown(got)}")

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
    mismatches += call_mismatches(expect.calls, result)
    for field, wanted_texts in (("detail", expect.detail_contains), ("hint", expect.hint_contains)):
        text = getattr(result, field)
        mismatches += [f"{field}: {t!r} not in {text!r}" for t in wanted_texts if t not in text]
    return mismatches


def _shown(value: object) -> str:
    """A value as a person reads it: an enum by its value (``'completed'``), not its repr."""
    return repr(value.value if isinstance(value, enum.Enum) else value)


def call_mismatches(calls: Sequence[CallExpectation], result: RunResult) -> list[str]:
    """How the run's proposed calls differ from the per-call expectations (``call`` is
    1-based; a call the run never proposed is a mismatch)."""
    mismatches: list[str] = []
    for wanted in calls:
        if wanted.call > len(result.call_log):
            mismatches.append(
                f"calls[{wanted.call}]: the run proposed {len(result.call_log)} call(s)"
            )
            continue
        entry = result.call_log[wanted.call - 1]
        for key in ("verdict", "tool"):
            want, got = getattr(wanted, key), getattr(entry, key)
            if want is not None and got != want:
                mismatches.append(f"calls[{wanted.call}].{key}: expected {want!r}, got {got!r}")
    return mismatches
