"""``python -m bench.cluster``: fleet throughput and event latency, measured.

Starts a throw-away ``nats-server``, then for 1, 2 and 3 worker daemons (subprocesses, so
they can use more than one core) submits ``--runs`` runs of a two-turn scenario whose model
answers after a fixed ``--latency``, through an API-only daemon in this process, and
reports runs per second from the first submission to the last stored end. A separate
measurement runs one worker in this process and times each event from its publication on
the worker's bus to its arrival at an event stream opened on another daemon (the path a
remote SSE client's events take): median, p95 and max, in milliseconds.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Final

import anyio

from bus import Message
from orchestrator.cluster.node import ClusterNode
from orchestrator.cluster.settings import ClusterSettings
from orchestrator.config import Config
from orchestrator.daemon.schemas import RunRequest
from orchestrator.sim import parse_scenario
from tests.nats_server import NatsServer

SCENARIO: Final = """
description = "Two turns; the model answers after a fixed latency."
task = "List the folder, then answer."

[config]
max_turns = 3

[folder]
"README.txt" = "bench\\n"

[[steps]]
latency = {latency}
tool_calls = [{{ name = "list_dir", arguments = {{ path = "." }} }}]

[[steps]]
latency = {latency}
text = "Done."

[expect]
exit_reason = "completed"
"""


def _start_workers(
    server: NatsServer, scenario_file: Path, workers: int, prefix: str
) -> list[subprocess.Popen[str]]:
    processes = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "orchestrator.cluster",
                "--nats",
                server.url,
                "--name",
                f"w{i}",
                "--scenario",
                str(scenario_file),
                "--prefix",
                prefix,
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(workers)
    ]
    for process in processes:
        assert process.stdout is not None
        process.stdout.readline()  # "ready <name>"
    return processes


SCENARIO_TEXT: list[str] = []


async def _throughput(
    server: NatsServer, scenario_file: Path, workers: int, runs: int, prefix: str
) -> float:
    settings = ClusterSettings(nats_url=server.url).named(prefix)
    scenario = parse_scenario(SCENARIO_TEXT[0], source=str(scenario_file), name="bench")
    processes = await anyio.to_thread.run_sync(
        _start_workers, server, scenario_file, workers, prefix
    )
    try:
        api = ClusterNode(Config(), settings, name="api", scenarios=[scenario], pull=False)
        async with api.running():
            watcher = await api.buckets.state.watchall(ignore_deletes=True)
            started = time.perf_counter()
            ids = {(await api.submit(RunRequest(scenario="bench")))[0].run_id for _ in range(runs)}
            ended: set[str] = set()
            async for entry in watcher:
                if entry is not None and entry.value and b'"status":"ended"' in entry.value:
                    ended.add(entry.key)
                    if ended >= ids:
                        break
            seconds = time.perf_counter() - started
            await watcher.stop()  # type: ignore[no-untyped-call]
        return runs / seconds
    finally:
        for process in processes:
            process.kill()
            process.wait()
            if process.stdout is not None:
                process.stdout.close()


async def _event_latency(server: NatsServer, scenario_file: Path, runs: int) -> list[float]:
    settings = ClusterSettings(nats_url=server.url).named("lat")
    scenario = parse_scenario(SCENARIO_TEXT[0], source=str(scenario_file), name="bench")
    worker = ClusterNode(Config(), settings, name="worker", scenarios=[scenario])
    reader = ClusterNode(Config(), settings, name="reader", scenarios=[scenario], pull=False)
    on_bus: dict[tuple[str, int], float] = {}
    counts: dict[str, int] = {}
    delays: list[float] = []
    async with worker.running(), reader.running():
        subscription = worker.runtime.bus.subscribe(name="bench_clock")

        async def clock(msg: Message) -> None:
            counts[msg.run_id] = counts.get(msg.run_id, 0) + 1
            on_bus[msg.run_id, counts[msg.run_id]] = time.perf_counter()

        async with anyio.create_task_group() as tg:
            tg.start_soon(subscription.serve, clock)
            for _ in range(runs):
                state, _ = await reader.submit(RunRequest(scenario="bench"))
                n = 0
                async for _event in reader.events(state.run_id):
                    n += 1
                    delays.append((time.perf_counter() - on_bus[state.run_id, n]) * 1000)
            tg.cancel_scope.cancel()
    return delays


async def _main(runs: int, latency: float, fleet_sizes: list[int], latency_runs: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        scenario_file = Path(tmp) / "bench.toml"
        SCENARIO_TEXT.append(SCENARIO.format(latency=latency))
        scenario_file.write_text(SCENARIO_TEXT[0])
        store = Path(tmp) / "js"
        store.mkdir()
        with NatsServer.running(store) as server:
            print(f"{runs} runs, 2 model calls each at {latency * 1000:.0f} ms latency")
            for workers in fleet_sizes:
                rate = await _throughput(server, scenario_file, workers, runs, f"b{workers}")
                print(f"  {workers} daemon(s): {rate:7.1f} runs/s")
            delays = sorted(await _event_latency(server, scenario_file, latency_runs))
            p95 = delays[int(len(delays) * 0.95)]
            print(
                f"event latency bus -> remote stream ({len(delays)} events): "
                f"median {statistics.median(delays):.2f} ms, p95 {p95:.2f} ms, "
                f"max {delays[-1]:.2f} ms"
            )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.cluster")
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--latency", type=float, default=0.05, help="model latency, seconds")
    parser.add_argument("--daemons", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--latency-runs", type=int, default=20)
    args = parser.parse_args(argv)
    anyio.run(_main, args.runs, args.latency, args.daemons, args.latency_runs)


if __name__ == "__main__":
    main()
