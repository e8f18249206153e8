"""Pipelines: the plan from config alone, stop policies, skipped stages, the final 100%."""

from __future__ import annotations

import anyio
import msgspec
import pytest

from bus import ExitReason, Progress, RunFinished
from orchestrator.pipeline import (
    AgentStage,
    CodeStage,
    PipelineConfig,
    Probes,
    StageContext,
    StageOutcome,
    plan_of,
    run_pipeline,
)
from orchestrator.pipeline.progress_view import ProgressView, percent_of
from orchestrator.report import ReportOptions, report_pipeline
from orchestrator.result import RunResult
from orchestrator.runtime import Runtime
from orchestrator.sim import parse_scenario

LOOPER = parse_scenario(
    """
task = "unused"
[pipeline]
name = "test"
[[steps]]
text = "unused"
[[tracks.work]]
tool_calls = [{ name = "list_dir", arguments = { path = "." } }]
repeat = true
[expect]
exit_reason = "max_turns"
""",
    source="pipe_looper.toml",
    name="pipe_looper",
)


def test_the_plan_is_the_stage_names_in_order() -> None:
    config = PipelineConfig(
        name="p", stages=(CodeStage(name="a"), AgentStage(name="b"), CodeStage(name="c.1"))
    )
    assert plan_of(config) == ("a", "b", "c.1")


def test_duplicate_or_missing_stages_are_refused_naming_them() -> None:
    with pytest.raises(ValueError, match="duplicate names a"):
        PipelineConfig(name="p", stages=(CodeStage(name="a"), CodeStage(name="a")))
    with pytest.raises(ValueError, match="at least one stage"):
        PipelineConfig(name="p", stages=())


@pytest.mark.parametrize(
    ("fmt", "xelatex", "compiles"),
    [("markdown", "/usr/bin/xelatex", False), ("latex", None, False), ("latex", "/x", True)],
)
def test_compile_is_planned_only_for_latex_with_xelatex(
    fmt: str, xelatex: str | None, compiles: bool
) -> None:
    options = ReportOptions(goal="g", out="r", format=fmt, reflect_rounds=2)  # type: ignore[arg-type]
    plan = plan_of(report_pipeline(options, Probes(xelatex=xelatex)))
    assert plan[:5] == ("scan", "explore", "draft", "reflect.1", "reflect.2")
    assert ("compile" in plan) is compiles
    assert plan[-1] == ("compile" if compiles else "finalize")


def _config(policy: str) -> PipelineConfig:
    return PipelineConfig(
        name="t",
        stages=(
            CodeStage(name="first"),
            AgentStage(
                name="work",
                on_stop=policy,  # type: ignore[arg-type]
                overrides={"model": "pipe_looper/work", "max_turns": 2, "tools": ["list_dir"]},
            ),
            CodeStage(name="last"),
        ),
    )


async def _code(ctx: StageContext) -> StageOutcome:
    return StageOutcome(detail=f"ran {ctx.stage.name}")


async def _work(ctx: StageContext) -> StageOutcome:
    result = await ctx.run_agent("loop forever")
    return StageOutcome(stopped=result if result.exit_reason is not ExitReason.COMPLETED else None)


async def _run(policy: str, tmp: str) -> tuple[list[Progress], RunFinished, RunResult]:
    handlers = {"first": _code, "work": _work, "last": _code}
    async with Runtime(scenarios=[LOOPER]) as runtime:
        handle = await runtime.start_pipeline(
            lambda run_id, trace_id: run_pipeline(
                runtime, _config(policy), handlers, run_id=run_id, trace_id=trace_id, folder=tmp
            )
        )
        events = [e async for e in handle.events()]
        result = await handle.result()
    assert result.trace_id == handle.trace_id  # the pipeline's trace is the handle's
    progress = [e for e in events if isinstance(e, Progress)]
    finished = [e for e in events if isinstance(e, RunFinished)]
    assert len(finished) == 1
    assert events[-1] is finished[0]
    return progress, finished[0], result


@pytest.mark.asyncio
async def test_a_fail_stage_ends_the_run_with_its_reason_and_skips_the_rest(tmp_path) -> None:
    with anyio.fail_after(20):
        progress, finished, _result = await _run("fail", str(tmp_path))
    assert all(p.total == 3 for p in progress)  # the plan is known from the first event
    assert progress[0].stage == "first"
    assert progress[0].index == 1
    assert finished.exit_reason is ExitReason.MAX_TURNS
    assert finished.cause == "budget.max_turns"
    assert (progress[-1].stage, progress[-1].status, progress[-1].index) == ("last", "skipped", 3)
    assert percent_of(progress[-1]) == 100
    assert not finished.degraded


@pytest.mark.asyncio
async def test_a_degrade_stage_goes_on_and_marks_the_result_degraded(tmp_path) -> None:
    with anyio.fail_after(20):
        progress, finished, _result = await _run("degrade", str(tmp_path))
    assert finished.exit_reason is ExitReason.COMPLETED
    assert finished.degraded
    assert "work (max_turns: budget.max_turns)" in finished.detail
    assert [(p.stage, p.status) for p in progress][-3:] == [
        ("work", "started"),
        ("work", "finished"),
        ("last", "finished"),  # a code stage reports only its end
    ]
    assert progress[-1].tokens > 0  # the agent stage's tokens are counted
    assert finished.llm_requests == 2


def test_the_plain_view_prints_one_line_per_event() -> None:
    import io

    event = Progress(run_id="r", stage="draft", index=3, total=6, status="finished", tokens=1234)
    plain = io.StringIO()
    view = ProgressView(plain)
    view.show(event)
    view.show(msgspec.structs.replace(event, index=4, status="started", detail="again"))
    assert plain.getvalue() == (
        "3/6 draft finished  50%   0.0s 1,234 tokens\n"
        "4/6 draft started  50%   0.0s 1,234 tokens: again\n"
    )


SLOW = parse_scenario(
    """
task = "unused"
[pipeline]
name = "test"
[[steps]]
text = "unused"
[[tracks.work]]
text = "slow"
latency = 30
[expect]
exit_reason = "aborted_streaming"
""",
    source="pipe_slow.toml",
    name="pipe_slow",
)


@pytest.mark.asyncio
async def test_aborting_a_pipeline_aborts_its_stage_run_and_skips_the_rest(tmp_path) -> None:
    config = PipelineConfig(
        name="t",
        stages=(
            AgentStage(name="work", on_stop="degrade", overrides={"model": "pipe_slow/work"}),
            CodeStage(name="last"),
        ),
    )
    working = anyio.Event()

    async def work(ctx: StageContext) -> StageOutcome:
        working.set()  # the stage run is registered before this task yields
        return await _work(ctx)

    handlers = {"work": work, "last": _code}
    async with Runtime(scenarios=[SLOW]) as runtime:
        with anyio.fail_after(20):
            handle = await runtime.start_pipeline(
                lambda run_id, trace_id: run_pipeline(
                    runtime,
                    config,
                    handlers,
                    run_id=run_id,
                    trace_id=trace_id,
                    folder=str(tmp_path),
                )
            )
            await working.wait()
            await handle.abort("stop it")
            result = await handle.result()
            stage_run = runtime.handle(f"{handle.run_id}.work")
            assert stage_run is not None
            stage_result = await stage_run.result()
            events = runtime.event_log.events(handle.run_id)
    assert stage_result.cause == result.cause == "abort.caller"  # not degraded: aborted
    assert result.exit_reason is stage_result.exit_reason
    assert not result.degraded
    progress = [e for e in events if isinstance(e, Progress)]
    assert [(p.stage, p.status) for p in progress][-1] == ("last", "skipped")
