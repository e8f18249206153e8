"""A new user's first hour with the command line (issue #30, items 1, 2, 6-10): no
tracebacks, the documented exit statuses, the shipped ``mcp_git`` scenario reachable by
name, a bounded exit when the trace backend is down, plain ``--help``, a live progress line
on a terminal. Real ``loopfuse`` processes where the terminal or the exit is the point."""

from __future__ import annotations

import argparse
import io
import re
import shlex
import signal
import textwrap
import threading
from collections.abc import Sequence
from functools import partial
from pathlib import Path

import anyio
import msgspec
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from rich.console import Console

from orchestrator import cli
from orchestrator.cli import Follower, main
from orchestrator.cli_progress import ProgressLine
from orchestrator.config import Config
from orchestrator.report import SAMPLE_FOLDER, simulated_models
from orchestrator.report.command import run_report_command
from orchestrator.runtime import Runtime
from orchestrator.scenarios.runs import expectation_mismatches, start_scenario
from orchestrator.sim import find_scenario
from orchestrator.sim.loader import SCENARIO_DIR
from orchestrator.tracing import wiring
from tests.cli_support import OnTerminal, free_port, loopfuse

ROOT = Path(__file__).resolve().parent.parent
UNREACHABLE = "http://127.0.0.1:9/v1"  # nothing is sent: the command fails before a request
BAD_MCP = textwrap.dedent(
    """\
    [[mcp.servers]]
    name = "git"
    command = "python3"
    args = ["-m", "mcp_server_that_is_not_installed", "--repository", "/path/to/repo"]
    """
)


def assert_one_line(err: str) -> str:
    assert "Traceback" not in err, err
    assert "Exception Group" not in err, err
    assert err.count("\n") == 1, err
    return err.strip()


# ------------------------------------------------------------- 1: no daemon at the URL


@pytest.mark.parametrize("command", [["runs"], ["watch", "0123456789abcdef"]])
def test_runs_and_watch_without_a_daemon_say_how_to_start_one(command: list[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    for done in (
        loopfuse(*command, "--url", url),
        loopfuse(*command, env={"LOOPFUSE_URL": url}),
    ):
        line = assert_one_line(done.stderr)
        assert done.returncode == 2
        assert line.startswith(f"loopfuse: no daemon at {url}")
        assert "`loopfuse serve`" in line
        assert "--url" in line
        assert done.stdout == ""


# ------------------------------------------------------- 2: serve and demo that cannot start


@pytest.mark.parametrize("command", [["serve", "--port", "0"], ["demo"]])
def test_serve_and_demo_that_cannot_start_say_so_in_one_line_as_run_does(
    command: list[str], tmp_path: Path
) -> None:
    config = tmp_path / "mcp.toml"
    config.write_text(BAD_MCP)
    ran = loopfuse("--config", str(config), "run", "--scenario", "completed")
    done = loopfuse("--config", str(config), *command)
    assert (done.returncode, ran.returncode) == (2, 2)
    line = assert_one_line(done.stderr)
    assert line == assert_one_line(ran.stderr)
    assert line.startswith("loopfuse: config key 'mcp.servers.0': server 'git'")
    assert "mcp_server_that_is_not_installed" in line


@pytest.mark.parametrize("command", [["serve", "--port", "0"], ["demo"]])
def test_serve_and_demo_with_tracing_but_no_otel_extra_say_so_in_one_line(
    command: list[str],
) -> None:
    env = {"LOOPFUSE_TRACING__ENABLED": "true"}
    done = loopfuse(*command, env=env, block="opentelemetry.sdk,opentelemetry.exporter")
    assert done.returncode == 2
    line = assert_one_line(done.stderr)
    assert line.startswith("loopfuse: config key 'tracing.enabled'")
    assert "pip install 'loopfuse[otel]'" in line


@pytest.mark.parametrize("command", ["serve", "sim"])
@pytest.mark.parametrize("port", ["99999", "-1", "http"])
def test_a_port_out_of_range_is_a_usage_error(command: str, port: str) -> None:
    done = loopfuse(command, "--port", port)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert f"argument --port: {port!r}" in done.stderr or f"{port} is not a port" in done.stderr
    assert "(0-65535)" in done.stderr


# ------------------------------------------------------------- 6: the mcp_git scenario


def test_the_mcp_git_scenario_is_found_by_name_from_anywhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # as after `pip install`: no source tree here
    scenario = find_scenario("mcp_git")
    assert scenario.name == "mcp_git"
    assert "git__git_status" in scenario.config["tools"]


def _command_lines(text: str) -> list[list[str]]:
    """Every ``loopfuse ...`` command line in ``text`` (comment marks removed)."""
    lines = [line.lstrip("# ").strip() for line in text.splitlines()]
    return [shlex.split(line)[1:] for line in lines if line.startswith("loopfuse ")]


@pytest.mark.parametrize(
    "source", [SCENARIO_DIR / "mcp" / "mcp_git.toml", ROOT / "docs" / "mcp.md"]
)
def test_the_documented_mcp_git_command_lines_parse_and_name_the_scenario(
    source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    commands = [argv for argv in _command_lines(source.read_text()) if "mcp_git" in " ".join(argv)]
    assert commands, f"{source} shows no command line for mcp_git"
    monkeypatch.chdir(tmp_path)
    for argv in commands:
        args = cli._parser().parse_args(argv)  # argparse exits on a refused line
        assert args.config == "mcp-git.toml"
        assert find_scenario(args.scenario).name == "mcp_git"


def test_config_after_the_command_is_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "mcp-git.toml"
    config.write_text(BAD_MCP)
    assert main(["run", "--scenario", "mcp_git", "--config", str(config)]) == 2
    line = assert_one_line(capsys.readouterr().err)
    assert "mcp.servers.0" in line  # the file was read, the scenario found
    for command in ("runs", "scenarios", "demo", "serve"):
        args = cli._parser().parse_args([command, "--config", "x.toml"])
        assert args.config == "x.toml"
    assert cli._parser().parse_args(["--config", "x.toml", "scenarios"]).config == "x.toml"


# ------------------------------------------------------------------- 7: Ctrl-C: 130


SLOW = textwrap.dedent(
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


def test_ctrl_c_during_run_scenario_exits_130_without_an_expectation_mismatch(
    tmp_path: Path,
) -> None:
    scenario = tmp_path / "slow.toml"
    scenario.write_text(SLOW)
    terminal = OnTerminal("run", "--scenario", str(scenario))
    # The progress line is drawn once Ctrl-C is handled: the slow tool is running now.
    terminal.read_until(b"1 tool call")
    terminal.process.send_signal(signal.SIGINT)
    status, err = terminal.finish()
    shown = terminal.seen.decode(errors="replace")
    assert status == 130, err
    assert "expectation not met" not in err
    assert "Traceback" not in err
    assert "ExitReason" not in err + shown
    assert "aborted_tools" in shown


def test_a_mismatch_names_values_not_python_reprs(tmp_path: Path) -> None:
    wrong = tmp_path / "wrong.toml"
    text = (SCENARIO_DIR / "completed.toml").read_text(encoding="utf-8")
    wrong.write_text(text.replace('exit_reason = "completed"', 'exit_reason = "max_turns"'))
    scenario = find_scenario(str(wrong))

    async def play() -> list[str]:
        async with Runtime(Config(), scenarios=[scenario]) as runtime:
            result = await (await start_scenario(runtime, scenario)).result()
        return expectation_mismatches(scenario, result)

    mismatches = anyio.run(play)
    assert "exit_reason: expected 'max_turns', got 'completed'" in mismatches
    assert not any("ExitReason" in mismatch for mismatch in mismatches)


# ----------------------------------------------------------- 8: a folder that is not there


def test_run_with_a_missing_folder_is_a_usage_error_and_runs_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nonexistent"
    argv = ["run", "--task", "x", "--folder", str(missing), "--base-url", UNREACHABLE]
    assert main([*argv, "--model", "m"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # nothing ran: no result, no ending
    line = assert_one_line(captured.err)
    assert f"--folder {missing}: no such directory" in line


# ---------------------------------------------------------------- 9: trace backend down


def test_a_traced_run_with_the_backend_down_warns_once_and_exits_normally() -> None:
    env = {
        "LOOPFUSE_TRACING__ENABLED": "true",
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{free_port()}",
    }
    done = loopfuse("run", "--scenario", "completed", env=env)
    assert done.returncode == 0, done.stderr
    assert "Finished:" in done.stdout
    assert "Traceback" not in done.stderr
    assert "Transient error" not in done.stderr  # the SDK's retry records
    assert "Failed to export" not in done.stderr
    assert done.stderr.count("\n") == 1, done.stderr  # one warning line at most
    assert "spans not exported to http://127.0.0.1:" in done.stderr
    assert "tracing.endpoint" in done.stderr


class _StuckBackend(SpanExporter):
    """An exporter whose export waits until it is shut down: a backend that hangs."""

    def __init__(self) -> None:
        self.released = threading.Event()
        self.shut_down = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.released.wait(600)
        return SpanExportResult.FAILURE

    def shutdown(self) -> None:
        self.shut_down = True
        self.released.set()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return False


@pytest.mark.asyncio
async def test_the_exit_flush_is_bounded_and_then_stops_the_exporter(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(wiring, "FLUSH_SECONDS", 0.2)
    backend = _StuckBackend()
    config = traced(Config())
    scenario = find_scenario("completed")
    with anyio.fail_after(60):  # a safety net: the flush gives up after 0.2 s
        async with Runtime(config, scenarios=[scenario], span_exporter=backend) as runtime:
            await (await start_scenario(runtime, scenario)).result()
    assert backend.shut_down  # told to stop: it retries no longer, the process can exit
    warnings = [r for r in caplog.records if r.name == "loopfuse.tracing"]
    assert len(warnings) == 1
    assert "spans not exported" in warnings[0].getMessage()


def traced(config: Config) -> Config:
    tracing = msgspec.structs.replace(config.tracing, enabled=True)
    return msgspec.structs.replace(config, tracing=tracing)


# ------------------------------------------------------- 10: --help, and the progress line


def _parsers() -> dict[str, argparse.ArgumentParser]:
    parser = cli._parser()
    [commands] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return {"loopfuse": parser, **commands.choices}


def test_every_option_of_every_command_has_help() -> None:
    for name, parser in _parsers().items():
        for action in parser._actions:
            assert action.help, f"loopfuse {name}: {action.option_strings or action.dest}"


@pytest.mark.parametrize("command", sorted(_parsers()))
def test_help_is_plain_text(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main([*([] if command == "loopfuse" else [command]), "--help"])
    out = capsys.readouterr().out
    assert "``" not in out  # reStructuredText markup
    assert not re.search(r"(^|\s)::\s*$", out, re.MULTILINE), out
    assert ":class:" not in out
    assert ":func:" not in out


def _terminal() -> tuple[Console, io.StringIO]:
    buffer = io.StringIO()
    return Console(file=buffer, force_terminal=True, width=200), buffer


def test_the_progress_line_shows_turn_calls_tokens_and_the_last_verdict() -> None:
    console, buffer = _terminal()
    scenario = find_scenario("dead_loop")
    line = ProgressLine(console)

    async def play() -> None:
        async with Runtime(Config(), scenarios=[scenario]) as runtime:
            handle = await start_scenario(runtime, scenario)
            await Follower(progress=line)(handle)

    anyio.run(play)
    shown = buffer.getvalue()
    tally = line.tally
    assert tally.turn >= 2
    assert tally.model_calls >= 2
    assert tally.tool_calls >= 2
    assert tally.tokens > 0
    assert tally.verdict.startswith(("warn", "block"))
    assert f"turn {tally.turn} · {tally.model_calls} model calls" in shown
    assert f"{tally.tokens:,} tokens" in shown
    assert f"last verdict: {tally.verdict}" in shown
    assert "\x1b[" in shown  # drawn in place, with the terminal's control sequences


def test_the_report_progress_line_names_the_stage(tmp_path: Path) -> None:
    console, buffer = _terminal()
    args = argparse.Namespace(
        folder=str(SAMPLE_FOLDER),
        goal="growth",
        format="markdown",
        out=str(tmp_path / "r.md"),
        reflect=1,
        json=False,
    )
    status = anyio.run(
        partial(run_report_command, models=simulated_models("report")),
        Config(),
        args,
        Follower(progress=ProgressLine(console)),
    )
    assert status == 0
    shown = buffer.getvalue()
    assert "stage 2/5 explore" in shown
    assert "model call" in shown


def test_the_progress_line_is_drawn_on_a_terminal_only() -> None:
    base_url_free = f"http://127.0.0.1:{free_port()}/v1"
    argv = ["run", "--task", "x", "--base-url", base_url_free, "--model", "m"]
    env = {"LOOPFUSE_MODEL__MAX_ATTEMPTS": "1"}
    terminal = OnTerminal(*argv, env=env)
    status, err = terminal.finish()
    assert status == 1, err  # the endpoint is down: the run failed, and says why
    assert b"turn 1 \xc2\xb7 0 model calls" in terminal.seen  # through the pty
    piped = loopfuse(*argv, env=env)
    assert "model call" not in piped.stdout
    as_json = OnTerminal(*argv, "--json", env=env)
    as_json.finish()
    assert b"model call" not in as_json.seen
