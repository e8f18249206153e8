"""``python -m bench.thresholds`` (issue #29): a threshold swept by replay over recordings
made with the fuses off moves where stuck runs stop, and legitimate runs stay untouched."""

from __future__ import annotations

import io

import anyio
import pytest

from bench.thresholds import SWEEPS, Labelled, Sweep, format_points, measure, record_scenarios
from orchestrator.scenarios.corpus import corpus

CHOSEN = ("identical_call", "error_streak_http", "listing_then_reads", "paged_api")


@pytest.mark.asyncio
async def test_a_sweep_moves_the_stop_and_spares_the_legitimate_runs() -> None:
    runs = [run for run in corpus() if run.scenario.name in CHOSEN]
    assert len(runs) == len(CHOSEN)
    with anyio.fail_after(120):
        recordings = await record_scenarios(
            [run.scenario for run in runs], {"loop_preset": "off", "max_cache_hits": 10_000}
        )
    labelled = [
        Labelled(corpus="acceptance", label=run.half, recording=recording, settings={})
        for run, recording in zip(runs, recordings, strict=True)
    ]
    # recorded with the fuses off: the stuck runs ran on to the end of their script
    assert all(
        r.recording.ending and not r.recording.ending.cause.startswith("loop.") for r in labelled
    )
    sweeps = [
        Sweep(name="generic_repeat.break_at", values=(4, 6), default=5),
        Sweep(name="error_streak.break_at", values=(4, 8), default=6),
    ]
    with anyio.fail_after(120):
        points = await measure(labelled, sweeps)
    by = {(p.threshold, p.value): p.mean_stop_call or 0.0 for p in points}
    for point in points:
        assert (point.legit, point.stuck) == (2, 2)
        assert point.legit_with_verdict == 0, point.legit_touched
        assert point.stuck_stopped == 2
    # a later stop is a later stop call, for the detector the threshold belongs to
    assert 0 < by["generic_repeat.break_at", 4] < by["generic_repeat.break_at", 6]
    assert 0 < by["error_streak.break_at", 4] < by["error_streak.break_at", 8]
    out = io.StringIO()
    format_points(points, out)
    assert out.getvalue().count("\n") == 2 + len(points)


def test_every_sweep_has_its_default_among_its_values() -> None:
    for sweep in SWEEPS:
        assert sweep.default in sweep.values
        sweep.overrides(sweep.default)  # a known threshold
