"""Serving the daemon: uvicorn on a socket, inside an anyio task group, signals handled here.

:func:`open_daemon` (``async with``) serves until its body ends, then drains without grace
and stops; tests and ``loopfuse demo`` use it. :func:`serve_daemon` is ``loopfuse serve``:
it prints where it listens and where the metrics are, then serves until SIGTERM or SIGINT.
The first signal drains (no new runs, ``daemon.drain_seconds`` for running ones, then
``abort.shutdown``), ends the event streams, stops the server and returns 0; a second
signal exits at once (status 1): SQLite's WAL keeps the store consistent and the next start
recovers the runs that were active.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import logging
import os
import signal
import socket
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Final

import anyio
import uvicorn

from orchestrator.config import Config
from orchestrator.daemon.app import create_app
from orchestrator.daemon.connections import limited_protocol
from orchestrator.daemon.lifespan import Daemon
from orchestrator.daemon.starting import warn_without_model
from orchestrator.sim import Scenario
from orchestrator.web.serving import serve_on

__all__ = ["RunningDaemon", "open_daemon", "serve_daemon"]

logger = logging.getLogger("loopfuse.daemon")

# How long open connections may keep uvicorn alive once the daemon has drained.
GRACEFUL_SHUTDOWN_SECONDS: Final = 5


@dataclass(frozen=True, slots=True)
class RunningDaemon:
    """A daemon that listens: where, and its state."""

    host: str
    port: int
    daemon: Daemon

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"


@contextlib.asynccontextmanager
async def open_daemon(
    config: Config,
    *,
    host: str | None = None,
    port: int | None = None,
    scenarios: Sequence[Scenario] = (),
) -> AsyncIterator[RunningDaemon]:
    """Serve the daemon for the ``async with`` body (port 0 picks a free port), with
    ``scenarios`` served besides the shipped ones. It answers once recovery is done; on
    exit it aborts what still runs (``abort.shutdown``) and stops."""
    host = host if host is not None else config.daemon.host
    port = port if port is not None else config.daemon.port
    daemon = Daemon(config, scenarios=scenarios)
    sock = socket.create_server((host, port))
    with sock:
        # The daemon starts before uvicorn does, not in its lifespan: a start that fails
        # (a config key, an MCP server, the otel extra) then raises here, to the caller,
        # instead of being logged by uvicorn as a traceback and exiting the process (3).
        async with daemon.running():
            app = create_app(config, daemon=daemon, lifespan=False)
            uv_config = uvicorn.Config(
                app,
                log_config=None,
                access_log=False,
                # Nothing here reads the client's address or scheme: X-Forwarded-* rewriting
                # (uvicorn's default) would be a middleware layer on every request for nothing.
                proxy_headers=False,
                lifespan="off",
                timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS,
                # The limits every connection is held to before the app sees a request.
                http=limited_protocol(config.daemon),
                ws="none",
                timeout_keep_alive=config.daemon.keep_alive_seconds,
            )
            running = RunningDaemon(host=host, port=sock.getsockname()[1], daemon=daemon)
            async with anyio.create_task_group() as tg:
                server = await tg.start(functools.partial(serve_on, name="daemon"), uv_config, sock)
                try:
                    yield running
                finally:
                    with anyio.CancelScope(shield=True):
                        await daemon.shutdown(0.0)
                    server.should_exit = True


async def serve_daemon(
    config: Config,
    *,
    host: str | None = None,
    port: int | None = None,
) -> int:
    """``loopfuse serve``: serve until a signal; returns the exit status."""
    async with open_daemon(config, host=host, port=port) as running:
        if (
            not running.daemon.auth.enabled
            and not ipaddress.ip_address(socket.gethostbyname(running.host)).is_loopback
        ):
            logger.warning(
                "the API is open to the network: no tokens in $%s", config.daemon.token_env
            )
        warn_without_model(config, logger)
        print(
            f"loopfuse daemon listening on {running.url} (API {running.url}/v1, "
            f"metrics {running.url}/metrics, store {running.daemon.store_path})",
            flush=True,
        )
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async with anyio.create_task_group() as tg:
                async for signum in signals:
                    name = signal.Signals(signum).name
                    if running.daemon.closing.is_set() or running.daemon.service.draining:
                        logger.warning("second %s: exiting now", name)
                        os._exit(1)
                    logger.info("%s: draining", name)
                    tg.start_soon(_drain_then_stop, running.daemon, tg.cancel_scope)
    return 0


async def _drain_then_stop(daemon: Daemon, scope: anyio.CancelScope) -> None:
    await daemon.shutdown(daemon.config.daemon.drain_seconds)
    scope.cancel()
