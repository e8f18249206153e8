"""Metrics of real runs: a Runtime against the simulator, counted by its own registry."""

from __future__ import annotations

import collections

import anyio
import pytest
from prometheus_client import CollectorRegistry

from bus import ModelError, ModelReply
from orchestrator.config import Config, ModelSettings, RuntimeSettings
from orchestrator.metrics import new_registry
from orchestrator.runtime import Runtime
from orchestrator.scenarios.runs import run_scenario, start_scenario
from orchestrator.sim import Scenario, parse_scenario, shipped_scenarios


def value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def total(registry: CollectorRegistry, family: str, **labels: str) -> float:
    """The sum of ``family``'s ``_total`` samples whose labels include ``labels``."""
    return sum(
        sample.value
        for metric in registry.collect()
        if metric.name == family
        for sample in metric.samples
        if sample.name == f"{family}_total" and labels.items() <= sample.labels.items()
    )


RETRY_AND_TRUNCATION = parse_scenario(
    """
task = "Write the report."
[[steps]]
text_tokens = 40
finish_reason = "length"
faults = [{ status = 429, retry_after = 0 }]
[[steps]]
text_tokens = 40
finish_reason = "length"
[[steps]]
text = "Done."
[expect]
exit_reason = "completed"
""",
    source="retry_truncation.toml",
    name="retry_truncation",
)

SLOW = parse_scenario(
    """
task = "Write slowly."
[[steps]]
latency = 30
text = "never"
[expect]
exit_reason = "aborted_streaming"
""",
    source="slow.toml",
    name="slow",
)


@pytest.mark.asyncio
async def test_every_shipped_scenario_is_counted_as_it_ended() -> None:
    # One run each (a pipeline scenario is several stage runs: tests/test_report.py).
    scenarios = tuple(s for s in shipped_scenarios() if s.pipeline is None)
    async with Runtime() as runtime:
        registry = runtime.metrics_registry
        results = {}

        async def one(scenario: Scenario) -> None:
            results[scenario.name] = await run_scenario(runtime, scenario)

        async with anyio.create_task_group() as tg:
            for scenario in scenarios:
                tg.start_soon(one, scenario)
    assert value(registry, "loopfuse_runs_started_total") == len(scenarios)
    endings = collections.Counter((r.exit_reason.value, r.cause) for r in results.values())
    for (reason, cause), count in endings.items():
        assert total(registry, "loopfuse_runs_finished", exit_reason=reason, cause=cause) == count
    assert total(registry, "loopfuse_runs_finished") == len(scenarios)
    assert value(registry, "loopfuse_turns_total") == sum(r.turns for r in results.values())
    # Each scenario is its own model on the simulator, so per-model counts are per run.
    for name, result in results.items():
        tokens = "loopfuse_model_tokens_total"
        assert value(registry, tokens, model=name, token_type="input") == result.usage.prompt_tokens
        assert (
            value(registry, tokens, model=name, token_type="output")
            == result.usage.completion_tokens
        )
        answered = total(registry, "loopfuse_model_requests", model=name, outcome="ok") + total(
            registry, "loopfuse_model_requests", model=name, outcome="aborted"
        )
        # A final error is not answered; refusals as too long are final and the turn is
        # sent again after a collapse or compaction (docs/context.md).
        refused = total(registry, "loopfuse_model_requests", model=name, outcome="context_length")
        assert answered >= result.llm_requests - 1 - refused, name
    assert total(registry, "loopfuse_model_requests", model="other") == 0
    executed = sum(r.tool_calls for r in results.values())
    ran = total(registry, "loopfuse_tool_calls") - total(
        registry, "loopfuse_tool_calls", outcome="blocked"
    )
    assert ran >= executed
    assert value(registry, "loopfuse_runs_active") == 0
    assert value(registry, "loopfuse_runs_queued") == 0


@pytest.mark.asyncio
async def test_retries_and_truncation_recovery_are_counted() -> None:
    config = Config(model=ModelSettings(backoff_base_seconds=0.0))
    async with Runtime(config, scenarios=[RETRY_AND_TRUNCATION]) as runtime:
        handle = await start_scenario(runtime, RETRY_AND_TRUNCATION)
        events = [event async for event in handle.events()]
        result = await handle.result()
        registry = runtime.metrics_registry
    assert result.exit_reason.value == "completed"
    replies = [event for event in events if isinstance(event, ModelReply)]
    errors = [event for event in events if isinstance(event, ModelError)]
    assert [error.kind for error in errors] == ["rate_limited"]
    # Every attempt that was not a failure returned a reply, cut or not: the answered
    # ones plus the silent retries with a higher output limit (if the endpoint escalates).
    attempts = sum(reply.attempts for reply in replies)
    requests = "loopfuse_model_requests_total"
    assert value(registry, requests, model="retry_truncation", outcome="rate_limited") == 1
    assert value(registry, requests, model="retry_truncation", outcome="ok") == attempts - 1
    steps = "loopfuse_truncation_recoveries_total"
    assert value(registry, steps, step="escalate") == attempts - 1 - len(replies)
    assert value(registry, steps, step="recover_1") == 1
    assert value(registry, steps, step="recover_2") == 1
    assert value(registry, steps, step="gave_up") == 0
    assert value(registry, "loopfuse_nudges_total", kind="truncation.recover") == 2


@pytest.mark.asyncio
async def test_active_and_queued_runs_are_read_from_the_runtime() -> None:
    config = Config(runtime=RuntimeSettings(max_concurrent_runs=1))
    registry = new_registry(process=False)
    async with Runtime(config, scenarios=[SLOW], metrics_registry=registry) as runtime:
        assert runtime.metrics_registry is registry
        handles = [await start_scenario(runtime, SLOW) for _ in range(3)]
        with anyio.fail_after(10):
            async for _ in handles[0].events():
                break  # its first event: the run holds the only slot
        assert value(registry, "loopfuse_runs_active") == 1
        assert value(registry, "loopfuse_runs_queued") == 2
        assert value(registry, "loopfuse_runs_max_concurrent") == 1
        assert value(registry, "loopfuse_bus_run_inboxes") == 1
        for handle in handles:
            await handle.abort()
        with anyio.fail_after(10):
            for handle in handles:
                await handle.result()
        assert value(registry, "loopfuse_runs_active") == 0
        assert value(registry, "loopfuse_runs_queued") == 0
    # Runs aborted in the queue start (and end at once) too: every start has one ending.
    assert value(registry, "loopfuse_runs_started_total") == 3
    assert (
        value(
            registry,
            "loopfuse_runs_finished_total",
            exit_reason="aborted_streaming",
            cause="abort.caller",
            outcome="failed",
        )
        == 3
    )


@pytest.mark.asyncio
async def test_the_tool_result_cache_is_a_metric() -> None:
    cache_hits = next(s for s in shipped_scenarios() if s.name == "cache_hits")
    async with Runtime() as runtime:
        registry = runtime.metrics_registry
        assert value(registry, "loopfuse_tool_cache_hits_total") == 0
        with anyio.fail_after(30):
            result = await run_scenario(runtime, cache_hits)
        assert result.cause == "loop.cache_hits"
        assert value(registry, "loopfuse_tool_cache_misses_total") == 1
        assert value(registry, "loopfuse_tool_cache_hits_total") == 2
        assert value(registry, "loopfuse_tool_cache_loops_total") == 1
        assert value(registry, "loopfuse_tool_cache_entries") == 0  # dropped with the run
