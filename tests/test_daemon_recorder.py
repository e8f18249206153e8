"""What the event recorder stores: streamed text coalesced per commit, text the reply carries
not stored twice, the progress event that restates a turn folded into it; every character of
text still there, in order, and the ids consecutive."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

from bus import (
    Bus,
    ExitReason,
    Message,
    ModelReply,
    ModelTextDelta,
    Outcome,
    Progress,
    RunFinished,
    TurnStarted,
    Usage,
)
from orchestrator.daemon.recorder import EventRecorder
from orchestrator.daemon.store import MAX_PENDING_EVENTS, RunRow, Store

RUN = "run-1"


def turn(n: int) -> TurnStarted:
    return TurnStarted(run_id=RUN, turn=n, stage="agent", prompt_messages=1)


def running(n: int, **extra: Any) -> Progress:
    return Progress(
        run_id=RUN,
        stage="agent",
        index=1,
        total=1,
        status="running",
        detail=f"turn {n} of at most 5",
        turn=n,
        **extra,
    )


def delta(text: str, n: int = 1) -> ModelTextDelta:
    return ModelTextDelta(run_id=RUN, turn=n, text=text)


def reply(text: str, n: int = 1) -> ModelReply:
    return ModelReply(run_id=RUN, turn=n, text=text, finish_reason="stop")


FINISHED = RunFinished(
    run_id=RUN,
    exit_reason=ExitReason.COMPLETED,
    cause="model.end_turn",
    outcome=Outcome.DONE,
    detail="",
    hint="",
    turns=1,
    llm_requests=1,
    tool_calls=0,
    usage=Usage(),
)


class Recording:
    def __init__(self, bus: Bus, store: Store, recorder: EventRecorder) -> None:
        self.bus, self.store, self.recorder = bus, store, recorder
        self.finished = recorder.track(RUN)

    async def publish(self, *messages: Message) -> None:
        for msg in messages:
            await self.bus.publish(msg)

    async def stored(self) -> list[dict[str, Any]]:
        with anyio.fail_after(10):
            await self.finished.wait()
            await self.store.flush()
            events = await self.store.events(RUN)
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
        return [json.loads(e.data) for e in events]


@asynccontextmanager
async def recording(
    tmp_path: Path, *, writing: bool = True, cap: int = 1000
) -> AsyncIterator[Recording]:
    """A bus, a store and a recorder; with ``writing=False`` the store's writer starts only
    when the body ends (nothing commits meanwhile: every held text stays held)."""
    store = Store(tmp_path / "daemon.db")
    store.insert_run(
        RunRow(
            id=RUN,
            trace_id="t",
            status="running",
            on_crash="abort",
            request=b"{}",
            request_hash="h",
            created_at=0.0,
        )
    )
    bus = Bus()
    recorder = EventRecorder(bus, store, cap=cap)
    async with anyio.create_task_group() as tg:
        await tg.start(recorder.run)
        if writing:
            await tg.start(store.run)
        yield Recording(bus, store, recorder)
        if not writing:
            await tg.start(store.run)
        bus.close()
        store.close()


def kinds(events: Sequence[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events]


@pytest.mark.asyncio
async def test_deltas_held_until_the_run_moves_on_are_stored_as_one(tmp_path: Path) -> None:
    async with recording(tmp_path, writing=False) as rec:
        # The reply differs from the streamed text (a retried stream): both are kept.
        await rec.publish(turn(1), delta("The "), delta("folder "), delta("holds"))
        await rec.publish(reply("Another text."), FINISHED)
        with anyio.fail_after(10):
            await rec.finished.wait()
    stored = await rec.stored()
    assert kinds(stored) == ["TurnStarted", "ModelTextDelta", "ModelReply", "RunFinished"]
    assert stored[1]["text"] == "The folder holds"
    assert stored[1]["turn"] == 1
    assert rec.recorder.statistics.coalesced_deltas == 2


@pytest.mark.asyncio
async def test_text_the_reply_carries_is_stored_once_in_the_reply(tmp_path: Path) -> None:
    async with recording(tmp_path, writing=False) as rec:
        await rec.publish(turn(1), delta("The "), delta("answer."), reply("The answer."))
        await rec.publish(FINISHED)
        with anyio.fail_after(10):
            await rec.finished.wait()
    stored = await rec.stored()
    assert kinds(stored) == ["TurnStarted", "ModelReply", "RunFinished"]
    assert stored[1]["text"] == "The answer."
    assert rec.recorder.statistics.deltas_in_replies == 1


@pytest.mark.asyncio
async def test_text_is_coalesced_per_commit_and_a_follower_still_sees_all_of_it(
    tmp_path: Path,
) -> None:
    async with recording(tmp_path) as rec:
        committed = rec.store.watch(RUN)
        await rec.publish(turn(1), delta("Yeast "))
        with anyio.fail_after(10):
            await committed.wait()  # the writer was idle: the first delta committed alone
            while not [e for e in await rec.store.events(RUN) if e.type == "ModelTextDelta"]:
                committed = rec.store.watch(RUN)
                await committed.wait()
        await rec.publish(delta("grows "), delta("at 30 C."), reply("Yeast grows at 30 C."))
        await rec.publish(delta("Next turn", n=2), FINISHED)
        stored = await rec.stored()
    texts = [e["text"] for e in stored if e["type"] == "ModelTextDelta"]
    assert texts[0] == "Yeast "
    assert "".join(texts[:-1]) in ("Yeast ", "Yeast grows ")  # the rest held: in the reply
    replies = [e["text"] for e in stored if e["type"] == "ModelReply"]
    assert replies == ["Yeast grows at 30 C."]
    assert texts[-1] == "Next turn"  # another turn's text is never merged into this one's
    # Whatever the commits were, the deltas are the start of the answer the reply has.
    turn_one = "".join(texts[:-1])
    assert replies[0].startswith(turn_one)


@pytest.mark.asyncio
async def test_a_progress_that_restates_the_turn_is_folded_and_others_are_kept(
    tmp_path: Path,
) -> None:
    started = Progress(run_id=RUN, stage="agent", index=1, total=1, status="started")
    async with recording(tmp_path) as rec:
        await rec.publish(started, turn(1), running(1))  # folded into TurnStarted 1
        await rec.publish(turn(2), running(3))  # says another turn: kept
        await rec.publish(turn(4), running(4, tokens=1200))  # carries tokens: kept
        await rec.publish(running(4))  # a second one for the same turn: kept
        # a text that reads like the turn's but no turn field: kept (the text is not parsed)
        await rec.publish(turn(5), msgspec.structs.replace(running(5), turn=0))
        await rec.publish(FINISHED)
        stored = await rec.stored()
    assert kinds(stored) == [
        "Progress",
        "TurnStarted",
        "TurnStarted",
        "Progress",
        "TurnStarted",
        "Progress",
        "Progress",
        "TurnStarted",
        "Progress",
        "RunFinished",
    ]
    assert [e.get("detail") for e in stored if e["type"] == "Progress"] == [
        "",
        "turn 3 of at most 5",
        "turn 4 of at most 5",
        "turn 4 of at most 5",
        "turn 5 of at most 5",
    ]
    assert rec.recorder.statistics.folded_progress == 1


@pytest.mark.asyncio
async def test_past_the_cap_events_are_counted_and_the_run_finished_is_still_stored(
    tmp_path: Path,
) -> None:
    async with recording(tmp_path, cap=2) as rec:
        await rec.publish(turn(1), reply("One."), turn(2), reply("Two."), FINISHED)
        stored = await rec.stored()
        row = await rec.store.get_run(RUN)
    assert kinds(stored) == ["TurnStarted", "ModelReply", "RunFinished"]
    assert row is not None
    assert row.events_dropped == 2


@pytest.mark.asyncio
async def test_a_full_store_holds_the_recorder_back_and_loses_no_event(tmp_path: Path) -> None:
    """A store whose queue is full (nothing commits: its writer is not running yet) makes
    the recorder wait after the event that filled it; once a commit makes room, it records
    the rest of what its mailbox kept, in order."""
    store = Store(tmp_path / "daemon.db")
    for run_id in (RUN, "filler"):
        store.insert_run(
            RunRow(
                id=run_id,
                trace_id="t",
                status="running",
                on_crash="abort",
                request=b"{}",
                request_hash="h",
                created_at=0.0,
            )
        )
    for seq in range(1, MAX_PENDING_EVENTS):
        store.append_event("filler", seq, "E", b"{}")
    assert store.has_room()
    bus = Bus()
    recorder = EventRecorder(bus, store, cap=1000)
    rec = Recording(bus, store, recorder)
    async with anyio.create_task_group() as tg:
        await tg.start(recorder.run)
        await rec.publish(turn(1), reply("One."), turn(2), reply("Two."), FINISHED)
        await anyio.wait_all_tasks_blocked()
        # The first message filled the queue: the rest wait in the recorder's mailbox.
        assert recorder.statistics.messages == 1
        assert not store.has_room()
        assert store.statistics().pending_events == MAX_PENDING_EVENTS
        assert not rec.finished.is_set()
        await tg.start(store.run)
        stored = await rec.stored()
        bus.close()
        store.close()
    assert kinds(stored) == [
        "TurnStarted",
        "ModelReply",
        "TurnStarted",
        "ModelReply",
        "RunFinished",
    ]
    assert recorder.statistics.messages == 5
