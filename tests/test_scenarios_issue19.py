"""The scenarios of issue #19 end as expected, and for the reason their comments give:
polls that make progress complete under the default preset, a rotation of different
commands with one output is stopped, volatile ids do not pass for progress, a 5 MB result
fits a 32k window, an unknown tool called over and over is stopped."""

from __future__ import annotations

import io
from typing import Final

import anyio
import msgspec
import pytest

from bench.waste import DEFAULT_SCENARIOS, format_table, measure_waste
from bus import ModelReply
from orchestrator.config import Config, ContextSettings
from orchestrator.result import RunResult
from orchestrator.runtime import Runtime
from orchestrator.scenarios.runs import expectation_mismatches, run_scenario, start_scenario
from orchestrator.sim import Scenario, ScenarioError, find_scenario, shipped_scenarios

SHIPPED: Final = {scenario.name: scenario for scenario in shipped_scenarios()}
NEW: Final = (
    "poll_progress_strict.strict",
    "poll_progress_strict.openclaw_current",
    "poll_progress_strict.gemini",
    "poll_progress_strict.qwen",
    "varied_command_loop",
    "volatile_poll",
    "huge_tool_result",
    "unknown_tool_loop",
    "llm_loop_check",
)


async def run(scenario: Scenario, config: Config | None = None) -> RunResult:
    async with Runtime(config, scenarios=[scenario]) as runtime:
        with anyio.fail_after(60):
            return await run_scenario(runtime, scenario)


def tool_results(result: RunResult) -> list[str]:
    """What the calls that ran returned (not the refusal of the call that stopped the run)."""
    ran = {e.call_id for e in result.call_log if e.verdict in ("allow", "warn")}
    return [m.content or "" for m in result.transcript if m.tool_call_id in ran]


@pytest.mark.asyncio
@pytest.mark.parametrize("name", NEW)
async def test_the_scenario_ends_as_it_expects(name: str) -> None:
    result = await run(SHIPPED[name])
    assert expectation_mismatches(SHIPPED[name], result) == []


def test_shipped_files_of_runs_are_listed_and_found_by_run() -> None:
    names = [s.name for s in shipped_scenarios()]
    assert {"poll_progress_strict.strict", "poll_progress_strict.openclaw_current"} <= set(names)
    assert "poll_progress_strict" not in names
    assert find_scenario("poll_progress_strict.strict").config.get("loop_preset") is None
    assert find_scenario("poll_progress_strict.openclaw_current").config["loop_preset"] == (
        "openclaw-current"
    )
    for preset in ("gemini", "qwen"):
        assert find_scenario(f"poll_progress_strict.{preset}").config["loop_preset"] == preset
    with pytest.raises(ScenarioError) as caught:
        find_scenario("poll_progress_strict")
    assert "has several runs" in str(caught.value)
    assert "poll_progress_strict.strict" in str(caught.value)


@pytest.mark.asyncio
async def test_progressing_polls_are_all_identical_calls_with_changing_results() -> None:
    result = await run(SHIPPED["poll_progress_strict.strict"])
    assert len({(e.tool, e.arguments) for e in result.call_log}) == 1
    assert len(set(tool_results(result))) == 12


@pytest.mark.asyncio
async def test_the_rotation_is_distinct_calls_with_one_result_streamed_in_server_shapes() -> None:
    scenario = SHIPPED["varied_command_loop"]
    assert scenario.wire  # over HTTP: the LLM caller reassembles the cumulative chunks
    assert scenario.steps[-1].cycle
    result = await run(scenario)
    commands = [msgspec.json.decode(e.arguments)["command"] for e in result.call_log]
    assert len(commands) == 11
    assert len(set(commands)) == 11  # no two calls alike: no repeat detector could see it
    assert len(set(tool_results(result))) == 1
    assert result.turns < scenario.config["max_turns"]


@pytest.mark.asyncio
async def test_volatile_results_differ_byte_for_byte_and_still_count_as_one() -> None:
    result = await run(SHIPPED["volatile_poll"])
    results = tool_results(result)
    assert len(results) == len(set(results)) == 4
    assert all("still running" in text for text in results)
    assert "identical results" in result.detail


@pytest.mark.asyncio
async def test_a_5_mb_result_is_cut_to_fit_the_window_and_without_the_cut_it_blocks() -> None:
    scenario = SHIPPED["huge_tool_result"]
    assert scenario.tools[0].reply({}, 0).content().__len__() == 5_000_000
    result = await run(scenario)
    (cut,) = [e for e in result.trace if e.event == "context collapse"]
    assert cut.detail.startswith("Cut the result of export_table")
    assert sum(len(text) for text in tool_results(result)) < 100_000

    uncut = await run(scenario, Config(context=ContextSettings(tool_result_share=0)))
    assert (uncut.exit_reason.value, uncut.cause) == ("blocking_limit", "context.blocking_limit")


@pytest.mark.asyncio
async def test_the_unknown_tool_never_runs_and_each_attempt_is_an_unknown_tool_error() -> None:
    result = await run(SHIPPED["unknown_tool_loop"])
    assert [e.error_kind for e in result.call_log[:4]] == ["unknown_tool"] * 4  # the 5th: stopped
    assert len({e.arguments for e in result.call_log}) == 5  # each attempt differs


@pytest.mark.asyncio
async def test_the_waste_bench_reports_the_new_scenarios_with_fuses_on_and_off() -> None:
    assert set(NEW) - set(DEFAULT_SCENARIOS) == {
        "poll_progress_strict.openclaw_current",
        "poll_progress_strict.gemini",
        "poll_progress_strict.qwen",
    }
    with anyio.fail_after(120):
        rows = await measure_waste(["volatile_poll", "poll_progress_strict.strict"], max_turns=20)
    volatile, polls = rows
    assert (volatile.on.cause, volatile.off.cause) == ("loop.generic_repeat", "budget.max_turns")
    assert volatile.reached_cap
    assert volatile.off.llm_requests == 20 > volatile.on.llm_requests
    assert polls.on == msgspec.structs.replace(polls.off, seconds=polls.on.seconds)
    table = io.StringIO()
    format_table(rows, table)
    assert "poll_progress_strict.strict: off/on = 1x model requests" in table.getvalue()
    assert "(completes either way)" in table.getvalue()


@pytest.mark.asyncio
async def test_the_loop_check_fires_where_no_rule_does_and_its_tokens_count() -> None:
    scenario = SHIPPED["llm_loop_check"]
    result = await run(scenario)
    assert len({e.arguments for e in result.call_log}) == len(result.call_log)  # all differ
    assert len(set(tool_results(result))) == len(tool_results(result))
    nudges = [m.content or "" for m in result.transcript if m.role == "user"][1:]
    assert len(nudges) == 1
    assert "rewrites the same sentence" in nudges[0]
    # The same script with the check off runs to its turn budget: no rule catches it.
    off = msgspec.structs.replace(scenario, config={"max_turns": 12})
    unchecked = await run(off)
    assert (unchecked.cause, unchecked.turns) == ("budget.max_turns", 12)
    # Two checks were asked (requests of negative turn); their tokens are in the run's usage.
    async with Runtime(scenarios=[scenario]) as runtime:
        handle = await start_scenario(runtime, scenario)
        with anyio.fail_after(60):
            events = [event async for event in handle.events()]
            again = await handle.result()
    checks = [e for e in events if isinstance(e, ModelReply) and e.turn < 0]
    turns = [e for e in events if isinstance(e, ModelReply) and e.turn > 0]
    assert len(checks) == 2
    assert all(c.text.startswith('{"unproductive_state_analysis"') for c in checks)
    assert again.usage.total_tokens == sum(r.usage.total_tokens for r in checks + turns)
