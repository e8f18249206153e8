"""The result cache in whole runs: the shipped cache_hits scenario, the settings that reach
the executor through RunStarted, and how the cache meets the strict loop preset."""

from __future__ import annotations

from collections import Counter

import anyio
import msgspec
import pytest

from actors.tools import Tool, ToolContext, ToolRegistry, default_registry
from bus import ExitReason, RunStarted, StopSignal, ToolResult
from orchestrator.config import Config, ToolSettings, run_settings
from orchestrator.errors import ConfigError
from orchestrator.runtime import Runtime
from orchestrator.scenarios.runs import expectation_mismatches, start_scenario
from orchestrator.sim import Scenario, parse_scenario, shipped_scenarios

SHIPPED = {scenario.name: scenario for scenario in shipped_scenarios()}
CACHE_HITS = SHIPPED["cache_hits"]


class Order(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    order_id: str


def counting_registry(ran: Counter[str]) -> ToolRegistry:
    """The built-in tools and an idempotent ``query_order`` that counts its executions."""

    async def query(params: Order, ctx: ToolContext) -> str:
        ran[params.order_id] += 1
        return f"order {params.order_id}: delivered"

    registry = default_registry()
    registry.add(Tool("query_order", "Look up an order.", Order, query, idempotent=True))
    return registry


def without_scripted_tools(scenario: Scenario, **config: object) -> Scenario:
    tools = (*Config().tools.enabled, "query_order")
    return msgspec.structs.replace(
        scenario, tools=(), config={**scenario.config, "tools": tools, **config}
    )


@pytest.mark.asyncio
async def test_cache_hits_runs_the_tool_once_then_hits_twice_then_stops() -> None:
    async with Runtime() as runtime:
        handle = await start_scenario(runtime, CACHE_HITS)
        with anyio.fail_after(30):
            events = [event async for event in handle.events()]
            result = await handle.result()
    assert expectation_mismatches(CACHE_HITS, result) == []
    assert (result.exit_reason, result.cause) == (ExitReason.HOOK_STOPPED, "loop.cache_hits")
    log = [(e.cache, e.verdict, e.error_kind) for e in result.call_log]
    assert log == [
        ("miss", "allow", None),
        ("hit", "allow", None),
        ("hit", "allow", None),
        ("none", "not_run", "loop"),
    ]
    answers = [m.content or "" for m in result.transcript if m.role == "tool"]
    # The scripted tool numbers its real executions: every answer is the first one's.
    assert [a.endswith("(lookup 1)") for a in answers] == [True, True, True, False]
    assert "loop.cache_hits" in answers[-1]
    assert result.transcript[-1].role == "tool"  # the model is not called again
    # The executor's stop precedes the refused call's result, and is the run's only stop.
    kinds = [type(e).__name__ for e in events if isinstance(e, StopSignal | ToolResult)]
    assert kinds == ["ToolResult"] * 3 + ["StopSignal", "ToolResult"]
    (stop,) = [e for e in events if isinstance(e, StopSignal)]
    assert stop.source == "tool_executor"
    (started,) = [e for e in events if isinstance(e, RunStarted)]
    assert (started.max_cache_hits, started.cache_ttl_seconds, started.cache_max_entries) == (
        2,
        300.0,
        256,
    )


@pytest.mark.asyncio
async def test_the_tool_function_really_runs_once() -> None:
    ran: Counter[str] = Counter()
    registry = counting_registry(ran)
    scenario = without_scripted_tools(CACHE_HITS)
    async with Runtime(tools=registry) as runtime:
        handle = await start_scenario(runtime, scenario)
        with anyio.fail_after(30):
            result = await handle.result()
    assert expectation_mismatches(CACHE_HITS, result) == []
    assert ran == {"A1001": 1}
    assert [e.cache for e in result.call_log] == ["miss", "hit", "hit", "none"]


@pytest.mark.asyncio
async def test_per_run_settings_reach_the_executor() -> None:
    ran: Counter[str] = Counter()
    registry = counting_registry(ran)
    three_hits = without_scripted_tools(CACHE_HITS, max_cache_hits=3)
    no_cache = without_scripted_tools(CACHE_HITS, cache_max_entries=0, max_turns=6)
    async with Runtime(tools=registry) as runtime:
        with anyio.fail_after(30):
            allowed = await (await start_scenario(runtime, three_hits)).result()
            assert ran == {"A1001": 1}
            uncached = await (await start_scenario(runtime, no_cache)).result()
    assert allowed.cause == "loop.cache_hits"
    assert [e.cache for e in allowed.call_log] == ["miss", "hit", "hit", "hit", "none"]
    assert (uncached.exit_reason, uncached.cause) == (ExitReason.MAX_TURNS, "budget.max_turns")
    assert {e.cache for e in uncached.call_log} == {"none"}
    assert ran == {"A1001": 1 + 6}


REPEATED_READ = parse_scenario(
    """
task = "Read the notes."
[config]
max_turns = 10
[folder]
"notes.txt" = "OD600 every 30 minutes.\\n"
[[steps]]
tool_calls = [{ name = "read_file", arguments = { path = "notes.txt" } }]
repeat = true
[expect]
exit_reason = "hook_stopped"
""",
    source="repeated_read.toml",
    name="repeated_read",
)


@pytest.mark.asyncio
async def test_with_the_defaults_the_cache_stops_a_repeated_read_before_strict_would() -> None:
    # read_file is idempotent. Strict (the default preset) warns at the 3rd identical call
    # and would stop the 5th; the cache's third hit is the 4th call.
    async with Runtime(scenarios=[REPEATED_READ]) as runtime:
        with anyio.fail_after(30):
            result = await (await start_scenario(runtime, REPEATED_READ)).result()
    assert (result.cause, result.turns, result.nudges) == ("loop.cache_hits", 4, 1)
    assert [e.cache for e in result.call_log] == ["miss", "hit", "hit", "none"]


def test_cache_settings_come_from_the_tools_section_and_run_overrides() -> None:
    config = Config(tools=ToolSettings(max_cache_hits=4, cache_ttl_seconds=9.5))
    settings = run_settings(config)
    assert (settings.max_cache_hits, settings.cache_ttl_seconds, settings.cache_max_entries) == (
        4,
        9.5,
        256,
    )
    assert run_settings(config, {"cache_max_entries": 0}).cache_max_entries == 0
    defaults = run_settings(Config())
    assert (defaults.max_cache_hits, defaults.cache_ttl_seconds) == (2, 300.0)


@pytest.mark.parametrize(
    ("key", "value"),
    [("max_cache_hits", -1), ("cache_ttl_seconds", 0), ("cache_max_entries", -5)],
)
def test_bad_cache_settings_name_the_key(key: str, value: int) -> None:
    with pytest.raises(ConfigError) as caught:
        run_settings(Config(), {key: value})
    assert f"config.{key}" in str(caught.value)
