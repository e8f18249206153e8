"""Turn requests are logged without the messages the log already holds (the previous
request's, the turn checkpoint's) and without the run's tools, and every request rebuilds
exactly from the log (:class:`bus.LogReader`), folds, summaries and tool changes included.
(Through the daemon over HTTP: ``tests/test_daemon_events_stored.py``.)"""

from __future__ import annotations

import anyio
import pytest

from bus import (
    DECODER,
    ENCODER,
    ChatMessage,
    LogReader,
    Message,
    ModelRequest,
    RunStarted,
    ToolSpec,
    TurnStarted,
    for_the_log,
)
from orchestrator.runtime import Runtime
from orchestrator.scenarios.runs import expectation_mismatches, start_scenario
from orchestrator.sim import shipped_scenarios
from tests.test_resume_fuses import Journal

SHIPPED = {scenario.name: scenario for scenario in shipped_scenarios()}
SPEC = ToolSpec(name="echo", description="Echo.", parameters='{"type": "object"}')


async def events_of(name: str) -> list[Message]:
    async with Runtime() as runtime:
        handle = await start_scenario(runtime, SHIPPED[name])
        with anyio.fail_after(60):
            events: list[Message] = [event async for event in handle.events()]
            result = await handle.result()
    assert expectation_mismatches(SHIPPED[name], result) == []
    return events


async def requests_of(name: str) -> list[ModelRequest]:
    return [event for event in await events_of(name) if isinstance(event, ModelRequest)]


async def journaled_events(name: str, journal: Journal) -> list[Message]:
    async with Runtime(journal=journal) as runtime:
        handle = await start_scenario(runtime, SHIPPED[name], run_id="resumed-run")
        with anyio.fail_after(60):
            return [event async for event in handle.events()]


def logged(events: list[Message]) -> list[Message]:
    """The events as a log stores and reads them back (JSON)."""
    return [DECODER.decode(ENCODER.encode(for_the_log(event))) for event in events]


def read_back(stored: list[Message]) -> list[Message]:
    reader = LogReader()
    return [reader.read(message) for message in stored]


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "name",
    [
        "completed",
        "dead_loop",
        "truncation",
        "prompt_too_long_recovers",  # a fold: the retry logs from the folded message on
        "prompt_too_long",  # a summary request (no tools) between turn requests
        "answer_on_stop",  # the last request has no tools
        "llm_loop_check",  # the loop monitor's requests; nudges injected after the checkpoint
        "huge_tool_result",  # a result cut after its checkpoint: logged in the request
    ],
)
async def test_requests_rebuild_exactly_from_the_log(name: str) -> None:
    events = await events_of(name)
    sent = [event for event in events if isinstance(event, ModelRequest)]
    stored = logged(events)
    assert read_back(stored) == events  # every field: whole prompts, tools, checkpoints
    requests = [event for event in stored if isinstance(event, ModelRequest)]
    assert sum(len(r.messages) for r in requests) < sum(len(r.messages) for r in sent)


@pytest.mark.asyncio
async def test_a_resumed_run_rebuilds_from_the_log_it_goes_on() -> None:
    whole = Journal()
    first = await journaled_events("dead_loop", whole)
    point = next(c for c in whole.checkpoints if c.turn == 2)
    resumed = await journaled_events("dead_loop", Journal(resume=point))
    started = resumed[0]
    assert isinstance(started, RunStarted)
    assert started.resumed_from_turn == 2
    # The daemon's log of such a run: what it stored before the crash, then the rest.
    crashed = first[: next(i for i, e in enumerate(first) if getattr(e, "turn", 0) == 3)]
    assert read_back(logged(crashed + resumed)) == crashed + resumed
    request = next(e for e in logged(resumed) if isinstance(e, ModelRequest))
    assert (request.first_message, request.checkpointed) == (0, len(point.transcript))
    assert read_back(logged(resumed)) == resumed  # and from its restart alone


@pytest.mark.asyncio
async def test_the_tool_schemas_are_stored_once_per_run() -> None:
    events = await events_of("dead_loop")
    started = events[0]
    assert isinstance(started, RunStarted)
    assert started.tool_specs
    requests = [event for event in events if isinstance(event, ModelRequest)]
    assert len(requests) > 2
    assert all(r.run_tools and r.tools is started.tool_specs for r in requests)
    data = [ENCODER.encode(for_the_log(event)) for event in events]
    for spec in started.tool_specs:
        schema = ENCODER.encode(spec.parameters)  # as JSON text inside the JSON
        assert sum(schema in one for one in data) == 1, spec.name
    assert b'"tools":[]' in data[events.index(requests[-1])]


@pytest.mark.asyncio
async def test_each_prompt_message_is_stored_once() -> None:
    events = await events_of("dead_loop")
    last = [event for event in events if isinstance(event, ModelRequest)][-1]
    data = [ENCODER.encode(for_the_log(event)) for event in events]
    for message in last.messages:
        assert sum(ENCODER.encode(message) in one for one in data) == 1, message


@pytest.mark.asyncio
async def test_a_request_without_the_run_tools_stores_what_it_had() -> None:
    sent = await requests_of("answer_on_stop")
    final = for_the_log(sent[-1])
    assert isinstance(final, ModelRequest)
    assert sent[0].tools
    assert not sent[-1].tools
    assert (final.run_tools, final.tools) == (False, ())
    assert final.first_message == len(sent[-2].messages)  # only the new messages stored
    assert final.messages == sent[-1].messages[final.first_message :]


@pytest.mark.asyncio
async def test_a_fold_makes_the_next_request_log_from_the_folded_message_on() -> None:
    sent = await requests_of("prompt_too_long_recovers")
    refused, retried = sent[-2], sent[-1]  # the refused turn and its folded retry
    changed = next(
        i
        for i, (a, b) in enumerate(zip(refused.messages, retried.messages, strict=False))
        if a != b
    )
    assert retried.unchanged == changed  # nothing before the fold is logged again
    assert retried.unchanged < len(refused.messages)


def test_a_request_without_known_history_is_logged_whole() -> None:
    message = ChatMessage(role="user", content="task")
    request = ModelRequest(run_id="r", turn=1, model="m", messages=(message,), tools=(SPEC,))
    assert for_the_log(request) is request  # nothing to leave out: its own tools, whole
    later = ModelRequest(
        run_id="r", turn=2, model="m", messages=(message, message, message), unchanged=2
    )
    logged = for_the_log(later)
    assert isinstance(logged, ModelRequest)
    assert (logged.first_message, len(logged.messages)) == (2, 1)


def test_the_reader_refuses_a_request_whose_checkpoint_is_not_in_the_log() -> None:
    message = ChatMessage(role="user", content="task")
    request = ModelRequest(
        run_id="r", turn=1, model="m", messages=(message,), checkpointed=1, run_tools=True
    )
    stored = for_the_log(request)
    assert isinstance(stored, ModelRequest)
    assert stored.messages == ()
    with pytest.raises(ValueError, match="checkpoint of 1 messages"):
        LogReader().read(stored)
    reader = LogReader()
    reader.read(
        TurnStarted(run_id="r", turn=1, stage="agent", prompt_messages=1, appended=(message,))
    )
    assert reader.read(stored) == request
    later = ModelRequest(run_id="r", turn=2, model="m", messages=(message, message), unchanged=1)
    with pytest.raises(ValueError, match="no previous prompt"):
        LogReader().read(for_the_log(later))
    short = LogReader()  # a checkpoint that holds fewer messages than the request needs
    short.read(TurnStarted(run_id="r", turn=1, stage="agent", prompt_messages=2))
    two = ModelRequest(run_id="r", turn=1, model="m", messages=(message, message), checkpointed=2)
    with pytest.raises(ValueError, match="checkpoint of 2 messages"):
        short.read(for_the_log(two))
