"""``bench.recorder``: the metrics recorder's benchmark feeds the workload's own messages
(a tiny workload here; the figures are never timed against a bound)."""

from __future__ import annotations

import json

import pytest

from bench.recorder import main, measure_recorder


def test_the_benchmark_feeds_every_message_of_the_workload() -> None:
    figures = measure_recorder(3, 4, repeat=2, reps=2)
    mix = figures.mix
    assert mix["RunStarted"] == mix["RunFinished"] == 3
    assert mix["TurnStarted"] == mix["ModelReply"] == 12  # 3 runs x 4 turns
    assert mix["ToolResult"] == 9  # every turn but the last calls echo
    assert figures.messages == sum(mix.values()) * 2
    assert figures.messages_per_turn == sum(mix.values()) / 12
    assert 0 <= figures.us_per_message_min <= figures.us_per_message <= figures.us_per_message_max
    assert figures.scrape_ms > 0
    with pytest.raises(ValueError, match="reps must be positive, got 0"):
        measure_recorder(1, 1, reps=0)


def test_the_json_report(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--runs", "1", "--turns", "2", "--repeat", "1", "--reps", "1", "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert set(figures) == {
        "messages",
        "messages_per_turn",
        "us_per_message",
        "us_per_message_min",
        "us_per_message_max",
        "scrape_ms",
        "mix",
    }
    with pytest.raises(SystemExit):
        main(["--repeat", "0"])
    assert "'0' is not a positive whole number" in capsys.readouterr().err
