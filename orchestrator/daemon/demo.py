"""``loopfuse demo``: every shipped scenario at once, through the daemon.

It starts the daemon (loopback, a temporary store, the embedded simulator as its model),
submits every scenario through the API, follows each run live over its event stream,
reads each result back from the API, and shows a few lines of ``/metrics``. It prints a
table (scenario, exit reason, cause, turns, model requests, tool calls) or, with
``--json``, one JSON object per line and scenario: ``scenario``, ``expected_exit_reason``,
``matches`` and every field of the run result except the transcript.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Final, NamedTuple, TextIO

import anyio
import msgspec

from orchestrator.config import Config
from orchestrator.daemon import open_daemon
from orchestrator.daemon.client import DaemonClient
from orchestrator.result import RunResult, result_summary
from orchestrator.scenarios.runs import expectation_mismatches
from orchestrator.sim import Scenario, shipped_scenarios

__all__ = ["Demo", "DemoRow", "format_table", "run_demo"]

METRICS_SHOWN: Final = 10


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


class Demo(NamedTuple):
    """What ``loopfuse demo`` saw: a row per scenario, and a few lines of ``/metrics``."""

    rows: list[DemoRow]
    metrics_url: str
    metrics: list[str]


async def run_demo(
    config: Config | None = None,
    scenarios: Sequence[Scenario] | None = None,
    *,
    live: TextIO | None = None,
) -> Demo:
    """Run ``scenarios`` (default: every shipped one) concurrently through a daemon of
    their own; rows in input order. ``live`` gets a line as each followed run ends."""
    chosen = list(scenarios if scenarios is not None else shipped_scenarios())
    results: dict[int, RunResult] = {}
    with tempfile.TemporaryDirectory(prefix="loopfuse-demo-") as folder:
        # Served on loopback by the simulator, with a throw-away store, no tokens and room
        # for every run.
        config = config or Config()
        daemon = msgspec.structs.replace(
            config.daemon,
            host="127.0.0.1",
            port=0,
            store_path=str(Path(folder) / "demo.db"),
            token_env="",
            queue_size=max(config.daemon.queue_size, len(chosen)),
            scenarios=(),
        )
        model = msgspec.structs.replace(config.model, base_url=None)
        demo_config = msgspec.structs.replace(config, model=model, daemon=daemon)
        shipped = {scenario.name for scenario in shipped_scenarios()}
        extra = [scenario for scenario in chosen if scenario.name not in shipped]
        async with (
            open_daemon(demo_config, scenarios=extra) as running,
            DaemonClient(running.url) as client,
        ):

            async def follow(index: int, run_id: str) -> None:
                events = [event async for event in client.events(run_id)]
                run = await client.run(run_id)
                results[index] = msgspec.convert(run["result"], RunResult)
                if live is not None:
                    live.write(
                        f"  {chosen[index].name:<24} followed live: {len(events) - 1:>4} events,"
                        f" ended {run['exit_reason']} ({run['cause']})\n"
                    )

            submitted = [
                (await client.submit({"scenario": scenario.name}))["id"] for scenario in chosen
            ]
            async with anyio.create_task_group() as tg:
                for index, run_id in enumerate(submitted):
                    tg.start_soon(follow, index, run_id)
            metrics = _interesting(await client.metrics())
            metrics_url = f"{running.url}/metrics"
    rows = [
        DemoRow(
            scenario=scenario.name,
            expected_exit_reason=scenario.expect.exit_reason.value,
            mismatches=tuple(expectation_mismatches(scenario, results[index])),
            result=results[index],
        )
        for index, scenario in enumerate(chosen)
    ]
    return Demo(rows, metrics_url, metrics)


def _interesting(exposition: str) -> list[str]:
    """A few lines of a scrape: the daemon's own counters, then the runs by ending."""
    samples = [
        line
        for line in exposition.splitlines()
        if line.startswith("loopfuse_") and "_created" not in line and not line.endswith(" 0.0")
    ]
    first = (
        "loopfuse_runs_started_total",
        "loopfuse_daemon_runs_accepted_total",
        "loopfuse_daemon_store_commits_total",
        "loopfuse_daemon_store_events_written_total",
    )
    chosen = [line for name in first for line in samples if line.split(" ")[0] == name]
    chosen += [line for line in samples if line.startswith("loopfuse_runs_finished_total")]
    if len(chosen) < METRICS_SHOWN:
        chosen += [line for line in samples if line.startswith("loopfuse_daemon_runs_ended")]
    return chosen[:METRICS_SHOWN]


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
