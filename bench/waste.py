"""The waste the loop fuses save: each scenario with its fuses on, then off.

::

    python -m bench.waste [--json] [--max-turns N] [--deadline SECONDS] [SCENARIO ...]
    python -m bench.waste --corpus [--json] [--preset NAME] [RUN ...]
    python -m bench.waste --real [--json] [--record DIR]
    python -m bench.waste --corpus [--json] [--preset NAME ...] [RUN ...]

Every scenario (default: :data:`DEFAULT_SCENARIOS`; a shipped name, ``NAME.LABEL`` for one
run of a file with several, or a file) runs twice through the runtime and the embedded
simulator, as a real run does:

* **on**: the scenario as shipped (its loop preset and per-run ``loop`` overrides);
* **off**: the same script with ``loop_preset = "off"``, no loop overrides, the result
  cache off (its hit limit is a loop fuse too), ``max_turns`` raised to the cap (200), the
  tool-call budget and the context window out of the way and a large deadline. A scripted
  loop repeats forever, so the off run ends only at the turn cap.

For each run it reports model requests and total tokens (prompt + completion, as the
endpoint reported them; the simulator counts request bytes / 4) until the run stopped, and
the ratio off/on. A scenario that completes with its fuses on (a legitimate poll, a huge
result cut to fit) shows what the fuses cost it: nothing, or, for a result cut to fit the
window, the tokens saved. :func:`measure_waste` is the library entry point.

``--corpus`` reports issue #32's acceptance corpus instead: every legitimate and stuck run
under every preset (or the ``--preset`` ones; ``RUN`` names pick corpus runs), with the
false positives, the stuck runs stopped and the call at which each was
(:mod:`bench.waste_corpus`).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final, TextIO

import anyio
import msgspec

from actors.loop import PRESETS
from bench.corpus_play import Outcome
from bench.waste_corpus import CorpusRow, format_corpus, measure_corpus
from orchestrator.config import Config, RunSettings
from orchestrator.result import RunResult
from orchestrator.runtime import Runtime
from orchestrator.scenarios.runs import run_scenario
from orchestrator.sim import Scenario, find_scenario

__all__ = [
    "DEFAULT_SCENARIOS",
    "OFF_DEADLINE_SECONDS",
    "OFF_MAX_TURNS",
    "Figures",
    "Waste",
    "format_table",
    "fuses_off",
    "main",
    "measure_waste",
]

DEFAULT_SCENARIOS: Final = (
    "dead_loop",
    "ping_pong",
    # issue #19: loops no repeat detector sees, and runs the fuses must not cost anything
    "varied_command_loop",
    "volatile_poll",
    "unknown_tool_loop",
    "poll_progress_strict.strict",
    "huge_tool_result",
    "llm_loop_check",
)
OFF_MAX_TURNS: Final = 200
"""The turn cap of a fuses-off run: what a looping model costs without loop detection."""
OFF_DEADLINE_SECONDS: Final = 3600.0
_OFF_SETTINGS: Final[dict[str, Any]] = {
    "loop_preset": "off",
    "loop": {},
    "cache_max_entries": 0,  # the result cache's hit limit is a loop fuse too
    "max_tool_calls": 100_000,  # the largest allowed
    "context_window": 10_000_000,  # the largest allowed: no blocking_limit, no collapse
}
"""Run settings of a fuses-off run. Only the keys this version's ``RunSettings`` has are
applied (a fuse added later brings its key); an off run stopped by anything but the turn
cap is reported (``reached_cap`` false), never hidden."""


class Figures(msgspec.Struct, frozen=True, kw_only=True):
    """What one run cost until it stopped."""

    exit_reason: str
    cause: str
    turns: int
    llm_requests: int
    tool_calls: int
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    seconds: float

    @classmethod
    def of(cls, result: RunResult, seconds: float) -> Figures:
        return cls(
            exit_reason=result.exit_reason.value,
            cause=result.cause,
            turns=result.turns,
            llm_requests=result.llm_requests,
            tool_calls=result.tool_calls,
            prompt_tokens=result.usage.prompt_tokens,
            completion_tokens=result.usage.completion_tokens,
            total_tokens=result.usage.total_tokens,
            seconds=round(seconds, 3),
        )


class Waste(msgspec.Struct, frozen=True, kw_only=True):
    """One scenario with its fuses on and off; ratios are off / on.

    ``reached_cap`` is true when the off run really ran to the turn cap (a scripted loop
    that repeats forever); otherwise the off run ended on its own and the ratio is smaller
    than what an endless loop would cost.
    """

    scenario: str
    on: Figures
    off: Figures
    max_turns: int
    reached_cap: bool
    requests_ratio: float
    tokens_ratio: float


def fuses_off(
    scenario: Scenario,
    *,
    max_turns: int = OFF_MAX_TURNS,
    deadline_seconds: float = OFF_DEADLINE_SECONDS,
) -> Scenario:
    """``scenario`` with loop detection off and only the turn cap left to stop it."""
    known = RunSettings.__struct_fields__
    config = {
        **scenario.config,
        **{key: value for key, value in _OFF_SETTINGS.items() if key in known},
        "max_turns": max_turns,
        "deadline_seconds": deadline_seconds,
    }
    return msgspec.structs.replace(scenario, config=config)


async def _timed(runtime: Runtime, scenario: Scenario) -> Figures:
    started = time.perf_counter()
    result = await run_scenario(runtime, scenario)
    return Figures.of(result, time.perf_counter() - started)


def _ratio(off: int, on: int) -> float:
    return round(off / on, 2) if on else float("inf")


async def measure_waste(
    scenarios: Sequence[str | Scenario] = DEFAULT_SCENARIOS,
    *,
    max_turns: int = OFF_MAX_TURNS,
    deadline_seconds: float = OFF_DEADLINE_SECONDS,
    config: Config | None = None,
) -> list[Waste]:
    """Run each scenario (a shipped name, a file or a :class:`Scenario`) with its fuses on,
    then off, one run at a time (so ``seconds`` are not skewed by each other).

    :raises ScenarioError: a name is neither a shipped scenario nor a scenario file.
    """
    chosen = [s if isinstance(s, Scenario) else find_scenario(s) for s in scenarios]
    rows: list[Waste] = []
    async with Runtime(config, scenarios=chosen) as runtime:
        for scenario in chosen:
            on = await _timed(runtime, scenario)
            off_scenario = fuses_off(
                scenario, max_turns=max_turns, deadline_seconds=deadline_seconds
            )
            off = await _timed(runtime, off_scenario)
            rows.append(
                Waste(
                    scenario=scenario.name,
                    on=on,
                    off=off,
                    max_turns=max_turns,
                    reached_cap=off.cause == "budget.max_turns" and off.turns == max_turns,
                    requests_ratio=_ratio(off.llm_requests, on.llm_requests),
                    tokens_ratio=_ratio(off.total_tokens, on.total_tokens),
                )
            )
    return rows


def format_table(rows: Sequence[Waste], out: TextIO) -> None:
    """Write one line per scenario and fuse setting, then the ratios."""
    headers = ("scenario", "fuses", "ended", "requests", "tool calls", "total tokens", "seconds")
    table: list[tuple[str, ...]] = []
    for row in rows:
        for label, figures in (("on", row.on), ("off", row.off)):
            table.append(
                (
                    row.scenario,
                    label,
                    f"{figures.exit_reason}/{figures.cause}",
                    str(figures.llm_requests),
                    str(figures.tool_calls),
                    f"{figures.total_tokens:,}",
                    f"{figures.seconds:.2f}",
                )
            )
    widths = [max(len(line[i]) for line in (headers, *table)) for i in range(len(headers))]
    for line in (headers, tuple("-" * w for w in widths), *table):
        out.write("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)))
        out.write("\n")
    out.write("\n")
    for row in rows:
        if row.reached_cap:
            note = ""
        elif row.on.exit_reason == row.off.exit_reason == "completed":
            note = " (completes either way)"
        else:
            note = f" (the off run ended before the {row.max_turns}-turn cap)"
        out.write(
            f"{row.scenario}: off/on = {row.requests_ratio:g}x model requests, "
            f"{row.tokens_ratio:g}x tokens{note}\n"
        )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.waste",
        description="Model requests and tokens a looping model costs with the loop fuses on "
        "and off.",
    )
    parser.add_argument(
        "scenarios",
        nargs="*",
        metavar="SCENARIO",
        help=f"shipped scenario names (NAME.LABEL for one run of a file with several) or "
        f"files (default: {' '.join(DEFAULT_SCENARIOS)})",
    )
    parser.add_argument(
        "--json", action="store_true", help="one JSON object per scenario (--corpus: per preset)"
    )
    parser.add_argument(
        "--corpus",
        action="store_true",
        help="report issue #32's acceptance corpus under every preset instead "
        "(SCENARIO names then pick corpus runs)",
    )
    parser.add_argument(
        "--real",
        action="store_true",
        help="the real-model tasks (SmolLM2-135M on llama-cpp-python, scripts/realmodel "
        "installs both) with the fuses on and off, instead (minutes)",
    )
    parser.add_argument(
        "--record",
        metavar="DIR",
        type=Path,
        help="with --real: also write each run to DIR as a replay input (the committed "
        "corpus is bench/real_corpus, see bench/real_corpus.py)",
    )
    parser.add_argument(
        "--preset",
        action="append",
        default=[],
        metavar="NAME",
        help="with --corpus: only this preset (repeatable; default: every preset)",
    )
    parser.add_argument(
        "--max-turns", type=int, default=OFF_MAX_TURNS, help="turn cap of the fuses-off runs"
    )
    parser.add_argument(
        "--deadline",
        type=float,
        default=OFF_DEADLINE_SECONDS,
        help="wall-clock deadline of the fuses-off runs, in seconds",
    )
    return parser


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Entry point of ``python -m bench.waste``; returns the exit status."""
    args = _parser().parse_args(argv)
    out = out or sys.stdout
    if args.max_turns < 1 or args.deadline <= 0:
        print("bench.waste: --max-turns and --deadline must be positive", file=sys.stderr)
        return 2
    if args.corpus:
        return _corpus(args, out)
    if args.real:
        return _real(args, out)
    if args.record is not None:
        print("bench.waste: --record needs --real", file=sys.stderr)
        return 2
    if args.preset:
        print("bench.waste: --preset needs --corpus", file=sys.stderr)
        return 2
    names = tuple(args.scenarios) or DEFAULT_SCENARIOS

    async def measure() -> list[Waste]:
        return await measure_waste(names, max_turns=args.max_turns, deadline_seconds=args.deadline)

    rows = anyio.run(measure)
    if args.json:
        encoder = msgspec.json.Encoder()
        for row in rows:
            out.write(encoder.encode(row).decode() + "\n")
    else:
        format_table(rows, out)
    return 0


def _corpus(args: argparse.Namespace, out: TextIO) -> int:
    presets = tuple(args.preset) or tuple(PRESETS)

    async def measure() -> tuple[list[CorpusRow], list[Outcome]]:
        return await measure_corpus(tuple(args.scenarios), presets)

    try:
        rows, outcomes = anyio.run(measure)
    except ValueError as exc:
        print(f"bench.waste: {exc}", file=sys.stderr)
        return 2
    if args.json:
        encoder = msgspec.json.Encoder()
        for row in rows:
            out.write(encoder.encode(row).decode() + "\n")
    else:
        format_corpus(rows, outcomes, out)
    return 0


def _real(args: argparse.Namespace, out: TextIO) -> int:
    from bench.waste_real import format_real, measure_real

    if args.scenarios or args.preset:
        print("bench.waste: --real takes no SCENARIO and no --preset", file=sys.stderr)
        return 2
    try:
        rows = measure_real(args.record)
    except (FileNotFoundError, RuntimeError) as exc:
        print(f"bench.waste: {exc}", file=sys.stderr)
        return 2
    if args.json:
        encoder = msgspec.json.Encoder()
        for row in rows:
            out.write(encoder.encode(row).decode() + "\n")
    else:
        format_real(rows, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
