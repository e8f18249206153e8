"""The budget monitor: hard limits on turns, tool calls, wall-clock time, tokens and cost.

* ``max_turns`` is checked when a turn ends (after its tools ran), ``max_tool_calls`` when
  a call is proposed (the call past the limit does not run).
* ``deadline_seconds``: one timer task serves every run (a heap of deadlines), so a run
  waiting on a slow model or tool is stopped when its time is up; checkpoints check too.
* tokens and cost: :mod:`actors.budget.tokens` decides from each ``ModelReplied``'s total
  usage (a warning or continuation ``Nudge``; a stop when the turn ends, or on diminishing
  returns).

Every limit ends the run with ``max_turns`` and its own cause (``docs/budgets.md``).
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, assert_never

import anyio
import msgspec
from anyio.abc import TaskStatus

from actors.budget.snapshot import restore_account, snapshot_account
from actors.budget.tokens import BudgetNudge, BudgetStop, TokenAccount, TokenLimits
from bus import (
    Bus,
    Message,
    ModelReplied,
    Nudge,
    RunFinished,
    RunStarted,
    ToolCallProposed,
    TurnEnded,
    TurnStarted,
    stop_signal,
)

__all__ = ["BudgetMonitor"]


@dataclass(slots=True)
class _RunBudget:
    max_turns: int
    max_tool_calls: int
    deadline_at: float | None
    tokens: TokenAccount | None = None
    proposed: int = 0
    stopped: bool = False


class BudgetMonitor:
    """Publishes a ``StopSignal`` when a run exceeds its turns, tool calls, deadline, tokens
    or cost, and the token budget's ``Nudge``s (warning at 90%, target continuations)."""

    def __init__(self, bus: Bus, *, clock: Callable[[], float] = time.time) -> None:
        self._bus = bus
        self._clock = clock
        self._runs: dict[str, _RunBudget] = {}
        self._deadlines: list[tuple[float, str]] = []
        self._rearm = anyio.Event()
        self._restored: dict[str, bytes] = {}  # run id -> token state to resume with

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Serve until the bus closes this subscription."""
        handlers = self.handlers()
        subscription = self._bus.subscribe(
            *handlers, name="budget_monitor", answers=True, inline=True
        )
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._watch_deadlines)
            task_status.started()
            await subscription.serve_by_type(handlers)
            tg.cancel_scope.cancel()

    def active_runs(self) -> int:
        return len(self._runs)

    def snapshot(self, run_id: str) -> bytes | None:
        """The token budget's state of ``run_id`` (``None``: the run has no token budget,
        or is not running); what :meth:`restore` takes to resume it."""
        budget = self._runs.get(run_id)
        if budget is None or budget.tokens is None:
            return self._restored.get(run_id)
        return snapshot_account(budget.tokens)

    def restore(self, run_id: str, state: bytes) -> None:
        """Resume ``run_id``'s token budget from a :meth:`snapshot` (call before the run
        starts): applied at its ``RunStarted``, dropped at its ``RunFinished``. A snapshot
        that cannot be read is ignored (the account starts from zero)."""
        self._restored[run_id] = state

    def handlers(self) -> dict[type[Message], Callable[[Any], None]]:
        """The function of each message type the monitor handles (what the bus calls)."""
        return {
            TurnStarted: self._turn_started,
            TurnEnded: self._turn_ended,
            ToolCallProposed: self._call_proposed,
            ModelReplied: self._replied,
            RunStarted: self._run_started,
            RunFinished: self._run_finished,
        }

    def _turn_started(self, msg: TurnStarted) -> None:
        self._check_deadline(msg.run_id)

    def _turn_ended(self, msg: TurnEnded) -> None:
        budget = self._runs.get(msg.run_id)
        if budget is None:
            return
        if budget.max_turns and msg.turn >= budget.max_turns:
            self._stop(
                msg.run_id,
                "budget.max_turns",
                f"Reached the limit of {budget.max_turns} turns (max_turns).",
            )
        if budget.tokens is not None:
            self._answer(msg.run_id, budget.tokens.exhausted())

    def _call_proposed(self, msg: ToolCallProposed) -> None:
        budget = self._runs.get(msg.run_id)
        if budget is None:
            return
        budget.proposed += 1
        if budget.max_tool_calls and budget.proposed > budget.max_tool_calls:
            self._stop(
                msg.run_id,
                "budget.max_tool_calls",
                f"Call {budget.proposed} ({msg.call.name}) would exceed the limit of "
                f"{budget.max_tool_calls} tool calls (max_tool_calls); it did not run.",
            )

    def _replied(self, msg: ModelReplied) -> None:
        budget = self._runs.get(msg.run_id)
        if budget is None or budget.tokens is None or budget.stopped:
            return
        total = msg.total_usage
        answer = budget.tokens.replied(
            total.prompt_tokens,
            total.completion_tokens,
            ended_turn=msg.tool_calls == 0 and msg.finish_reason != "length",
        )
        self._answer(msg.run_id, answer)

    def _run_finished(self, msg: RunFinished) -> None:
        self._runs.pop(msg.run_id, None)
        self._restored.pop(msg.run_id, None)

    def _run_started(self, msg: RunStarted) -> None:
        deadline = msg.started_at + msg.deadline_seconds if msg.deadline_seconds else None
        limits = TokenLimits(
            output_tokens=msg.output_token_budget,
            input_tokens=msg.input_token_budget,
            cost=msg.cost_budget,
            mode=msg.budget_mode,
            input_price_per_million=msg.input_price_per_million,
            output_price_per_million=msg.output_price_per_million,
        )
        tokens = TokenAccount(limits) if limits.any else None
        restored = self._restored.pop(msg.run_id, None)
        if tokens is not None and restored is not None:
            try:
                restore_account(tokens, restored)
            except (msgspec.DecodeError, msgspec.ValidationError):
                tokens = TokenAccount(limits)
        self._runs[msg.run_id] = _RunBudget(msg.max_turns, msg.max_tool_calls, deadline, tokens)
        if deadline is not None:
            heapq.heappush(self._deadlines, (deadline, msg.run_id))
            if self._deadlines[0][1] == msg.run_id:
                self._rearm.set()

    def _answer(self, run_id: str, answer: BudgetNudge | BudgetStop | None) -> None:
        match answer:
            case None:
                pass
            case BudgetStop(cause=cause, detail=detail):
                self._stop(run_id, cause, detail)
            case BudgetNudge(kind=kind, text=text, continues=continues):
                self._bus.publish_nowait(
                    Nudge(
                        run_id=run_id,
                        kind=kind,
                        text=text,
                        source="budget_monitor",
                        continues=continues,
                        keeps_answer=continues,  # a token target: the answer grows
                    )
                )
            case _:
                assert_never(answer)

    def _check_deadline(self, run_id: str) -> None:
        budget = self._runs.get(run_id)
        deadline = budget.deadline_at if budget is not None else None
        if deadline is not None and self._clock() >= deadline:
            self._stop(
                run_id,
                "budget.deadline",
                "The run's wall-clock deadline passed (deadline_seconds).",
            )

    def _stop(self, run_id: str, cause: str, detail: str) -> None:
        budget = self._runs.get(run_id)
        if budget is None or budget.stopped:
            return
        budget.stopped = True
        self._bus.publish_nowait(
            stop_signal(cause, run_id=run_id, source="budget_monitor", detail=detail)
        )

    async def _watch_deadlines(self) -> None:
        while True:
            self._rearm = anyio.Event()
            while self._deadlines and (
                self._deadlines[0][1] not in self._runs or self._deadlines[0][0] <= self._clock()
            ):
                _, run_id = heapq.heappop(self._deadlines)
                self._check_deadline(run_id)
            wait = self._deadlines[0][0] - self._clock() if self._deadlines else None
            with anyio.move_on_after(wait):
                await self._rearm.wait()
