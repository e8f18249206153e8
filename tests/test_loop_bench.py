"""``bench.loop_monitor``: the loop monitor's benchmark plays the echo workload's messages
(a tiny workload here; the times are never checked against a bound, the bytes are)."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from bench.loop_monitor import main, measure, run_messages
from bus import ToolCallProposed


def test_the_workload_is_every_message_the_monitor_sees_of_each_run() -> None:
    messages = list(run_messages(3, 4))
    mix = Counter(type(msg).__name__ for msg in messages)
    assert mix == {
        "RunStarted": 3, "ToolCallProposed": 12, "ToolResult": 12, "ModelReply": 15,
        "RunFinished": 3,
    }  # fmt: skip
    # interleaved turn by turn, as concurrent runs are; new arguments every call
    proposed = [msg for msg in messages if isinstance(msg, ToolCallProposed)]
    assert [msg.run_id for msg in proposed[:3]] == ["run-0", "run-1", "run-2"]
    assert len({msg.fingerprint for msg in proposed if msg.run_id == "run-0"}) == 4
    parked = list(run_messages(2, 0, finish=False))
    assert [type(msg).__name__ for msg in parked] == ["RunStarted", "RunStarted"]


@pytest.mark.parametrize("preset", ["strict", "openclaw", "openclaw-current", "gemini", "qwen"])
def test_the_figures_of_a_small_run(preset: str) -> None:
    figures = measure(preset, runs=5, calls=3, reps=2, parked=50)
    assert figures.preset == preset
    assert figures.calls_per_run == 3
    assert 0 < figures.monitor_us_per_call_min <= figures.monitor_us_per_call
    assert figures.monitor_us_per_call <= figures.monitor_us_per_call_max
    assert 0 < figures.engine_us_per_call_min <= figures.engine_us_per_call_max
    assert figures.bytes_per_parked_run <= 300  # issue #8's bound for a parked run
    assert figures.bytes_per_run_after_calls > figures.bytes_per_parked_run


def test_bad_sizes_and_presets_are_named() -> None:
    with pytest.raises(ValueError, match="reps: must be a positive integer, got 0"):
        measure("strict", reps=0)
    with pytest.raises(
        ValueError, match="preset: must be one of gemini, openclaw, openclaw-current, qwen, strict"
    ):
        measure("lenient")


def test_the_json_report(capsys: pytest.CaptureFixture[str]) -> None:
    main(["--json", "--runs", "2", "--calls", "2", "--reps", "1", "--parked", "10"])
    figures = json.loads(capsys.readouterr().out)
    assert set(figures) == {"strict", "openclaw", "openclaw-current", "gemini", "qwen"}
    assert set(figures["strict"]) == {
        "preset", "monitor_us_per_call", "monitor_us_per_call_min", "monitor_us_per_call_max",
        "engine_us_per_call", "engine_us_per_call_min", "engine_us_per_call_max",
        "bytes_per_parked_run", "bytes_per_run_after_calls", "calls_per_run",
    }  # fmt: skip
    main(["--preset", "gemini", "--runs", "1", "--calls", "1", "--reps", "1", "--parked", "5"])
    table = capsys.readouterr().out
    assert "| gemini |" in table
    assert "| strict |" not in table
    with pytest.raises(SystemExit):
        main(["--calls", "0"])
    assert "--calls: must be a positive integer, got 0" in capsys.readouterr().err
