"""Correctness under concurrency: a thousand runs on one runtime, and no state leaks.

The runs go through the whole runtime (every monitor, the tool executor, scripted scenario
tools) with the in-process scripted model of ``bench`` instead of HTTP: a thousand runs
through the simulator would take minutes. The scripted model plays each scenario by the
simulator's own rules (``orchestrator.sim.script``), so only fault-free scenarios are mixed
in (faults, latencies and aborts are the simulator's and the caller's business, tested in
``test_runtime.py``).
"""

from __future__ import annotations

import itertools

import anyio
import pytest

from bench.scripted_model import ScriptedModel, scenario_script
from bus import ExitReason, ToolCallProposed
from orchestrator.config import Config, RuntimeSettings
from orchestrator.runtime import Runtime
from orchestrator.scenarios.runs import expectation_mismatches, start_scenario
from orchestrator.sim import Scenario, shipped_scenarios

SHIPPED = {scenario.name: scenario for scenario in shipped_scenarios()}

MIXED = (
    "answer_on_stop",
    "cache_hits",
    "completed",
    "cycle3",
    "dead_loop",
    "dead_loop_recovers",
    "diminishing_returns",
    "long_legit_read",
    "max_tool_calls",
    "max_turns",
    "path_escape",
    "ping_pong",
    "ping_pong_progress",
    "poll_no_progress",
    "poll_progress",
    "token_burn",
    "token_target",
    "truncation",
    "truncation_giveup",
)
"""Shipped scenarios without faults, latencies, hooks or abort triggers."""


def scripted_runtime(runs: int) -> Runtime:
    script = scenario_script(SHIPPED.values())
    return Runtime(
        Config(runtime=RuntimeSettings(max_concurrent_runs=runs)),
        model_actor=lambda bus: ScriptedModel(bus, script),
        keep_finished_runs=runs,
    )


@pytest.mark.asyncio
async def test_a_thousand_concurrent_mixed_runs_each_end_as_expected() -> None:
    chosen: list[Scenario] = [
        SHIPPED[name] for name in itertools.islice(itertools.cycle(MIXED), 1_000)
    ]
    with anyio.fail_after(90):
        async with scripted_runtime(len(chosen)) as runtime:
            for scenario in {scenario.name: scenario for scenario in chosen}.values():
                # Each scenario's folder is written once, in a thread: before the burst,
                # so that no start waits for one while the runs started before it end.
                await runtime.scenario_folders.folder(scenario.name, scenario.folder)
            handles = [await start_scenario(runtime, scenario) for scenario in chosen]
            assert runtime.active_runs == len(chosen)  # all started before any is awaited
            results = [await handle.result() for handle in handles]
    mismatches = {
        f"{scenario.name} ({result.run_id})": problems
        for scenario, result in zip(chosen, results, strict=True)
        if (problems := expectation_mismatches(scenario, result))
    }
    assert mismatches == {}
    assert len({result.run_id for result in results}) == 1_000
    ended = {result.exit_reason for result in results}
    assert {ExitReason.COMPLETED, ExitReason.HOOK_STOPPED, ExitReason.MAX_TURNS} <= ended


@pytest.mark.asyncio
async def test_interleaved_identical_runs_do_not_trip_each_others_loop_monitor() -> None:
    # Two runs make the very same read_file call turn after turn, interleaved on one bus.
    # Counted together they would reach the strict repeat limit at half the turns; each
    # must end exactly as a lone run does: nudged once, stopped before its 5th call runs.
    scenario = SHIPPED["dead_loop"]
    with anyio.fail_after(30):
        async with scripted_runtime(2) as runtime:
            first = await start_scenario(runtime, scenario)
            second = await start_scenario(runtime, scenario)
            fingerprints: dict[str, list[str]] = {first.run_id: [], second.run_id: []}
            order: list[str] = []

            async def watch(handle_id: str) -> None:
                handle = runtime.handle(handle_id)
                assert handle is not None
                async for event in handle.events():
                    if isinstance(event, ToolCallProposed):
                        fingerprints[handle_id].append(event.fingerprint)
                        order.append(handle_id)

            async with anyio.create_task_group() as tg:
                tg.start_soon(watch, first.run_id)
                tg.start_soon(watch, second.run_id)
            results = [await first.result(), await second.result()]
    for result in results:
        assert expectation_mismatches(scenario, result) == []
        assert (result.cause, result.turns, result.tool_calls, result.nudges) == (
            "loop.generic_repeat",
            5,
            4,
            1,
        )
    # identical calls, and truly interleaved: the runs took turns on the bus
    assert fingerprints[first.run_id] == fingerprints[second.run_id]
    assert len(set(fingerprints[first.run_id])) == 1
    last_of_first = len(order) - 1 - order[::-1].index(first.run_id)
    assert order.index(second.run_id) < last_of_first


@pytest.mark.asyncio
async def test_budgets_caches_and_nudges_stay_per_run() -> None:
    # Many runs of the scenarios that exercise per-run counters: the tool-call budget, the
    # result cache's hit limit and the token budget. Shared counters would end them early.
    names = ("max_tool_calls", "cache_hits", "token_burn", "dead_loop_recovers")
    chosen = [SHIPPED[name] for name in names for _ in range(25)]
    with anyio.fail_after(60):
        async with scripted_runtime(len(chosen)) as runtime:
            handles = [await start_scenario(runtime, scenario) for scenario in chosen]
            results = [await handle.result() for handle in handles]
    for scenario, result in zip(chosen, results, strict=True):
        assert expectation_mismatches(scenario, result) == [], scenario.name
    for name in names:
        ends = {
            (r.cause, r.turns, r.tool_calls, r.nudges, r.usage.total_tokens)
            for s, r in zip(chosen, results, strict=True)
            if s.name == name
        }
        assert len(ends) == 1, (name, ends)  # every copy ended exactly alike
