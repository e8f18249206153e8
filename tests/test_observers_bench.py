"""``bench.observers``: each observer gets the workload's messages of the types it
subscribes to (a tiny workload here; the figures are never timed against a bound)."""

from __future__ import annotations

import json

import pytest

from actors.budget.monitor import BudgetMonitor
from actors.hooks.runner import HANDLED_TYPES
from actors.loop.monitor import LoopMonitor
from actors.progress.reporter import ProgressReporter
from bench.observers import COMPONENTS, main, measure_observers
from bus import Bus


def test_each_component_gets_the_types_its_actor_handles() -> None:
    handled = {
        "budget_monitor": set(BudgetMonitor(Bus()).handlers()),
        "hook_runner": set(HANDLED_TYPES),
        "progress_reporter": set(ProgressReporter(Bus()).handlers()),
        "loop_monitor": set(LoopMonitor(Bus()).handlers()),
    }
    types = {component.name: component.types for component in COMPONENTS}
    assert types.pop("recorder") is None
    assert types.pop("event_log") is None
    assert {name: set(kinds or ()) for name, kinds in types.items()} == handled


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
