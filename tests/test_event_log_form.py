"""Turn requests are logged without the messages the previous request carried, and the
whole prompts can be rebuilt from the log, folds and summaries included."""

from __future__ import annotations

import anyio
import pytest

from bus import ChatMessage, Message, ModelRequest, for_the_log
from orchestrator.runtime import Runtime
from orchestrator.scenarios.runs import expectation_mismatches, start_scenario
from orchestrator.sim import shipped_scenarios

SHIPPED = {scenario.name: scenario for scenario in shipped_scenarios()}


def rebuilt_prompts(logged: list[ModelRequest]) -> list[tuple[ChatMessage, ...]]:
    """Each turn request's prompt, from the logged forms alone."""
    prompts: list[tuple[ChatMessage, ...]] = []
    previous: tuple[ChatMessage, ...] = ()
    for request in logged:
        if request.purpose != "turn":
            prompts.append(request.messages)  # a summary request: logged whole
            continue
        prompt = previous[: request.first_message] + request.messages
        prompts.append(prompt)
        previous = prompt
    return prompts


async def requests_of(name: str) -> list[ModelRequest]:
    async with Runtime() as runtime:
        handle = await start_scenario(runtime, SHIPPED[name])
        with anyio.fail_after(60):
            events: list[Message] = [event async for event in handle.events()]
            result = await handle.result()
    assert expectation_mismatches(SHIPPED[name], result) == []
    return [event for event in events if isinstance(event, ModelRequest)]


@pytest.mark.asyncio
@pytest.mark.parametrize("name", ["dead_loop", "truncation", "prompt_too_long_recovers"])
async def test_prompts_rebuild_exactly_from_the_logged_requests(name: str) -> None:
    sent = await requests_of(name)
    logged = [for_the_log(request) for request in sent]
    assert all(isinstance(request, ModelRequest) for request in logged)
    rebuilt = rebuilt_prompts([r for r in logged if isinstance(r, ModelRequest)])
    assert rebuilt == [request.messages for request in sent]
    assert sum(len(r.messages) for r in logged if isinstance(r, ModelRequest)) < sum(
        len(request.messages) for request in sent
    )


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
    request = ModelRequest(run_id="r", turn=1, model="m", messages=(message,))
    assert for_the_log(request) is request
    later = ModelRequest(
        run_id="r", turn=2, model="m", messages=(message, message, message), unchanged=2
    )
    logged = for_the_log(later)
    assert isinstance(logged, ModelRequest)
    assert (logged.first_message, len(logged.messages)) == (2, 1)
