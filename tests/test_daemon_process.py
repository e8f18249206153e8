"""``loopfuse serve`` as a real process: kill -9 mid-run and restart, SIGTERM drain."""

from __future__ import annotations

import json
import signal
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from orchestrator.cli import main
from orchestrator.daemon.client import DaemonClient
from tests.daemon_support import daemon_process, events_until, wait_ended, write_slow

MAX_TURNS = 8


def write_config(tmp_path: Path, *, concurrent: int = 2, drain: float = 20.0) -> Path:
    scenarios = [
        write_slow(tmp_path, "slow", max_turns=MAX_TURNS, latency=0.2),
        write_slow(tmp_path, "quick", max_turns=2, latency=0.1),
        write_slow(tmp_path, "long", max_turns=1000, latency=0.2),
    ]
    path = tmp_path / "loopfuse.toml"
    path.write_text(
        f"[runtime]\nmax_concurrent_runs = {concurrent}\n\n"
        f"[daemon]\nstore_path = {json.dumps(str(tmp_path / 'daemon.db'))}\n"
        f"drain_seconds = {drain}\nscenarios = {json.dumps(scenarios)}\n",
        encoding="utf-8",
    )
    return path


async def all_events(client: DaemonClient, run_id: str) -> list[dict[str, Any]]:
    return [
        {"id": e.id, **json.loads(e.data)}
        async for e in client.events(run_id)
        if e.event == "message"
    ]


@pytest.mark.asyncio
async def test_kill_9_mid_run_then_every_accepted_run_ends_as_its_config_says(
    tmp_path: Path,
) -> None:
    config, log = write_config(tmp_path), tmp_path / "daemon.log"
    with daemon_process(config, log) as (process, url):
        async with DaemonClient(url) as client:
            resumed = (await client.submit({"scenario": "slow"}))["id"]
            ended = (await client.submit({"scenario": "slow", "config": {"on_crash": "abort"}}))[
                "id"
            ]
            queued = (await client.submit({"scenario": "slow"}))["id"]
            with anyio.fail_after(30):
                seen_resumed = await events_until(
                    client, resumed, lambda e: e["type"] == "TurnEnded" and e["turn"] >= 2
                )
                seen_ended = await events_until(
                    client, ended, lambda e: e["type"] == "ModelRequest"
                )
            assert (await client.run(queued))["status"] == "queued"
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=10)

    with daemon_process(config, log) as (_, url):
        async with DaemonClient(url) as client:
            with anyio.fail_after(60):
                runs = {
                    run_id: await wait_ended(client, run_id) for run_id in (resumed, ended, queued)
                }
            events = {run_id: await all_events(client, run_id) for run_id in runs}

    for run_id, seen in ((resumed, seen_resumed), (ended, seen_ended)):
        stored = events[run_id]
        assert stored[: len(seen)] == seen  # everything streamed before the crash is intact
        assert [e["id"] for e in stored] == list(range(1, len(stored) + 1))
        assert stored[-1]["type"] == "RunFinished"

    # Resumed from its last completed turn: the turn count goes on to max_turns.
    restarts = [e for e in events[resumed] if e["type"] == "RunStarted"]
    assert len(restarts) == 2
    assert restarts[1]["resumed_from_turn"] >= 2
    assert runs[resumed]["exit_reason"] == "max_turns"
    assert runs[resumed]["cause"] == "budget.max_turns"
    assert runs[resumed]["result"]["turns"] == MAX_TURNS

    # Its config forbids resuming: ended as an abort by the crash, visible in its events.
    assert runs[ended]["exit_reason"] in ("aborted_streaming", "aborted_tools")
    assert runs[ended]["cause"] == "abort.crash"
    crash = [e for e in events[ended] if e["type"] == "AbortRequested"]
    assert [e["source"] for e in crash] == ["crash"]

    # Queued at the crash: it never started, so it simply starts after the restart.
    assert [e.get("resumed_from_turn") for e in events[queued] if e["type"] == "RunStarted"] == [
        None
    ]
    assert runs[queued]["exit_reason"] == "max_turns"
    logged = [json.loads(line) for line in log.read_text().splitlines()]  # JSON lines only
    lines = {(entry["message"], entry.get("run_id")): entry for entry in logged}
    assert lines["run accepted", resumed]["trace_id"] == runs[resumed]["trace_id"]
    assert lines["run ended by the crash", ended]["exit_reason"] == runs[ended]["exit_reason"]
    resumes = [e for e in logged if e["message"].startswith("run resumed after turn")]
    assert [e["run_id"] for e in resumes] == [resumed]


async def _poll_until_draining(http: httpx.AsyncClient) -> httpx.Response:
    with anyio.fail_after(10):
        for _ in range(10_000):
            ready = await http.get("/readyz")
            if ready.status_code == 503:
                return ready
            await anyio.sleep(0.01)
    raise AssertionError("the daemon never said it was draining")


@pytest.mark.asyncio
async def test_sigterm_drains_then_aborts_the_rest_and_exits_0(tmp_path: Path) -> None:
    config, log = write_config(tmp_path, drain=2.0), tmp_path / "daemon.log"
    with daemon_process(config, log) as (process, url):
        async with DaemonClient(url) as client, httpx.AsyncClient(base_url=url) as http:
            quick = (await client.submit({"scenario": "quick"}))["id"]
            long = (await client.submit({"scenario": "long"}))["id"]
            with anyio.fail_after(30):
                for run_id in (quick, long):
                    await events_until(client, run_id, lambda e: e["type"] == "ModelRequest")
            process.send_signal(signal.SIGTERM)
            ready = await _poll_until_draining(http)
            refused = await http.post("/v1/runs", json={"scenario": "quick"})
        assert await anyio.to_thread.run_sync(lambda: process.wait(timeout=30)) == 0

    assert ready.json()["status"] == "draining"
    assert refused.status_code == 503
    with daemon_process(config, log) as (_, url):
        async with DaemonClient(url) as client:
            finished, aborted = await client.run(quick), await client.run(long)
    assert finished["status"] == aborted["status"] == "ended"
    assert finished["cause"] == "budget.max_turns"  # it finished within the drain
    assert aborted["exit_reason"] in ("aborted_streaming", "aborted_tools")
    assert aborted["cause"] == "abort.shutdown"


@pytest.mark.asyncio
async def test_a_second_signal_exits_at_once_and_the_store_survives(tmp_path: Path) -> None:
    config, log = write_config(tmp_path, drain=30.0), tmp_path / "daemon.log"
    with daemon_process(config, log) as (process, url):
        async with DaemonClient(url) as client, httpx.AsyncClient(base_url=url) as http:
            long = (await client.submit({"scenario": "long", "config": {"on_crash": "abort"}}))[
                "id"
            ]
            with anyio.fail_after(30):
                await events_until(client, long, lambda e: e["type"] == "ModelRequest")
            process.send_signal(signal.SIGTERM)
            await _poll_until_draining(http)
            process.send_signal(signal.SIGTERM)
        assert await anyio.to_thread.run_sync(lambda: process.wait(timeout=10)) == 1

    with closing(sqlite3.connect(tmp_path / "daemon.db")) as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    with daemon_process(config, log) as (_, url):
        async with DaemonClient(url) as client:
            with anyio.fail_after(30):
                run = await wait_ended(client, long)
    assert run["cause"] == "abort.crash"


def test_runs_and_watch_at_a_terminal(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config, log = write_config(tmp_path), tmp_path / "daemon.log"
    with daemon_process(config, log) as (_, url):
        run_id = httpx.post(f"{url}/v1/runs", json={"scenario": "max_turns"}).json()["id"]
        assert main(["watch", run_id, "--url", url]) == 0
        watched = capsys.readouterr().out
        last = httpx.get(f"{url}/v1/runs/{run_id}").json()["events"]
        assert main(["runs", "--url", url, "--status", "ended"]) == 0
        listed = capsys.readouterr().out
        assert main(["watch", run_id, "--url", url, "--json", "--after", str(last - 3)]) == 0
        tail = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        assert main(["watch", "no-such-run", "--url", url]) == 1
        missing = capsys.readouterr().err
    lines = watched.splitlines()
    assert lines[0].split()[:2] == ["1", "RunStarted"]
    assert any(line.split()[:2] == [str(last), "RunFinished"] for line in lines)
    assert f"Stopped: run {run_id} ended with max_turns (cause budget.max_turns)." in watched
    assert "Next: Raise budget.max_turns" in watched
    assert run_id in listed
    assert "budget.max_turns" in listed
    assert [event["type"] for event in tail] == [  # the last three events
        "RunEnding",
        "Progress",
        "RunFinished",
    ]
    assert "unknown_run" in missing
