"""``loopfuse serve``, ``loopfuse runs`` and ``loopfuse watch``: the daemon at a terminal.

``serve`` runs the daemon until SIGTERM/SIGINT. ``runs`` and ``watch`` are thin clients of
its API: the URL is ``--url``, else ``$LOOPFUSE_URL``, else the configured host and port;
the bearer token is ``$LOOPFUSE_TOKEN``.

A fleet member (``serve --nats``) is served by ``orchestrator.cluster``, which builds on
the daemon: the command line hands it in (``serve_fleet``), this package never imports it.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, Final

import anyio
import httpx
import msgspec

from orchestrator.cli_errors import DaemonUnreachable, one_line
from orchestrator.config import Config
from orchestrator.daemon.client import DaemonClient, DaemonError
from orchestrator.daemon.logs import configure_logging
from orchestrator.daemon.server import serve_daemon
from orchestrator.result import SIMULATOR_NOTE, ExitStatus

__all__ = ["COMMANDS", "ServeFleet", "add_commands", "port_number", "run_command"]

COMMANDS: Final = ("serve", "runs", "watch")
_decode = msgspec.json.Decoder(dict[str, Any])
_SHOWN: Final = ("turn", "stage", "status", "kind", "tool", "exit_reason", "cause", "detail")
_SIMULATED: Final = "[simulator]"
"""Marks a run the embedded simulator answered though it plays no scenario (no model)."""

ServeFleet = Callable[[Config, str, str | None, int | None], Awaitable[int]]
"""Serves a fleet member until a signal: ``(config, nats_url, host, port)`` → exit status."""


def port_number(text: str) -> int:
    """An argparse type: a TCP port, 0-65535 (0: the system picks a free one)."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (0-65535)") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a port number (0-65535)")
    return port


def add_commands(commands: Any) -> None:
    """Add the three subcommands to ``loopfuse``'s subparsers."""
    serve = commands.add_parser("serve", help="run the daemon (HTTP API, SSE, /metrics)")
    serve.add_argument("--host", help="address to bind (default: daemon.host, 127.0.0.1)")
    serve.add_argument(
        "--port", type=port_number, help="port, 0-65535 (default: daemon.port, 8470; 0 picks one)"
    )
    serve.add_argument(
        "--nats",
        metavar="URL",
        help="join the fleet on this NATS (default: cluster.nats_url; none: single-node)",
    )

    url_help = "the daemon (default: $LOOPFUSE_URL, else daemon.host and daemon.port)"
    runs = commands.add_parser("runs", help="list the daemon's runs")
    runs.add_argument("--url", help=url_help)
    runs.add_argument(
        "--status", choices=("queued", "running", "ended"), help="only runs in this state"
    )
    runs.add_argument(
        "--exit-reason", metavar="REASON", help="only runs that ended so (e.g. max_turns)"
    )
    runs.add_argument(
        "--limit", type=int, default=20, metavar="N", help="at most N runs (default: 20)"
    )
    runs.add_argument("--json", action="store_true", help="the API's JSON page")

    watch = commands.add_parser("watch", help="follow a run's events live, then its ending")
    watch.add_argument("id", help="the run's id")
    watch.add_argument("--url", help=url_help)
    watch.add_argument("--after", type=int, metavar="N", help="start after this event id")
    watch.add_argument("--json", action="store_true", help="each event as a JSON line")


def run_command(config: Config, args: argparse.Namespace, *, serve_fleet: ServeFleet) -> int:
    """Run ``serve``, ``runs`` or ``watch``; returns the exit status. ``serve_fleet`` serves
    ``serve`` when a NATS URL is given (``--nats`` or ``cluster.nats_url``).

    A daemon that cannot start (a config key, a port, the store) and a client that finds
    no daemon raise what :func:`orchestrator.cli_errors.explain` makes one line of; a
    refusal of the daemon (an unknown run) is one line and status 1."""
    if args.command == "serve":
        configure_logging(config.log_level)
        try:
            nats_url = getattr(args, "nats", None) or config.cluster.nats_url
            if nats_url:
                return anyio.run(serve_fleet, config, nats_url, args.host, args.port)
            return anyio.run(partial(serve_daemon, config, host=args.host, port=args.port))
        except OSError as exc:
            port = args.port if args.port is not None else config.daemon.port
            where = f"{args.host or config.daemon.host}:{port}"
            print(
                f"loopfuse serve: cannot listen on {where} or open the store "
                f"{config.daemon.store_path or '(default)'}: {one_line(str(exc))}; "
                "change --host/--port (daemon.host, daemon.port) or daemon.store_path",
                file=sys.stderr,
            )
            return ExitStatus.USAGE
    host = config.daemon.host
    configured = f"http://{f'[{host}]' if ':' in host else host}:{config.daemon.port}"
    url = args.url or os.environ.get("LOOPFUSE_URL") or configured
    try:
        if args.command == "runs":
            return anyio.run(_runs, url, args)
        return anyio.run(_watch, url, args)
    except DaemonError as exc:
        print(f"loopfuse {args.command}: {exc}", file=sys.stderr)
        return ExitStatus.FAILED
    except (httpx.ConnectError, httpx.ConnectTimeout, httpx.UnsupportedProtocol) as exc:
        raise DaemonUnreachable(url, one_line(str(exc)) or type(exc).__name__) from None
    except httpx.InvalidURL as exc:
        raise DaemonUnreachable(url, f"not a URL: {exc}") from None
    except msgspec.DecodeError:
        raise DaemonUnreachable(url, "what answers there is not a loopfuse daemon") from None


def _client(url: str) -> DaemonClient:
    return DaemonClient(url, token=os.environ.get("LOOPFUSE_TOKEN") or None)


async def _runs(url: str, args: argparse.Namespace) -> int:
    filters = {"status": args.status, "exit_reason": args.exit_reason}
    query = {"limit": args.limit, **{key: value for key, value in filters.items() if value}}
    async with _client(url) as client:
        page = await client.runs(**query)
    if args.json:
        print(msgspec.json.encode(page).decode())
        return 0
    rows = [("id", "status", "exit reason", "cause", "events", "request")]
    simulated = False
    for run in page["runs"]:
        what = _describe_request(run.get("request"))
        if run.get("simulated"):
            simulated = True
            what = f"{_SIMULATED} {what}"
        rows.append(
            (
                run["id"],
                run["status"],
                run["exit_reason"] or "-",
                run["cause"] or "-",
                str(run["events"]),
                what[:40],
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))
    if simulated:
        print(
            f"{_SIMULATED} runs: no model was configured, the embedded simulator answered them, "
            "not a model; set [model] base_url and model, see docs/servers.md."
        )
    if page.get("next_cursor"):
        print(f"(more: --limit or the API's cursor {page['next_cursor']})")
    return 0


async def _watch(url: str, args: argparse.Namespace) -> int:
    async with _client(url) as client:
        async for event in client.events(args.id, after=args.after):
            if event.event != "message":
                if event.event == "shutdown":
                    print("(the daemon is shutting down; watch again to go on)", file=sys.stderr)
                    return 1
                break
            if args.json:
                print(event.data, flush=True)
            else:
                print(_describe(event.id, _decode.decode(event.data)), flush=True)
        if args.json:
            return 0
        run = await client.run(args.id)
    result = run.get("result") or {}
    verb = "Finished" if result.get("outcome") == "done" else "Stopped"
    print(f"{verb}: run {run['id']} ended with {run['exit_reason']} (cause {run['cause']}).")
    if result.get("detail"):
        print(f"Why: {result['detail']}")
    if result.get("hint"):
        print(f"Next: {result['hint']}")
    if run.get("simulated"):
        print(f"Note: {result.get('note') or SIMULATOR_NOTE}")
    return 0


def _describe(event_id: int | None, data: dict[str, Any]) -> str:
    """One line per event: its id, type and the few fields a person reads."""
    parts = [f"{event_id or '-':>5}", f"{data.get('type', '?'):<16}"]
    if data.get("type") == "ModelTextDelta":
        parts.append(repr(data.get("text", ""))[:80])
    elif data.get("type") == "ToolCallProposed":
        call = data.get("call", {})
        parts.append(f"{call.get('name')}({call.get('arguments', '')[:60]})")
    else:
        parts.extend(f"{key}={data[key]}" for key in _SHOWN if data.get(key) not in (None, ""))
    return " ".join(parts)[:160]


def _describe_request(request: dict[str, Any] | None) -> str:
    """A run's request in a few words: its scenario, pipeline or task."""
    if request is None:
        return "(unreadable stored request)"
    if request.get("scenario"):
        return f"scenario {request['scenario']}"
    if request.get("pipeline"):
        return f"pipeline {request['pipeline']['name']} on {request.get('folder')}"
    return str(request.get("task"))
