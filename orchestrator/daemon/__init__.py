"""The daemon: loopfuse as a long-running service (``loopfuse serve``).

An HTTP API (Starlette under uvicorn) to submit, list, follow (Server-Sent Events) and
abort runs; durable runs and events in SQLite (WAL, group commit) that survive restarts
(resumed from the last completed turn, or ended with ``abort.crash``); bearer tokens;
limits (concurrency, a bounded queue, body size, events per run); a graceful drain on
SIGTERM; retention; JSON logs; ``/metrics``. See ``docs/daemon.md`` (its modules, one
concept each: "How it is built").
"""

from __future__ import annotations

from orchestrator.daemon.app import create_app
from orchestrator.daemon.errors import ApiError
from orchestrator.daemon.lifespan import Daemon
from orchestrator.daemon.server import RunningDaemon, open_daemon, serve_daemon

__all__ = ["ApiError", "Daemon", "RunningDaemon", "create_app", "open_daemon", "serve_daemon"]
