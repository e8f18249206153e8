"""Smoke tests of the realistic shape, the run lifecycle bench and their report keys
(tiny workloads, never timed)."""

from __future__ import annotations

import io

import anyio
import msgspec
import pytest

from bench.__main__ import main
from bench.instructions import run_workload
from bench.realistic import WorkerModel, parked_after, realistic_loop
from bench.run_lifecycle import main as lifecycle_main
from bench.scripted_model import echo_script
from bus import Bus, ChatMessage, Inbox, ModelCancel, ModelReply, ModelRequest


@pytest.mark.asyncio
@pytest.mark.parametrize("realistic", [True, False])
async def test_each_shape_runs_every_turn_and_reports_the_collector_share(
    realistic: bool,
) -> None:
    got = await realistic_loop(3, 4, realistic=realistic)
    assert got.sample.turns == 12
    assert 0.0 <= got.gc_share < 1.0
    assert got.collections >= 0


@pytest.mark.asyncio
async def test_runs_park_after_the_turns_they_were_given() -> None:
    figures = await parked_after(10, 4)
    assert (figures.runs, figures.turns) == (10, 4)
    assert figures.heap_bytes_per_run > 0


@pytest.mark.asyncio
async def test_the_worker_model_answers_and_aborts_as_the_caller_does() -> None:
    """Answered in a pool worker; a cancelled request (parked, or not yet started) gets an
    aborted reply, and the worker serves the next request whole."""
    bus = Bus()
    model = WorkerModel(bus, echo_script(10), answers=1)

    def request(run_id: str, turn: int) -> ModelRequest:
        prompt = (ChatMessage(role="user", content="Echo the steps."),)
        return ModelRequest(run_id=run_id, turn=turn, model="scripted", messages=prompt)

    async def reply(inbox: Inbox) -> ModelReply:
        with anyio.fail_after(5):
            msg = await inbox.receive()
        assert isinstance(msg, ModelReply)
        return msg

    async with anyio.create_task_group() as tg:
        await tg.start(model.run)
        with bus.open_inbox("r1") as first, bus.open_inbox("r2") as second:
            await bus.publish(request("r1", 1))
            answered = await reply(first)
            await bus.publish(request("r1", 2))  # beyond `answers`: parks
            await model.parked(1)
            await bus.publish(ModelCancel(run_id="r1", turn=2, reason="stop"))
            parked = await reply(first)
            await bus.publish(request("r2", 2))  # cancelled before its job starts
            await bus.publish(ModelCancel(run_id="r2", turn=2, reason="stop"))
            unstarted = await reply(second)
            await bus.publish(request("r2", 1))
            again = await reply(second)
        bus.close()
    assert (answered.turn, answered.aborted) == (1, False)
    assert (parked.turn, parked.aborted) == (2, True)
    assert (unstarted.turn, unstarted.aborted) == (2, True)
    assert (again.turn, again.aborted) == (1, False)
    assert model.requests == 4


def test_the_lifecycle_bench_reports_start_and_end() -> None:
    out = io.StringIO()
    argv = ["--runs", "20", "--turns", "3", "--in-flight", "4", "--reps", "1", "--json"]
    assert lifecycle_main(argv, out) == 0
    figures = msgspec.json.decode(out.getvalue())
    assert set(figures) == {"run_us", "turn_us", "start_end_us"}
    assert figures["run_us"]["median"] > 0
    assert lifecycle_main(["--turns", "1"], io.StringIO()) == 2
    out = io.StringIO()
    argv = ["--scenario", "completed", "--runs", "3", "--reps", "1", "--json"]
    assert lifecycle_main(argv, out) == 0
    assert msgspec.json.decode(out.getvalue())["scenario_run_us"]["median"] > 0


def test_the_report_has_the_realistic_shape_beside_the_cheap_one() -> None:
    out = io.StringIO()
    argv = ["--json", "--reps", "1", "--runs", "2", "--turns", "3", "--latency-turns", "3"]
    assert main([*argv, "--parked", "5", "--parked-after", "5", "--no-http"], out) == 0
    figures = msgspec.json.decode(out.getvalue())
    assert figures["loopfuse_realistic_us_per_turn"] > 0
    assert figures["realistic_vs_cheap"] == pytest.approx(
        figures["loopfuse_realistic_us_per_turn"] / figures["loopfuse_us_per_turn"]
    )
    assert set(figures["gc_share"]) == {"cheap", "realistic"}
    assert set(figures["rss_kb_per_run_after_turns"]) == {"cheap", "realistic"}
    assert figures["kb_per_run_after_turns"]["realistic"] > 0
    assert figures["parked_after_turns"] == 4
    text = io.StringIO()
    plain = argv[1:]  # the table instead of JSON
    assert main([*plain, "--parked", "5", "--parked-after", "5", "--no-http"], text) == 0
    assert "realistic shape" in text.getvalue()


@pytest.mark.asyncio
@pytest.mark.parametrize("workload", ["realistic", "lifecycle"])
async def test_the_instruction_count_workloads_of_this_pass_run(workload: str) -> None:
    sample = await run_workload(workload, 3, 4)
    assert sample is not None
    assert sample.turns == (3 if workload == "lifecycle" else 12)
