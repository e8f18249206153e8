"""The event log: what it keeps of each opened run (in order, up to the cap, RunFinished
always), and readers following a run live until it ends or is closed."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import anyio
import pytest

from bus import Bus, Message, RunFinished, TurnEnded, TurnStarted
from orchestrator.runtime.event_log import EventLog
from tests.messages_examples import finished


def turn(run_id: str, number: int) -> TurnStarted:
    return TurnStarted(run_id=run_id, turn=number, stage="agent", prompt_messages=1)


@dataclass
class _Reference:
    """The log's rules, written plainly: an opened run keeps its messages in order; past
    ``cap`` they are counted as dropped, except RunFinished, which is always kept."""

    cap: int
    runs: dict[str, tuple[list[Message], list[int]]] = field(default_factory=dict)

    def open_run(self, run_id: str) -> None:
        self.runs.setdefault(run_id, ([], [0]))

    def close_run(self, run_id: str) -> None:
        self.runs.pop(run_id, None)

    def record(self, msg: Message) -> None:
        if msg.run_id not in self.runs:
            return
        events, dropped = self.runs[msg.run_id]
        if not isinstance(msg, RunFinished) and len(events) >= self.cap:
            dropped[0] += 1
        else:
            events.append(msg)


@pytest.mark.parametrize("seed", range(20))
def test_the_log_keeps_what_the_rules_say_on_random_sequences(seed: int) -> None:
    rng = random.Random(seed)
    cap = rng.randint(1, 6)
    log = EventLog(Bus(), cap=cap)
    reference = _Reference(cap)
    ids = [f"r{index}" for index in range(4)]
    for step in range(300):
        run_id = rng.choice(ids)
        action = rng.random()
        if action < 0.08:
            log.open_run(run_id)
            reference.open_run(run_id)
        elif action < 0.12:
            log.close_run(run_id)
            reference.close_run(run_id)
        else:
            msg: Message = (
                finished(run_id)
                if action < 0.2
                else rng.choice(
                    (turn(run_id, step), TurnEnded(run_id=run_id, turn=step, tool_calls=0))
                )
            )
            log.record(msg)
            reference.record(msg)
        for known in ids:
            events, dropped = reference.runs.get(known, ([], [0]))
            assert log.events(known) == tuple(events)
            assert log.dropped(known) == dropped[0]


@pytest.mark.asyncio
async def test_a_follower_sees_every_event_live_and_stops_after_run_finished() -> None:
    log = EventLog(Bus())
    log.open_run("r1")
    log.record(turn("r1", 1))
    seen: list[Message] = []
    caught_up = anyio.Event()

    async def follow() -> None:
        async for event in log.follow("r1"):
            seen.append(event)
            if len(seen) == 1:
                caught_up.set()

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(follow)
            await caught_up.wait()  # the follower waits for more
            log.record(turn("r2", 1))  # another run's (not opened): not for it
            log.record(turn("r1", 2))
            log.record(finished("r1"))
    assert seen == [turn("r1", 1), turn("r1", 2), finished("r1")]
    assert [e async for e in log.follow("r1", after=2)] == [finished("r1")]


@pytest.mark.asyncio
async def test_closing_a_run_stops_its_followers() -> None:
    log = EventLog(Bus())
    log.open_run("r1")
    log.record(turn("r1", 1))
    seen: list[Message] = []
    caught_up = anyio.Event()

    async def follow() -> None:
        async for event in log.follow("r1"):
            seen.append(event)
            caught_up.set()

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(follow)
            await caught_up.wait()
            log.close_run("r1")
    assert seen == [turn("r1", 1)]
    assert log.events("r1") == ()
