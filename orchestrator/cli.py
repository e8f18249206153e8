"""The ``loopfuse`` command line.

::

    loopfuse demo [--json]                      every shipped scenario, concurrently
    loopfuse run --scenario NAME|PATH [--json]  one scenario against the embedded simulator
    loopfuse run --base-url URL --model M --task TEXT [--folder DIR] [--json]
    loopfuse sim [--host H] [--port P] [--scenario PATH ...]
    loopfuse scenarios                          list the shipped scenarios
    loopfuse report DIR --goal TEXT [--format markdown|latex] [--out PATH]
    loopfuse serve [--host H] [--port P]        the daemon: HTTP API, SSE, /metrics
    loopfuse serve --nats URL                   a daemon of a fleet (docs/scale-out.md)
    loopfuse runs [--status S] [--json]         the daemon's runs
    loopfuse watch ID [--after N] [--json]      follow a run's events live

Every ending printed for a person says that the run stopped, why, and what to do next.
Ctrl-C aborts a run cleanly (its work so far is kept and printed); a second Ctrl-C quits.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Sequence

import anyio
import msgspec

from actors.tools.figure import warn_about_figure_sandbox
from orchestrator.config import Config, ModelSettings, load_config
from orchestrator.daemon.commands import COMMANDS as DAEMON_COMMANDS
from orchestrator.daemon.commands import add_commands as add_daemon_commands
from orchestrator.daemon.commands import run_command as run_daemon_command
from orchestrator.daemon.demo import format_table, run_demo
from orchestrator.errors import LoopfuseError
from orchestrator.result import RunResult, describe_ending, result_summary
from orchestrator.runtime import RunHandle, RunSpec, Runtime
from orchestrator.runtime.compiled import STALE_FIX, stale_modules
from orchestrator.scenarios.runs import expectation_mismatches, start_scenario
from orchestrator.sim import find_scenario, serve_simulator, shipped_scenarios

__all__ = ["main"]

logger = logging.getLogger("loopfuse.cli")

_json = msgspec.json.Encoder()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="loopfuse", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", help="TOML config file (default: $LOOPFUSE_CONFIG)")
    commands = parser.add_subparsers(dest="command", required=True)

    demo = commands.add_parser("demo", help="run every shipped scenario against the simulator")
    demo.add_argument("--json", action="store_true", help="one JSON object per scenario")

    run = commands.add_parser("run", help="run one scenario, or a task against a real endpoint")
    run.add_argument("--scenario", help="a shipped scenario's name or a scenario file")
    run.add_argument("--base-url", help="an OpenAI-compatible endpoint (key: $OPENAI_API_KEY)")
    run.add_argument("--model", help="the model to ask")
    run.add_argument("--task", help="the task for the model")
    run.add_argument("--folder", help="the folder the file tools may read")
    run.add_argument("--json", action="store_true", help="print the result as JSON")

    sim = commands.add_parser("sim", help="serve the OpenAI-compatible simulator")
    sim.add_argument("--host", default="127.0.0.1")
    sim.add_argument("--port", type=int, default=8400)
    sim.add_argument("--scenario", action="append", default=[], help="extra scenario files")

    commands.add_parser("scenarios", help="list the shipped scenarios")

    report = commands.add_parser("report", help="explore a data folder and write a report")
    report.add_argument("folder", metavar="DIR", help="the data folder to report on")
    report.add_argument("--goal", required=True, help="what the report should cover")
    report.add_argument("--format", choices=("markdown", "latex"), default="markdown")
    report.add_argument("--out", help="the report's path (default: report.md / report.tex)")
    report.add_argument("--reflect", type=int, default=1, help="reflect rounds (default 1)")
    report.add_argument("--json", action="store_true", help="print the result as JSON")
    add_daemon_commands(commands)
    return parser


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
        match args.command:
            case "demo":
                return anyio.run(_demo, config, args.json)
            case "run":
                return anyio.run(_run, config, args)
            case "report":
                from orchestrator.report.command import run_report_command

                return anyio.run(run_report_command, config, args, _follow)
            case "sim":
                scenarios = [*shipped_scenarios(), *(find_scenario(p) for p in args.scenario)]
                anyio.run(serve_simulator, scenarios, args.host, args.port)
                return 0
            case command if command in DAEMON_COMMANDS:
                return run_daemon_command(config, args, serve_fleet=_serve_fleet)
            case "scenarios":
                for scenario in shipped_scenarios():
                    print(f"{scenario.name:24} {scenario.description}")
                return 0
    except LoopfuseError as exc:
        print(f"loopfuse: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 2


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
    if args.scenario:
        scenario = find_scenario(args.scenario)
        async with Runtime(config, scenarios=[scenario]) as runtime:
            handle = await start_scenario(runtime, scenario)
            result = await _follow(handle)
        mismatches = expectation_mismatches(scenario, result)
    else:
        missing = [flag for flag in ("base_url", "model", "task") if not getattr(args, flag)]
        if missing:
            flags = ", ".join("--" + flag.replace("_", "-") for flag in missing)
            print(f"loopfuse run: give --scenario, or all of {flags}", file=sys.stderr)
            return 2
        model = msgspec.structs.replace(config.model, base_url=args.base_url, model=args.model)
        config = msgspec.structs.replace(config, model=model)
        assert isinstance(config.model, ModelSettings)
        async with Runtime(config) as runtime:
            offered = [tool for tool in config.tools.enabled if tool in runtime.tools]
            await warn_about_figure_sandbox(logger, offered, config.tools.figure_sandbox)
            handle = await runtime.start(RunSpec(task=args.task, folder=args.folder))
            result = await _follow(handle)
        mismatches = []
    _print_result(result, as_json=args.json)
    for mismatch in mismatches:
        print(f"scenario expectation not met: {mismatch}", file=sys.stderr)
    return 0 if not mismatches else 1


async def _serve_fleet(config: Config, nats_url: str, host: str | None, port: int | None) -> int:
    """``loopfuse serve --nats URL``: a daemon of a fleet (the cluster builds on the daemon,
    so the command line, above both, hands it to the daemon's ``serve``)."""
    # Imported here: the fleet needs the optional nats-py (pip install 'loopfuse[nats]').
    from orchestrator.cluster.server import cluster_settings, serve_fleet_daemon

    settings = cluster_settings(config, nats_url)
    return await serve_fleet_daemon(config, settings, host=host, port=port)


async def _follow(handle: RunHandle) -> RunResult:
    """Wait for the run; the first Ctrl-C aborts it, a second one quits at once."""
    async with anyio.create_task_group() as tg:

        async def on_interrupt() -> None:
            with anyio.open_signal_receiver(signal.SIGINT) as signals:
                interrupts = 0
                async for _ in signals:
                    interrupts += 1
                    if interrupts > 1:
                        raise KeyboardInterrupt
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
