"""``loopfuse run`` and ``loopfuse report``: the exit status says how the run ended
(docs/cli.md), a config error is one line naming the config file's keys, and a task or a
folder of the user's own is never answered by the embedded simulator."""

from __future__ import annotations

import os
import signal
import textwrap
from pathlib import Path

import anyio
import pytest

from bus import ToolExecute
from orchestrator.cli import NO_MODEL, Follower, main
from orchestrator.config import Config
from orchestrator.report import SAMPLE_FOLDER
from orchestrator.result import ExitStatus, exit_status
from orchestrator.runtime import Runtime
from orchestrator.scenarios.runs import start_scenario
from orchestrator.sim import find_scenario
from orchestrator.sim.loader import SCENARIO_DIR

UNREACHABLE = "http://127.0.0.1:9/v1"  # nothing is sent: the run fails before a request


def test_the_exit_statuses_are_the_documented_numbers() -> None:
    assert {status.name: int(status) for status in ExitStatus} == {
        "COMPLETED": 0,
        "FAILED": 1,
        "USAGE": 2,
        "EXPECTATIONS": 3,
        "INTERRUPTED": 130,
    }


def test_a_completed_run_exits_0_and_a_failed_one_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--scenario", "completed"]) == 0
    assert "Finished:" in capsys.readouterr().out
    for failing in ("max_turns", "blocking_limit", "abort_streaming"):
        assert main(["run", "--scenario", failing]) == 1, failing
        assert "Stopped:" in capsys.readouterr().out


def test_a_scenario_that_ends_other_than_expected_exits_3(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    wrong = tmp_path / "wrong.toml"
    text = (SCENARIO_DIR / "completed.toml").read_text(encoding="utf-8")
    wrong.write_text(text.replace('exit_reason = "completed"', 'exit_reason = "max_turns"'))
    assert 'exit_reason = "max_turns"' in wrong.read_text()
    assert main(["run", "--scenario", str(wrong)]) == 3
    assert "scenario expectation not met: exit_reason" in capsys.readouterr().err


def test_a_window_too_small_is_one_line_naming_the_config_files_keys(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "loopfuse.toml"
    # set by the operator, so kept as set (a default safety buffer would scale to 51)
    config.write_text(
        "[context]\nsafety_buffer_tokens = 600\ndefault_window = 512\n[context.windows]\nm = 512\n"
    )
    status = main(
        ["--config", str(config), "run", "--base-url", UNREACHABLE, "--model", "m", "--task", "x"]
    )
    err = capsys.readouterr().err
    assert status == 2
    assert err.count("\n") == 1, err  # one line: no traceback, no exception group
    assert err.startswith("loopfuse: config key ")
    for key in ("context.safety_buffer_tokens", "model.max_output_tokens", "context.windows"):
        assert key in err
    assert "512-token context window" in err
    assert "config.context" not in err


def test_a_bad_config_file_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "loopfuse.toml"
    config.write_text('[model]\nbase_url = "http://127.0.0.1:9/v1"\nmax_attempts = 0\n')
    assert main(["--config", str(config), "run", "--task", "x"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "model.max_attempts" in err


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "--task", "Summarise the risks", "--folder", "."],
        ["report", str(SAMPLE_FOLDER), "--goal", "Summarise the risks"],
        ["run", "--task", "Summarise the risks", "--base-url", UNREACHABLE],  # no --model
    ],
)
def test_without_a_model_a_users_task_or_folder_is_refused_with_how_to_set_one(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "report.md"
    assert main([*argv, *(["--out", str(out)] if argv[0] == "report" else [])]) == 2
    captured = capsys.readouterr()
    assert NO_MODEL in captured.err
    assert "--base-url" in captured.err
    assert "model.base_url" in captured.err
    assert "docs/servers.md" in captured.err
    assert captured.out == ""
    assert not out.exists()


def test_the_model_may_come_from_the_config_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "loopfuse.toml"
    config.write_text(
        textwrap.dedent(
            f"""\
            [model]
            base_url = "{UNREACHABLE}"
            model = "m"
            max_attempts = 1
            """
        )
    )
    status = main(["--config", str(config), "run", "--task", "x", "--json"])
    out = capsys.readouterr().out
    assert status == ExitStatus.FAILED
    assert '"cause":"model.unavailable"' in out  # it asked the configured endpoint


def test_help_documents_the_exit_status(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    out = capsys.readouterr().out
    assert "exit status:" in out
    assert "130" in out
    assert "usage or config error" in out


@pytest.mark.asyncio
async def test_ctrl_c_aborts_the_run_and_exits_130(tmp_path: Path) -> None:
    scenario_file = tmp_path / "slow.toml"
    scenario_file.write_text(
        textwrap.dedent(
            """\
            description = "One slow tool."
            task = "Fit the model."

            [config]
            abort_grace_seconds = 0.1

            [[tools]]
            name = "fit"
            description = "Slow."
            delay_seconds = 600.0
            results = ["done"]

            [[steps]]
            tool_calls = [{ name = "fit" }]

            [[steps]]
            text = "Fitted."

            [expect]
            exit_reason = "completed"
            """
        )
    )
    scenario = find_scenario(str(scenario_file))
    listening = anyio.Event()
    follower = Follower(listening=listening)
    async with Runtime(Config(), scenarios=[scenario]) as runtime:
        handle = await start_scenario(runtime, scenario)
        async with anyio.create_task_group() as tg:
            results = []

            async def follow() -> None:
                results.append(await follower(handle))

            tg.start_soon(follow)
            with anyio.fail_after(30):
                async for message in handle.events():
                    if isinstance(message, ToolExecute):  # the slow tool runs now
                        break
                await listening.wait()  # SIGINT before that would stop pytest itself
            os.kill(os.getpid(), signal.SIGINT)
    [result] = results
    assert follower.interrupted
    assert result.exit_reason == "aborted_tools"
    assert "Ctrl-C" in result.detail
    assert exit_status(result, interrupted=follower.interrupted) == 130
