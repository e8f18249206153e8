"""Smoke tests of the benchmarks: each returns sane figures on a tiny workload (never timed)."""

from __future__ import annotations

import io
import os

import msgspec
import pytest

from bench.__main__ import main
from bench.bus_throughput import measure_bus
from bench.instructions import main as instructions_main
from bench.instructions import run_workload
from bench.loops import bare_loop, guard_loop, loopfuse_loop
from bench.memory import bare_parked, loopfuse_parked


@pytest.mark.asyncio
@pytest.mark.parametrize("workload", [bare_loop, guard_loop, loopfuse_loop])
async def test_each_loop_runs_every_turn_of_every_run(workload: object) -> None:
    sample = await workload(3, 4)  # type: ignore[operator]
    assert sample.turns == 12
    assert sample.cpu_seconds >= 0
    assert sample.wall_seconds > 0
    assert sample.cpu_us_per_turn == pytest.approx(sample.cpu_seconds / 12 * 1e6)


@pytest.mark.asyncio
@pytest.mark.parametrize("workload", ["loopfuse", "guard"])
async def test_the_instruction_count_workload_runs_what_it_is_told(workload: str) -> None:
    sample = await run_workload(workload, 3, 4)
    assert sample is not None
    assert sample.turns == 12
    assert await run_workload(workload, 0, 4) is None  # the warm-up alone: the baseline


def test_the_instruction_count_workload_refuses_an_unknown_one() -> None:
    with pytest.raises(SystemExit):
        instructions_main(["bare", "3"])


@pytest.mark.asyncio
async def test_loopfuse_with_the_event_recorder_runs_every_turn() -> None:
    sample = await loopfuse_loop(2, 3, events=True)
    assert sample.turns == 6


@pytest.mark.asyncio
async def test_parked_runs_cost_memory_per_run() -> None:
    parked = await loopfuse_parked(20)
    bare = await bare_parked(20)
    assert parked.runs == bare.runs == 20
    assert parked.heap_bytes_per_run > 0
    assert bare.heap_bytes_per_run > 0
    assert parked.kb_per_run == pytest.approx(parked.heap_bytes_per_run / 1024)


@pytest.mark.asyncio
async def test_bus_figures_count_both_publishes() -> None:
    figures = await measure_bus(3, 200)
    assert (figures.subscribers, figures.messages) == (3, 200)
    assert figures.publish_per_second > 0
    assert figures.settled_per_second > 0


def test_the_json_report_has_every_key() -> None:
    out = io.StringIO()
    argv = ["--json", "--reps", "1", "--runs", "2", "--turns", "3", "--latency-turns", "3"]
    assert main([*argv, "--parked", "5", "--no-http"], out) == 0
    figures = msgspec.json.decode(out.getvalue())
    keys = (
        "bare_us_per_turn",
        "guard_us_per_turn",
        "loopfuse_us_per_turn",
        "loopfuse_tracing_us_per_turn",
        "kb_per_run",
    )
    for key in keys:
        assert figures[key] > 0, key
    assert figures["ratio_vs_guard"] == pytest.approx(
        figures["loopfuse_us_per_turn"] / figures["guard_us_per_turn"]
    )
    assert figures["http_client_us_per_request"] is None  # --no-http
    # The editable install the suite runs on is pure Python (scripts/check-compiled has the
    # wheel, where the same report says "compiled").
    compiled = os.environ.get("TEST_COMPILED_WHEEL") == "1"
    assert figures["build"] == ("compiled" if compiled else "pure Python")
    assert (figures["compiled_modules"] > 0) is compiled
    assert "raw_openai_us_per_request" in figures


def test_bad_counts_are_refused() -> None:
    assert main(["--reps", "0"], io.StringIO()) == 2


def test_the_http_path_counts_requests_both_ways() -> None:
    import anyio

    from bench.http_client import measure_http, simulator_process

    with simulator_process() as url:
        figures = anyio.run(measure_http, url, 2)
    assert figures.loopfuse.turns == figures.raw.turns == 4  # two requests per run
    assert figures.loopfuse_us_per_request > 0
    assert figures.raw_us_per_request > 0
