"""The progress reporter: milestones with ``index`` of ``total`` from a plan fixed up front.

The plan (the run's stages) travels in ``RunStarted``, so the first progress event already
knows the denominator. The stage name is taken from the messages, never reconstructed from
a position in the plan. When the run ends, stages that never ran are reported as skipped
and the last event always reaches 100%.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio
from anyio.abc import TaskStatus

from bus import Bus, Message, Progress, ProgressStatus, RunEnding, RunStarted, TurnStarted

__all__ = ["ProgressReporter"]


@dataclass(slots=True)
class _Plan:
    stages: tuple[str, ...]
    current: str
    limit: str  # " of at most <max_turns>", or "" without a limit
    index: int = 0  # the position of ``current`` in ``stages`` (1-based)


class ProgressReporter:
    """Publishes :class:`bus.Progress` events for every run (an observer: never waited for)."""

    def __init__(self, bus: Bus) -> None:
        self._bus = bus
        self._plans: dict[str, _Plan] = {}

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Serve until the bus closes this subscription."""
        # Answering (waited for) only so that the last progress events precede
        # RunFinished; it never stops or nudges a run.
        handlers = self.handlers()
        subscription = self._bus.subscribe(
            *handlers, name="progress_reporter", answers=True, inline=True
        )
        await subscription.serve_by_type(handlers, task_status=task_status)

    def handlers(self) -> dict[type[Message], Callable[[Any], None]]:
        """The function of each message type the reporter handles (what the bus calls)."""
        return {
            TurnStarted: self._turn_started,
            RunStarted: self._run_started,
            RunEnding: self._run_ending,
        }

    def _turn_started(self, msg: TurnStarted) -> None:
        running = self._plans.get(msg.run_id)
        if running is None:
            return
        if msg.stage != running.current:
            running.current = msg.stage
            running.index = self._position(running, msg.stage)
        self._bus.publish_nowait(
            Progress(
                run_id=msg.run_id,
                stage=msg.stage,
                index=running.index,
                total=len(running.stages),
                status="running",
                detail=f"turn {msg.turn}{running.limit}",
                turn=msg.turn,
            )
        )

    def _run_started(self, msg: RunStarted) -> None:
        limit = f" of at most {msg.max_turns}" if msg.max_turns else ""
        plan = _Plan(msg.plan or (msg.stage,), msg.stage, limit)
        plan.index = self._position(plan, msg.stage)
        self._plans[msg.run_id] = plan
        self._emit(msg.run_id, plan, msg.stage, "started", "run started")

    def _run_ending(self, msg: RunEnding) -> None:
        ended = self._plans.pop(msg.run_id, None)
        if ended is None:
            return
        done = f"{msg.exit_reason.value} ({msg.cause})"
        self._emit(msg.run_id, ended, ended.current, "finished", done)
        for stage in ended.stages[ended.index :]:  # the stages after the current one
            self._emit(msg.run_id, ended, stage, "skipped", "not reached")

    @staticmethod
    def _position(plan: _Plan, stage: str) -> int:
        return plan.stages.index(stage) + 1 if stage in plan.stages else len(plan.stages)

    def _emit(
        self, run_id: str, plan: _Plan, stage: str, status: ProgressStatus, detail: str
    ) -> None:
        index = self._position(plan, stage)
        if status in ("finished", "skipped") and stage == plan.stages[-1]:
            index = len(plan.stages)
        self._bus.publish_nowait(
            Progress(
                run_id=run_id,
                stage=stage,
                index=index,
                total=len(plan.stages),
                status=status,
                detail=detail,
            )
        )
