"""The tool executor's CPU per tool call: ``python -m bench.tool_executor [--json]``.

The executor alone on a :class:`~bus.Bus`: ``runs`` concurrent drivers each start a run
(``RunStarted`` enabling ``echo``), then, ``turns`` times, publish a ``ToolExecute`` of one
``echo`` call (with the fingerprints, as the conductor sends it) and receive its
``ToolResult`` from the run's inbox, as the conductor does. Two tools, the same text back:
``async`` (an ``async def`` echo, run by a pooled worker) and ``sync`` (a plain ``def``
echo, answered inside the executor's inline handler). A third column, ``floor``, replaces
the executor by an inline subscriber that answers every call with a ready-made result: the
drivers' own cost (publish, inbox, task switches), to subtract. The messages are built
before the clock starts; figures are CPU time (``time.process_time``) per call, median and
range over ``--reps`` repetitions, the columns alternated (a garbage collection before each
clock start).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import anyio
from anyio.abc import TaskStatus

from actors.fingerprint import fingerprint_call
from actors.tools import ToolRegistry
from actors.tools.executor import ToolExecutor
from bench.loops import echo_tool
from bench.scripted_model import ECHO_TOOL, finished_run
from bus import (
    Bus,
    ToolCall,
    ToolExecute,
    ToolResult,
)
from tests.started import run_started

__all__ = ["KINDS", "ExecutorFigures", "main", "measure"]

KINDS = ("floor", "async", "sync")


class ExecutorFigures(NamedTuple):
    """Microseconds of CPU per tool call, over the repetitions."""

    kind: str
    us_per_call: float
    us_per_call_min: float
    us_per_call_max: float


def _messages(runs: int, turns: int) -> list[list[ToolExecute]]:
    batches = []
    for r in range(runs):
        run_id = f"run-{r}"
        batch = []
        for turn in range(1, turns + 1):
            call = ToolCall(
                id=f"call_{turn}", name=ECHO_TOOL, arguments=f'{{"text":"step {turn}"}}'
            )
            batch.append(
                ToolExecute(
                    run_id=run_id,
                    turn=turn,
                    calls=(call,),
                    fingerprints=(fingerprint_call(call.name, call.arguments),),
                )
            )
        batches.append(batch)
    return batches


class _Floor:
    """Answers every call at once with a result made in advance (no tool, no cache)."""

    def __init__(self, bus: Bus) -> None:
        self._bus = bus

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        sub = self._bus.subscribe(ToolExecute, name="bench_floor", inline=True)
        await sub.serve(self._answer, task_status=task_status)

    def _answer(self, msg: ToolExecute) -> None:
        call = msg.calls[0]
        self._bus.publish_nowait(
            ToolResult(
                run_id=msg.run_id,
                turn=msg.turn,
                call_id=call.id,
                tool=call.name,
                content="",
                duration_seconds=0.0,
                fingerprint=msg.fingerprints[0],
                result_fingerprint="",
                cache="none",
            )
        )


async def _once(kind: str, runs: int, turns: int) -> float:
    """CPU seconds of ``runs`` x ``turns`` calls."""
    bus = Bus()
    tools = ToolRegistry([echo_tool(asynchronous=kind == "async")])
    actor: Callable[..., Any] = _Floor(bus).run if kind == "floor" else ToolExecutor(bus, tools).run
    batches = _messages(runs, turns)
    errors = 0

    async def drive(run: list[ToolExecute]) -> None:
        nonlocal errors
        run_id = run[0].run_id
        with bus.open_inbox(run_id) as inbox:
            await bus.publish(
                run_started(run_id=run_id, trace_id="t", task="t", model="m", tools=(ECHO_TOOL,))
            )
            for msg in run:
                await bus.publish(msg)
                result = await inbox.receive()
                assert isinstance(result, ToolResult)
                errors += result.is_error
            await bus.publish(finished_run(run_id, len(run), len(run)))

    async with anyio.create_task_group() as tg:
        await tg.start(actor)
        gc.collect()  # the previous repetition's garbage is not this one's cost
        cpu = time.process_time()
        async with anyio.create_task_group() as runs_tg:
            for run in batches:
                runs_tg.start_soon(drive, run)
        cpu = time.process_time() - cpu
        bus.close()
    if errors:
        raise RuntimeError(f"{kind}: {errors} calls answered with an error")
    return cpu


def measure(
    runs: int = 500, turns: int = 20, reps: int = 7, kinds: tuple[str, ...] = KINDS
) -> list[ExecutorFigures]:
    """Each kind ``reps`` times, alternated; µs of CPU per call.

    :raises ValueError: an unknown kind, or a size that is not positive (named)."""
    for kind in kinds:
        if kind not in KINDS:
            raise ValueError(f"kinds: unknown kind {kind!r} (known: {', '.join(KINDS)})")
    for key, size in (("runs", runs), ("turns", turns), ("reps", reps)):
        if size < 1:
            raise ValueError(f"{key} must be positive, got {size}")
    samples: dict[str, list[float]] = {kind: [] for kind in kinds}
    for kind in kinds:  # warm up
        anyio.run(_once, kind, 2, 2)
    for rep in range(reps):
        for kind in kinds:
            samples[kind].append(anyio.run(_once, kind, runs, turns) / (runs * turns) * 1e6)
        print(f"rep {rep + 1}/{reps}", file=sys.stderr)
    return [
        ExecutorFigures(kind, statistics.median(s), min(s), max(s)) for kind, s in samples.items()
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.tool_executor")
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument(
        "--kinds", default=",".join(KINDS), help="comma-separated: " + ", ".join(KINDS)
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    kinds = tuple(k for k in args.kinds.split(",") if k)
    figures = measure(args.runs, args.turns, args.reps, kinds)
    if args.json:
        print(json.dumps([f._asdict() for f in figures], indent=2))
        return
    for f in figures:
        print(
            f"{f.kind:>6}: {f.us_per_call:6.1f} us CPU per call "
            f"({f.us_per_call_min:.1f}-{f.us_per_call_max:.1f})"
        )


if __name__ == "__main__":
    main()
