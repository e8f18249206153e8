"""``loopfuse serve --nats URL``: a fleet member on a socket (uvicorn handles the signals).

On SIGTERM/SIGINT uvicorn stops accepting requests, then the node stops: the daemon
stops pulling, hands the runs it holds back to the queue (negative acknowledgement: another
daemon takes them at once and resumes them from their last checkpoint) and leaves.
"""

from __future__ import annotations

import logging
import socket

import uvicorn

from orchestrator.cluster.app import create_fleet_app, running_fleet_app
from orchestrator.cluster.node import ClusterNode
from orchestrator.cluster.settings import ClusterSettings
from orchestrator.config import Config
from orchestrator.daemon.connections import limited_protocol
from orchestrator.daemon.starting import warn_without_model
from orchestrator.sim import find_scenario

__all__ = ["cluster_settings", "serve_fleet_daemon"]


def cluster_settings(config: Config, nats_url: str) -> ClusterSettings:
    """The fleet layout ``config``'s ``[cluster]`` section describes, on NATS at ``nats_url``."""
    section = config.cluster
    return ClusterSettings(
        nats_url=nats_url,
        ack_wait_seconds=section.ack_wait_seconds,
        node_ttl_seconds=section.node_ttl_seconds,
    ).named(section.fleet)


async def serve_fleet_daemon(
    config: Config,
    settings: ClusterSettings,
    *,
    host: str | None = None,
    port: int | None = None,
) -> int:
    """Serve a fleet member until a signal; returns the exit status."""
    host = host if host is not None else config.daemon.host
    port = port if port is not None else config.daemon.port
    scenarios = [find_scenario(path) for path in config.daemon.scenarios]
    node = ClusterNode(config, settings, name=config.cluster.node_name, scenarios=scenarios)
    app = create_fleet_app(node)
    with socket.create_server((host, port)) as sock:
        bound = sock.getsockname()[1]
        # The node joins the fleet before uvicorn starts, not in its lifespan: a start that
        # fails (no NATS, a config key, an MCP server) raises here, to the command line.
        async with running_fleet_app(app):
            warn_without_model(config, logging.getLogger("loopfuse.cluster"))
            print(
                f"loopfuse daemon {node.name} listening on http://{host}:{bound} "
                f"(fleet {settings.subject_prefix} on {settings.nats_url})",
                flush=True,
            )
            server = uvicorn.Server(
                uvicorn.Config(
                    app,
                    log_config=None,
                    access_log=False,
                    lifespan="off",
                    # The daemon's connection limits (docs/security.md, "Connections").
                    http=limited_protocol(config.daemon),
                    ws="none",
                    timeout_keep_alive=config.daemon.keep_alive_seconds,
                )
            )
            await server.serve(sockets=[sock])
    return 0
