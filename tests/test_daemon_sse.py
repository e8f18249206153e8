"""Event streams: ids, resumption without gaps or duplicates, heartbeats, replay from the store."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import httpx
import pytest
from starlette.types import Message

from orchestrator.daemon import open_daemon, sse
from orchestrator.daemon.client import DaemonClient
from tests.daemon_support import daemon_config, events_until, wait_ended, write_slow


@pytest.mark.asyncio
async def test_last_event_id_resumes_a_live_stream_without_gaps_or_duplicates(
    tmp_path: Path,
) -> None:
    config = daemon_config(tmp_path, scenarios=(write_slow(tmp_path, max_turns=4, latency=0.05),))
    async with open_daemon(config) as running, DaemonClient(running.url) as client:
        run_id = (await client.submit({"scenario": "slow"}))["id"]
        with anyio.fail_after(30):
            first = await events_until(client, run_id, lambda e: e["type"] == "ModelRequest")
            # The client drops the connection here; the run goes on without it.
            rest = await events_until(
                client, run_id, lambda e: e["type"] == "RunFinished", after=first[-1]["id"]
            )
            whole = await events_until(client, run_id, lambda e: e["type"] == "RunFinished")
    assert [e["id"] for e in first + rest] == list(range(1, len(first) + len(rest) + 1))
    assert first + rest == whole
    assert whole[-1]["type"] == "RunFinished"


@pytest.mark.asyncio
async def test_after_query_and_header_resume_an_ended_run(tmp_path: Path) -> None:
    async with open_daemon(daemon_config(tmp_path)) as running:
        async with DaemonClient(running.url) as client:
            run_id = (await client.submit({"scenario": "max_turns"}))["id"]
            with anyio.fail_after(20):
                last = (await wait_ended(client, run_id))["events"]
        async with httpx.AsyncClient(base_url=running.url) as http:
            by_query = await http.get(f"/v1/runs/{run_id}/events?after={last - 3}")
            by_header = await http.get(
                f"/v1/runs/{run_id}/events?after=1", headers={"Last-Event-ID": str(last - 2)}
            )
            past_end = await http.get(f"/v1/runs/{run_id}/events?after=999")
            bad = await http.get(f"/v1/runs/{run_id}/events?after=-1")
    assert by_query.headers["content-type"].startswith("text/event-stream")
    assert by_query.headers["x-accel-buffering"] == "no"
    ids = [line for line in by_query.text.splitlines() if line.startswith("id:")]
    assert ids == [f"id: {last - 2}", f"id: {last - 1}", f"id: {last}"]
    assert by_query.text.startswith("retry: 3000")
    assert "event: end" in by_query.text
    end = by_query.text.split("event: end\ndata: ")[1].splitlines()[0]
    assert json.loads(end) == {
        "id": run_id,
        "status": "ended",
        "exit_reason": "max_turns",
        "last_event_id": last,
        "events_dropped": 0,
    }
    # The header wins over the query (a browser's reconnect carries it).
    assert [line for line in by_header.text.splitlines() if line.startswith("id:")] == [
        f"id: {last - 1}",
        f"id: {last}",
    ]
    assert "id:" not in past_end.text
    assert "event: end" in past_end.text
    assert bad.status_code == 400


@pytest.mark.asyncio
async def test_heartbeats_while_a_run_waits(tmp_path: Path) -> None:
    config = daemon_config(
        tmp_path, concurrent=1, heartbeat_seconds=0.05, scenarios=(write_slow(tmp_path),)
    )
    async with open_daemon(config) as running, DaemonClient(running.url) as client:
        busy = (await client.submit({"scenario": "slow"}))["id"]
        waiting = (await client.submit({"scenario": "slow"}))["id"]
        with anyio.fail_after(10):
            async for event in client.events(waiting, pings=True):
                if event.event == "ping":
                    break
                raise AssertionError(f"a queued run has no events yet: {event}")
        status = (await client.run(waiting))["status"]
        for run_id in (busy, waiting):
            await client.abort(run_id)
    assert status == "queued"


@pytest.mark.asyncio
async def test_an_ended_run_replays_from_the_store_after_a_restart(tmp_path: Path) -> None:
    config = daemon_config(tmp_path)
    async with open_daemon(config) as running, DaemonClient(running.url) as client:
        run_id = (await client.submit({"scenario": "path_escape"}))["id"]
        with anyio.fail_after(20):
            before = await events_until(client, run_id, lambda e: e["type"] == "RunFinished")
    async with open_daemon(config) as running, DaemonClient(running.url) as client:
        with anyio.fail_after(20):
            after = await events_until(client, run_id, lambda e: e["type"] == "RunFinished")
            run = await client.run(run_id)
    assert after == before
    assert run["exit_reason"] == "completed"


@pytest.mark.asyncio
async def test_the_event_cap_keeps_the_first_events_and_the_ending(tmp_path: Path) -> None:
    config = daemon_config(tmp_path, event_cap=5)
    async with open_daemon(config) as running, DaemonClient(running.url) as client:
        run_id = (await client.submit({"scenario": "max_turns"}))["id"]
        with anyio.fail_after(20):
            events = await events_until(client, run_id, lambda e: e["type"] == "RunFinished")
            run = await wait_ended(client, run_id)
    assert [e["id"] for e in events] == [1, 2, 3, 4, 5, 6]
    assert events[-1]["type"] == "RunFinished"
    assert run["events_dropped"] >= 20  # max_turns stores about 30 events uncapped
    assert run["exit_reason"] == "max_turns"  # the cap limits what is kept, not the run


@pytest.mark.asyncio
async def test_a_client_that_never_reads_does_not_slow_the_run(tmp_path: Path) -> None:
    async with (
        open_daemon(daemon_config(tmp_path)) as running,
        DaemonClient(running.url) as client,
        httpx.AsyncClient(base_url=running.url, timeout=None) as stalled,
    ):
        run_id = (await client.submit({"scenario": "long_legit_read"}))["id"]
        # Open the stream, read its headers, and read nothing more until the run has ended.
        async with stalled.stream("GET", f"/v1/runs/{run_id}/events") as response:
            assert response.status_code == 200
            with anyio.fail_after(30):
                run = await wait_ended(client, run_id)
                late = [line async for line in response.aiter_lines() if line.startswith("id:")]
    assert run["exit_reason"] == "completed"
    assert run["events"] > 50
    assert late == [f"id: {n}" for n in range(1, run["events"] + 1)]  # and it still gets it all


@pytest.mark.asyncio
async def test_a_stream_stops_when_its_client_goes_away_before_the_run_ends() -> None:
    """The frames stop at the client's ``http.disconnect``, though the run (here: a stream
    whose next frame never comes) goes on; no last body is sent to a client that left."""
    sent: list[Message] = []
    first_frame, gone, never = anyio.Event(), anyio.Event(), anyio.Event()
    counted: list[int] = []
    closed = anyio.Event()

    async def frames() -> AsyncIterator[bytes]:
        try:
            yield b"retry: 3000\n\n"
            await never.wait()
            yield b"id: 1\ndata: {}\n\n"
        finally:
            closed.set()

    requests: list[Message] = [{"type": "http.request", "body": b"", "more_body": False}]

    async def receive() -> Message:
        if requests:
            return requests.pop()
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)
        if message.get("body"):
            first_frame.set()

    response = sse.EventStreamResponse(frames(), heartbeat=3600.0, opened=counted.append)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            group.start_soon(response, {"type": "http"}, receive, send)
            await first_frame.wait()
            assert counted == [1]
            gone.set()
        await closed.wait()
    assert counted == [1, -1]
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    assert sent[1] == {"type": "http.response.body", "body": b"retry: 3000\n\n", "more_body": True}


@pytest.mark.asyncio
async def test_a_ping_follows_the_first_frame_when_nothing_else_comes() -> None:
    sent: list[bytes] = []
    pinged = anyio.Event()

    async def frames() -> AsyncIterator[bytes]:
        yield b"retry: 3000\n\n"
        await pinged.wait()
        yield b"id: 1\ndata: {}\n\n"

    async def receive() -> Message:
        await anyio.Event().wait()  # the client stays
        raise AssertionError("unreachable")

    async def send(message: Message) -> None:
        if message["type"] == "http.response.body":
            sent.append(message["body"])
            if message["body"] == sse.PING:
                pinged.set()

    response = sse.EventStreamResponse(frames(), heartbeat=0.01, opened=lambda _: None)
    with anyio.fail_after(10):
        await response({"type": "http"}, receive, send)
    assert sent[0] == b"retry: 3000\n\n"
    assert set(sent[1:-2]) == {sse.PING}
    assert sent[-2:] == [b"id: 1\ndata: {}\n\n", b""]


@pytest.mark.asyncio
async def test_the_last_frames_complete_the_body_in_the_same_write() -> None:
    sent: list[Message] = []

    async def frames() -> AsyncIterator[bytes]:
        yield b"retry: 3000\n\n"
        yield sse.Last(b"event: end\ndata: {}\n\n")

    async def receive() -> Message:
        await anyio.Event().wait()  # the client stays
        raise AssertionError("unreachable")

    async def send(message: Message) -> None:
        sent.append(message)

    response = sse.EventStreamResponse(frames(), heartbeat=3600.0, opened=lambda _: None)
    with anyio.fail_after(10):
        await response({"type": "http"}, receive, send)
    assert [(m.get("body"), m.get("more_body")) for m in sent[1:]] == [
        (b"retry: 3000\n\n", True),
        (b"event: end\ndata: {}\n\n", False),
    ]
