"""``python -m bench [--json]``: the overhead, memory, bus and HTTP benchmarks in one process.

See ``docs/performance.md`` for what each figure means. Workloads alternate within each
repetition (bare, guard, loopfuse, loopfuse + event recorder), so a noisy machine slows all
of them alike; figures are medians with their min–max.
"""

from __future__ import annotations

import argparse
import functools
import gc
import statistics
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, NamedTuple, TextIO

import anyio
import msgspec

from bench.bus_throughput import measure_bus
from bench.http_client import measure_http, simulator_process
from bench.loops import Sample, bare_loop, guard_loop, loopfuse_loop
from bench.memory import bare_parked, loopfuse_parked
from bench.realistic import GcClock, parked_after, realistic_loop
from orchestrator.runtime.compiled import compiled_modules

__all__ = ["Spread", "main", "measure"]

Workload = Callable[[int, int], Awaitable[Sample]]


async def _loopfuse(runs: int, turns: int) -> Sample:
    return await loopfuse_loop(runs, turns)


async def _loopfuse_events(runs: int, turns: int) -> Sample:
    return await loopfuse_loop(runs, turns, events=True)


async def _loopfuse_async_tool(runs: int, turns: int) -> Sample:
    return await loopfuse_loop(runs, turns, async_tool=True)


async def _loopfuse_tracing(runs: int, turns: int) -> Sample:
    return await loopfuse_loop(runs, turns, tracing=True)


async def _loopfuse_realistic(runs: int, turns: int) -> Sample:
    return (await realistic_loop(runs, turns)).sample


WORKLOADS: dict[str, Workload] = {
    "bare": bare_loop,
    "guard": guard_loop,
    "loopfuse": _loopfuse,
    "loopfuse+events": _loopfuse_events,
    "loopfuse+async_tool": _loopfuse_async_tool,
    "loopfuse+tracing": _loopfuse_tracing,  # needs the otel extra
    "loopfuse+realistic": _loopfuse_realistic,  # async tool, worker-hop model (bench.realistic)
}
SHAPES = {"loopfuse": "cheap", "loopfuse+realistic": "realistic"}
"""The two shapes whose collector share and memory after a few turns are reported."""
PARKED_AFTER_TURNS = 4


class Spread(NamedTuple):
    """Median, min and max of one figure over the repetitions."""

    median: float
    low: float
    high: float

    @staticmethod
    def of(values: Sequence[float]) -> Spread:
        return Spread(statistics.median(values), min(values), max(values))

    def __str__(self) -> str:
        return f"{self.median:,.1f} ({self.low:,.1f}–{self.high:,.1f})"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench", description="loopfuse's overhead beside a bare loop."
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--reps", type=int, default=5, help="repetitions (default 5)")
    parser.add_argument("--runs", type=int, default=500, help="throughput path: runs")
    parser.add_argument("--turns", type=int, default=20, help="throughput path: turns")
    parser.add_argument("--latency-turns", type=int, default=200, help="latency path: turns")
    parser.add_argument("--parked", type=int, default=10_000, help="memory: parked runs")
    parser.add_argument("--http-runs", type=int, default=50, help="HTTP: concurrent runs")
    parser.add_argument("--no-http", action="store_true", help="skip the real HTTP path")
    parser.add_argument(
        "--parked-after", type=int, default=2_000, help="memory after 4 turns: parked runs"
    )
    return parser


def measure(args: argparse.Namespace, log: TextIO) -> dict[str, Any]:
    """Every figure, as the ``--json`` object."""
    paths = {
        "latency": (1, args.latency_turns),
        "throughput": (args.runs, args.turns),
        "history_20": (20, 20),
        "history_200": (20, 200),
    }
    samples: dict[tuple[str, str], list[Sample]] = {}
    gc_shares: dict[tuple[str, str], list[float]] = {}
    for workload in WORKLOADS.values():  # warm-up: imports, caches, first-use costs
        anyio.run(workload, 2, 3)
    for rep in range(args.reps):
        log.write(f"repetition {rep + 1}/{args.reps}\n")
        for path, (runs, turns) in paths.items():
            for name, workload in WORKLOADS.items():
                if path.startswith("history") and name != "loopfuse":
                    continue
                gc.collect()  # the previous workload's garbage is not this one's cost
                with GcClock() as collector:
                    sample = anyio.run(workload, runs, turns)
                samples.setdefault((name, path), []).append(sample)
                share = collector.seconds / sample.wall_seconds if sample.wall_seconds else 0.0
                gc_shares.setdefault((name, path), []).append(share)
    figures: dict[str, Any] = {"workloads": {}}
    for (name, path), got in samples.items():
        cpu = Spread.of([s.cpu_us_per_turn for s in got])
        wall = Spread.of([s.wall_us_per_turn for s in got])
        figures["workloads"].setdefault(name, {})[path] = {
            "cpu_us_per_turn": cpu._asdict(),
            "wall_us_per_turn": wall._asdict(),
            "turns_per_second": 1e6 / wall.median if wall.median else 0.0,
            "gc_share": Spread.of(gc_shares[(name, path)])._asdict(),
        }

    def cpu_of(name: str, path: str = "throughput") -> float:
        return float(figures["workloads"][name][path]["cpu_us_per_turn"]["median"])

    figures["bare_us_per_turn"] = cpu_of("bare")
    figures["guard_us_per_turn"] = cpu_of("guard")
    figures["loopfuse_us_per_turn"] = cpu_of("loopfuse")
    figures["loopfuse_events_us_per_turn"] = cpu_of("loopfuse+events")
    figures["loopfuse_async_tool_us_per_turn"] = cpu_of("loopfuse+async_tool")
    figures["loopfuse_tracing_us_per_turn"] = cpu_of("loopfuse+tracing")
    figures["ratio_vs_guard"] = figures["loopfuse_us_per_turn"] / figures["guard_us_per_turn"]
    figures["loopfuse_realistic_us_per_turn"] = cpu_of("loopfuse+realistic")
    figures["loopfuse_realistic_latency_us_per_turn"] = cpu_of("loopfuse+realistic", "latency")
    figures["realistic_vs_cheap"] = (
        figures["loopfuse_realistic_us_per_turn"] / figures["loopfuse_us_per_turn"]
    )
    figures["gc_share"] = {
        shape: figures["workloads"][name]["throughput"]["gc_share"]["median"]
        for name, shape in SHAPES.items()
    }
    figures["compiled_modules"] = len(compiled_modules())  # 0: a pure-Python install
    figures["build"] = "compiled" if figures["compiled_modules"] else "pure Python"
    figures["us_per_turn_runs_of_20_turns"] = cpu_of("loopfuse", "history_20")
    figures["us_per_turn_runs_of_200_turns"] = cpu_of("loopfuse", "history_200")
    # turns 21..200 alone: what the 180 later turns of a run cost beyond its first 20
    figures["us_per_turn_21_to_200"] = (
        figures["us_per_turn_runs_of_200_turns"] * 200
        - figures["us_per_turn_runs_of_20_turns"] * 20
    ) / 180

    log.write(f"memory: {args.parked} parked runs\n")
    bare = anyio.run(bare_parked, args.parked)
    parked = anyio.run(loopfuse_parked, args.parked)
    figures["parked_runs"] = args.parked
    figures["kb_per_run"] = parked.heap_bytes_per_run / 1024
    figures["rss_kb_per_run"] = parked.rss_bytes_per_run / 1024
    figures["bare_kb_per_run"] = bare.heap_bytes_per_run / 1024
    figures["bare_rss_kb_per_run"] = bare.rss_bytes_per_run / 1024
    log.write(f"memory: {args.parked_after} runs parked after {PARKED_AFTER_TURNS} turns\n")
    figures["parked_after_turns"] = PARKED_AFTER_TURNS
    after_turns = {
        shape: anyio.run(
            functools.partial(
                parked_after,
                args.parked_after,
                PARKED_AFTER_TURNS,
                realistic=shape == "realistic",
            )
        )
        for shape in SHAPES.values()
    }
    figures["kb_per_run_after_turns"] = {
        shape: parked.heap_bytes_per_run / 1024 for shape, parked in after_turns.items()
    }
    figures["rss_kb_per_run_after_turns"] = {
        shape: parked.rss_bytes_per_run / 1024 for shape, parked in after_turns.items()
    }

    log.write("bus\n")
    figures["bus"] = [anyio.run(measure_bus, n, 20_000)._asdict() for n in (1, 5, 10)]

    for key in _HTTP_KEYS:
        figures[key] = None
    if not args.no_http:
        log.write("real HTTP\n")
        with simulator_process() as url:
            anyio.run(measure_http, url, 5)  # warm-up: first connections, caches
            http = anyio.run(lambda: measure_http(url, args.http_runs, reps=args.reps))
        # The model client's CPU per request: loopfuse over HTTP minus the same runs with
        # the in-process model, repetition by repetition (what the target is about); the
        # whole per-request CPU (runtime included) is reported beside it.
        figures["http_client_us_per_request"] = http.client_us_per_request
        figures["http_loopfuse_us_per_request"] = http.loopfuse_us_per_request
        figures["http_runtime_us_per_request"] = http.runtime_us_per_request
        figures["raw_openai_us_per_request"] = http.raw_us_per_request
        figures["lean_openai_us_per_request"] = http.lean_us_per_request
    return figures


_HTTP_KEYS = (
    "http_client_us_per_request",
    "http_loopfuse_us_per_request",
    "http_runtime_us_per_request",
    "raw_openai_us_per_request",
    "lean_openai_us_per_request",
)


def format_report(figures: dict[str, Any], args: argparse.Namespace, out: TextIO) -> None:
    """The human-readable table."""
    out.write(
        f"per-turn CPU and wall µs, median (min–max) over {args.reps} repetitions\n"
        f"latency: 1 run x {args.latency_turns} turns; "
        f"throughput: {args.runs} runs x {args.turns} turns\n\n"
    )
    for name, paths in figures["workloads"].items():
        for path, row in paths.items():
            cpu = Spread(**row["cpu_us_per_turn"])
            wall = Spread(**row["wall_us_per_turn"])
            out.write(
                f"{name:16} {path:12} cpu {cpu!s:28} wall {wall!s:28} "
                f"{row['turns_per_second']:,.0f} turns/s\n"
            )
    out.write(
        f"\nbuild measured: {figures['build']} ({figures['compiled_modules']} modules compiled; "
        "an editable install is pure Python, a wheel or `pip install .` compiles)\n"
        f"throughput CPU/turn: bare {figures['bare_us_per_turn']:.1f} µs, guard "
        f"{figures['guard_us_per_turn']:.1f} µs, loopfuse {figures['loopfuse_us_per_turn']:.1f} "
        f"µs (x{figures['ratio_vs_guard']:.1f} the guard; target ≤ 3); with tracing on "
        f"{figures['loopfuse_tracing_us_per_turn']:.1f} µs\n"
        f"O(history): 20 runs x 20 turns {figures['us_per_turn_runs_of_20_turns']:.1f} µs/turn, "
        f"x 200 turns {figures['us_per_turn_runs_of_200_turns']:.1f} µs/turn, turns 21-200 "
        f"alone {figures['us_per_turn_21_to_200']:.1f} µs/turn\n"
        f"realistic shape (async tool, worker-hop model): "
        f"{figures['loopfuse_realistic_us_per_turn']:.1f} µs/turn at {args.runs} x "
        f"{args.turns} (x{figures['realistic_vs_cheap']:.2f} the cheap shape; target ≤ 1.5), "
        f"{figures['loopfuse_realistic_latency_us_per_turn']:.1f} µs/turn at 1 x "
        f"{args.latency_turns}; share of wall time in the cycle collector: cheap "
        f"{figures['gc_share']['cheap']:.0%}, realistic {figures['gc_share']['realistic']:.0%}; "
        f"per run parked after {figures['parked_after_turns']} turns, heap / RSS: cheap "
        f"{figures['kb_per_run_after_turns']['cheap']:.1f} / "
        f"{figures['rss_kb_per_run_after_turns']['cheap']:.1f} KB, realistic "
        f"{figures['kb_per_run_after_turns']['realistic']:.1f} / "
        f"{figures['rss_kb_per_run_after_turns']['realistic']:.1f} KB\n"
        f"memory: {figures['parked_runs']:,} parked runs: {figures['kb_per_run']:.1f} KB heap, "
        f"{figures['rss_kb_per_run']:.1f} KB RSS per run (bare: "
        f"{figures['bare_kb_per_run']:.1f} / {figures['bare_rss_kb_per_run']:.1f}; target ≤ 10)\n"
    )
    for row in figures["bus"]:
        out.write(
            f"bus, {row['subscribers']} subscriber(s): publish "
            f"{row['publish_per_second']:,.0f}/s, settled {row['settled_per_second']:,.0f}/s; "
            f"inline: publish {row['inline_publish_per_second']:,.0f}/s, settled "
            f"{row['inline_settled_per_second']:,.0f}/s\n"
        )
    if figures["http_client_us_per_request"] is not None:
        out.write(
            f"real HTTP, CPU per request: the model client "
            f"{figures['http_client_us_per_request']:,.0f} µs (target ≤ 1,500), raw "
            f"AsyncOpenAI {figures['raw_openai_us_per_request']:,.0f} µs; loopfuse whole "
            f"(runtime + client) {figures['http_loopfuse_us_per_request']:,.0f} µs, its "
            f"runtime alone {figures['http_runtime_us_per_request']:,.0f} µs\n"
        )


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Entry point of ``python -m bench``; returns the exit status."""
    args = _parser().parse_args(argv)
    out = out or sys.stdout
    if (
        min(args.reps, args.runs, args.turns, args.latency_turns, args.parked, args.parked_after)
        < 1
    ):
        print("bench: counts must be positive", file=sys.stderr)
        return 2
    figures = measure(args, sys.stderr)
    if args.json:
        out.write(msgspec.json.encode(figures).decode() + "\n")
    else:
        format_report(figures, args, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
