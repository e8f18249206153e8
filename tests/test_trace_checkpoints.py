"""A run's trace as checkpoints and its result see it: entries made as plain tuples are
turned into TraceEntry structs once, in order, and a resumed run goes on from its own."""

from __future__ import annotations

import pytest

from actors.tools import default_registry
from bench.loops import bench_overrides, echo_tool
from bench.scripted_model import ScriptedModel, echo_script
from orchestrator.conductor import RunCheckpoint
from orchestrator.result import TraceEntry
from orchestrator.runtime import RunSpec, Runtime, StartPoint


class Journal:
    def __init__(self, resume: RunCheckpoint | None = None) -> None:
        self.points: list[RunCheckpoint] = []
        self.resume = resume

    def start_point(self, run_id: str) -> StartPoint | None:
        return None if self.resume is None else StartPoint(resume=self.resume)

    def checkpoint(self, checkpoint: RunCheckpoint) -> None:
        self.points.append(checkpoint)


def runtime(journal: Journal) -> Runtime:
    tools = default_registry()
    tools.add(echo_tool())
    return Runtime(
        tools=tools,
        journal=journal,
        model_actor=lambda bus: ScriptedModel(bus, echo_script(6)),
    )


@pytest.mark.asyncio
async def test_every_checkpoint_trace_is_a_prefix_of_the_result_trace() -> None:
    journal = Journal()
    async with runtime(journal) as rt:
        result = await rt.run(RunSpec(task="Echo the steps.", overrides=bench_overrides(6)))
    assert result.cause == "model.end_turn"
    assert len(journal.points) == 5  # one per completed turn with tool calls
    for point in journal.points:
        assert all(type(entry) is TraceEntry for entry in point.trace)
        assert result.trace[: len(point.trace)] == point.trace
    times = [entry.at for entry in result.trace]
    assert times == sorted(times)
    states = [e.state for e in result.trace if e.event != "context counting"]  # a note
    assert states[:4] == ["PLAN", "ACT", "ACT", "OBSERVE"]
    assert result.trace[-1].state == "DONE"
    assert result.trace[-1].event == "completed/model.end_turn"


@pytest.mark.asyncio
async def test_a_resumed_run_keeps_the_trace_it_resumed_from() -> None:
    first = Journal()
    async with runtime(first) as rt:
        await rt.run(RunSpec(task="Echo the steps.", overrides=bench_overrides(6)))
    point = first.points[2]  # after turn 3
    resumed = Journal(resume=point)
    async with runtime(resumed) as rt:
        result = await rt.run(RunSpec(task="Echo the steps.", overrides=bench_overrides(6)))
    assert result.trace[: len(point.trace)] == point.trace
    assert result.trace[len(point.trace)].event == "resumed"
    assert all(type(entry) is TraceEntry for entry in result.trace)
    assert result.turns == 6
