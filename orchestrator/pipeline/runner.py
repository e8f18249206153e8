"""The stage runner: runs a pipeline's stages one after another under one run id.

Every stage is announced with a :class:`bus.Progress` event carrying ``index`` of ``total``
from the plan (known before the first stage runs), under the stage's own name. An agent
stage runs its model loops through the runtime (one conductor run per attempt, run id
``RUN.STAGE`` or ``RUN.STAGE.N``) with the stage's own settings; its stop policy decides
what a stop means. Stages that never run are reported as skipped, and the last event
reaches 100%. One ``RunFinished`` ends the pipeline run.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

import msgspec

from bus import (
    ChatMessage,
    ExitReason,
    Progress,
    ProgressStatus,
    Usage,
    abort_cause,
    reason_of,
)
from orchestrator.pipeline.config import AgentStage, PipelineConfig, Stage
from orchestrator.pipeline.plan import plan_of
from orchestrator.result import RunResult, end_result, finished_message
from orchestrator.runtime import RunSpec, Runtime

__all__ = ["PipelineRun", "StageContext", "StageHandler", "StageOutcome", "run_pipeline"]

logger = logging.getLogger("loopfuse.pipeline")


class StageFailed(Exception):
    """Raised by a stage handler: the stage cannot go on (``cause`` is declared in the cause
    table; ``reason``: another of its reasons, as :func:`bus.stop_signal` takes it)."""

    def __init__(self, cause: str, detail: str, reason: ExitReason | None = None) -> None:
        super().__init__(detail)
        self.reason = reason_of(cause, reason)
        self.cause = cause
        self.detail = detail


@dataclass(frozen=True, kw_only=True)
class StageOutcome:
    """What a stage handler reports: a one-line detail, the agent run that stopped the stage
    (its policy applies), and later stages it makes unnecessary (reported as skipped)."""

    detail: str = ""
    stopped: RunResult | None = None
    skip: tuple[str, ...] = ()


@dataclass
class PipelineRun:
    """The state of one pipeline run, shared by its stages."""

    run_id: str
    trace_id: str
    folder: str | None
    plan: tuple[str, ...]
    results: list[RunResult] = field(default_factory=list)
    degraded_by: list[str] = field(default_factory=list)
    output: str = ""
    started: float = field(default_factory=time.monotonic)

    @property
    def usage(self) -> Usage:
        return sum((result.usage for result in self.results), Usage())


@dataclass
class StageContext:
    """What a stage handler gets: the run, its stage, and a way to run agent attempts."""

    runtime: Runtime
    run: PipelineRun
    stage: Stage
    attempts: int = 0

    async def run_agent(
        self, task: str, *, system: str | None = None, history: tuple[ChatMessage, ...] = ()
    ) -> RunResult:
        """Run one model loop with this (agent) stage's settings and return its result."""
        stage = self.stage
        assert isinstance(stage, AgentStage), f"stage {stage.name} is not an agent stage"
        pipeline = self.runtime.handle(self.run.run_id)
        abort = pipeline.abort_requested if pipeline is not None else None
        if abort is not None:
            detail = abort.detail or "The run was aborted."
            raise StageFailed(abort_cause(abort.source), detail, ExitReason.ABORTED_TOOLS)
        self.attempts += 1
        suffix = "" if self.attempts == 1 else f".{self.attempts}"
        result = await self.runtime.run(
            RunSpec(
                task=task,
                system=system,
                folder=self.run.folder,
                overrides=dict(stage.overrides),
                run_id=f"{self.run.run_id}.{stage.name}{suffix}",
                trace_id=self.run.trace_id,
                history=history,
                stage=stage.name,
                plan=(stage.name,),  # the stage run's own progress; the pipeline's is above
            )
        )
        self.run.results.append(result)
        if result.cause.startswith("abort."):  # the run was aborted: no stage goes on
            raise StageFailed(result.cause, result.detail, result.exit_reason)
        return result


StageHandler = Callable[[StageContext], Awaitable[StageOutcome]]


async def run_pipeline(
    runtime: Runtime,
    config: PipelineConfig,
    handlers: Mapping[str, StageHandler],
    *,
    run_id: str | None = None,
    trace_id: str | None = None,
    folder: str | None = None,
) -> RunResult:
    """Run ``config``'s stages in order with ``handlers`` (one per stage name).

    :raises ValueError: a stage has no handler.
    """
    if missing := [s.name for s in config.stages if s.name not in handlers]:
        raise ValueError(f"pipeline {config.name!r}: no handler for stages {', '.join(missing)}")
    run = PipelineRun(
        run_id=run_id or uuid.uuid4().hex,
        trace_id=trace_id or uuid.uuid4().hex,
        folder=folder,
        plan=plan_of(config),
    )
    runtime.event_log.open_run(run.run_id)
    reason, cause, detail = ExitReason.COMPLETED, "model.end_turn", "Every stage ran."
    skipped: set[str] = set()
    for index, stage in enumerate(config.stages, start=1):
        if stage.name in skipped:
            _progress(runtime, run, stage.name, index, "skipped", "not needed")
            continue
        if isinstance(stage, AgentStage):
            # A code stage (the scan) is quick and deterministic: its one event is its end,
            # so the first event of a run already carries the scan's summary.
            _progress(runtime, run, stage.name, index, "started", "")
        context = StageContext(runtime=runtime, run=run, stage=stage)
        # Set when the stage ends the run: reason, cause, detail, and its progress detail.
        ending: tuple[ExitReason, str, str, str] | None = None
        try:
            outcome = await handlers[stage.name](context)
        except StageFailed as failed:
            ending = (failed.reason, failed.cause, failed.detail, f"failed: {failed.detail}")
        except Exception as exc:
            logger.exception("stage %s of run %s failed", stage.name, run.run_id)
            detail = f"stage {stage.name} failed: {exc!r}"
            ending = (ExitReason.HOOK_STOPPED, "internal.error", detail, f"failed: {detail}")
        else:
            skipped.update(outcome.skip)
            stop = outcome.stopped
            if stop is not None and isinstance(stage, AgentStage) and stage.on_stop == "fail":
                detail = f"stage {stage.name} stopped: {stop.detail}"
                ending = (stop.exit_reason, stop.cause, detail, detail)
            elif stop is not None:
                run.degraded_by.append(f"{stage.name} ({stop.exit_reason.value}: {stop.cause})")
        if ending is not None:
            reason, cause, detail, shown = ending
            _progress(runtime, run, stage.name, index, "finished", shown)
            for later, rest in enumerate(config.stages[index:], start=index + 1):
                _progress(runtime, run, rest.name, later, "skipped", "not reached")
            break
        _progress(runtime, run, stage.name, index, "finished", outcome.detail)
    if reason is ExitReason.COMPLETED and run.degraded_by:
        detail = f"Every stage ran; degraded by {', '.join(run.degraded_by)}."
    result = msgspec.structs.replace(
        end_result(run.run_id, run.trace_id, reason, cause, detail),
        turns=sum(r.turns for r in run.results),
        llm_requests=sum(r.llm_requests for r in run.results),
        tool_calls=sum(r.tool_calls for r in run.results),
        usage=run.usage,
        output=run.output,
        degraded=bool(run.degraded_by),
        nudges=sum(r.nudges for r in run.results),
        trace=tuple(e for r in run.results for e in r.trace),
        call_log=tuple(e for r in run.results for e in r.call_log),
    )
    await runtime.bus.publish(finished_message(result))
    return result


def _progress(
    runtime: Runtime,
    run: PipelineRun,
    stage: str,
    index: int,
    status: ProgressStatus,
    detail: str,
) -> None:
    runtime.bus.publish_nowait(
        Progress(
            run_id=run.run_id,
            stage=stage,
            index=index,
            total=len(run.plan),
            status=status,
            detail=detail,
            tokens=run.usage.total_tokens,
            elapsed_seconds=round(time.monotonic() - run.started, 3),
        )
    )
