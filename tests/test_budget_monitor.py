"""The budget monitor on a real bus: every answer is in the run's inbox when the settling
publish returns (the barrier rule); runs are isolated; state is dropped at RunFinished."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import ExitStack, asynccontextmanager
from typing import Any

import anyio
import pytest

from actors.budget.monitor import BudgetMonitor
from bus import (
    Bus,
    ExitReason,
    Inbox,
    Message,
    ModelReplied,
    Nudge,
    Outcome,
    RunFinished,
    StopSignal,
    ToolCall,
    ToolCallProposed,
    TurnEnded,
    TurnStarted,
    Usage,
)
from tests.harness import serving, settle
from tests.started import run_started


class Clock:
    def __init__(self, now: float = 1_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@asynccontextmanager
async def monitored(
    clock: Callable[[], float] = time.time,
) -> AsyncIterator[tuple[Bus, BudgetMonitor]]:
    bus = Bus()
    monitor = BudgetMonitor(bus, clock=clock)
    async with serving(bus, monitor):
        yield bus, monitor


class Run:
    """Plays the conductor's part for one run: settled checkpoints, answers drained."""

    def __init__(self, bus: Bus, run_id: str, inbox: Inbox) -> None:
        self.bus, self.run_id, self.inbox = bus, run_id, inbox
        self.turn = 0
        self.completion = 0
        self.prompt = 0

    async def start(self, **budgets: Any) -> list[Message]:
        budgets.setdefault("max_turns", 100)
        budgets.setdefault("max_tool_calls", 100)
        return await self.settle(
            run_started(run_id=self.run_id, trace_id="t", task="x", model="m", **budgets)
        )

    async def settle(self, msg: Message) -> list[Message]:
        return await settle(self.bus, self.inbox, msg)

    async def reply(
        self, completion: int, *, prompt: int = 0, tool_calls: int = 0, finish: str = "stop"
    ) -> list[Message]:
        """One turn's reply with this many new tokens; returns the answers to it."""
        self.turn += 1
        self.completion += completion
        self.prompt += prompt
        await self.settle(
            TurnStarted(run_id=self.run_id, turn=self.turn, stage="agent", prompt_messages=1)
        )
        return await self.settle(
            ModelReplied(
                run_id=self.run_id,
                turn=self.turn,
                text_chars=10,
                tool_calls=tool_calls,
                finish_reason="tool_calls" if tool_calls else finish,
                usage=Usage(prompt_tokens=prompt, completion_tokens=completion),
                total_usage=Usage(prompt_tokens=self.prompt, completion_tokens=self.completion),
            )
        )

    async def end_turn(self, tool_calls: int = 0) -> list[Message]:
        return await self.settle(
            TurnEnded(run_id=self.run_id, turn=self.turn, tool_calls=tool_calls)
        )

    async def propose(self, index: int) -> list[Message]:
        call = ToolCall(id=f"c{self.turn}-{index}", name="read_file", arguments="{}")
        return await self.settle(
            ToolCallProposed(
                run_id=self.run_id, turn=self.turn, call=call, fingerprint="f", index=index
            )
        )

    async def finish(self) -> None:
        await self.settle(
            RunFinished(
                run_id=self.run_id,
                exit_reason=ExitReason.COMPLETED,
                cause="model.end_turn",
                outcome=Outcome.DONE,
                detail="",
                hint="",
                turns=self.turn,
                llm_requests=self.turn,
                tool_calls=0,
                usage=Usage(),
            )
        )


@pytest.fixture
def inboxes() -> Iterator[ExitStack]:
    with ExitStack() as stack:
        yield stack


def open_run(bus: Bus, stack: ExitStack, run_id: str = "r1") -> Run:
    return Run(bus, run_id, stack.enter_context(bus.open_inbox(run_id)))


def stops(answers: list[Message]) -> list[StopSignal]:
    return [a for a in answers if isinstance(a, StopSignal)]


def nudges(answers: list[Message]) -> list[Nudge]:
    return [a for a in answers if isinstance(a, Nudge)]


# ---------------------------------------------------------------- turns, calls, deadline


@pytest.mark.asyncio
async def test_max_turns_stops_when_the_last_allowed_turn_ends(inboxes: ExitStack) -> None:
    async with monitored() as (bus, _):
        run = open_run(bus, inboxes)
        await run.start(max_turns=2)
        await run.reply(10, tool_calls=1)
        assert await run.end_turn(1) == []
        await run.reply(10, tool_calls=1)
        (stop,) = stops(await run.end_turn(1))
    assert (stop.reason, stop.cause, stop.source) == (
        ExitReason.MAX_TURNS,
        "budget.max_turns",
        "budget_monitor",
    )


@pytest.mark.asyncio
async def test_the_call_beyond_max_tool_calls_is_stopped_before_it_runs(
    inboxes: ExitStack,
) -> None:
    async with monitored() as (bus, _):
        run = open_run(bus, inboxes)
        await run.start(max_tool_calls=2)
        await run.reply(10, tool_calls=3)
        assert await run.propose(0) == []
        assert await run.propose(1) == []
        (stop,) = stops(await run.propose(2))
    assert stop.cause == "budget.max_tool_calls"
    assert "Call 3 (read_file)" in stop.detail


@pytest.mark.asyncio
async def test_deadline_is_checked_at_each_turn_start(inboxes: ExitStack) -> None:
    clock = Clock(1_000.0)
    async with monitored(clock) as (bus, _):
        run = open_run(bus, inboxes)
        await run.start(deadline_seconds=3_600.0, started_at=1_000.0)
        assert await run.reply(10) == []
        clock.now = 4_600.0
        run.turn += 1
        (stop,) = stops(
            await run.settle(
                TurnStarted(run_id=run.run_id, turn=run.turn, stage="agent", prompt_messages=1)
            )
        )
    assert stop.cause == "budget.deadline"


@pytest.mark.asyncio
async def test_deadline_timer_stops_a_run_that_is_waiting(inboxes: ExitStack) -> None:
    async with monitored() as (bus, _):
        run = open_run(bus, inboxes)
        await run.start(deadline_seconds=0.05, started_at=time.time())
        with anyio.fail_after(5):
            stop = await run.inbox.receive()  # nothing else happens in the run
    assert isinstance(stop, StopSignal)
    assert stop.cause == "budget.deadline"


# ---------------------------------------------------------------- output-token ceiling


@pytest.mark.asyncio
async def test_warning_nudge_once_at_90_percent_with_the_numbers(inboxes: ExitStack) -> None:
    async with monitored() as (bus, _):
        run = open_run(bus, inboxes)
        await run.start(output_token_budget=30_000)
        answers = []
        for tokens in (13_000, 13_100, 1_000, 1_000):  # 43%, 87%, 90%, 93%
            answers.append(await run.reply(tokens, tool_calls=1))
            assert await run.end_turn(1) == []
    assert answers[0] == answers[1] == answers[3] == []
    (nudge,) = answers[2]
    assert nudge == Nudge(
        run_id="r1",
        kind="budget.warning",
        text="Output-token budget 90% used (27,100 / 30,000); keep working, do not summarise.",
        source="budget_monitor",
    )
    assert not nudge.continues


@pytest.mark.asyncio
async def test_output_ceiling_stops_when_the_turn_ends_not_at_the_reply(
    inboxes: ExitStack,
) -> None:
    async with monitored() as (bus, _):
        run = open_run(bus, inboxes)
        await run.start(output_token_budget=5_000)
        await run.reply(3_000, tool_calls=1)
        assert await run.end_turn(1) == []
        assert stops(await run.reply(3_000, tool_calls=1)) == []  # its tools may still run
        (stop,) = stops(await run.end_turn(1))
        assert stops(await run.end_turn(1)) == []  # a run needs only its first stop
    assert (stop.reason, stop.cause) == (ExitReason.MAX_TURNS, "budget.output_tokens")
    assert "6,000 completion tokens" in stop.detail


@pytest.mark.asyncio
async def test_input_and_cost_ceilings(inboxes: ExitStack) -> None:
    async with monitored() as (bus, _):
        by_input = open_run(bus, inboxes, "input")
        by_cost = open_run(bus, inboxes, "cost")
        await by_input.start(input_token_budget=10_000)
        await by_cost.start(
            cost_budget=0.03, input_price_per_million=2.5, output_price_per_million=10.0
        )
        for run in (by_input, by_cost):
            await run.reply(500, prompt=6_000, tool_calls=1)
            assert await run.end_turn(1) == []  # 6,000 prompt; cost 0.015 + 0.005
            await run.reply(500, prompt=6_000, tool_calls=1)
        (input_stop,) = stops(await by_input.end_turn(1))
        (cost_stop,) = stops(await by_cost.end_turn(1))
    assert input_stop.cause == "budget.input_tokens"
    assert "12,000 prompt tokens" in input_stop.detail
    assert cost_stop.cause == "budget.cost"
    assert cost_stop.detail.startswith("The run cost 0.0400 ")


# ---------------------------------------------------------------- target mode


@pytest.mark.asyncio
async def test_target_mode_continues_an_ending_turn_below_90_percent(
    inboxes: ExitStack,
) -> None:
    async with monitored() as (bus, _):
        run = open_run(bus, inboxes)
        await run.start(output_token_budget=10_000, budget_mode="target")
        (first,) = nudges(await run.reply(4_000))
        await run.end_turn()
        assert await run.reply(500, tool_calls=1) == []  # a tool-calling turn is no ending
        await run.end_turn(1)
        (second,) = nudges(await run.reply(2_500))
        await run.end_turn()
        assert await run.reply(2_500) == []  # 9,500: the run may complete
    assert first.continues
    assert first.kind == "budget.continue"
    assert first.text == (
        "Output-token target 40% reached (4,000 / 10,000), continuation 1; keep working, "
        "do not summarise."
    )
    assert second.continues
    assert "(7,000 / 10,000), continuation 2" in second.text


@pytest.mark.asyncio
async def test_a_truncated_reply_is_no_end_of_turn(inboxes: ExitStack) -> None:
    async with monitored() as (bus, _):
        run = open_run(bus, inboxes)
        await run.start(output_token_budget=10_000, budget_mode="target")
        assert await run.reply(1_000, finish="length") == []


@pytest.mark.asyncio
async def test_diminishing_returns_stop_and_nothing_after_it(inboxes: ExitStack) -> None:
    async with monitored() as (bus, _):
        run = open_run(bus, inboxes)
        await run.start(output_token_budget=30_000, budget_mode="target")
        for tokens in (3_000, 3_000, 2_500, 400):
            (nudge,) = await run.reply(tokens)
            assert isinstance(nudge, Nudge)
            await run.end_turn()
        (stop,) = await run.reply(300)
        assert await run.reply(10) == []  # stopped runs get no more answers
    assert isinstance(stop, StopSignal)
    assert (stop.reason, stop.cause) == (ExitReason.MAX_TURNS, "budget.diminishing_returns")


@pytest.mark.asyncio
async def test_short_tool_calling_turns_never_trip_diminishing_returns(
    inboxes: ExitStack,
) -> None:
    """Ceiling mode has no continuations; a long run of 40-token tool calls goes on."""
    async with monitored() as (bus, _):
        run = open_run(bus, inboxes)
        await run.start(output_token_budget=100_000, max_turns=1_000)
        for _ in range(50):
            assert await run.reply(40, tool_calls=1) == []
            assert await run.end_turn(1) == []


# ---------------------------------------------------------------- runs and state


@pytest.mark.asyncio
async def test_runs_are_isolated_and_state_is_dropped_at_run_finished(
    inboxes: ExitStack,
) -> None:
    async with monitored() as (bus, monitor):
        small = open_run(bus, inboxes, "small")
        large = open_run(bus, inboxes, "large")
        await small.start(output_token_budget=1_000)
        await large.start(output_token_budget=1_000_000)
        assert monitor.active_runs() == 2
        await small.reply(950, tool_calls=1)
        assert await large.reply(950, tool_calls=1) == []
        assert stops(await large.end_turn(1)) == []
        await large.finish()
        assert monitor.active_runs() == 1
        assert await large.reply(10**7, tool_calls=1) == []  # unknown run now: ignored
        await small.finish()
        assert monitor.active_runs() == 0


@pytest.mark.asyncio
async def test_a_run_without_token_limits_gets_no_token_answers(inboxes: ExitStack) -> None:
    async with monitored() as (bus, _):
        run = open_run(bus, inboxes)
        await run.start()
        assert await run.reply(10**8, prompt=10**8) == []
        assert await run.end_turn() == []


# ---------------------------------------------------------------- resumed runs


@pytest.mark.asyncio
async def test_a_restored_token_account_does_not_warn_again(inboxes: ExitStack) -> None:
    async with monitored() as (bus, monitor):
        run = open_run(bus, inboxes)
        await run.start(output_token_budget=30_000)
        (warning,) = nudges(await run.reply(27_100, tool_calls=1))
        assert warning.kind == "budget.warning"
        saved = monitor.snapshot("r1")
        await run.finish()
        assert saved is not None
        assert monitor.snapshot("r1") is None

        monitor.restore("r1", saved)  # the same run, resumed: warned already
        assert monitor.snapshot("r1") == saved
        resumed = open_run(bus, inboxes, "r1b")
        monitor.restore("r1b", saved)
        resumed.completion = 27_100
        await resumed.start(output_token_budget=30_000)
        assert await resumed.reply(500, tool_calls=1) == []  # 92%: no second warning

        fresh = open_run(bus, inboxes, "r2")  # the same numbers without the snapshot
        fresh.completion = 27_100
        await fresh.start(output_token_budget=30_000)
        assert [n.kind for n in nudges(await fresh.reply(500, tool_calls=1))] == ["budget.warning"]


@pytest.mark.asyncio
async def test_a_restored_target_keeps_its_continuations(inboxes: ExitStack) -> None:
    async with monitored() as (bus, monitor):
        run = open_run(bus, inboxes)
        await run.start(output_token_budget=30_000, budget_mode="target")
        for tokens in (3_000, 3_000, 400):  # three continuations
            assert nudges(await run.reply(tokens))[0].continues
            await run.end_turn()
        saved = monitor.snapshot("r1")
        assert saved is not None
        resumed = open_run(bus, inboxes, "r1-resumed")
        monitor.restore("r1-resumed", saved)
        resumed.completion = run.completion
        await resumed.start(output_token_budget=30_000, budget_mode="target")
        (stop,) = stops(await resumed.reply(300))  # 400 then 300 after 3 continuations
        assert stop.cause == "budget.diminishing_returns"


@pytest.mark.asyncio
async def test_an_unreadable_snapshot_starts_the_account_from_zero(inboxes: ExitStack) -> None:
    async with monitored() as (bus, monitor):
        monitor.restore("r1", b"not a snapshot")
        run = open_run(bus, inboxes)
        await run.start(output_token_budget=30_000)
        (warning,) = nudges(await run.reply(27_100, tool_calls=1))
        assert warning.kind == "budget.warning"
