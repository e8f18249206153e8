"""``bench.gatekeeper``: the context gatekeeper's benchmark feeds the workload's own
messages (a tiny workload here; the figures are never timed against a bound)."""

from __future__ import annotations

import json

import pytest

from bench.gatekeeper import main, measure_gatekeeper


def test_the_benchmark_feeds_the_gatekeepers_messages_of_the_workload() -> None:
    figures = measure_gatekeeper(3, 4, repeat=2, reps=2)
    assert figures.mix == {
        "TurnStarted": 12,  # 3 runs x 4 turns
        "ModelRequest": 12,
        "ModelReplied": 12,
        "RunStarted": 3,
        "RunFinished": 3,
    }
    assert figures.turns == 12 * 2
    assert figures.messages_per_turn == 42 / 12
    assert 0 <= figures.us_per_turn_min <= figures.us_per_turn <= figures.us_per_turn_max
    with pytest.raises(ValueError, match="reps must be positive, got 0"):
        measure_gatekeeper(1, 1, reps=0)


def test_the_json_report(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--runs", "1", "--turns", "2", "--repeat", "1", "--reps", "1", "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert set(figures) == {
        "turns",
        "messages_per_turn",
        "us_per_turn",
        "us_per_turn_min",
        "us_per_turn_max",
        "mix",
    }
