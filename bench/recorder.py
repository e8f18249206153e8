"""The metrics recorder's cost per bus message: ``python -m bench.recorder [--json]``.

The messages are the throughput workload's own (:func:`bench.loops.bench_runtime`: the echo
script, every monitor on), captured from real runs by an inline observer on the runtime's
bus. They are then fed, in their order, to :meth:`MetricsRecorder.handle` of a fresh
recorder (the handler the bus calls inline), ``repeat`` times over; only those calls are
timed, in CPU time (``time.process_time``: on a shared machine, other processes count
less than in wall time). Progress goes to stderr; the figures to stdout.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections import Counter
from collections.abc import Sequence
from typing import NamedTuple, cast

import anyio
import msgspec
from anyio.abc import TaskStatus
from prometheus_client import generate_latest

from actors.tools import default_registry
from bench.loops import bench_overrides, bench_runtime, echo_tool
from bench.options import replay_parser
from bus import Bus, BusMessage, Message
from orchestrator.config import Config
from orchestrator.metrics import MetricsRecorder, new_registry
from orchestrator.runtime import RunSpec

__all__ = ["RecorderFigures", "capture_messages", "main", "measure_recorder"]


class RecorderFigures(NamedTuple):
    """Microseconds per message through the recorder, over the repetitions."""

    messages: int
    messages_per_turn: float
    us_per_message: float
    us_per_message_min: float
    us_per_message_max: float
    scrape_ms: float
    mix: dict[str, int]


class _Capture:
    def __init__(self, bus: Bus) -> None:
        self._bus = bus
        self.messages: list[BusMessage] = []

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        sub = self._bus.subscribe(name="bench_capture", inline=True)
        await sub.serve(self._keep, task_status=task_status)

    def _keep(self, msg: Message) -> None:
        self.messages.append(cast(BusMessage, msg))


async def capture_messages(runs: int, turns: int) -> list[BusMessage]:
    """Every bus message of ``runs`` concurrent runs of the throughput workload."""
    runtime = bench_runtime(runs, turns)
    capture = _Capture(runtime.bus)
    async with anyio.create_task_group() as tg:
        await tg.start(capture.run)
        async with runtime:
            overrides = bench_overrides(turns)
            handles = [
                await runtime.start(RunSpec(task="Echo the steps.", overrides=overrides))
                for _ in range(runs)
            ]
            for handle in handles:
                await handle.result()
    return capture.messages


def _recorder() -> MetricsRecorder:
    # As the runtime builds it: the configured model (the workload's "scripted" model is
    # not it, so its label is `other`) and the live tool registry with the echo tool.
    tools = default_registry()
    tools.add(echo_tool())
    return MetricsRecorder(
        Bus(), new_registry(process=False), models=(Config().model.model,), tools=tools
    )


def _time_once(messages: Sequence[BusMessage], repeat: int) -> float:
    recorder = _recorder()
    handle = recorder.handle
    started = time.process_time()
    for _ in range(repeat):
        for msg in messages:
            handle(msg)
    return time.process_time() - started


def measure_recorder(
    runs: int = 20, turns: int = 20, *, repeat: int = 50, reps: int = 5
) -> RecorderFigures:
    """µs per message through :meth:`MetricsRecorder.handle` on the workload's messages.

    :raises ValueError: a count is not positive.
    """
    for key, count in (("runs", runs), ("turns", turns), ("repeat", repeat), ("reps", reps)):
        if count < 1:
            raise ValueError(f"{key} must be positive, got {count}")
    messages = anyio.run(capture_messages, runs, turns)
    total = len(messages) * repeat
    _time_once(messages, 1)  # warm up
    per_message = [_time_once(messages, repeat) / total * 1e6 for _ in range(reps)]
    recorder = _recorder()
    for msg in messages:
        recorder.handle(msg)
    started = time.perf_counter()
    generate_latest(recorder.metrics.registry)
    scrape = time.perf_counter() - started
    return RecorderFigures(
        messages=total,
        messages_per_turn=len(messages) / (runs * turns),
        us_per_message=statistics.median(per_message),
        us_per_message_min=min(per_message),
        us_per_message_max=max(per_message),
        scrape_ms=scrape * 1e3,
        mix=dict(Counter(type(msg).__name__ for msg in messages).most_common()),
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Print the figures (a table, or one JSON object with ``--json``); 0 on success."""
    parser = replay_parser("python -m bench.recorder", __doc__, repeat=50)
    args = parser.parse_args(argv)
    print("capturing the workload's messages, then timing the recorder…", file=sys.stderr)
    figures = measure_recorder(args.runs, args.turns, repeat=args.repeat, reps=args.reps)
    if args.json:
        print(msgspec.json.encode(figures._asdict()).decode())
        return 0
    print(
        f"{figures.messages:,} messages ({figures.messages_per_turn:.1f} per turn): "
        f"{figures.us_per_message:.2f} µs/message median "
        f"({figures.us_per_message_min:.2f}–{figures.us_per_message_max:.2f}); "
        f"scrape {figures.scrape_ms:.1f} ms"
    )
    print("mix per pass: " + ", ".join(f"{name} {count}" for name, count in figures.mix.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
