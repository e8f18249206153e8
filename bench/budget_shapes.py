"""The shapes the performance budget guards, run in one process for callgrind to count.

``python -m bench.budget_shapes`` runs, after its imports, each shape three times: a
warm-up at the small size, the small size, the large size. Between phases it calls
``os.getpgid(0)``, which nothing else in the workload calls: ``bench.budget`` runs this
module under ``valgrind --tool=callgrind --dump-before=getpgid``, so each phase's
instructions land in a dump of their own. Per unit (a turn, or a daemon run) of a shape:
(large − small) / (large units − small units): a shape's setup (a runtime, a store)
cancels out.

The shapes (:data:`SHAPES`):

- ``cheap``: ``bench.loops.loopfuse_loop``: the model answers inside its bus handler, a
  plain ``def`` echo tool, every monitor on; concurrent runs of 20 turns;
- ``realistic``: ``bench.realistic.realistic_loop``: the model as a pooled worker with a
  deadline (the LLM caller's shape), an ``async def`` echo;
- ``peer``: the like-for-like row of the peer harness (``../shared/bench-peers``, row
  ``loopfuse``) reproduced here without the peer frameworks: one run at a time of 200
  turns (R=1, T=200), the fake model an actor with an inline subscription handing each
  request to a pooled worker that yields once to the event loop, the harness's
  ``async def echo`` as a msgspec-typed :class:`~actors.tools.Tool`, every monitor on,
  ``max_concurrent_runs`` 100,000 (:mod:`bench.peer_shape`);
- ``daemon``: the daemon in process (its store on disk, event recorder, run service and
  ASGI app, no socket): runs of the shipped ``completed`` scenario submitted with
  ``POST /v1/runs`` and followed over SSE to their end; the unit is a run.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Final, NamedTuple

import anyio
import httpx

from bench.loops import loopfuse_loop
from bench.peer_shape import peer_loop
from bench.realistic import realistic_loop
from orchestrator.config import Config, DaemonSettings, RuntimeSettings

__all__ = ["SHAPES", "Shape", "main", "mark"]


class Shape(NamedTuple):
    """One guarded shape: what runs, its two sizes, and the unit counted."""

    name: str
    unit: str
    small: int
    large: int
    run: Callable[[int], Awaitable[int]]
    """Runs the shape at a size and returns the units it ran (turns or runs)."""


async def _cheap(runs: int) -> int:
    return (await loopfuse_loop(runs, 20)).turns


async def _realistic(runs: int) -> int:
    return (await realistic_loop(runs, 20)).sample.turns


async def _peer(runs: int) -> int:
    return await peer_loop(runs, 200)


async def _daemon(runs: int) -> int:
    """``runs`` runs of ``completed`` through a daemon in process, followed to their end."""
    from orchestrator.daemon.app import create_app
    from orchestrator.daemon.lifespan import Daemon

    with tempfile.TemporaryDirectory() as folder:
        config = Config(
            runtime=RuntimeSettings(max_concurrent_runs=max(runs, 1)),
            daemon=DaemonSettings(store_path=str(Path(folder) / "store.db"), queue_size=runs),
        )
        daemon = Daemon(config, environ={})
        app = create_app(config, daemon=daemon)
        transport = httpx.ASGITransport(app=app)
        client = httpx.AsyncClient(transport=transport, base_url="http://daemon")
        async with daemon.running(), client:
            ids = []
            for _ in range(runs):
                response = await client.post("/v1/runs", json={"scenario": "completed"})
                if response.status_code != 202:
                    raise RuntimeError(f"POST /v1/runs: {response.status_code} {response.text}")
                ids.append(response.json()["id"])
            for run_id in ids:
                events = await client.get(f"/v1/runs/{run_id}/events")
                if "event: end" not in events.text:
                    raise RuntimeError(f"run {run_id}'s stream did not end: {events.text!r}")
    return runs


SHAPES: Final[tuple[Shape, ...]] = (
    Shape("cheap", "turn", 10, 50, _cheap),
    Shape("realistic", "turn", 10, 50, _realistic),
    Shape("peer", "turn", 1, 4, _peer),
    Shape("daemon", "run", 4, 40, _daemon),
)


def mark() -> None:
    """End the phase in progress: callgrind dumps its counts before this call."""
    os.getpgid(0)


async def _all(names: tuple[str, ...]) -> None:
    for shape in SHAPES:
        if names and shape.name not in names:
            continue
        await shape.run(shape.small)  # warm-up: first-use costs, caches
        mark()
        small = await shape.run(shape.small)
        mark()
        large = await shape.run(shape.large)
        mark()
        print(f"{shape.name} {small} {large}", flush=True)


def main(argv: list[str] | None = None) -> int:
    """Run every shape (or the named ones), printing ``name small-units large-units``."""
    names = tuple(sys.argv[1:] if argv is None else argv)
    mark()  # the imports end here
    anyio.run(_all, names)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
