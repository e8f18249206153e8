"""The bus: vocabulary round-trips, ordering, backpressure, settling, failure isolation."""

from __future__ import annotations

import gc

import anyio
import msgspec
import pytest

from bus import (
    CAUSES,
    DECODER,
    ENCODER,
    MESSAGE_TYPES,
    ActorFailed,
    Bus,
    ExitReason,
    Message,
    ModelRequest,
    Nudge,
    Outcome,
    StopSignal,
    TurnEnded,
    TurnStarted,
    cause_hint,
    is_known_cause,
    outcome_of,
)
from tests.messages_examples import examples


@pytest.mark.parametrize("msg", examples(), ids=lambda m: type(m).__name__)
def test_every_message_round_trips_unchanged(msg: Message) -> None:
    assert DECODER.decode(ENCODER.encode(msg)) == msg


def test_every_message_type_is_frozen_tagged_and_carries_run_id() -> None:
    for kind in MESSAGE_TYPES:
        config = kind.__struct_config__
        assert config.frozen, kind
        assert config.tag == kind.__name__, kind
        assert "run_id" in kind.__struct_fields__, kind
    with pytest.raises(AttributeError):
        examples()[0].run_id = "other"  # type: ignore[misc]


def test_exit_reasons_are_exactly_seven_and_map_to_outcomes() -> None:
    assert [reason.value for reason in ExitReason] == [
        "completed",
        "max_turns",
        "aborted_streaming",
        "aborted_tools",
        "hook_stopped",
        "blocking_limit",
        "prompt_too_long",
    ]
    assert outcome_of(ExitReason.COMPLETED) is Outcome.DONE
    assert {outcome_of(r) for r in ExitReason if r is not ExitReason.COMPLETED} == {Outcome.FAILED}


def test_causes_are_a_closed_set_with_hints() -> None:
    for cause, hint in CAUSES.items():
        assert is_known_cause(cause)
        assert cause_hint(cause) == hint
        assert hint.endswith(".")
    assert is_known_cause("hook.lint")
    assert "lint" in cause_hint("hook.lint")
    assert not is_known_cause("hook.")
    assert not is_known_cause("made.up")


def test_decoder_rejects_unknown_message_types() -> None:
    with pytest.raises(msgspec.ValidationError):
        DECODER.decode(b'{"type": "Nope", "run_id": "r"}')


def _turn(run_id: str, turn: int) -> TurnStarted:
    return TurnStarted(run_id=run_id, turn=turn, stage="agent", prompt_messages=1)


@pytest.mark.asyncio
async def test_each_subscriber_gets_its_types_in_publish_order() -> None:
    bus = Bus()
    seen: list[int] = []
    other: list[Message] = []
    turns = bus.subscribe(TurnStarted, name="turns")
    ends = bus.subscribe(TurnEnded, name="ends")
    async with anyio.create_task_group() as tg:
        await tg.start(turns.serve, lambda m: seen.append(m.turn))
        await tg.start(ends.serve, other.append)
        for turn in range(1, 101):
            await bus.publish(_turn("r", turn))
        bus.close()
    assert seen == list(range(1, 101))
    assert other == []


@pytest.mark.asyncio
async def test_publish_waits_for_room_in_a_full_lossless_mailbox() -> None:
    bus = Bus()
    sub = bus.subscribe(TurnStarted, name="slow", capacity=2)
    await bus.publish(_turn("r", 1))
    await bus.publish(_turn("r", 2))
    third_sent = anyio.Event()

    async def publish_third() -> None:
        await bus.publish(_turn("r", 3))
        third_sent.set()

    handled: list[int] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(publish_third)
        await anyio.wait_all_tasks_blocked()
        assert not third_sent.is_set(), "publisher must wait while the mailbox is full"
        await tg.start(sub.serve, lambda m: handled.append(m.turn))
        with anyio.fail_after(5):
            await third_sent.wait()
        bus.close()
    assert handled == [1, 2, 3]


@pytest.mark.asyncio
async def test_dropping_observer_never_slows_the_publisher_and_counts_drops() -> None:
    bus = Bus()
    sub = bus.subscribe(TurnStarted, name="dashboard", capacity=3, on_full="drop")
    with anyio.fail_after(5):
        for turn in range(10):
            await bus.publish(_turn("r", turn))
    stats = sub.statistics()
    assert (stats.depth, stats.dropped) == (3, 7)


@pytest.mark.asyncio
async def test_settled_publish_waits_for_answering_subscribers_only() -> None:
    bus = Bus()
    monitor = bus.subscribe(TurnStarted, name="monitor", answers=True)
    observer = bus.subscribe(TurnStarted, name="observer")
    release = anyio.Event()
    handled: list[str] = []

    async def slow_monitor(msg: TurnStarted) -> None:
        await release.wait()
        handled.append("monitor")
        bus.publish_nowait(Nudge(run_id=msg.run_id, kind="k", text="t", source="monitor"))

    settled = anyio.Event()
    with bus.open_inbox("r") as inbox:

        async def publisher() -> None:
            await bus.publish_settled(_turn("r", 1))
            settled.set()

        async with anyio.create_task_group() as tg:
            await tg.start(monitor.serve, slow_monitor)
            tg.start_soon(publisher)
            await anyio.wait_all_tasks_blocked()
            # The observer is not served at all, yet only the monitor holds the publisher.
            assert not settled.is_set()
            release.set()
            with anyio.fail_after(5):
                await settled.wait()
            # The monitor's answer is in the inbox by the time the publish settles.
            answer = inbox.receive_nowait()
            assert isinstance(answer, Nudge)
            bus.close()
    assert handled == ["monitor"]
    assert observer.statistics().depth == 1


@pytest.mark.asyncio
async def test_settle_covers_everything_queued_before_it() -> None:
    """FIFO: a settled checkpoint implies earlier unsettled messages were handled."""
    bus = Bus()
    monitor = bus.subscribe(TurnStarted, TurnEnded, name="monitor", answers=True)
    handled: list[str] = []
    async with anyio.create_task_group() as tg:
        await tg.start(monitor.serve, lambda m: handled.append(type(m).__name__))
        for turn in range(5):
            await bus.publish(TurnEnded(run_id="r", turn=turn, tool_calls=0))
        await bus.publish_settled(_turn("r", 6))
        assert handled == ["TurnEnded"] * 5 + ["TurnStarted"]
        bus.close()


@pytest.mark.asyncio
async def test_settled_publish_with_no_answering_subscriber_returns_at_once() -> None:
    """An observer is never waited for: the publish settles while the message is still
    queued, unhandled, in the observer's mailbox (nobody serves it here)."""
    bus = Bus()
    observer = bus.subscribe(TurnStarted, name="observer")
    with anyio.fail_after(5):
        await bus.publish_settled(_turn("r", 1))
    assert observer.statistics().depth == 1


@pytest.mark.asyncio
async def test_answers_never_block_even_on_a_full_mailbox() -> None:
    bus = Bus()
    sub = bus.subscribe(Nudge, name="log", capacity=1)
    for _ in range(5):
        bus.publish_nowait(Nudge(run_id="r", kind="k", text="t", source="s"))
    assert sub.statistics().depth == 5  # a lossless mailbox overfills rather than wait


@pytest.mark.asyncio
async def test_a_failing_handler_fails_only_that_run() -> None:
    bus = Bus()
    sub = bus.subscribe(TurnStarted, name="flaky", answers=True)
    handled: list[str] = []

    def handler(msg: TurnStarted) -> None:
        if msg.run_id == "bad":
            raise RuntimeError("boom")
        handled.append(msg.run_id)

    with bus.open_inbox("bad") as bad, bus.open_inbox("good") as good:
        async with anyio.create_task_group() as tg:
            await tg.start(sub.serve, handler)
            with anyio.fail_after(5):
                await bus.publish_settled(_turn("bad", 1))
                await bus.publish_settled(_turn("good", 1))
            bus.close()
        failure = bad.receive_nowait()
        assert isinstance(failure, ActorFailed)
        assert failure.actor == "flaky"
        assert "boom" in failure.error
        assert good.receive_nowait() is None
    assert handled == ["good"]
    assert sub.statistics().failed == 1


@pytest.mark.asyncio
async def test_a_cancelled_subscriber_releases_waiting_publishers() -> None:
    """pykka's rule: when an actor stops, nobody waiting on it waits forever."""
    bus = Bus()
    sub = bus.subscribe(TurnStarted, name="stuck", answers=True)
    never = anyio.Event()
    settled = anyio.Event()
    serve_scope = anyio.CancelScope()

    async def stuck(_: TurnStarted) -> None:
        await never.wait()

    async def serve() -> None:
        with serve_scope:
            await sub.serve(stuck)

    async def settle() -> None:
        await bus.publish_settled(_turn("r", 2))
        settled.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(serve)
        await bus.publish(_turn("r", 1))
        tg.start_soon(settle)
        await anyio.wait_all_tasks_blocked()
        assert not settled.is_set()
        serve_scope.cancel()
        with anyio.fail_after(5):
            await settled.wait()


@pytest.mark.asyncio
async def test_stop_signal_reaches_only_its_run_inbox() -> None:
    bus = Bus()
    with bus.open_inbox("a") as a, bus.open_inbox("b") as b:
        bus.publish_nowait(
            StopSignal(
                run_id="a", reason=ExitReason.MAX_TURNS, cause="budget.max_turns", source="x"
            )
        )
        assert isinstance(a.receive_nowait(), StopSignal)
        assert b.receive_nowait() is None
    with (
        pytest.raises(ValueError, match="already has an inbox"),
        bus.open_inbox("c"),
        bus.open_inbox("c"),
    ):
        pass
    assert bus.active_inboxes() == 0  # the first one closed when the block was left


def test_messages_and_transcripts_stay_out_of_the_cycle_collector() -> None:
    """Immutable data cannot form cycles; tracking them would make every collection walk
    each message held by thousands of runs in flight."""
    samples = examples()
    assert {type(sample) for sample in samples} == set(MESSAGE_TYPES)
    assert [sample for sample in samples if gc.is_tracked(sample)] == []
    request = next(sample for sample in samples if isinstance(sample, ModelRequest))
    assert request.messages
    assert not gc.is_tracked(request.messages[0])
