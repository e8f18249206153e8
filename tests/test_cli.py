"""The command line: `demo --json`, `run --scenario`, endings a person can act on."""

from __future__ import annotations

import contextlib
import io
import json
from typing import Any

import msgspec
import pytest

from bus import CAUSES, ExitReason, Outcome, Usage, cause_hint, outcome_of
from orchestrator.cli import main
from orchestrator.daemon.demo import DemoRow, format_table
from orchestrator.result import RunResult, describe_ending
from orchestrator.sim import shipped_scenarios

DemoOutput = tuple[int, list[dict[str, Any]]]


@pytest.fixture(scope="module")
def demo_json() -> DemoOutput:
    """One real ``loopfuse demo --json`` run: its exit status and its lines."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = main(["demo", "--json"])
    return status, [json.loads(line) for line in out.getvalue().splitlines()]


def test_demo_json_shows_every_scenario_ending_as_expected(demo_json: DemoOutput) -> None:
    status, lines = demo_json
    assert status == 0
    assert [line["scenario"] for line in lines] == [s.name for s in shipped_scenarios()]
    for line in lines:
        assert line["exit_reason"] == line["expected_exit_reason"], line["scenario"]
        assert line["matches"] is True
        for key in (
            "cause",
            "outcome",
            "turns",
            "llm_requests",
            "tool_calls",
            "usage",
            "incomplete",
            "degraded",
            "detail",
            "hint",
            "trace",
            "call_log",
        ):
            assert key in line, key
        assert "transcript" not in line


def test_run_scenario_prints_an_ending_with_reason_cause_and_next_step(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["run", "--scenario", "max_turns"]) == 1  # a failed run (docs/cli.md)
    out = capsys.readouterr().out
    assert "Stopped:" in out
    assert "max_turns" in out
    assert "budget.max_turns" in out
    assert "Next: Raise budget.max_turns" in out


def test_run_without_scenario_or_endpoint_is_a_clear_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["run", "--task", "x"]) == 2
    assert "--base-url" in capsys.readouterr().err


def test_a_bad_config_file_names_the_key(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "bad.toml"
    config.write_text("[budget]\nmax_turns = 0\n")
    assert main(["--config", str(config), "demo"]) == 2
    err = capsys.readouterr().err
    assert "budget.max_turns" in err
    assert ">= 1" in err


def test_unknown_scenario_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--scenario", "no_such_scenario"]) == 2
    assert "no_such_scenario" in capsys.readouterr().err


@pytest.mark.parametrize("reason", list(ExitReason))
def test_every_ending_names_reason_cause_and_next_step(reason: ExitReason) -> None:
    cause = next(iter(CAUSES))
    result = RunResult(
        run_id="r",
        trace_id="t",
        exit_reason=reason,
        cause=cause,
        outcome=outcome_of(reason),
        detail="what happened",
        hint=cause_hint(cause),
        turns=1,
        llm_requests=1,
        tool_calls=0,
        usage=Usage(),
        output="",
        incomplete=False,
        degraded=False,
        nudges=0,
        trace=(),
        call_log=(),
    )
    text = describe_ending(result)
    assert ("Finished:" if result.outcome is Outcome.DONE else "Stopped:") in text
    assert reason.value in text
    assert cause in text
    assert "Why: what happened" in text
    assert f"Next: {cause_hint(cause)}" in text


@pytest.mark.parametrize("reason", list(ExitReason))
def test_a_real_demo_run_ends_with_every_reason_naming_cause_and_next_step(
    demo_json: DemoOutput, reason: ExitReason
) -> None:
    _, lines = demo_json
    rows = [line for line in lines if line["exit_reason"] == reason.value]
    assert rows, f"no shipped scenario ends with {reason.value}"
    for line in rows:
        fields = {key: line[key] for key in RunResult.__struct_fields__ if key in line}
        result = msgspec.convert(fields, RunResult)
        row = DemoRow(
            scenario=line["scenario"],
            expected_exit_reason=line["expected_exit_reason"],
            mismatches=tuple(line["mismatches"]),
            result=result,
        )
        table = io.StringIO()
        format_table([row], table)
        printed = table.getvalue().splitlines()[-1]  # what the demo prints for a person
        assert printed.startswith(f"{row.scenario}: "), printed
        assert f" with {reason.value} ({result.cause})." in printed
        assert result.hint  # its variant per what happened: tests/test_cause_hints.py
        assert printed.endswith(f"Next: {result.hint}")
        text = describe_ending(result)  # what `loopfuse run` prints
        assert f"ended with {reason.value} (cause {result.cause})" in text
        assert f"Next: {result.hint}" in text


def test_run_scenario_plays_on_the_simulator_whatever_model_says(
    tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:
    """#30 item 5: a `[model] base_url` (here a port nothing listens on) does not take a
    scenario away from the embedded simulator."""
    config = tmp_path / "model.toml"
    config.write_text('[model]\nbase_url = "http://127.0.0.1:9/v1"\nmodel = "my-model"\n')
    assert main(["--config", str(config), "run", "--scenario", "completed"]) == 0
    assert "completed" in capsys.readouterr().out


def test_the_readme_s_config_example_still_plays_scenarios(
    tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:
    """#30 item 5: the README's config (a `[model]` on api.example.com) leaves scenarios on
    the simulator."""
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Configuration", 1)[1]
    block = re.search(r"```toml\n(.*?)```", section, re.S)
    assert block is not None
    assert "base_url" in block.group(1)
    config = tmp_path / "loopfuse.toml"
    config.write_text(block.group(1))
    assert main(["--config", str(config), "run", "--scenario", "max_turns"]) == 1
    out = capsys.readouterr().out
    assert "budget.max_turns" in out
