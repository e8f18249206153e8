"""The loop monitor's cost per proposed call and per run: ``python -m bench.loop_monitor``.

The workload is the throughput benchmark's echo loop (:func:`bench.scripted_model.echo_script`:
one ``echo`` call per turn with new arguments, so no fuse trips), played as the bus messages
the loop monitor sees, for ``runs`` runs interleaved turn by turn: ``RunStarted``, then per
turn a ``ModelReply`` with the call, its ``ToolCallProposed`` (with the conductor's
fingerprint) and its ``ToolResult`` (with the tool executor's result fingerprint), and
``RunFinished``. The messages are built before the clock starts.

* ``monitor``: a fresh monitor's function of each message's type
  (:meth:`LoopMonitor.handlers`, as the bus calls them) over every message, CPU time
  (``time.process_time``) per proposed call;
* ``engine``: :meth:`LoopDetector.propose` + :meth:`LoopDetector.record_result` alone, per
  call, fingerprints given as the monitor gives them;
* memory (``tracemalloc``): the monitor's heap per run for ``parked`` runs that have only
  started (``RunStarted``: parked at their first model request), and per run after
  ``turns`` calls each (messages made and dropped as they are handled, as on the bus).

Each figure is the median of ``reps`` repetitions (min–max beside it), per preset (every
preset of ``actors.loop.PRESETS`` unless ``--preset`` names some). The echo results carry a
digit ("step N"), so the result normaliser's search runs on every result, as it does on
most real ones.
Progress goes to stderr; the table or the JSON to stdout.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
import tracemalloc
from collections.abc import Iterator, Sequence
from typing import NamedTuple

import msgspec

from actors.fingerprint import fingerprint_call, fingerprint_result
from actors.loop import PRESETS, LoopConfig, LoopDetector
from actors.loop.monitor import LoopMonitor
from bench.scripted_model import ECHO_TOOL, finished_run
from bus import (
    Bus,
    ModelReply,
    RunFinished,
    RunStarted,
    ToolCall,
    ToolCallProposed,
    ToolResult,
)
from tests.started import run_started

__all__ = ["LoopMonitorFigures", "main", "measure", "run_messages"]

Message = RunStarted | RunFinished | ModelReply | ToolCallProposed | ToolResult


class LoopMonitorFigures(NamedTuple):
    """One preset's figures (µs are CPU time; bytes are the monitor's heap per run)."""

    preset: str
    monitor_us_per_call: float
    monitor_us_per_call_min: float
    monitor_us_per_call_max: float
    engine_us_per_call: float
    engine_us_per_call_min: float
    engine_us_per_call_max: float
    bytes_per_parked_run: float
    bytes_per_run_after_calls: float
    calls_per_run: int


def _started(run_id: str) -> RunStarted:
    return run_started(run_id=run_id, trace_id="t", task="Echo the steps.", model="scripted")


def _turn(run_id: str, turn: int) -> tuple[ModelReply, ToolCallProposed, ToolResult]:
    text = f"step {turn}"
    call = ToolCall(id=f"call_{turn}", name=ECHO_TOOL, arguments=f'{{"text":"{text}"}}')
    fingerprint = fingerprint_call(call.name, call.arguments)
    reply = ModelReply(run_id=run_id, turn=turn, text="", tool_calls=(call,))
    proposed = ToolCallProposed(
        run_id=run_id, turn=turn, call=call, fingerprint=fingerprint, index=0
    )
    result = ToolResult(
        run_id=run_id,
        turn=turn,
        call_id=call.id,
        tool=ECHO_TOOL,
        content=text,
        fingerprint=fingerprint,
        result_fingerprint=fingerprint_result(text),
    )
    return reply, proposed, result


def run_messages(runs: int, calls: int, *, finish: bool = True) -> Iterator[Message]:
    """The messages of ``runs`` echo runs of ``calls`` calls each, interleaved turn by
    turn as concurrent runs are (made one by one, as they are consumed)."""
    ids = [f"run-{n}" for n in range(runs)]
    for run_id in ids:
        yield _started(run_id)
    for turn in range(1, calls + 1):
        for run_id in ids:
            yield from _turn(run_id, turn)
    if finish:
        for run_id in ids:
            yield ModelReply(run_id=run_id, turn=calls + 1, text="done")
            yield finished_run(run_id, calls + 1, calls)


def _monitor_us(config: LoopConfig, messages: Sequence[Message], calls: int) -> float:
    handlers = LoopMonitor(Bus(), config).handlers()  # what the bus calls, by type
    deliveries = [(handlers[type(msg)], msg) for msg in messages]
    start = time.process_time()
    for handle, msg in deliveries:
        handle(msg)
    return (time.process_time() - start) / calls * 1e6


def _engine_us(config: LoopConfig, runs: int, calls: int) -> float:
    # (tool, arguments, call id, fingerprint, result text, result fingerprint) per call
    script = []
    for turn in range(1, calls + 1):
        _, proposed, result = _turn("r", turn)
        call, fingerprint = proposed.call, proposed.fingerprint
        script.append(
            (
                call.name,
                call.arguments,
                call.id,
                fingerprint,
                result.content,
                result.result_fingerprint,
            )
        )
    detectors = [LoopDetector(config) for _ in range(runs)]
    start = time.process_time()
    for tool, arguments, call_id, fingerprint, content, result_fp in script:
        for detector in detectors:
            decision = detector.propose(tool, arguments, call_id=call_id, fingerprint=fingerprint)
            detector.record_result(decision.call_id, content, result_fingerprint=result_fp)
    return (time.process_time() - start) / (runs * calls) * 1e6


def _bytes_per_run(config: LoopConfig, runs: int, calls: int) -> float:
    """The monitor's heap per run after ``runs`` runs started and made ``calls`` calls."""
    monitor = LoopMonitor(Bus(), config)
    # warm up: every code path and interned string once, outside the measurement
    for msg in run_messages(1, max(calls, 1)):
        monitor.handle(msg)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        for msg in run_messages(runs, calls, finish=False):
            monitor.handle(msg)
        gc.collect()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    assert monitor.active_runs() <= runs
    grown = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    del monitor
    return grown / runs


def measure(
    preset: str, *, runs: int = 500, calls: int = 20, reps: int = 5, parked: int = 2000
) -> LoopMonitorFigures:
    """Figures of one preset (a name of ``actors.loop.PRESETS``).

    :raises ValueError: an unknown preset, or a size that is not positive.
    """
    if preset not in PRESETS:
        raise ValueError(f"preset: must be one of {', '.join(sorted(PRESETS))}, got {preset!r}")
    for key, value in (("runs", runs), ("calls", calls), ("reps", reps), ("parked", parked)):
        if value < 1:
            raise ValueError(f"{key}: must be a positive integer, got {value}")
    config = PRESETS[preset]
    messages = list(run_messages(runs, calls))
    _monitor_us(config, messages[: len(messages) // 10 + 1], calls)  # warm up, not counted
    _engine_us(config, max(runs // 10, 1), calls)
    monitor, engine = [], []
    for rep in range(reps):
        print(f"  {preset}: repetition {rep + 1}/{reps}", file=sys.stderr)
        monitor.append(_monitor_us(config, messages, runs * calls))
        engine.append(_engine_us(config, runs, calls))
    return LoopMonitorFigures(
        preset=preset,
        monitor_us_per_call=statistics.median(monitor),
        monitor_us_per_call_min=min(monitor),
        monitor_us_per_call_max=max(monitor),
        engine_us_per_call=statistics.median(engine),
        engine_us_per_call_min=min(engine),
        engine_us_per_call_max=max(engine),
        bytes_per_parked_run=_bytes_per_run(config, parked, 0),
        bytes_per_run_after_calls=_bytes_per_run(config, parked, calls),
        calls_per_run=calls,
    )


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m bench.loop_monitor [--json] [--runs N] [--calls N] [--reps N]``."""
    parser = argparse.ArgumentParser(prog="python -m bench.loop_monitor", description=__doc__)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--runs", type=int, default=500, help="interleaved runs (500)")
    parser.add_argument("--calls", type=int, default=20, help="calls per run (20)")
    parser.add_argument("--reps", type=int, default=5, help="repetitions (5)")
    parser.add_argument("--parked", type=int, default=2000, help="runs in the memory figures")
    parser.add_argument(
        "--preset", action="append", choices=sorted(PRESETS), help="repeatable; default: all"
    )
    args = parser.parse_args(argv)
    for name in ("runs", "calls", "reps", "parked"):
        if getattr(args, name) < 1:
            parser.error(f"--{name}: must be a positive integer, got {getattr(args, name)}")
    figures = [
        measure(p, runs=args.runs, calls=args.calls, reps=args.reps, parked=args.parked)
        for p in args.preset or tuple(PRESETS)
    ]
    if args.json:
        sys.stdout.write(
            msgspec.json.encode({f.preset: f._asdict() for f in figures}).decode() + "\n"
        )
        return
    print(
        "| preset | monitor µs/call, median (min–max) | engine µs/call, median (min–max) "
        f"| B per parked run | B per run after {args.calls} calls |"
    )
    print("|---|---:|---:|---:|---:|")
    for f in figures:
        print(
            f"| {f.preset} "
            f"| {f.monitor_us_per_call:.2f} ({f.monitor_us_per_call_min:.2f}–"
            f"{f.monitor_us_per_call_max:.2f}) "
            f"| {f.engine_us_per_call:.2f} ({f.engine_us_per_call_min:.2f}–"
            f"{f.engine_us_per_call_max:.2f}) "
            f"| {f.bytes_per_parked_run:,.0f} | {f.bytes_per_run_after_calls:,.0f} |"
        )


if __name__ == "__main__":
    main()
