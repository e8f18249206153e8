"""Real HTTP: client CPU per model request, loopfuse beside raw ``AsyncOpenAI`` loops.

The simulator runs in a subprocess (``loopfuse sim`` on loopback), so this process's CPU
(``time.process_time``) is the client's alone. Every workload plays the shipped
``completed`` scenario (two streamed requests per run: one ``list_dir`` call, then the
answer), with the same number of concurrent runs:

* **loopfuse**: :class:`~orchestrator.runtime.Runtime` runs pointed at the simulator, every
  monitor on, the LLM caller's own transport;
* **raw**: the same two requests per run with ``AsyncOpenAI.chat.completions.create(
  stream=True)``, chunks iterated, the tool call answered by hand;
* **lean**: the same raw loop on the LLM caller's transport path: the body encoded by
  msgspec and sent by :class:`actors.llm.transport.ChatTransport` (headers made once per
  transport, aiohttp's connection pool and C parser, the SDK's exceptions) on the caller's
  transports (:mod:`actors.llm.clients`: runs spread over a few connection pools),
  the reply read by :class:`actors.llm.stream.ChunkReader` into the caller's accumulator.
  What the HTTP stack alone costs on that path, without the caller and the runtime;
* **runtime**: the loopfuse runs again with the in-process scripted model playing the same
  scenario (no HTTP): the runtime's own share of the loopfuse figure (run start, its
  scenario folder, the tool call, every monitor). ``loopfuse - runtime`` is what the model
  client adds per request.

``python -m bench.http_client [--runs N] [--reps N] [--json]`` prints all four, the
workloads alternating within each repetition, medians over the repetitions;
``--decode`` prints only what parsing one streamed answer costs, loopfuse's way beside the
SDK's (:func:`decode_costs`, no network). ``--steady loopfuse|runtime|lean [--batches N]
[--runs K]`` runs one workload on one runtime with its connections kept (:func:`steady`: what
a daemon pays per request once its connections are open; the repetitions above open theirs
anew), for timing or for counting instructions under callgrind.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, NamedTuple

import anyio
import msgspec
import openai

from actors.llm.accumulator import ReplyAccumulator
from actors.llm.clients import Clients, tls_context
from actors.llm.settings import EndpointSettings
from actors.llm.stream import ChunkReader
from bench.loops import Sample
from bench.scripted_model import ScriptedModel, scenario_script
from orchestrator.config import Config, ModelSettings, RuntimeSettings
from orchestrator.runtime import Runtime
from orchestrator.scenarios.runs import start_scenario
from orchestrator.sim import find_scenario

__all__ = ["HttpFigures", "decode_costs", "main", "measure_http", "simulator_process", "steady"]

SCENARIO = "completed"
_LIST_DIR = {
    "type": "function",
    "function": {
        "name": "list_dir",
        "description": "List a directory.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
    },
}


class HttpFigures(NamedTuple):
    """Client CPU and wall time per request, every way (see the module docstring)."""

    loopfuse: Sample
    raw: Sample
    lean: Sample | None = None
    runtime: Sample | None = None
    reps: Mapping[str, tuple[float, ...]] | None = None
    """CPU µs per request of every repetition, per workload, in the order measured."""

    @property
    def loopfuse_us_per_request(self) -> float:
        return self.loopfuse.cpu_us_per_turn

    @property
    def raw_us_per_request(self) -> float:
        return self.raw.cpu_us_per_turn

    @property
    def lean_us_per_request(self) -> float | None:
        return None if self.lean is None else self.lean.cpu_us_per_turn

    @property
    def runtime_us_per_request(self) -> float | None:
        return None if self.runtime is None else self.runtime.cpu_us_per_turn

    @property
    def client_pairs(self) -> tuple[float, ...]:
        """Loopfuse minus its runtime alone, repetition by repetition (the two measured
        back to back, so a slow stretch of the machine weighs on both)."""
        reps = self.reps or {}
        loopfuse, runtime = reps.get("loopfuse", ()), reps.get("runtime", ())
        return tuple(a - b for a, b in zip(loopfuse, runtime, strict=False))

    @property
    def client_us_per_request(self) -> float | None:
        """What the model client adds per request: the median of :attr:`client_pairs`
        (loopfuse minus its runtime alone when the repetitions are not kept)."""
        pairs = sorted(self.client_pairs)
        if pairs:
            return pairs[len(pairs) // 2]
        runtime = self.runtime_us_per_request
        return None if runtime is None else self.loopfuse_us_per_request - runtime

    def spread(self, name: str) -> tuple[float, float] | None:
        """The lowest and highest CPU µs per request of ``name`` (a workload or
        ``"client"``) over the repetitions."""
        values = self.client_pairs if name == "client" else (self.reps or {}).get(name, ())
        return (min(values), max(values)) if values else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def simulator_process(scenarios: Sequence[str] = ()) -> Iterator[str]:
    """``loopfuse sim`` in a subprocess on loopback (serving ``scenarios``, files, beside the
    shipped ones); yields its base URL (``…/v1``) once the simulator says it listens (its
    first line of output)."""
    port = _free_port()
    code = "import sys; from orchestrator.cli import main; sys.exit(main(sys.argv[1:]))"
    extra = [arg for path in scenarios for arg in ("--scenario", path)]
    process = subprocess.Popen(
        [sys.executable, "-c", code, "sim", "--host", "127.0.0.1", "--port", str(port), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    output = process.stdout
    assert output is not None
    drain = threading.Thread(target=output.read, daemon=True)
    try:
        ready = output.readline()  # "loopfuse simulator on http://… serving …"
        if "simulator on" not in ready:
            raise RuntimeError(f"the simulator subprocess did not come up: {ready!r}")
        drain.start()  # keep reading its output (access logs): a full pipe would block it
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        process.terminate()
        process.wait(timeout=10)
        if drain.is_alive():
            drain.join(timeout=10)
        output.close()


async def _loopfuse(base_url: str, runs: int, *, scripted: bool = False) -> Sample:
    scenario = find_scenario(SCENARIO)
    config = Config(
        model=ModelSettings(base_url=base_url),
        runtime=RuntimeSettings(max_concurrent_runs=max(runs, 1)),
    )
    script = scenario_script([scenario])
    model_actor = (lambda bus: ScriptedModel(bus, script)) if scripted else None
    async with Runtime(config, model_actor=model_actor) as runtime:
        started = (time.process_time(), time.perf_counter())
        handles = [await start_scenario(runtime, scenario) for _ in range(runs)]
        results = [await handle.result() for handle in handles]
        cpu, wall = time.process_time() - started[0], time.perf_counter() - started[1]
    bad = [r for r in results if r.cause != "model.end_turn"]
    if bad:
        raise RuntimeError(f"a loopfuse run ended {bad[0].exit_reason.value}/{bad[0].cause}")
    return Sample(cpu, wall, sum(r.llm_requests for r in results))


async def _runtime(base_url: str, runs: int) -> Sample:
    return await _loopfuse(base_url, runs, scripted=True)


Turn = Callable[[Any, str, list[dict[str, Any]]], Awaitable[ReplyAccumulator]]
"""One request of a bare loop on a client (an ``AsyncOpenAI``, or the caller's ``Clients``)."""


async def _sdk_turn(
    client: openai.AsyncOpenAI, run_id: str, messages: list[dict[str, Any]]
) -> ReplyAccumulator:
    create: Any = client.chat.completions.create  # plain dicts, as a bare loop sends them
    stream = await create(
        model=SCENARIO,
        messages=messages,
        tools=[_LIST_DIR],
        stream=True,
        stream_options={"include_usage": True},
    )
    acc = ReplyAccumulator()
    async for chunk in stream:
        for choice in chunk.choices:
            delta = choice.delta
            if delta.content:
                acc.add_text(delta.content)
            for call in delta.tool_calls or ():
                function = call.function
                acc.add_tool_fragment(
                    call.index,
                    id=call.id,
                    name=function and function.name,
                    arguments=function and function.arguments,
                )
    return acc


_encode = msgspec.json.Encoder().encode


async def _lean_turn(
    clients: Clients, run_id: str, messages: list[dict[str, Any]]
) -> ReplyAccumulator:
    body = {
        "model": SCENARIO,
        "messages": messages,
        "tools": [_LIST_DIR],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    transport = clients.transport_for_run(run_id)
    response = await transport.post(_encode(body), run_id, stream=True)
    acc = ReplyAccumulator()
    reader = ChunkReader(response)
    try:
        while (batch := await reader.next_batch()) is not None:
            for chunk in batch:
                acc.feed_chunk(chunk)
    finally:
        await reader.aclose()
        await response.aclose()
    return acc


async def _bare_run(client: Any, run_id: str, task: str, turn: Turn) -> int:
    messages: list[dict[str, Any]] = [{"role": "user", "content": task}]
    requests = 0
    while True:
        requests += 1
        acc = await turn(client, run_id, messages)
        calls = acc.assemble().tool_calls
        if not calls:
            return requests
        messages.append(
            {
                "role": "assistant",
                "content": acc.text or None,
                "tool_calls": [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.name, "arguments": c.arguments},
                    }
                    for c in calls
                ],
            }
        )
        for c in calls:
            messages.append({"role": "tool", "tool_call_id": c.id, "content": "README.txt"})


async def _bare(runs: int, turn: Turn, client: Any) -> Sample:
    """``runs`` bare loops on ``client`` (closed at the end)."""
    task = find_scenario(SCENARIO).task
    counts: list[int] = []
    try:

        async def one(run_id: str) -> None:
            counts.append(await _bare_run(client, run_id, task, turn))

        started = (time.process_time(), time.perf_counter())
        async with anyio.create_task_group() as tg:
            for i in range(runs):
                tg.start_soon(one, f"run-{i}")
        cpu, wall = time.process_time() - started[0], time.perf_counter() - started[1]
    finally:
        await (client.aclose() if isinstance(client, Clients) else client.close())
    return Sample(cpu, wall, sum(counts))


async def _raw(base_url: str, runs: int) -> Sample:
    """One ``AsyncOpenAI`` client, as most code has (the process's TLS context)."""
    client = openai.AsyncOpenAI(
        base_url=base_url,
        api_key="bench",
        max_retries=0,
        http_client=openai.DefaultAsyncHttpxClient(verify=tls_context()),
    )
    return await _bare(runs, _sdk_turn, client)


async def _lean(base_url: str, runs: int) -> Sample:
    """The caller's transports: runs spread over a few connection pools."""
    return await _bare(runs, _lean_turn, Clients(EndpointSettings(base_url=base_url)))


async def steady(base_url: str, workload: str, batches: int, runs: int = 32) -> Sample:
    """``batches`` batches of ``runs`` concurrent runs of ``workload`` (``loopfuse``,
    ``runtime`` or ``lean``) on ONE runtime (or one ``Clients``), after a warm-up of two
    batches: connections are kept from batch to batch, as a daemon keeps them, so nothing
    but requests is measured (no connection set-up). Under callgrind, the instructions of
    ``batches`` = B minus those of B = 3, divided by the requests of the difference, are
    what one request costs (``--steady``)."""
    scenario = find_scenario(SCENARIO)
    if workload == "lean":
        clients = Clients(EndpointSettings(base_url=base_url))
        try:

            async def lean_batch(batch: int) -> int:
                counts: list[int] = []

                async def one(run_id: str) -> None:
                    counts.append(await _bare_run(clients, run_id, scenario.task, _lean_turn))

                async with anyio.create_task_group() as tg:
                    for i in range(runs):
                        tg.start_soon(one, f"run-{batch}-{i}")
                return sum(counts)

            for warm_up in range(2):
                await lean_batch(warm_up)
            started = (time.process_time(), time.perf_counter())
            requests = 0
            for number in range(batches):
                requests += await lean_batch(number + 2)
        finally:
            await clients.aclose()
        cpu, wall = time.process_time() - started[0], time.perf_counter() - started[1]
        return Sample(cpu, wall, requests)
    if workload not in ("loopfuse", "runtime"):
        raise ValueError(f"no steady workload {workload!r}")
    config = Config(
        model=ModelSettings(base_url=base_url),
        runtime=RuntimeSettings(max_concurrent_runs=runs),
    )
    script = scenario_script([scenario])
    scripted = workload == "runtime"
    model_actor = (lambda bus: ScriptedModel(bus, script)) if scripted else None
    async with Runtime(config, model_actor=model_actor) as runtime:

        async def runtime_batch() -> int:
            handles = [await start_scenario(runtime, scenario) for _ in range(runs)]
            return sum([(await handle.result()).llm_requests for handle in handles])

        for _ in range(2):
            await runtime_batch()
        started = (time.process_time(), time.perf_counter())
        requests = 0
        for _ in range(batches):
            requests += await runtime_batch()
        cpu, wall = time.process_time() - started[0], time.perf_counter() - started[1]
    return Sample(cpu, wall, requests)


WORKLOADS: dict[str, Callable[[str, int], Awaitable[Sample]]] = {
    "raw": _raw,
    "lean": _lean,
    "loopfuse": _loopfuse,
    "runtime": _runtime,
}


def _median(samples: list[Sample]) -> Sample:
    return sorted(samples, key=lambda s: s.cpu_us_per_turn)[len(samples) // 2]


async def measure_http(base_url: str, runs: int = 50, *, reps: int = 1) -> HttpFigures:
    """Every workload against the simulator at ``base_url``, alternating within each of
    ``reps`` repetitions; each figure is the repetition with the median CPU."""
    got: dict[str, list[Sample]] = {name: [] for name in WORKLOADS}
    for _ in range(reps):
        for name, workload in WORKLOADS.items():
            got[name].append(await workload(base_url, runs))
    return HttpFigures(
        **{name: _median(samples) for name, samples in got.items()},
        reps={name: tuple(s.cpu_us_per_turn for s in samples) for name, samples in got.items()},
    )


def _sample_stream(words: int = 20) -> bytes:
    """A streamed text answer as the simulator sends it: role, ``words`` text chunks, the
    finish chunk, the usage chunk, ``[DONE]``."""

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": "m",
            "choices": [choice],
        }

    frames: list[dict[str, Any]] = [chunk({"role": "assistant", "content": None})]
    frames += [chunk({"content": f"word{i} "}) for i in range(words)]
    frames.append(chunk({}, "stop"))
    frames.append({"id": "chatcmpl-1", "choices": [], "usage": {"prompt_tokens": 9}})
    return b"".join(b"data: " + _encode(f) + b"\n\n" for f in frames) + b"data: [DONE]\n\n"


def decode_costs(read_size: int = 300, number: int = 500) -> dict[str, float]:
    """CPU µs to turn one sample stream (:func:`_sample_stream`, cut into ``read_size``-byte
    reads) into chunk objects, three ways: loopfuse's (:class:`~actors.llm.sse.SSEDecoder`
    over bytes + msgspec), SSE lines as ``httpx2.Response.iter_lines`` splits them +
    msgspec, and the SDK's own stream (``openai.Stream`` over the same response: its SSE
    decoder, ``json.loads``, a pydantic chunk model per chunk). No network: the parsing
    alone, through public APIs only."""
    import timeit

    import httpx2
    import openai
    from openai.types.chat import ChatCompletionChunk

    from actors.llm.chunks import decode_chunk
    from actors.llm.sse import SSEDecoder

    body = _sample_stream()
    reads = [body[i : i + read_size] for i in range(0, len(body), read_size)]

    def ours() -> list[Any]:
        sse = SSEDecoder()
        payloads = [p for data in reads for p in sse.feed(data)]
        return [decode_chunk(p) for p in payloads if not p.startswith(b"[DONE]")]

    request = httpx2.Request("POST", "http://model.test/v1/chat/completions")
    client = openai.OpenAI(api_key="bench", base_url="http://model.test/v1")

    def lines() -> list[Any]:
        out: list[Any] = []
        data: list[str] = []
        for line in httpx2.Response(200, content=iter(reads)).iter_lines():
            if line.startswith("data:"):
                data.append(line[6:] if line[5:6] == " " else line[5:])
            elif not line and data:
                payload, data = "\n".join(data), []
                if not payload.startswith("[DONE]"):
                    out.append(decode_chunk(payload.encode()))
        return out

    def sdk() -> list[Any]:
        response = httpx2.Response(200, content=iter(reads), request=request)
        return list(openai.Stream(cast_to=ChatCompletionChunk, response=response, client=client))

    assert len(ours()) == len(lines()) == len(sdk())
    ways = {"loopfuse": ours, "aiter_lines": lines, "openai_sdk": sdk}
    return {
        name: min(timeit.repeat(way, number=number, repeat=5)) / number * 1e6
        for name, way in ways.items()
    }


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.http_client",
        description="Client CPU per model request over real HTTP (loopback simulator).",
    )
    parser.add_argument("--runs", type=int, default=50, help="concurrent runs (default 50)")
    parser.add_argument("--reps", type=int, default=7, help="repetitions (default 7)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--decode", action="store_true", help="only the parsing of one sample stream, 3 ways"
    )
    parser.add_argument(
        "--steady",
        choices=("loopfuse", "runtime", "lean"),
        help="only this workload, connections kept: --batches batches of --runs runs",
    )
    parser.add_argument("--batches", type=int, default=20, help="with --steady (default 20)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m bench.http_client``; returns the exit status."""
    args = _parser().parse_args(argv)
    if min(args.runs, args.reps) < 1:
        print("bench.http_client: counts must be positive", file=sys.stderr)
        return 2
    if args.steady:
        if args.batches < 1:
            print("bench.http_client: counts must be positive", file=sys.stderr)
            return 2
        with simulator_process() as url:
            sample = anyio.run(steady, url, args.steady, args.batches, args.runs)
        print(
            f"{args.steady}, connections kept, {args.batches} batches of {args.runs} runs: "
            f"{sample.cpu_us_per_turn:,.0f} µs CPU per request ({sample.turns} requests)"
        )
        return 0
    if args.decode:
        costs = decode_costs()
        if args.json:
            print(msgspec.json.encode(costs).decode())
        else:
            print("CPU µs to parse one streamed answer (24 events, 300-byte reads):")
            for name, us in costs.items():
                print(f"  {name:12} {us:8,.1f} µs")
        return 0
    with simulator_process() as url:
        anyio.run(measure_http, url, 5)  # warm-up: imports, first connections, caches
        figures = anyio.run(lambda: measure_http(url, args.runs, reps=args.reps))
    row = {
        "loopfuse_us_per_request": figures.loopfuse_us_per_request,
        "runtime_us_per_request": figures.runtime_us_per_request,
        "client_us_per_request": figures.client_us_per_request,
        "raw_openai_us_per_request": figures.raw_us_per_request,
        "lean_openai_us_per_request": figures.lean_us_per_request,
    }
    if args.json:
        print(msgspec.json.encode(row).decode())
        return 0
    print(
        f"client CPU per request, {args.runs} concurrent runs, "
        f"median (min-max) of {args.reps} alternating repetitions:"
    )
    labels = {
        "loopfuse_us_per_request": "loopfuse (runtime + LLM caller over HTTP)",
        "runtime_us_per_request": "loopfuse runtime alone (in-process model)",
        "client_us_per_request": "the model client's share (paired difference)",
        "raw_openai_us_per_request": "raw AsyncOpenAI create(stream=True)",
        "lean_openai_us_per_request": "bare loop on loopfuse's transport + stream reader",
    }
    for key, label in labels.items():
        name = key.removesuffix("_us_per_request").removesuffix("_openai")
        low, high = figures.spread(name) or (0.0, 0.0)
        print(f"  {label:50} {row[key] or 0.0:8,.0f} µs  ({low:,.0f}-{high:,.0f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
