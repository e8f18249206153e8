"""``bench.observers``: each observer gets the workload's messages of the types it
subscribes to (a tiny workload here; the figures are never timed against a bound)."""

from __future__ import annotations

import json
from typing import get_args

import pytest

import actors.budget.monitor
import actors.hooks.runner
import actors.loop.monitor
import actors.progress.reporter
from bench.observers import COMPONENTS, main, measure_observers


def test_each_component_gets_the_types_its_actor_handles() -> None:
    unions = {
        "budget_monitor": actors.budget.monitor._Message,
        "hook_runner": actors.hooks.runner._Message,
        "progress_reporter": actors.progress.reporter._Message,
        "loop_monitor": actors.loop.monitor._Message,
    }
    types = {component.name: component.types for component in COMPONENTS}
    assert types.pop("recorder") is None
    assert types.pop("event_log") is None
    assert {name: set(kinds or ()) for name, kinds in types.items()} == {
        name: set(get_args(union)) for name, union in unions.items()
    }


def test_the_benchmark_times_every_component() -> None:
    figures = measure_observers(2, 3, repeat=1, reps=2)
    assert [f.name for f in figures] == [component.name for component in COMPONENTS]
    for f in figures:
        assert 0 <= f.us_per_turn_min <= f.us_per_turn <= f.us_per_turn_max
    by_name = {f.name: f for f in figures}
    assert by_name["progress_reporter"].messages_per_turn == pytest.approx((2 + 6 + 2) / 6)
    with pytest.raises(ValueError, match="reps must be positive, got 0"):
        measure_observers(1, 1, reps=0)


def test_the_json_report(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--runs", "1", "--turns", "2", "--repeat", "1", "--reps", "1", "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert [f["name"] for f in figures] == [component.name for component in COMPONENTS]
    assert set(figures[0]) == {
        "name",
        "messages_per_turn",
        "us_per_turn",
        "us_per_turn_min",
        "us_per_turn_max",
    }
