"""``loopfuse demo``: every shipped scenario at once against the embedded simulator.

Prints a table (scenario, exit reason, cause, turns, model requests, tool calls) or, with
``--json``, one JSON object per line and scenario: ``scenario``, ``expected_exit_reason``,
``matches`` and every field of the run result except the transcript.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TextIO

import anyio
import msgspec

from orchestrator.config import Config
from orchestrator.result import RunResult, result_summary
from orchestrator.runtime import Runtime
from orchestrator.scenario_runs import expectation_mismatches, run_scenario
from orchestrator.sim import Scenario, shipped_scenarios

__all__ = ["DemoRow", "format_table", "run_demo"]


class DemoRow(msgspec.Struct, frozen=True, kw_only=True):
    """One scenario's outcome next to what it expects."""

    scenario: str
    expected_exit_reason: str
    mismatches: tuple[str, ...]
    result: RunResult

    def as_json(self) -> dict[str, object]:
        return {
            "scenario": self.scenario,
            "expected_exit_reason": self.expected_exit_reason,
            "matches": not self.mismatches,
            "mismatches": list(self.mismatches),
            **result_summary(self.result),
        }


async def run_demo(
    config: Config | None = None, scenarios: Sequence[Scenario] | None = None
) -> list[DemoRow]:
    """Run ``scenarios`` (default: every shipped one) concurrently; rows in input order."""
    chosen = list(scenarios if scenarios is not None else shipped_scenarios())
    results: dict[int, RunResult] = {}
    async with Runtime(config) as runtime:

        async def one(index: int, scenario: Scenario) -> None:
            results[index] = await run_scenario(runtime, scenario)

        async with anyio.create_task_group() as tg:
            for index, scenario in enumerate(chosen):
                tg.start_soon(one, index, scenario)
    return [
        DemoRow(
            scenario=scenario.name,
            expected_exit_reason=scenario.expect.exit_reason.value,
            mismatches=tuple(expectation_mismatches(scenario, results[index])),
            result=results[index],
        )
        for index, scenario in enumerate(chosen)
    ]


def format_table(rows: Sequence[DemoRow], out: TextIO) -> None:
    """Write the demo table for a person, then what each ending means."""
    headers = ("scenario", "exit reason", "cause", "turns", "requests", "tool calls", "as expected")
    table = [
        (
            row.scenario,
            row.result.exit_reason.value,
            row.result.cause,
            str(row.result.turns),
            str(row.result.llm_requests),
            str(row.result.tool_calls),
            "yes" if not row.mismatches else "NO: " + "; ".join(row.mismatches),
        )
        for row in rows
    ]
    widths = [max(len(line[i]) for line in (headers, *table)) for i in range(len(headers))]
    for line in (headers, tuple("-" * w for w in widths), *table):
        out.write("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)))
        out.write("\n")
    out.write("\n")
    for row in rows:
        verb = "finished" if row.result.outcome.value == "done" else "stopped"
        out.write(f"{row.scenario}: {verb} with {row.result.exit_reason.value}")
        out.write(f" ({row.result.cause}). {row.result.detail} Next: {row.result.hint}\n")
