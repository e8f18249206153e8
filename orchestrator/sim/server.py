"""Run the simulator under uvicorn on a real socket, inside an anyio task group.

:func:`open_simulator` is for tests and embedded use (``async with``); it returns only once
the server is listening and stops it on exit. :func:`serve_simulator` is the CLI entry.
The server never installs signal handlers: the caller owns Ctrl-C and cancellation.
"""

from __future__ import annotations

import contextlib
import functools
import socket
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Final

import anyio
import uvicorn
from anyio.abc import TaskStatus

from orchestrator.sim.app import make_app
from orchestrator.sim.scenario import Scenario
from orchestrator.web.serving import serve_on

__all__ = ["GRACEFUL_SHUTDOWN_SECONDS", "RunningSimulator", "open_simulator", "serve_simulator"]

# How long open streams may keep the server alive after it was asked to stop.
GRACEFUL_SHUTDOWN_SECONDS: Final = 2


@dataclass(frozen=True, slots=True)
class RunningSimulator:
    """Where a running simulator listens; ``base_url`` ends in ``/v1``."""

    host: str
    port: int

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"


@contextlib.asynccontextmanager
async def open_simulator(
    scenarios: Iterable[Scenario], *, host: str = "127.0.0.1", port: int = 0
) -> AsyncIterator[RunningSimulator]:
    """Serve ``scenarios`` on ``host:port`` (0 picks a free port) for the ``async with`` body."""
    app = make_app(scenarios)
    with socket.create_server((host, port)) as sock:
        config = uvicorn.Config(
            app,
            log_config=None,
            log_level="warning",
            lifespan="off",
            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS,
        )
        error: BaseException | None = None
        async with anyio.create_task_group() as tg:
            server = await tg.start(functools.partial(serve_on, name="simulator"), config, sock)
            try:
                yield RunningSimulator(host=host, port=sock.getsockname()[1])
            except BaseException as exc:  # re-raised below, outside the task group
                error = exc
                server.force_exit = True
            finally:
                server.should_exit = True
        if error is not None:
            raise error  # unwrapped: the body's exception, not an exception group


async def serve_simulator(
    scenarios: Iterable[Scenario],
    host: str,
    port: int,
    *,
    task_status: TaskStatus[RunningSimulator] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``scenarios`` until cancelled, after printing where it listens.

    With ``await tg.start(serve_simulator, …)`` the caller gets the :class:`RunningSimulator`.
    """
    scenarios = tuple(scenarios)
    async with open_simulator(scenarios, host=host, port=port) as running:
        names = ", ".join(s.name for s in scenarios) or "(none)"
        print(f"loopfuse simulator on {running.base_url} serving {names}", flush=True)
        task_status.started(running)
        await anyio.sleep_forever()
