"""``python -m bench.daemon`` at a tiny size: it drives a real ``loopfuse serve`` and reports
sane figures (never timed)."""

from __future__ import annotations

import io
import json
import os
import time

import anyio
import pytest

from bench.daemon import group_samples, main, measure_daemon, proc_cpu_seconds, report
from bench.daemon_jetstream import measure_jetstream
from tests.fleet_support import NEEDS_NATS_SERVER


def test_a_process_cpu_is_read_to_below_a_clock_tick() -> None:
    """The daemon's CPU is read from the process's CPU-time clock, the clock
    ``time.process_time`` reads for this process, not in 10 ms ticks: four runs' CPU (a few
    ms) once read as zero."""
    before = time.process_time()
    read = proc_cpu_seconds(os.getpid())
    after = time.process_time()
    assert before <= read <= after
    assert read != round(read, 2)  # not a whole number of ticks


def test_the_bench_runs_a_real_daemon_followed_and_against_a_separate_simulator() -> None:
    figures = anyio.run(
        lambda: measure_daemon(runs=4, warmup=1, in_flight=2, clients=2, follow=True, endpoint=True)
    )
    daemon = figures.daemon
    assert daemon.runs == 4
    assert len(daemon.submit_ms) == 4
    assert daemon.cpu_seconds > 0
    assert daemon.wall_seconds > 0
    assert daemon.model_requests == 8  # two per `completed` run, read from the results
    assert figures.library is not None
    assert figures.library.model_requests == 8
    assert figures.stored["events_per_run"] > 5
    assert figures.stored["events.RunFinished"] == 1.0
    endpoint = figures.endpoint_daemon
    assert endpoint is not None
    assert endpoint.model_requests >= 8
    assert endpoint.cpu_us_per_request > 0
    out = io.StringIO()
    report(figures, out)
    assert "daemon CPU per run" in out.getvalue()
    assert "per model request" in out.getvalue()


def test_the_command_line_prints_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--runs", "2", "--warmup", "0", "--in-flight", "2", "--no-library", "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["daemon"]["runs"] == 2
    assert figures["library"] is None
    assert figures["daemon"]["submit_p99_ms"] > 0


def test_samples_are_charged_to_the_innermost_loopfuse_frame() -> None:
    raw = "\n".join(
        [
            # the daemon's API calls into the store: the store's
            "process 1;run_command (orchestrator/daemon/commands.py:70);"
            "submit (orchestrator/daemon/app.py:150);flush (orchestrator/daemon/store.py:300);"
            "wait (asyncio/locks.py:200) 3",
            # nothing of loopfuse below the entry point: the event loop's
            "process 1;run_command (orchestrator/daemon/commands.py:70);"
            "_run_once (asyncio/base_events.py:1900);select (selectors.py:468) 1",
            # through the ASGI guard into h11: the HTTP server's
            "process 1;__call__ (orchestrator/daemon/app.py:97);handle (h11/_connection.py:400) 1",
            # a worker thread committing
            "thread 2;_commit (orchestrator/daemon/store.py:252) 5",
        ]
    )
    shares = group_samples(raw)
    assert shares == {
        "store (SQLite)": 0.8,
        "event loop (asyncio, anyio)": 0.1,
        "HTTP server (uvicorn, h11, starlette)": 0.1,
    }


@NEEDS_NATS_SERVER
def test_the_jetstream_bench_publishes_both_ways() -> None:
    figures = anyio.run(lambda: measure_jetstream(messages=400, size=100, window=8))
    assert set(figures) == {"serial", "pipelined"}
    for figure in figures.values():
        assert figure["messages_per_second"] > 0
        assert figure["server_cpu_us_per_message"] >= 0
