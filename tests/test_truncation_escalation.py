"""The silent first step of truncation recovery: one retry with a raised output limit, per
request. The simulator cuts a reply whose tokens exceed the request's ``max_tokens``
(``honor_max_tokens``), so a reply that fits only the raised limit proves the limit rose."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from bus import ModelReplied, ModelReply
from orchestrator.config import Config, ModelSettings, run_settings
from orchestrator.errors import ConfigError
from orchestrator.result import RunResult
from orchestrator.runtime import Runtime
from orchestrator.scenarios.runs import start_scenario
from orchestrator.sim import Scenario, open_simulator, parse_scenario
from tests.test_llm_caller import ask, open_caller, request, write_scenario

CHARS_PER_TOKEN = 4


def long_answer(tokens: int, **config: object) -> Scenario:
    """One reply of ``tokens`` tokens (cut by a smaller ``max_tokens``)."""
    settings = "".join(f"{key} = {value!r}\n" for key, value in config.items())
    return parse_scenario(
        f"""
task = "Write the whole report."
[config]
{settings}
[[steps]]
text = "All samples were measured twice. "
text_tokens = {tokens}
chunk_size = 4096
[[steps]]
text = " (end of the report)"
[expect]
exit_reason = "completed"
""",
        source="long_answer.toml",
        name="long_answer",
    )


async def run(scenario: Scenario) -> tuple[RunResult, list[ModelReply], list[ModelReplied]]:
    async with Runtime(scenarios=[scenario]) as runtime:
        handle = await start_scenario(runtime, scenario)
        with anyio.fail_after(30):
            events = [event async for event in handle.events()]
            result = await handle.result()
    replies = [e for e in events if isinstance(e, ModelReply)]
    replied = [e for e in events if isinstance(e, ModelReplied)]
    return result, replies, replied


@pytest.mark.asyncio
async def test_a_reply_cut_at_8k_that_fits_64k_completes_silently() -> None:
    result, replies, replied = await run(long_answer(9000))
    assert (result.cause, result.incomplete, result.nudges) == ("model.end_turn", False, 0)
    assert result.llm_requests == 1  # one request of the run ...
    (reply,) = replies
    assert reply.attempts == 2  # ... sent twice: cut at 8192 tokens, then whole at 65536
    assert reply.finish_reason == "stop"
    assert len(result.output) == 9000 * CHARS_PER_TOKEN
    assert [r.finish_reason for r in replied] == ["stop"]  # the cut attempt never surfaced
    assert result.usage.completion_tokens == 9000
    assert not [e for e in result.trace if e.event in ("truncated", "nudge")]


@pytest.mark.asyncio
async def test_without_a_higher_limit_the_same_reply_is_cut_and_recovered_with_a_nudge() -> None:
    result, replies, _ = await run(long_answer(9000, escalated_max_tokens=8192))
    assert result.nudges == 1
    assert [(r.finish_reason, r.attempts) for r in replies] == [("length", 1), ("stop", 1)]
    assert result.output.startswith("All samples")
    assert len(result.output) == 8192 * CHARS_PER_TOKEN + len(" (end of the report)")


@pytest.mark.asyncio
@pytest.mark.parametrize(("escalated", "attempts", "nudges"), [(1000, 2, 0), (400, 2, 1)])
async def test_the_limits_are_per_run(escalated: int, attempts: int, nudges: int) -> None:
    scenario = long_answer(500, max_output_tokens=100, escalated_max_tokens=escalated)
    result, replies, _ = await run(scenario)
    assert replies[0].attempts == attempts
    assert result.nudges == nudges
    # Cut at 100 tokens, then at 400 when that is the raised limit, or whole at 1000.
    assert replies[0].usage.completion_tokens == min(500, escalated)


@pytest.mark.asyncio
async def test_the_request_limit_wins_over_the_endpoint_one(tmp_path: Path) -> None:
    answer = write_scenario(
        tmp_path, "long_answer", "[[steps]]\ntext_tokens = 40\nchunk_size = 400"
    )
    async with open_simulator([answer]) as sim:
        async with open_caller(sim.base_url) as (bus, _):  # no endpoint escalation
            (reply,) = await ask(
                bus, request("long_answer", max_tokens=10, escalated_max_tokens=50)
            )
            assert isinstance(reply, ModelReply)
            assert (reply.finish_reason, reply.attempts, len(reply.text)) == ("stop", 2, 160)
        async with open_caller(sim.base_url, escalated_max_tokens=20) as (bus, _):
            (reply,) = await ask(
                bus, request("long_answer", max_tokens=10, escalated_max_tokens=50)
            )
            assert isinstance(reply, ModelReply)
            assert (reply.finish_reason, reply.attempts) == ("stop", 2)  # 50, not 20
            (reply,) = await ask(bus, request("long_answer", run_id="r2", max_tokens=10))
            assert isinstance(reply, ModelReply)
            assert (reply.finish_reason, reply.attempts) == ("length", 2)  # the endpoint's 20


def test_output_limits_default_to_8k_then_64k_and_are_configurable() -> None:
    defaults = run_settings(Config())
    assert (defaults.max_output_tokens, defaults.escalated_max_tokens) == (8192, 65536)
    config = Config(model=ModelSettings(max_output_tokens=4096, escalated_max_tokens=None))
    settings = run_settings(config)
    assert (settings.max_output_tokens, settings.escalated_max_tokens) == (4096, None)
    assert run_settings(config, {"escalated_max_tokens": 16384}).escalated_max_tokens == 16384
    with pytest.raises(ConfigError) as caught:
        run_settings(Config(), {"escalated_max_tokens": 0})
    assert "config.escalated_max_tokens" in str(caught.value)
