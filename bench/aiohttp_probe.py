"""``python -m bench.aiohttp_probe``: the ``lean`` loop of :mod:`bench.http_client` on
``aiohttp``'s client with nothing of the transport around it (no SDK exceptions, redirects,
cookies, proxies or bounds): the measurement for issue #31 that chose ``aiohttp`` for the
transport (3.14 was measured).

The same bare loop as ``lean`` (the ``completed`` scenario, two streamed requests per run,
the body encoded by msgspec, the reply read by :class:`actors.llm.stream.ChunkReader` into
the caller's accumulator, runs spread over :data:`actors.llm.clients.SHARDS` sessions by
run id) with each request sent by an ``aiohttp.ClientSession`` (its C parser, ``llhttp``):
the fixed headers given to the session once, the run id per request, no cookie jar, no
decompression. What it leaves out of a transport (the SDK's exceptions, redirects,
cookies, proxies, bounds) costs the real transport a little more than this.

    python -m bench.aiohttp_probe [--runs 50] [--reps 3]    # CPU per request, fresh
                                                             # sessions per repetition
    python -m bench.aiohttp_probe --steady --batches N       # connections kept: for
                                                             # callgrind, as --steady lean
    python -m bench.aiohttp_probe --h11 whole|split N        # h11 alone, N cycles (below)

``--h11`` is the floor of any client on ``h11`` (``httpcore2``'s pool or ``h11`` under a
pool of one's own): :func:`h11_alone` sends one request with the transport's nine headers
and a 900-byte body through an ``h11.Connection`` and parses a 10-event chunked answer as
uvicorn sends it, in one read (``whole``) or one read per event (``split``), ``N`` times,
no socket. Under callgrind, ``N`` = 600 minus ``N`` = 100, ÷ 500, is its instructions per
request.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import anyio

from actors.llm.accumulator import ReplyAccumulator
from actors.llm.clients import SHARDS
from actors.llm.stream import ChunkReader
from bench.http_client import _LIST_DIR, SCENARIO, _bare_run, _encode, simulator_process
from orchestrator.sim import find_scenario

__all__ = ["main"]

_FIXED = {
    "Accept": "application/json",
    "Content-Type": "application/json",
    "Accept-Encoding": "identity",
    "User-Agent": "loopfuse/0",
    "Authorization": "Bearer bench",
}


class _Reply:
    """What :class:`ChunkReader` reads of an ``aiohttp.ClientResponse``."""

    http_version = "HTTP/1.1"
    request: Any = None

    def __init__(self, response: Any) -> None:
        self._response = response

    def aiter_bytes(self) -> AsyncIterator[bytes]:
        iterator: AsyncIterator[bytes] = self._response.content.iter_any()
        return iterator

    def aclose(self) -> None:
        self._response.release()


class _Sessions:
    """One ``aiohttp.ClientSession`` per shard, as ``Clients`` keeps one pool per shard."""

    def __init__(self, base_url: str) -> None:
        import aiohttp

        self._aiohttp = aiohttp
        self.url = base_url + "/chat/completions"
        self._sessions: dict[int, Any] = {}

    def session_for_run(self, run_id: str) -> Any:
        shard = hash(run_id) % SHARDS
        session = self._sessions.get(shard)
        if session is None:
            aiohttp = self._aiohttp
            session = self._sessions[shard] = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=1000),
                headers=_FIXED,
                auto_decompress=False,
                cookie_jar=aiohttp.DummyCookieJar(),
            )
        return session

    async def aclose(self) -> None:
        for session in self._sessions.values():
            await session.close()


async def _turn(
    sessions: _Sessions, run_id: str, messages: list[dict[str, Any]]
) -> ReplyAccumulator:
    body = {
        "model": SCENARIO,
        "messages": messages,
        "tools": [_LIST_DIR],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    session = sessions.session_for_run(run_id)
    response = await session.post(
        sessions.url, data=_encode(body), headers={"X-Loopfuse-Run-Id": run_id}
    )
    if response.status != 200:
        raise RuntimeError(f"the simulator answered {response.status}")
    reply = _Reply(response)
    acc = ReplyAccumulator()
    reader = ChunkReader(reply)
    try:
        while (batch := await reader.next_batch()) is not None:
            for chunk in batch:
                acc.feed_chunk(chunk)
    finally:
        await reader.aclose()
        reply.aclose()
    return acc


async def _batch(sessions: _Sessions, runs: int, prefix: str) -> int:
    task = find_scenario(SCENARIO).task
    counts: list[int] = []

    async def one(run_id: str) -> None:
        counts.append(await _bare_run(sessions, run_id, task, _turn))

    async with anyio.create_task_group() as tg:
        for i in range(runs):
            tg.start_soon(one, f"{prefix}-{i}")
    return sum(counts)


async def _fresh(base_url: str, runs: int, reps: int) -> list[float]:
    """CPU µs per request of each repetition (new sessions each, after one warm-up)."""
    figures: list[float] = []
    for rep in range(reps + 1):
        sessions = _Sessions(base_url)
        started = time.process_time()
        try:
            requests = await _batch(sessions, runs, "run")
        finally:
            await sessions.aclose()
        if rep:
            figures.append((time.process_time() - started) * 1e6 / requests)
    return figures


async def _steady(base_url: str, batches: int, runs: int) -> tuple[float, int]:
    sessions = _Sessions(base_url)
    try:
        for warm_up in range(2):
            await _batch(sessions, runs, f"run-{warm_up}")
        started = time.process_time()
        requests = 0
        for number in range(batches):
            requests += await _batch(sessions, runs, f"run-{number + 2}")
    finally:
        await sessions.aclose()
    return (time.process_time() - started) * 1e6 / requests, requests


def h11_alone(cycles: int, split: bool) -> None:
    """``cycles`` request/answer cycles of ``h11`` alone (the module docstring)."""
    import h11

    from bench.http_client import _sample_stream

    events = [event + b"\n\n" for event in _sample_stream(6).split(b"\n\n") if event]
    head = (
        b"HTTP/1.1 200 OK\r\ndate: Sat, 05 Dec 2026 13:00:00 GMT\r\nserver: uvicorn\r\n"
        b"content-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\n\r\n"
    )
    chunks = [b"%x\r\n%s\r\n" % (len(event), event) for event in events] + [b"0\r\n\r\n"]
    reads = [head, *chunks] if split else [head + b"".join(chunks)]
    headers = [
        (b"Host", b"127.0.0.1:8000"),
        *((name.encode(), value.encode()) for name, value in _FIXED.items()),
        (b"X-Loopfuse-Run-Id", b"run-1"),
        (b"traceparent", b"00-" + b"a" * 32 + b"-" + b"b" * 16 + b"-01"),
        (b"Content-Length", b"900"),
    ]
    connection = h11.Connection(h11.CLIENT)
    for _ in range(cycles):
        connection.send(h11.Request(method="POST", target="/v1/chat/completions", headers=headers))
        connection.send(h11.Data(data=b"x" * 900))
        connection.send(h11.EndOfMessage())
        for data in reads:
            connection.receive_data(data)
            while True:
                event = connection.next_event()
                if event is h11.NEED_DATA or type(event) is h11.EndOfMessage:
                    break
        connection.start_next_cycle()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m bench.aiohttp_probe``; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m bench.aiohttp_probe")
    parser.add_argument("--runs", type=int, default=50, help="concurrent runs (default 50)")
    parser.add_argument("--reps", type=int, default=3, help="repetitions (default 3)")
    parser.add_argument("--steady", action="store_true", help="connections kept (callgrind)")
    parser.add_argument("--batches", type=int, default=20, help="with --steady (default 20)")
    parser.add_argument("--h11", nargs=2, metavar=("whole|split", "N"), help="h11 alone")
    args = parser.parse_args(argv)
    if args.h11:
        h11_alone(int(args.h11[1]), args.h11[0] == "split")
        return 0
    with simulator_process() as url:
        if args.steady:
            us, requests = anyio.run(_steady, url, args.batches, args.runs)
            print(f"aiohttp lean, connections kept: {us:,.0f} µs CPU per request ({requests})")
        else:
            figures = anyio.run(_fresh, url, args.runs, args.reps)
            print(
                f"aiohttp lean, {args.runs} runs, fresh sessions per repetition: "
                + ", ".join(f"{us:,.0f}" for us in figures)
                + " µs CPU per request"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
