"""Running a scenario file: its folder, its scripted tools, its run config, its expectations.

A scenario names the simulator's script (the run's model is the scenario's name), the
files the run may read (written once per runtime, shared read-only by its runs), the
fake tools it may call, config overrides, and the result it expects. Its ``abort`` trigger
plays the caller who aborts the run (as Ctrl-C would) once enough text streamed or a given
tool's result came back.
"""

from __future__ import annotations

import enum
import functools
import tempfile
from pathlib import Path
from typing import Any

import anyio

from bus import ModelTextDelta, ToolResult
from orchestrator.result import RunResult
from orchestrator.runtime import RunHandle, RunSpec, Runtime
from orchestrator.runtime.folders import write_folder
from orchestrator.sim import Scenario
from orchestrator.sim.scenario import AbortTrigger

__all__ = ["expectation_mismatches", "run_scenario", "start_scenario"]


async def _abort_when(trigger: AbortTrigger, handle: RunHandle) -> None:
    """A run watcher (bound to ``trigger``) that aborts the run, as its caller, once
    ``trigger`` fires."""
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


async def start_scenario(
    runtime: Runtime, scenario: Scenario, *, run_id: str | None = None
) -> RunHandle:
    """Start ``scenario`` on ``runtime``. An agent run reads the scenario's folder that
    every run of it shares (read-only, :mod:`orchestrator.runtime.folders`); a pipeline,
    which writes its report into its folder, gets one of its own, removed when it ends."""
    if scenario.pipeline is not None:
        from orchestrator.report.scenario import start_pipeline_scenario

        temp = tempfile.TemporaryDirectory(prefix=f"loopfuse-{scenario.name}-")
        try:
            root = Path(temp.name)
            await anyio.to_thread.run_sync(write_folder, root, scenario.folder)
            return await start_pipeline_scenario(
                runtime, scenario, root, run_id=run_id, on_finished=temp.cleanup
            )
        except BaseException:
            temp.cleanup()
            raise
    folder = await runtime.scenario_folders.folder(scenario.name, scenario.folder)
    overrides: dict[str, Any] = {"model": scenario.name, **scenario.config}
    if scripted := runtime.add_scenario_tools(scenario):
        overrides["tools"] = (*overrides.get("tools", runtime.config.tools.enabled), *scripted)
    return await runtime.start(
        RunSpec(
            task=scenario.task,
            system=scenario.system,
            folder=folder,
            overrides=overrides,
            run_id=run_id,
        ),
        watch=functools.partial(_abort_when, scenario.abort) if scenario.abort else None,
        scenario=True,
    )


async def run_scenario(runtime: Runtime, scenario: Scenario) -> RunResult:
    """Run ``scenario`` to its end."""
    return await (await start_scenario(runtime, scenario)).result()


def expectation_mismatches(scenario: Scenario, result: RunResult) -> list[str]:
    """How ``result`` differs from what ``scenario`` expects (empty when it matches)."""
    expect = scenario.expect
    mismatches: list[str] = []
    for key in (
        "exit_reason",
        "cause",
        "turns",
        "llm_requests",
        "tool_calls",
        "incomplete",
        "degraded",
        "nudges",
    ):
        wanted, got = getattr(expect, key), getattr(result, key)
        if wanted is not None and wanted != got:
            # as a person reads them: an enum by its value ('completed'), not its repr
            shown = [repr(v.value if isinstance(v, enum.Enum) else v) for v in (wanted, got)]
            mismatches.append(f"{key}: expected {shown[0]}, got {shown[1]}")
    if expect.max_llm_requests is not None and result.llm_requests > expect.max_llm_requests:
        mismatches.append(
            f"llm_requests: expected at most {expect.max_llm_requests}, got {result.llm_requests}"
        )
    # the per-call expectations (``call`` is 1-based; a call never proposed is a mismatch)
    for wanted_call in expect.calls:
        if wanted_call.call > len(result.call_log):
            mismatches.append(
                f"calls[{wanted_call.call}]: the run proposed {len(result.call_log)} call(s)"
            )
            continue
        entry = result.call_log[wanted_call.call - 1]
        for key in ("verdict", "tool"):
            want, got = getattr(wanted_call, key), getattr(entry, key)
            if want is not None and got != want:
                mismatches.append(
                    f"calls[{wanted_call.call}].{key}: expected {want!r}, got {got!r}"
                )
    for field, wanted_texts in (("detail", expect.detail_contains), ("hint", expect.hint_contains)):
        text = getattr(result, field)
        mismatches += [f"{field}: {t!r} not in {text!r}" for t in wanted_texts if t not in text]
    return mismatches
