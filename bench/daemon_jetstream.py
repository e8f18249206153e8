"""``python -m bench.daemon_jetstream``: what one JetStream server stores of run events here.

Starts ``nats-server -js`` (file store, in a temporary folder, one node: stream replicas 1)
and publishes events the way a fleet member does (:class:`orchestrator.cluster.publisher.
EventPublisher`): to ``bench.run.<id>.events`` in one limits-retention stream, each with a
``Nats-Msg-Id`` and a type header, payload ``--size`` bytes (default: the mean stored event
of a ``completed`` run, from ``bench.daemon``). Two ways:

* **serial**: one publish at a time, each waiting for its ack (what the fleet's publisher
  does today: one subscriber publishes every run's messages in bus order);
* **pipelined**: ``--window`` publishes in flight at once (acks awaited concurrently).

Reported: messages/s, MB/s, and the CPU of nats-server and of this (the client's) process
per message, from ``/proc``. Numbers for ``docs/scale-out.md``; never a test.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any, Final

import anyio
import msgspec
import nats
from nats.js.api import StorageType, StreamConfig

from bench.daemon import proc_cpu_seconds

__all__ = ["main", "measure_jetstream"]

STREAM: Final = "BENCH_EVENTS"
RUNS: Final = 1000
"""Distinct run subjects the messages are spread over."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _serial(js: Any, payload: bytes, count: int) -> None:
    for n in range(count):
        await js.publish(
            f"bench.run.{n % RUNS}.events",
            payload,
            stream=STREAM,
            headers={"Nats-Msg-Id": f"s:{n}", "Loopfuse-Type": "ModelReply"},
        )


async def _pipelined(js: Any, payload: bytes, count: int, window: int) -> None:
    next_n = 0

    async def worker() -> None:
        nonlocal next_n
        while next_n < count:
            n = next_n
            next_n += 1
            await js.publish(
                f"bench.run.{n % RUNS}.events",
                payload,
                stream=STREAM,
                headers={"Nats-Msg-Id": f"p:{n}", "Loopfuse-Type": "ModelReply"},
            )

    async with anyio.create_task_group() as tg:
        for _ in range(window):
            tg.start_soon(worker)


def _start(server: str, folder: str, port: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [server, "-js", "-sd", folder, "-a", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


async def _quiet(error: Exception) -> None:
    """nats-py reports a refused connect before the server listens: not an error here."""


async def measure_jetstream(
    *, messages: int = 20_000, size: int = 700, window: int = 64
) -> dict[str, dict[str, float]]:
    """Serial and pipelined publishing against a fresh one-node JetStream server."""
    server = shutil.which("nats-server")
    if server is None:
        raise RuntimeError("nats-server is not installed")
    port = _free_port()
    payload = b"x" * size
    figures: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-js-") as folder:
        process = _start(server, folder, port)
        try:
            nc = None
            for _ in range(100):
                try:
                    nc = await nats.connect(
                        f"nats://127.0.0.1:{port}",
                        connect_timeout=1,
                        allow_reconnect=False,
                        error_cb=_quiet,
                    )
                    break
                except Exception:  # not listening yet
                    await anyio.sleep(0.05)
            assert nc is not None, "nats-server did not come up"
            js = nc.jetstream()
            await js.add_stream(
                StreamConfig(
                    name=STREAM,
                    subjects=["bench.run.*.events"],
                    storage=StorageType.FILE,
                    duplicate_window=120.0,
                )
            )
            await _serial(js, payload, 200)  # warm-up
            for name in ("serial", "pipelined"):
                count = messages if name == "pipelined" else messages // 4
                server_cpu, client_cpu = proc_cpu_seconds(process.pid), time.process_time()
                began = time.perf_counter()
                if name == "serial":
                    await _serial(js, payload, count)
                else:
                    await _pipelined(js, payload, count, window)
                wall = time.perf_counter() - began
                figures[name] = {
                    "messages": count,
                    "messages_per_second": count / wall,
                    "mb_per_second": count * size / wall / 1e6,
                    "server_cpu_us_per_message": 1e6
                    * (proc_cpu_seconds(process.pid) - server_cpu)
                    / count,
                    "client_cpu_us_per_message": 1e6 * (time.process_time() - client_cpu) / count,
                }
            await nc.close()
        finally:
            process.terminate()
            process.wait(timeout=10)
    return figures


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.daemon_jetstream", description=__doc__)
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--size", type=int, default=700, help="payload bytes")
    parser.add_argument("--window", type=int, default=64, help="pipelined publishes in flight")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    figures = anyio.run(
        lambda: measure_jetstream(messages=args.messages, size=args.size, window=args.window)
    )
    if args.json:
        sys.stdout.write(msgspec.json.encode(figures).decode() + "\n")
        return 0
    cpus = os.cpu_count()
    print(f"JetStream, one node, file store, {args.size} B payloads ({cpus} CPUs here):")
    for name, f in figures.items():
        print(
            f"  {name:9s} {f['messages_per_second']:9.0f} msg/s  {f['mb_per_second']:6.1f} MB/s  "
            f"nats-server {f['server_cpu_us_per_message']:5.1f} µs/msg, "
            f"client {f['client_cpu_us_per_message']:5.1f} µs/msg"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
