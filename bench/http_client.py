"""Real HTTP: client CPU per model request, loopfuse versus a raw ``AsyncOpenAI`` loop.

The simulator runs in a subprocess (``loopfuse sim`` on loopback), so this process's CPU
(``time.process_time``) is the client's alone. Both sides play the shipped ``completed``
scenario (two streamed requests per run: one ``list_dir`` call, then the answer), with the
same number of concurrent runs:

* **loopfuse**: :class:`~orchestrator.runtime.Runtime` runs pointed at the simulator, every
  monitor on, the real ``openai`` client inside the LLM caller;
* **raw**: the same two requests per run with ``AsyncOpenAI.chat.completions.create(
  stream=True)``, chunks iterated, the tool call answered by hand.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

import anyio
import openai

from bench.loops import Sample
from orchestrator.config import Config, ModelSettings, RuntimeSettings
from orchestrator.runtime import Runtime
from orchestrator.scenario_runs import start_scenario
from orchestrator.sim import find_scenario

__all__ = ["HttpFigures", "measure_http", "simulator_process"]

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
    """Client CPU and wall time per request, both ways."""

    loopfuse: Sample
    raw: Sample

    @property
    def loopfuse_us_per_request(self) -> float:
        return self.loopfuse.cpu_us_per_turn

    @property
    def raw_us_per_request(self) -> float:
        return self.raw.cpu_us_per_turn


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def simulator_process() -> Iterator[str]:
    """``loopfuse sim`` in a subprocess on loopback; yields its base URL (``…/v1``) once
    the simulator says it listens (its first line of output)."""
    port = _free_port()
    code = "import sys; from orchestrator.cli import main; sys.exit(main(sys.argv[1:]))"
    process = subprocess.Popen(
        [sys.executable, "-c", code, "sim", "--host", "127.0.0.1", "--port", str(port)],
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


async def _loopfuse(base_url: str, runs: int) -> Sample:
    scenario = find_scenario(SCENARIO)
    config = Config(
        model=ModelSettings(base_url=base_url),
        runtime=RuntimeSettings(max_concurrent_runs=max(runs, 1)),
    )
    async with Runtime(config) as runtime:
        started = (time.process_time(), time.perf_counter())
        handles = [await start_scenario(runtime, scenario) for _ in range(runs)]
        results = [await handle.result() for handle in handles]
        cpu, wall = time.process_time() - started[0], time.perf_counter() - started[1]
    bad = [r for r in results if r.cause != "model.end_turn"]
    if bad:
        raise RuntimeError(f"a loopfuse run ended {bad[0].exit_reason.value}/{bad[0].cause}")
    return Sample(cpu, wall, sum(r.llm_requests for r in results))


async def _raw_run(client: openai.AsyncOpenAI, task: str) -> int:
    messages: list[dict[str, Any]] = [{"role": "user", "content": task}]
    requests = 0
    while True:
        requests += 1
        create: Any = client.chat.completions.create  # plain dicts, as a bare loop sends them
        stream = await create(
            model=SCENARIO,
            messages=messages,
            tools=[_LIST_DIR],
            stream=True,
            stream_options={"include_usage": True},
        )
        text: list[str] = []
        calls: dict[int, dict[str, Any]] = {}
        async for chunk in stream:
            for choice in chunk.choices:
                delta = choice.delta
                if delta.content:
                    text.append(delta.content)
                for call in delta.tool_calls or ():
                    slot = calls.setdefault(call.index, {"id": "", "name": "", "arguments": ""})
                    slot["id"] = call.id or slot["id"]
                    if call.function is not None:
                        slot["name"] += call.function.name or ""
                        slot["arguments"] += call.function.arguments or ""
        if not calls:
            return requests
        messages.append(
            {
                "role": "assistant",
                "content": "".join(text) or None,
                "tool_calls": [
                    {
                        "id": c["id"],
                        "type": "function",
                        "function": {"name": c["name"], "arguments": c["arguments"]},
                    }
                    for c in calls.values()
                ],
            }
        )
        for c in calls.values():
            messages.append({"role": "tool", "tool_call_id": c["id"], "content": "README.txt"})


async def _raw(base_url: str, runs: int) -> Sample:
    task = find_scenario(SCENARIO).task
    counts: list[int] = []
    async with openai.AsyncOpenAI(base_url=base_url, api_key="bench", max_retries=0) as client:

        async def one() -> None:
            counts.append(await _raw_run(client, task))

        started = (time.process_time(), time.perf_counter())
        async with anyio.create_task_group() as tg:
            for _ in range(runs):
                tg.start_soon(one)
        cpu, wall = time.process_time() - started[0], time.perf_counter() - started[1]
    return Sample(cpu, wall, sum(counts))


async def measure_http(base_url: str, runs: int = 50) -> HttpFigures:
    """Both clients against the simulator at ``base_url``, one after the other."""
    raw = await _raw(base_url, runs)
    return HttpFigures(loopfuse=await _loopfuse(base_url, runs), raw=raw)
