"""A real model's runs under loopfuse (issue #29, part 1): SmolLM2-135M-Instruct on
llama-cpp-python's server, a 2,048-token window, temperature 0 and a fixed seed, the
tasks of :data:`bench.real_model.REAL_TASKS` under the default preset and with the fuses
off. What is asserted must hold for any model: every run ends for one of the seven reasons
with a cause, within its budgets; loopfuse's token counts are the server's; a window
overflow is a window ending, never an outage; and the fuses save requests and tokens.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from bench.real_model import (
    DEFAULT,
    MAX_TURNS,
    N_CTX,
    OFF,
    REAL_TASKS,
    RealRun,
    RealServer,
    open_recorder,
    real_config,
)
from bus import ExitReason
from orchestrator.result import RunResult
from orchestrator.runtime import RunSpec, Runtime

pytestmark = pytest.mark.realmodel

WINDOW_ENDINGS = {ExitReason.PROMPT_TOO_LONG, ExitReason.BLOCKING_LIMIT}


def test_every_task_ran_under_both_configurations(real_runs: list[RealRun]) -> None:
    assert len(REAL_TASKS) >= 12
    assert {(run.task.name, run.preset) for run in real_runs} == {
        (task.name, preset) for task in REAL_TASKS for preset in (DEFAULT, OFF)
    }


def test_every_run_ends_with_one_of_the_seven_reasons_and_a_cause(
    real_runs: list[RealRun],
) -> None:
    for run in real_runs:
        result = run.result
        assert result.exit_reason in set(ExitReason), run
        assert result.cause, run
        assert result.detail, run
        assert result.hint or result.exit_reason is ExitReason.COMPLETED, run


def test_no_run_exceeds_its_budgets(real_runs: list[RealRun]) -> None:
    for run in real_runs:
        result = run.result
        assert result.turns <= MAX_TURNS, run
        assert result.llm_requests <= MAX_TURNS + 2, run  # + a truncation retry, a last answer
        assert result.tool_calls <= 100, run  # budget.max_tool_calls' default
        if result.exit_reason is ExitReason.MAX_TURNS:
            assert result.cause.startswith("budget."), run


def test_token_usage_is_what_the_server_counted(real_runs: list[RealRun]) -> None:
    for run in real_runs:
        usage = run.result.usage
        assert (usage.prompt_tokens, usage.completion_tokens) == run.server_tokens, run
        if run.server_tokens != (0, 0):
            assert usage.estimated is False, run


def test_no_run_ends_as_an_outage(real_runs: list[RealRun]) -> None:
    """The server is up for the whole tier: a run that ends ``aborted_streaming`` took a
    refusal or a slow reply for an outage."""
    for run in real_runs:
        assert run.result.exit_reason is not ExitReason.ABORTED_STREAMING, run
        if 400 in run.statuses:  # the server refused a prompt as too long
            assert run.result.exit_reason in WINDOW_ENDINGS | {ExitReason.COMPLETED}, run


def _tokens(result: RunResult) -> int:
    return result.usage.prompt_tokens + result.usage.completion_tokens


def test_with_the_fuses_off_the_same_tasks_cost_more(real_runs: list[RealRun]) -> None:
    by_key = {(run.task.name, run.preset): run.result for run in real_runs}
    on_requests = sum(by_key[t.name, DEFAULT].llm_requests for t in REAL_TASKS)
    off_requests = sum(by_key[t.name, OFF].llm_requests for t in REAL_TASKS)
    on_tokens = sum(_tokens(by_key[t.name, DEFAULT]) for t in REAL_TASKS)
    off_tokens = sum(_tokens(by_key[t.name, OFF]) for t in REAL_TASKS)
    assert off_requests > on_requests
    assert off_tokens > on_tokens
    # and no task is stopped by a loop fuse only to cost more than without the fuses. A
    # run that ended otherwise is left out: a nudge changes the prompt, and a real model can
    # then take a longer path that ends by itself (summarise_risks: 8 requests to the full
    # window with the fuses on, 5 without them).
    for task in REAL_TASKS:
        fused = by_key[task.name, DEFAULT]
        if fused.cause.startswith("loop."):
            assert fused.llm_requests <= by_key[task.name, OFF].llm_requests + 1, task.name


def test_a_task_bigger_than_the_window_ends_blocking_limit_and_sends_nothing(
    real_server: RealServer,
) -> None:
    task = "Summarise this text: " + "the ledger lists another routine transfer. " * 600

    async def play() -> tuple[RunResult, tuple[int, ...]]:
        async with open_recorder(real_server) as (base_url, recorder):
            config = real_config(base_url, real_server.model_id)
            async with Runtime(config) as runtime:
                with anyio.fail_after(600):
                    result = await runtime.run(RunSpec(task=task))
            return result, tuple(recorder.statuses)

    result, statuses = anyio.run(play)
    assert result.exit_reason is ExitReason.BLOCKING_LIMIT, result
    assert statuses == ()


def test_a_window_the_server_refuses_ends_prompt_too_long_not_an_outage(
    real_server: RealServer, tmp_path: Path
) -> None:
    """loopfuse believes the window is 4x larger than the server's: the prompt is sent,
    the server refuses it (400, ``context_length_exceeded``), and the run ends on window
    grounds after its recovery, never as an outage."""
    import msgspec

    from orchestrator.config import ContextSettings

    task = "Summarise this text: " + "the ledger lists another routine transfer. " * 400

    async def play() -> tuple[RunResult, tuple[int, ...]]:
        async with open_recorder(real_server) as (base_url, recorder):
            config = real_config(base_url, real_server.model_id)
            config = msgspec.structs.replace(
                config, context=ContextSettings(windows={real_server.model_id: 4 * N_CTX})
            )
            async with Runtime(config) as runtime:
                with anyio.fail_after(600):
                    result = await runtime.run(RunSpec(task=task))
            return result, tuple(recorder.statuses)

    result, statuses = anyio.run(play)
    assert 400 in statuses
    assert result.exit_reason is ExitReason.PROMPT_TOO_LONG, result
