"""The ``loopfuse`` command line.

::

    loopfuse demo [--json]                      every shipped scenario, concurrently
    loopfuse run --scenario NAME|PATH [--json]  one scenario against the embedded simulator
    loopfuse run --task TEXT [--folder DIR] [--base-url URL --model M] [--json]
    loopfuse sim [--host H] [--port P] [--scenario PATH ...]
    loopfuse scenarios                          list the shipped scenarios
    loopfuse report DIR --goal TEXT [--format markdown|latex] [--out PATH]
                    [--base-url URL --model M] [--json]
    loopfuse serve [--host H] [--port P]        the daemon: HTTP API, SSE, /metrics
    loopfuse serve --nats URL                   a daemon of a fleet (docs/scale-out.md)
    loopfuse runs [--status S] [--json]         the daemon's runs
    loopfuse watch ID [--after N] [--json]      follow a run's events live
    loopfuse replay PATH... [--preset NAME]...  what another config would have done (docs/replay.md)

Every ending printed for a person says that the run stopped, why, and what to do next.
Ctrl-C aborts a run cleanly (its work so far is kept and printed); a second Ctrl-C quits.
A task or a folder of one's own needs a model (``--base-url`` and ``--model``, or
``[model]`` in the config file); the embedded simulator only plays scenarios.

Exit status of ``run`` and ``report`` (docs/cli.md): 0 the run completed, 1 it ended with
another exit reason, 2 a usage or config error (nothing ran), 3 a scenario's expectations
not met, 130 aborted with Ctrl-C.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Sequence
from typing import Final

import anyio
import msgspec

from actors.tools.figure import warn_about_figure_sandbox
from orchestrator.config import Config, load_config
from orchestrator.daemon.commands import COMMANDS as DAEMON_COMMANDS
from orchestrator.daemon.commands import add_commands as add_daemon_commands
from orchestrator.daemon.commands import run_command as run_daemon_command
from orchestrator.daemon.demo import format_table, run_demo
from orchestrator.errors import ConfigError, LoopfuseError
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

_RUN_KEYS: Final = {
    "config.context_window": "context.windows / context.default_window",
    "config.context_safety_buffer": (
        "context.safety_buffer_tokens / model.max_output_tokens / "
        "context.output_reserve_tokens / context.windows"
    ),
    "config.context_output_reserve": "model.max_output_tokens / context.output_reserve_tokens",
    "config.context_collapse_at": "context.collapse_at",
    "config.context_keep_turns": "context.keep_recent_turns",
}
"""The config file's keys behind a run setting's name (``config.<setting>``, as the daemon's
API names a request's override). The command line sets no overrides, so its errors name
the keys of the file instead."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="loopfuse", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", help="TOML config file (default: $LOOPFUSE_CONFIG)")
    commands = parser.add_subparsers(dest="command", required=True)

    demo = commands.add_parser("demo", help="run every shipped scenario against the simulator")
    demo.add_argument("--json", action="store_true", help="one JSON object per scenario")

    run = commands.add_parser(
        "run",
        help="run one scenario, or a task against a real endpoint",
        description="Run one scenario on the embedded simulator, or a task against a model.",
        epilog=_EXIT_STATUS_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("--scenario", help="a shipped scenario's name or a scenario file")
    _add_model_arguments(run)
    run.add_argument("--task", help="the task for the model")
    run.add_argument("--folder", help="the folder the file tools may read")
    run.add_argument("--json", action="store_true", help="print the result as JSON")

    sim = commands.add_parser("sim", help="serve the OpenAI-compatible simulator")
    sim.add_argument("--host", default="127.0.0.1")
    sim.add_argument("--port", type=int, default=8400)
    sim.add_argument("--scenario", action="append", default=[], help="extra scenario files")

    commands.add_parser("scenarios", help="list the shipped scenarios")

    report = commands.add_parser(
        "report",
        help="explore a data folder and write a report",
        description="Explore a data folder with a model and write a report.",
        epilog=_EXIT_STATUS_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    report.add_argument("folder", metavar="DIR", help="the data folder to report on")
    report.add_argument("--goal", required=True, help="what the report should cover")
    report.add_argument("--format", choices=("markdown", "latex"), default="markdown")
    report.add_argument("--out", help="the report's path (default: report.md / report.tex)")
    report.add_argument("--reflect", type=int, default=1, help="reflect rounds (default 1)")
    report.add_argument("--json", action="store_true", help="print the result as JSON")
    _add_model_arguments(report)
    add_daemon_commands(commands)
    add_replay_command(commands)
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
        help="an OpenAI-compatible endpoint, e.g. http://127.0.0.1:8080/v1 "
        "(default: model.base_url of the config; key: $OPENAI_API_KEY)",
    )
    parser.add_argument("--model", help="the model to ask (default: model.model of the config)")


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
    """Entry point of the ``loopfuse`` console script; returns the exit status."""
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
    except LoopfuseError as exc:
        return _config_error(exc)
    except BaseExceptionGroup as group:  # raised inside a task group (the runtime's)
        if group.subgroup(KeyboardInterrupt) is not None:
            return ExitStatus.INTERRUPTED
        error = _loopfuse_error(group)
        if error is None:
            raise
        return _config_error(error)
    except KeyboardInterrupt:
        return ExitStatus.INTERRUPTED


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
            return anyio.run(run_report_command, configured, args, Follower())
        case "sim":
            scenarios = [*shipped_scenarios(), *(find_scenario(p) for p in args.scenario)]
            anyio.run(serve_simulator, scenarios, args.host, args.port)
            return 0
        case command if command in DAEMON_COMMANDS:
            return run_daemon_command(config, args, serve_fleet=_serve_fleet)
        case "replay":
            return anyio.run(replay_command, config, args)
        case "scenarios":
            for scenario in shipped_scenarios():
                print(f"{scenario.name:24} {scenario.description}")
            return 0
    return ExitStatus.USAGE


def _loopfuse_error(error: BaseException) -> LoopfuseError | None:
    """The first loopfuse error in ``error``, looking inside exception groups."""
    if isinstance(error, LoopfuseError):
        return error
    if isinstance(error, BaseExceptionGroup):
        for inner in error.exceptions:
            if (found := _loopfuse_error(inner)) is not None:
                return found
    return None


def _config_error(error: LoopfuseError) -> int:
    """Print ``error`` as one line naming the config file's keys; the usage exit status."""
    if isinstance(error, ConfigError) and error.key in _RUN_KEYS:
        where = f"{error.source}: " if error.source else ""
        message = f"{where}config key {_RUN_KEYS[error.key]}: {error.reason}"
    else:
        message = str(error)
    print(f"loopfuse: {' '.join(message.split())}", file=sys.stderr)
    return ExitStatus.USAGE


async def _demo(config: Config, as_json: bool) -> int:
    demo = await run_demo(config, live=None if as_json else sys.stdout)
    rows = demo.rows
    if as_json:
        for row in rows:
            sys.stdout.write(_json.encode(row.as_json()).decode() + "\n")
    else:
        print()
        format_table(rows, sys.stdout)
        print(f"\nA few lines of {demo.metrics_url} (scraped before the daemon stopped):")
        for line in demo.metrics:
            print(f"  {line}")
    return 0 if all(not row.mismatches for row in rows) else 1


async def _run(config: Config, args: argparse.Namespace) -> int:
    follower = Follower()
    if args.scenario:
        scenario = find_scenario(args.scenario)
        async with Runtime(config, scenarios=[scenario]) as runtime:
            handle = await start_scenario(runtime, scenario)
            result = await follower(handle)
        mismatches = expectation_mismatches(scenario, result)
    else:
        if not args.task:
            print("loopfuse run: give --scenario NAME, or --task TEXT", file=sys.stderr)
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
    _print_result(result, as_json=args.json)
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
    :attr:`interrupted`), a second one quits at once."""

    def __init__(self, *, listening: anyio.Event | None = None) -> None:
        self.interrupted = False
        self._listening = listening  # set once Ctrl-C is handled here (tests wait for it)

    async def __call__(self, handle: RunHandle) -> RunResult:
        async with anyio.create_task_group() as tg:

            async def on_interrupt() -> None:
                with anyio.open_signal_receiver(signal.SIGINT) as signals:
                    if self._listening is not None:
                        self._listening.set()
                    async for _ in signals:
                        if self.interrupted:
                            raise KeyboardInterrupt
                        self.interrupted = True
                        print("\nAborting the run (Ctrl-C again to quit now)…", file=sys.stderr)
                        await handle.abort("Interrupted from the terminal (Ctrl-C).")

            tg.start_soon(on_interrupt)
            result = await handle.result()
            tg.cancel_scope.cancel()
        return result


def _print_result(result: RunResult, *, as_json: bool) -> None:
    if as_json:
        sys.stdout.write(_json.encode(result_summary(result)).decode() + "\n")
        return
    if result.output:
        print(result.output.rstrip())
        print()
    print(describe_ending(result))
