"""``python -m bench.run_lifecycle``: what starting and ending a run costs, in process.

Runs of one turn (the model answers in text at once) and runs of ``--turns`` turns go
through the benchmark runtime (every monitor on, the in-process scripted model); a turn
costs ``(cpu(long) - cpu(one)) / (turns - 1)``, and a run's start and end cost what its
one-turn run costs beyond that turn: ``cpu(one) - turn``. Runs are started ``--in-flight``
at a time (a burst of submissions, as the daemon sees them). Figures are medians over
``--reps`` repetitions with their min–max.

``--scenario NAME`` measures instead the CPU per run of a shipped scenario started with
``start_scenario`` on a runtime without an endpoint (what the daemon's scenario runs cost
in process: the in-process model, the shared folder), ``--runs`` runs ``--in-flight`` at a
time after a warm-up of 20.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections.abc import Sequence
from typing import NamedTuple, TextIO

import anyio
import msgspec

from bench.loops import bench_overrides, bench_runtime
from bench.options import positive
from orchestrator.config import Config, RuntimeSettings
from orchestrator.runtime import RunSpec, Runtime
from orchestrator.scenarios.runs import start_scenario
from orchestrator.sim import find_scenario

__all__ = ["Lifecycle", "cpu_per_run", "main", "measure_lifecycle", "scenario_cpu_per_run"]


class Lifecycle(NamedTuple):
    """One repetition: CPU µs per one-turn run, per turn, and the start and end of a run."""

    run_us: float
    turn_us: float
    start_end_us: float


async def cpu_per_run(runs: int, turns: int, in_flight: int) -> float:
    """CPU µs per run of ``turns`` turns, ``in_flight`` runs at a time (setup not timed)."""
    runtime = bench_runtime(in_flight, turns)
    overrides = bench_overrides(turns)
    async with runtime:
        started = time.process_time()
        done = 0
        while done < runs:
            batch = min(in_flight, runs - done)
            handles = [
                await runtime.start(RunSpec(task="Echo the steps.", overrides=overrides))
                for _ in range(batch)
            ]
            for handle in handles:
                result = await handle.result()
                if result.turns != turns or result.cause != "model.end_turn":
                    raise RuntimeError(f"bench run ended {result.cause} after {result.turns}")
            done += batch
        return (time.process_time() - started) / runs * 1e6


async def scenario_cpu_per_run(name: str, runs: int, in_flight: int) -> float:
    """CPU µs per run of the shipped scenario ``name`` (its expected exit reason checked)."""
    scenario = find_scenario(name)
    config = Config(runtime=RuntimeSettings(max_concurrent_runs=in_flight))
    async with Runtime(config) as runtime:
        for handle in [await start_scenario(runtime, scenario) for _ in range(20)]:
            await handle.result()
        gc.collect()
        started = time.process_time()
        handles = [await start_scenario(runtime, scenario) for _ in range(runs)]
        results = [await handle.result() for handle in handles]
        cpu = time.process_time() - started
    for result in results:
        if result.exit_reason != scenario.expect.exit_reason:
            raise RuntimeError(f"{name} ended {result.exit_reason.value}/{result.cause}")
    return cpu / runs * 1e6


def measure_lifecycle(runs: int, turns: int, in_flight: int) -> Lifecycle:
    """One repetition of both workloads."""
    gc.collect()
    one = anyio.run(cpu_per_run, runs, 1, in_flight)
    gc.collect()
    long = anyio.run(cpu_per_run, max(runs // turns, 1), turns, in_flight)
    turn = (long - one) / (turns - 1)
    return Lifecycle(one, turn, one - turn)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.run_lifecycle", description=__doc__)
    parser.add_argument("--runs", type=positive, default=2000, help="one-turn runs (2000)")
    parser.add_argument("--turns", type=positive, default=20, help="turns of the long runs (20)")
    parser.add_argument("--in-flight", type=positive, default=32, help="runs at a time (32)")
    parser.add_argument("--reps", type=positive, default=5, help="repetitions (5)")
    parser.add_argument("--scenario", help="CPU per run of this shipped scenario instead")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    return parser


def _spread(values: Sequence[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "low": min(values), "high": max(values)}


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Entry point; returns the exit status."""
    args = _parser().parse_args(argv)
    out = out or sys.stdout
    if args.turns < 2:
        print("bench.run_lifecycle: --turns must be at least 2", file=sys.stderr)
        return 2
    if args.scenario is not None:
        values = [
            anyio.run(scenario_cpu_per_run, args.scenario, args.runs, args.in_flight)
            for _ in range(args.reps)
        ]
        spread = _spread(values)
        if args.json:
            out.write(msgspec.json.encode({"scenario_run_us": spread}).decode() + "\n")
        else:
            out.write(
                f"{args.scenario} run {spread['median']:8.1f} µs CPU "
                f"({spread['low']:.1f}–{spread['high']:.1f}; {args.runs} runs, "
                f"{args.in_flight} in flight, {args.reps} repetitions)\n"
            )
        return 0
    measure_lifecycle(50, args.turns, args.in_flight)  # warm-up: imports, caches
    samples = [measure_lifecycle(args.runs, args.turns, args.in_flight) for _ in range(args.reps)]
    figures = {
        field: _spread([getattr(sample, field) for sample in samples])
        for field in Lifecycle._fields
    }
    if args.json:
        out.write(msgspec.json.encode(figures).decode() + "\n")
        return 0
    for field, label in (
        ("run_us", "one-turn run"),
        ("turn_us", "one turn"),
        ("start_end_us", "start + end"),
    ):
        spread = figures[field]
        out.write(
            f"{label:14} {spread['median']:8.1f} µs CPU "
            f"({spread['low']:.1f}–{spread['high']:.1f})\n"
        )
    out.write(f"({args.runs} runs, {args.in_flight} in flight, {args.reps} repetitions)\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
