"""The ``loopfuse`` command line (``loopfuse --help``; every command: ``docs/cli.md``).

Every ending printed for a person says that the run stopped, why, and what to do next.
Ctrl-C aborts a run cleanly (its work so far is kept and printed); a second Ctrl-C quits.
A task or a folder of one's own needs a model (--base-url and --model, or [model] in the
config file); the embedded simulator only plays scenarios. On a terminal, run and report
show a live progress line (turn, calls, tokens, last verdict).

A command that cannot start (a config key, a missing extra, a port, no daemon) prints one
line naming what to change (orchestrator.cli_errors). Exit status of run and report
(docs/cli.md): 0 the run completed, 1 it ended with another exit reason, 2 a usage or
config error (nothing ran), 3 a scenario's expectations not met, 130 aborted with Ctrl-C.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Sequence
from typing import Final, NoReturn

import anyio
import anyio.abc
import msgspec

from actors.tools.figure import warn_about_figure_sandbox
from orchestrator.cli_errors import explain
from orchestrator.cli_progress import ProgressLine
from orchestrator.config import Config, load_config
from orchestrator.daemon.commands import COMMANDS as DAEMON_COMMANDS
from orchestrator.daemon.commands import add_commands as add_daemon_commands
from orchestrator.daemon.commands import port_number
from orchestrator.daemon.commands import run_command as run_daemon_command
from orchestrator.daemon.demo import format_table, run_demo
from orchestrator.replay.command import add_replay_command, replay_command
from orchestrator.result import (
    ExitStatus,
    RunResult,
    describe_ending,
    exit_status,
    result_summary,
)
from orchestrator.runtime import RunHandle, RunSpec, Runtime
from orchestrator.runtime.compiled import STALE_FIX, stale_modules
from orchestrator.scenarios.runs import expectation_mismatches, start_scenario
from orchestrator.sim import find_scenario, serve_simulator, shipped_scenarios
from orchestrator.sim.loader import optional_scenarios

__all__ = ["main"]

logger = logging.getLogger("loopfuse.cli")

_json = msgspec.json.Encoder()

NO_MODEL: Final = (
    "no model to ask: give --base-url URL and --model NAME, or set model.base_url and "
    "model.model in the config file (--config FILE or $LOOPFUSE_CONFIG); docs/servers.md "
    "shows llama.cpp, vLLM and Ollama. Without a model, `loopfuse run --scenario NAME` plays "
    "a scripted scenario on the embedded simulator"
)
"""Why ``run --task`` and ``report`` refuse without a model: the embedded simulator plays
scripts, it does not read a task or a folder, and must not answer one as if a model had."""

CONFIG_HELP: Final = (
    "TOML config file (default: $LOOPFUSE_CONFIG, else the built-in defaults); "
    "accepted before or after the command"
)
JSON_HELP: Final = "print the result as JSON (no progress line)"


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage error on one line (as every other error of the command)."""

    def error(self, message: str) -> NoReturn:
        self.exit(ExitStatus.USAGE, f"{self.prog}: {message} (see `{self.prog} --help`)\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="loopfuse",
        description="Run LLM agent loops under hard, code-level fuses.",
        epilog="`loopfuse COMMAND --help` lists a command's options; docs/cli.md has more.",
    )
    parser.add_argument("--config", metavar="FILE", help=CONFIG_HELP)
    commands = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", help="what to do (below)"
    )

    demo = commands.add_parser("demo", help="run every shipped scenario against the simulator")
    demo.add_argument("--json", action="store_true", help="one JSON object per scenario")

    run = commands.add_parser(
        "run",
        help="run one scenario, or a task against a real endpoint",
        description="Run one scenario on the embedded simulator, or a task against a model.",
        epilog=_EXIT_STATUS_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument(
        "--scenario", metavar="NAME|PATH", help="a shipped scenario's name or a scenario file"
    )
    _add_model_arguments(run)
    run.add_argument("--task", metavar="TEXT", help="the task for the model")
    run.add_argument(
        "--folder", metavar="DIR", help="the folder the file tools may read (must exist)"
    )
    run.add_argument("--json", action="store_true", help=JSON_HELP)

    sim = commands.add_parser("sim", help="serve the OpenAI-compatible simulator")
    sim.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    sim.add_argument(
        "--port", type=port_number, default=8400, help="port, 0-65535 (default: 8400; 0 picks one)"
    )
    sim.add_argument(
        "--scenario",
        action="append",
        default=[],
        metavar="PATH",
        help="a scenario file to serve besides the shipped ones (repeatable)",
    )

    commands.add_parser("scenarios", help="list the shipped scenarios")

    report = commands.add_parser(
        "report",
        help="explore a data folder and write a report",
        description="Explore a data folder with a model and write a report.",
        epilog=_EXIT_STATUS_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    report.add_argument("folder", metavar="DIR", help="the data folder to report on")
    report.add_argument(
        "--goal", required=True, metavar="TEXT", help="what the report should cover"
    )
    report.add_argument(
        "--format",
        choices=("markdown", "latex"),
        default="markdown",
        help="the report's format (default: markdown)",
    )
    report.add_argument(
        "--out", metavar="PATH", help="the report's path (default: report.md / report.tex)"
    )
    report.add_argument(
        "--reflect", type=int, default=1, metavar="N", help="reflect rounds (default: 1)"
    )
    report.add_argument("--json", action="store_true", help=JSON_HELP)
    _add_model_arguments(report)
    add_daemon_commands(commands)
    for command in commands.choices.values():
        # Also after the command (`loopfuse run --config FILE ...`), as a user expects.
        command.add_argument(
            "--config", metavar="FILE", default=argparse.SUPPRESS, help=CONFIG_HELP
        )
    add_replay_command(commands)  # its own --config
    return parser


_EXIT_STATUS_HELP: Final = """exit status:
  0    the run completed
  1    the run ended with another exit reason (printed, with why and what to do next)
  2    usage or config error: nothing ran
  3    (run --scenario) the run did not end as the scenario expects
  130  aborted with Ctrl-C (the work so far is printed)"""


def _add_model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--base-url",
        metavar="URL",
        help="an OpenAI-compatible endpoint, e.g. http://127.0.0.1:8080/v1 "
        "(default: model.base_url of the config; key: $OPENAI_API_KEY)",
    )
    parser.add_argument(
        "--model", metavar="NAME", help="the model to ask (default: model.model of the config)"
    )


def with_model(config: Config, args: argparse.Namespace) -> Config | None:
    """``config`` with the model the command line names (``--base-url``, ``--model``) over
    the config file's; ``None`` unless together they name an endpoint and a model (a
    ``--base-url`` alone needs ``--model``: the config's default name is a scenario's)."""
    base_url = args.base_url or config.model.base_url
    model = args.model or (config.model.model if config.model.base_url else None)
    if base_url is None or model is None:
        return None
    settings = msgspec.structs.replace(config.model, base_url=base_url, model=model)
    return msgspec.structs.replace(config, model=settings)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``loopfuse`` console script; returns the exit status.

    A command that cannot start prints one line naming what to change and returns the
    documented status (:func:`orchestrator.cli_errors.explain`); Ctrl-C returns 130."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if stale := stale_modules():
        logger.warning(
            "compiled modules older than their sources (the old code runs): %s; %s",
            ", ".join(stale),
            STALE_FIX,
        )
    try:
        config = load_config(args.config)
        return _command(config, args)
    except (Exception, KeyboardInterrupt, BaseExceptionGroup) as error:
        failure = explain(error)
        if failure is None:
            raise
        if failure.message:
            print(f"loopfuse: {failure.message}", file=sys.stderr)
        return failure.status


def _command(config: Config, args: argparse.Namespace) -> int:
    match args.command:
        case "demo":
            return anyio.run(_demo, config, args.json)
        case "run":
            return anyio.run(_run, config, args)
        case "report":
            from orchestrator.report.command import run_report_command

            configured = with_model(config, args)
            if configured is None:
                print(f"loopfuse report: {NO_MODEL}", file=sys.stderr)
                return ExitStatus.USAGE
            follower = Follower(progress=not args.json and sys.stdout.isatty())
            return anyio.run(run_report_command, configured, args, follower)
        case "sim":
            scenarios = [*shipped_scenarios(), *(find_scenario(p) for p in args.scenario)]
            try:
                anyio.run(serve_simulator, scenarios, args.host, args.port)
            except OSError as exc:
                print(
                    f"loopfuse sim: cannot listen on {args.host}:{args.port}: {exc.strerror or exc}"
                    "; choose another --port (0 picks a free one) or --host",
                    file=sys.stderr,
                )
                return ExitStatus.USAGE
            return 0
        case command if command in DAEMON_COMMANDS:
            return run_daemon_command(config, args, serve_fleet=_serve_fleet)
        case "replay":
            return anyio.run(replay_command, config, args)
        case "scenarios":
            for scenario in shipped_scenarios():
                print(f"{scenario.name:24} {scenario.description}")
            print("\nNeeding an extra and the operator's config (docs/mcp.md):")
            for scenario in optional_scenarios():
                print(f"{scenario.name:24} {scenario.description}")
            return 0
    return ExitStatus.USAGE


async def _demo(config: Config, as_json: bool) -> int:
    demo = await run_demo(config, live=None if as_json else sys.stdout)
    if as_json:
        for row in demo.rows:
            sys.stdout.write(_json.encode(row.as_json()).decode() + "\n")
    else:
        print()
        format_table(demo.rows, sys.stdout)
        print(f"\nA few lines of {demo.metrics_url} (scraped before the daemon stopped):")
        for line in demo.metrics:
            print(f"  {line}")
    return 0 if all(not row.mismatches for row in demo.rows) else 1


async def _run(config: Config, args: argparse.Namespace) -> int:
    follower = Follower(progress=not args.json and sys.stdout.isatty())
    if args.scenario:
        scenario = find_scenario(args.scenario)
        # A scenario's model is its script: it plays on the embedded simulator whatever
        # [model] names (docs/scenarios.md).
        simulator = msgspec.structs.replace(config.model, base_url=None)
        config = msgspec.structs.replace(config, model=simulator)
        async with Runtime(config, scenarios=[scenario]) as runtime:
            handle = await start_scenario(runtime, scenario)
            result = await follower(handle)
        # An aborted run ends as Ctrl-C made it, not as the scenario expects: 130, not 3.
        mismatches = [] if follower.interrupted else expectation_mismatches(scenario, result)
    else:
        if not args.task:
            print("loopfuse run: give --scenario NAME, or --task TEXT", file=sys.stderr)
            return ExitStatus.USAGE
        if args.folder is not None and not await anyio.Path(args.folder).is_dir():
            print(
                f"loopfuse run: --folder {args.folder}: no such directory (nothing ran); "
                "give an existing folder, or leave --folder out",
                file=sys.stderr,
            )
            return ExitStatus.USAGE
        configured = with_model(config, args)
        if configured is None:
            print(f"loopfuse run: {NO_MODEL}", file=sys.stderr)
            return ExitStatus.USAGE
        async with Runtime(configured) as runtime:
            offered = [tool for tool in configured.tools.enabled if tool in runtime.tools]
            await warn_about_figure_sandbox(logger, offered, configured.tools.figure_sandbox)
            handle = await runtime.start(RunSpec(task=args.task, folder=args.folder))
            result = await follower(handle)
        mismatches = []
    if args.json:
        sys.stdout.write(_json.encode(result_summary(result)).decode() + "\n")
    else:
        ending = describe_ending(result)
        print(f"{result.output.rstrip()}\n\n{ending}" if result.output else ending)
    for mismatch in mismatches:
        print(f"scenario expectation not met: {mismatch}", file=sys.stderr)
    if mismatches:
        return ExitStatus.EXPECTATIONS
    return exit_status(result, interrupted=follower.interrupted)


async def _serve_fleet(config: Config, nats_url: str, host: str | None, port: int | None) -> int:
    """``loopfuse serve --nats URL``: a daemon of a fleet (the cluster builds on the daemon,
    so the command line, above both, hands it to the daemon's ``serve``)."""
    # Imported here: the fleet needs the optional nats-py (pip install 'loopfuse[nats]').
    from orchestrator.cluster.server import cluster_settings, serve_fleet_daemon

    settings = cluster_settings(config, nats_url)
    return await serve_fleet_daemon(config, settings, host=host, port=port)


class Follower:
    """Waits for a run from the terminal: the first Ctrl-C aborts it (and marks
    :attr:`interrupted`), a second one quits at once. With ``progress``, a live progress
    line is drawn while it waits (:class:`~orchestrator.cli_progress.ProgressLine`), once
    Ctrl-C is handled here."""

    def __init__(
        self,
        *,
        listening: anyio.Event | None = None,
        progress: bool | ProgressLine = False,
    ) -> None:
        self.interrupted = False
        self._listening = listening  # set once Ctrl-C is handled here (tests wait for it)
        self._progress = ProgressLine() if progress is True else progress or None

    async def __call__(self, handle: RunHandle) -> RunResult:
        async with anyio.create_task_group() as tg:

            async def on_interrupt(*, task_status: anyio.abc.TaskStatus[None]) -> None:
                with anyio.open_signal_receiver(signal.SIGINT) as signals:
                    task_status.started()
                    if self._listening is not None:
                        self._listening.set()
                    async for _ in signals:
                        if self.interrupted:
                            raise KeyboardInterrupt
                        self.interrupted = True
                        print("\nAborting the run (Ctrl-C again to quit now)…", file=sys.stderr)
                        await handle.abort("Interrupted from the terminal (Ctrl-C).")

            await tg.start(on_interrupt)
            if self._progress is not None:
                tg.start_soon(self._progress.follow, handle)
            result = await handle.result()
            tg.cancel_scope.cancel()
        return result
