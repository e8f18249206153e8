"""The loop monitor on a real bus: answers arrive before the settle returns, runs are
isolated, state is dropped at RunFinished."""

from __future__ import annotations

import tracemalloc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import pytest
from anyio.abc import TaskStatus

from actors.fingerprint import fingerprint_call, fingerprint_result
from actors.loop import GEMINI, OPENCLAW, STRICT, LoopConfig
from actors.loop.monitor import LoopMonitor
from bus import (
    Bus,
    ExitReason,
    Inbox,
    Message,
    ModelCancel,
    ModelReply,
    ModelTextDelta,
    Nudge,
    Outcome,
    RunFinished,
    StopSignal,
    ToolCall,
    ToolCallProposed,
    ToolResult,
    ToolVerdict,
    Usage,
)
from tests.harness import drain, serving
from tests.messages_examples import finished
from tests.published import Published
from tests.started import run_started

PARAGRAPH = (
    "I will now check the configuration once more to be sure that everything is in order "
    "before I continue with the next part of the task. "
)


@asynccontextmanager
async def monitored(
    monitor_config: LoopConfig | None = None,
) -> AsyncIterator[tuple[Bus, LoopMonitor]]:
    bus = Bus()
    monitor = LoopMonitor(bus, monitor_config or STRICT)
    async with serving(bus, monitor):
        yield bus, monitor


class Caller:
    """Plays the conductor's part for one run: proposes settled calls, reports results."""

    def __init__(self, bus: Bus, run_id: str, inbox: Inbox) -> None:
        self.bus, self.run_id, self.inbox = bus, run_id, inbox
        self.n = 0

    async def start(self) -> None:
        await self.bus.publish_settled(
            run_started(run_id=self.run_id, trace_id="t", task="x", model="m")
        )

    async def propose(
        self, name: str, arguments: str, result: str | None = "same"
    ) -> list[Message]:
        """Propose one call; returns what the inbox got before the settle returned."""
        self.n += 1
        call = ToolCall(id=f"{self.run_id}-{self.n}", name=name, arguments=arguments)
        fingerprint = fingerprint_call(name, arguments)
        msg = ToolCallProposed(
            run_id=self.run_id, turn=self.n, call=call, fingerprint=fingerprint, index=0
        )
        await self.bus.publish_settled(msg)
        answers = self.drain()
        blocked = any(isinstance(a, ToolVerdict) and a.verdict == "block" for a in answers)
        if result is not None and not blocked:
            await self.bus.publish_settled(
                ToolResult(
                    run_id=self.run_id,
                    turn=self.n,
                    call_id=call.id,
                    tool=name,
                    content=result,
                    fingerprint=fingerprint,
                    result_fingerprint=fingerprint_result(result),
                )
            )
            self.drain()  # the result itself lands in the inbox
        return answers

    def drain(self) -> list[Message]:
        """The inbox's answers (the results the test published left out)."""
        return [msg for msg in drain(self.inbox) if not isinstance(msg, ToolResult)]

    async def finish(self) -> None:
        await self.bus.publish_settled(
            RunFinished(
                run_id=self.run_id,
                exit_reason=ExitReason.COMPLETED,
                cause="model.end_turn",
                outcome=Outcome.DONE,
                detail="",
                hint="",
                turns=self.n,
                llm_requests=self.n,
                tool_calls=self.n,
                usage=Usage(),
            )
        )


READ = ("read_file", '{"path": "a.txt"}')


@pytest.mark.asyncio
async def test_strict_nudge_then_stop_arrive_before_the_settle_returns() -> None:
    async with monitored(STRICT) as (bus, _):
        with bus.open_inbox("r1") as inbox:
            run = Caller(bus, "r1", inbox)
            await run.start()
            answers = [await run.propose(*READ) for _ in range(5)]
    assert answers[0] == answers[1] == answers[3] == []
    verdict, nudge = answers[2]
    assert isinstance(verdict, ToolVerdict)
    assert verdict.verdict == "warn"
    assert (verdict.call_id, verdict.source, verdict.turn) == ("r1-3", "loop_monitor", 3)
    assert verdict.cause == "loop.generic_repeat"  # metrics count the detector from it
    assert isinstance(nudge, Nudge)
    assert nudge.kind == "loop.generic_repeat"
    assert "finish_exploration" in nudge.text
    (stop,) = answers[4]
    assert isinstance(stop, StopSignal)
    assert (stop.reason, stop.cause, stop.source) == (
        ExitReason.HOOK_STOPPED,
        "loop.generic_repeat",
        "loop_monitor",
    )


@pytest.mark.asyncio
async def test_openclaw_blocks_a_stuck_poll_with_a_reason() -> None:
    async with monitored(OPENCLAW) as (bus, _):
        with bus.open_inbox("r1") as inbox:
            run = Caller(bus, "r1", inbox)
            await run.start()
            answers = [await run.propose("command_status", '{"id": 1}') for _ in range(22)]
    assert [len(a) for a in answers[:10]] == [0] * 10
    assert {type(m) for m in answers[10]} == {ToolVerdict, Nudge}
    assert answers[11:20] == [[]] * 9  # rate-limited until the next bucket
    for blocked in answers[20:]:
        (verdict,) = blocked
        assert isinstance(verdict, ToolVerdict)
        assert verdict.verdict == "block"
        assert verdict.message.startswith("CRITICAL: Called command_status")


@pytest.mark.asyncio
async def test_two_interleaved_runs_with_identical_calls_are_isolated() -> None:
    async with monitored(STRICT) as (bus, monitor):
        with bus.open_inbox("r1") as one, bus.open_inbox("r2") as two:
            runs = [Caller(bus, "r1", one), Caller(bus, "r2", two)]
            for run in runs:
                await run.start()
            seen: list[Message] = []
            for _ in range(4):
                for run in runs:
                    seen += await run.propose(*READ)
            assert monitor.active_runs() == 2
            # each run nudged once at its own 3rd call; 8 calls in all but nobody stopped
            assert sorted((m.run_id, type(m).__name__) for m in seen) == [
                ("r1", "Nudge"), ("r1", "ToolVerdict"), ("r2", "Nudge"), ("r2", "ToolVerdict"),
            ]  # fmt: skip
            # r1 reaches its 5th: only r1 stops
            stop = await runs[0].propose(*READ)
            assert [(type(m), m.run_id) for m in stop] == [(StopSignal, "r1")]
            assert await runs[1].propose("read_file", '{"path": "other"}') == []


@pytest.mark.asyncio
async def test_run_finished_drops_the_run_state() -> None:
    async with monitored(STRICT) as (bus, monitor):
        with bus.open_inbox("r1") as inbox:
            run = Caller(bus, "r1", inbox)
            await run.start()
            for _ in range(4):
                await run.propose(*READ)
            assert monitor.active_runs() == 1
            await run.finish()
            assert monitor.active_runs() == 0
            # the same run id starts afresh: no stop at what would have been the 5th
            await run.start()
            assert await run.propose(*READ) == []
            await run.finish()
            assert monitor.active_runs() == 0


@pytest.mark.asyncio
async def test_per_run_config_override_and_callable_config() -> None:
    bus = Bus()
    monitor = LoopMonitor(bus, lambda run_id: GEMINI if run_id.startswith("g") else STRICT)
    monitor.override("oc", OPENCLAW)
    async with serving(bus, monitor):
        with bus.open_inbox("g1") as g, bus.open_inbox("oc") as oc:
            gemini, openclaw = Caller(bus, "g1", g), Caller(bus, "oc", oc)
            await gemini.start()
            await openclaw.start()
            gemini_answers = [await gemini.propose(*READ) for _ in range(5)]
            openclaw_answers = [await openclaw.propose(*READ) for _ in range(5)]
    verdict, nudge = gemini_answers[4]
    assert isinstance(verdict, ToolVerdict)
    assert verdict.verdict == "block"
    assert isinstance(nudge, Nudge)
    assert nudge.text.startswith("System: Potential loop detected.")
    assert openclaw_answers == [[]] * 5


class Probe:
    """An observer of ModelCancel (not an inbox message)."""

    def __init__(self, bus: Bus) -> None:
        self.subscription = bus.subscribe(ModelCancel, name="probe")
        self.cancels: list[ModelCancel] = []
        self.arrived = anyio.Event()

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        await self.subscription.serve(self.handle, task_status=task_status)

    def handle(self, msg: ModelCancel) -> None:
        self.cancels.append(msg)
        self.arrived.set()
        self.arrived = anyio.Event()


@pytest.mark.asyncio
async def test_content_loop_cancels_and_nudges_then_stops() -> None:
    bus = Bus()
    probe = Probe(bus)
    monitor = LoopMonitor(bus, GEMINI)
    async with serving(bus, monitor, probe):
        with bus.open_inbox("r1") as inbox:
            await bus.publish_settled(run_started(run_id="r1", trace_id="t", task="x", model="m"))
            for turn in (1, 2):
                arrived = probe.arrived
                answered: Message | None = None
                stream = PARAGRAPH * 20
                for piece in [stream[i : i + 9] for i in range(0, len(stream), 9)]:
                    await bus.publish_settled(ModelTextDelta(run_id="r1", turn=turn, text=piece))
                    if (answered := inbox.receive_nowait()) is not None:
                        break
                with anyio.fail_after(5):
                    await arrived.wait()
                assert probe.cancels[-1] == ModelCancel(
                    run_id="r1", turn=turn, reason="loop.content"
                )
                if turn == 1:
                    assert isinstance(answered, Nudge)
                    assert answered.kind == "loop.content"
                    await bus.publish_settled(
                        ModelReply(run_id="r1", turn=1, text="", aborted=True)
                    )
                    inbox.receive_nowait()  # the reply itself
                else:
                    assert isinstance(answered, StopSignal)
                    assert (answered.reason, answered.cause) == (
                        ExitReason.HOOK_STOPPED,
                        "loop.content",
                    )
    assert len(probe.cancels) == 2


def _proposed(
    run_id: str, n: int, name: str = READ[0], arguments: str = READ[1]
) -> ToolCallProposed:
    call = ToolCall(id=f"{run_id}-{n}", name=name, arguments=arguments)
    return ToolCallProposed(
        run_id=run_id, turn=n, call=call, fingerprint=fingerprint_call(name, arguments), index=0
    )


def test_a_run_holds_no_state_until_its_first_call_and_none_after_it_finishes() -> None:
    asked: list[str] = []

    def config(run_id: str) -> LoopConfig:
        asked.append(run_id)
        return STRICT

    monitor = LoopMonitor(Bus(), config)
    monitor.handle(run_started(run_id="r1", trace_id="t", task="x", model="m"))
    # a parked run, a reply without calls, a stray result: still nothing held
    monitor.handle(ModelReply(run_id="r1", turn=1, text=""))
    monitor.handle(ToolResult(run_id="r1", turn=1, call_id="c", tool="read_file", content="x"))
    # asked at the start only whether the model-based check is on (it is not: nothing kept)
    assert (monitor.active_runs(), asked) == (0, ["r1"])
    monitor.handle(_proposed("r1", 1))
    monitor.handle(_proposed("r1", 2))
    assert (monitor.active_runs(), asked) == (1, ["r1", "r1"])  # then once for the state
    monitor.handle(finished("r1"))
    assert monitor.active_runs() == 0


def test_a_run_that_only_streams_text_gets_its_state_at_the_first_delta() -> None:
    monitor = LoopMonitor(Bus(), GEMINI)
    monitor.handle(run_started(run_id="r1", trace_id="t", task="x", model="m"))
    assert monitor.active_runs() == 0
    monitor.handle(ModelTextDelta(run_id="r1", turn=1, text="Hello"))
    assert monitor.active_runs() == 1
    monitor.handle(finished("r1"))
    assert monitor.active_runs() == 0


def test_an_override_is_used_at_the_first_call_and_dropped_with_a_run_that_made_none() -> None:
    published = Published()
    monitor = LoopMonitor(published.bus, OPENCLAW)
    monitor.override("quiet", STRICT)
    monitor.handle(run_started(run_id="quiet", trace_id="t", task="x", model="m"))
    monitor.handle(finished("quiet"))  # never called a tool: the override goes too
    monitor.override("r1", STRICT)
    monitor.handle(run_started(run_id="r1", trace_id="t", task="x", model="m"))
    for n in range(1, 4):
        monitor.handle(_proposed("r1", n))
        monitor.handle(_proposed("quiet", n))  # a new run "quiet": the monitor's config
    # strict nudges r1 at its 3rd identical call; openclaw says nothing to "quiet" yet
    assert [(type(m).__name__, m.run_id) for m in published.messages] == [
        ("ToolVerdict", "r1"), ("Nudge", "r1"),
    ]  # fmt: skip


def test_run_started_again_starts_the_run_afresh() -> None:
    published = Published()
    monitor = LoopMonitor(published.bus, STRICT)
    for n in range(1, 5):
        monitor.handle(_proposed("r1", n))
    assert [type(m) for m in published.messages] == [ToolVerdict, Nudge]
    monitor.handle(run_started(run_id="r1", trace_id="t", task="x", model="m"))
    assert monitor.active_runs() == 0
    monitor.handle(_proposed("r1", 5))  # would have been the 5th identical call: a stop
    assert [type(m) for m in published.messages] == [ToolVerdict, Nudge]


def test_a_parked_run_and_a_looping_run_interleaved() -> None:
    published = Published()
    monitor = LoopMonitor(published.bus, STRICT)
    for run_id in ("parked", "looping"):
        monitor.handle(run_started(run_id=run_id, trace_id="t", task="x", model="m"))
    for n in range(1, 6):
        monitor.handle(_proposed("looping", n))
        monitor.handle(ModelReply(run_id="parked", turn=n, text=""))
    assert monitor.active_runs() == 1
    assert [(type(m), m.run_id) for m in published.messages] == [
        (ToolVerdict, "looping"), (Nudge, "looping"), (StopSignal, "looping"),
    ]  # fmt: skip
    # the parked run's first call is its first: nothing carried over from the other run
    monitor.handle(_proposed("parked", 1))
    assert len(published.messages) == 3


@pytest.mark.parametrize("preset", [STRICT, OPENCLAW, GEMINI], ids=lambda c: c.name)
def test_a_parked_run_costs_the_monitor_at_most_300_bytes(preset: LoopConfig) -> None:
    monitor = LoopMonitor(Bus(), preset)
    runs = 500
    started = [run_started(run_id=f"r{n}", trace_id="t", task="x", model="m") for n in range(runs)]
    replies = [ModelReply(run_id=f"r{n}", turn=1, text="") for n in range(runs)]
    monitor.handle(_proposed("warm", 1))  # code paths and caches once, outside the measure
    monitor.handle(finished("warm"))
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        for msg in started:
            monitor.handle(msg)
        for reply in replies:
            monitor.handle(reply)
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    grown = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    assert grown / runs <= 300
    assert monitor.active_runs() == 0
