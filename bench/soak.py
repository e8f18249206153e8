"""Soak: a real ``loopfuse serve`` process under a steady mixed load for a set time.

    python -m bench.soak [--duration SECONDS] [--rate RUNS_PER_SECOND] [--json]

Starts the daemon (embedded simulator, a temporary store) as a child process, submits
``--rate`` runs a second of a mix of quick shipped scenarios for ``--duration`` seconds,
follows every run's event stream to its end, and samples the daemon's resident memory
(``/proc/<pid>/status`` ``VmRSS``) every ``--sample`` seconds. It reports:

- memory over time, and its growth from the end of the warm-up to the end of the load
  (mean of the first and of the last quarter of the samples after ``--warmup``);
- event latency percentiles: submit accepted → first event (``RunStarted``) streamed,
  consecutive events of a run as the client receives them, and ``RunFinished`` → ``end``
  (the result stored);
- that every accepted run ended (status ``ended``, an exit reason) after the load stops.

Linux only (``/proc``). Not a test: figures depend on the machine; see bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import anyio
import httpx

from orchestrator.daemon.client import DaemonClient

__all__ = ["SoakReport", "main", "soak"]

MIX = ("completed", "max_turns", "path_escape", "max_tool_calls", "api_down", "dead_loop")


@dataclass
class SoakReport:
    """What one soak measured (seconds, KiB)."""

    duration_seconds: float
    rate: float
    accepted: int = 0
    ended: int = 0
    not_ended: list[str] = field(default_factory=list)
    exit_reasons: dict[str, int] = field(default_factory=dict)
    memory_kib: list[tuple[float, int]] = field(default_factory=list)
    memory_growth_kib: int = 0
    first_event: dict[str, float] = field(default_factory=dict)
    event_gap: dict[str, float] = field(default_factory=dict)
    result_stored: dict[str, float] = field(default_factory=dict)


def _percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 2)

    return {
        "n": len(values),
        "p50_ms": at(0.5),
        "p95_ms": at(0.95),
        "p99_ms": at(0.99),
        "max_ms": at(1.0),
    }


def _rss_kib(pid: int) -> int:
    text = Path(f"/proc/{pid}/status").read_text()
    found = re.search(r"VmRSS:\s+(\d+) kB", text)
    return int(found[1]) if found else 0


@contextmanager
def _daemon(folder: Path) -> Iterator[tuple[subprocess.Popen[str], str]]:
    config = folder / "loopfuse.toml"
    config.write_text(
        "[runtime]\nmax_concurrent_runs = 64\n\n"
        f"[daemon]\nstore_path = {json.dumps(str(folder / 'daemon.db'))}\nqueue_size = 10000\n",
        encoding="utf-8",
    )
    with (folder / "daemon.log").open("a", encoding="utf-8") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "orchestrator", "serve", "--config", str(config), "--port", "0"],
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", "TMPDIR": str(folder)},
        )
    try:
        assert process.stdout is not None
        banner = process.stdout.readline()
        found = re.search(r"listening on (\S+)", banner)
        if not found:
            raise RuntimeError(f"the daemon did not start: {banner!r}")
        yield process, found[1]
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()


async def soak(
    duration: float = 60.0, rate: float = 10.0, *, sample: float = 1.0, warmup: float = 10.0
) -> SoakReport:
    """Run the soak and return its report."""
    report = SoakReport(duration_seconds=duration, rate=rate)
    first: list[float] = []
    gaps: list[float] = []
    stored: list[float] = []
    with (
        tempfile.TemporaryDirectory(prefix="loopfuse-soak-") as name,
        _daemon(Path(name)) as (
            process,
            url,
        ),
    ):
        async with DaemonClient(url, timeout=120) as client:
            accepted: list[str] = []
            start = time.monotonic()

            async def follow(index: int) -> None:
                body = {"scenario": MIX[index % len(MIX)], "idempotency_key": f"soak-{index}"}
                for attempt in range(3):
                    try:
                        run_id = (await client.submit(body))["id"]
                        break
                    except httpx.TransportError:
                        if attempt == 2:
                            raise
                accepted.append(run_id)
                submitted = last = time.monotonic()
                finished_at: float | None = None
                async for event in client.events(run_id):
                    now = time.monotonic()
                    if event.event == "message":
                        if last == submitted:
                            first.append(now - submitted)
                        else:
                            gaps.append(now - last)
                        if json.loads(event.data).get("type") == "RunFinished":
                            finished_at = now
                        last = now
                    elif event.event == "end" and finished_at is not None:
                        stored.append(now - finished_at)

            async def sampler() -> None:
                while True:
                    report.memory_kib.append(
                        (round(time.monotonic() - start, 1), _rss_kib(process.pid))
                    )
                    await anyio.sleep(sample)

            async with anyio.create_task_group() as outer:
                outer.start_soon(sampler)
                async with anyio.create_task_group() as tg:
                    index = 0
                    while time.monotonic() - start < duration:
                        tg.start_soon(follow, index)
                        index += 1
                        next_at = start + index / rate
                        await anyio.sleep(max(0.0, next_at - time.monotonic()))
                outer.cancel_scope.cancel()
            report.accepted = len(accepted)
            ended: dict[str, str] = {}
            cursor: str | None = None
            while True:  # the listing, a page at a time (one GET per run is slow)
                query: dict[str, str | int] = {"limit": 500, "status": "ended"}
                if cursor is not None:
                    query["cursor"] = cursor
                page = await client.runs(**query)
                ended.update((run["id"], str(run["exit_reason"])) for run in page["runs"])
                cursor = page["next_cursor"]
                if cursor is None:
                    break
            for run_id in accepted:
                if run_id in ended:
                    report.ended += 1
                    reason = ended[run_id]
                    report.exit_reasons[reason] = report.exit_reasons.get(reason, 0) + 1
                else:
                    report.not_ended.append(run_id)
    warm = [kib for at, kib in report.memory_kib if at >= warmup]
    if len(warm) >= 4:
        quarter = len(warm) // 4
        report.memory_growth_kib = int(
            statistics.mean(warm[-quarter:]) - statistics.mean(warm[:quarter])
        )
    report.first_event = _percentiles(first)
    report.event_gap = _percentiles(gaps)
    report.result_stored = _percentiles(stored)
    return report


def _print(report: SoakReport) -> None:
    print(f"soak: {report.duration_seconds:g} s at {report.rate:g} runs/s")
    print(f"runs: {report.accepted} accepted, {report.ended} ended, {len(report.not_ended)} not")
    print(f"exit reasons: {report.exit_reasons}")
    series = report.memory_kib
    step = max(1, len(series) // 12)
    print(
        "memory (s: MiB): " + ", ".join(f"{at:g}: {kib / 1024:.1f}" for at, kib in series[::step])
    )
    print(f"memory growth after warm-up: {report.memory_growth_kib / 1024:+.1f} MiB")
    for label, figures in (
        ("accepted -> first event", report.first_event),
        ("between events of a run", report.event_gap),
        ("RunFinished -> result stored", report.result_stored),
    ):
        print(f"{label}: {figures}")


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.soak``; exit 1 if an accepted run did not end."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.soak", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of load (60)")
    parser.add_argument("--rate", type=float, default=10.0, help="runs submitted a second (10)")
    parser.add_argument("--sample", type=float, default=1.0, help="memory sample period (1 s)")
    parser.add_argument("--warmup", type=float, default=10.0, help="seconds before growth counts")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    report = anyio.run(
        lambda: soak(args.duration, args.rate, sample=args.sample, warmup=args.warmup)
    )
    if args.json:
        print(json.dumps(asdict(report), indent=2))
    else:
        _print(report)
    return 0 if not report.not_ended and report.ended == report.accepted else 1


if __name__ == "__main__":
    raise SystemExit(main())
