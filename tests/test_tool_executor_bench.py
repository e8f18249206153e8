"""``bench.tool_executor``: the executor alone on a bus, per kind of echo tool (a tiny
workload here; the figures are never timed against a bound)."""

from __future__ import annotations

import json

import pytest

from bench.tool_executor import KINDS, main, measure


def test_every_kind_is_measured_in_order() -> None:
    figures = measure(2, 3, reps=2)
    assert [f.kind for f in figures] == list(KINDS)
    for f in figures:
        assert 0 <= f.us_per_call_min <= f.us_per_call <= f.us_per_call_max


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="unknown kind 'eager'"):
        measure(1, 1, reps=1, kinds=("eager",))
    with pytest.raises(ValueError, match="turns must be positive, got 0"):
        measure(1, 0, reps=1)


def test_the_json_report(capsys: pytest.CaptureFixture[str]) -> None:
    main(["--runs", "1", "--turns", "2", "--reps", "1", "--kinds", "sync,async", "--json"])
    figures = json.loads(capsys.readouterr().out)
    assert [f["kind"] for f in figures] == ["sync", "async"]
    assert set(figures[0]) == {"kind", "us_per_call", "us_per_call_min", "us_per_call_max"}
