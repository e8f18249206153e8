"""The three workloads of the overhead benchmark, each timed around its runs only.

1. :func:`bare_loop`: the floor. Plain dicts, a zero-latency fake model (an ``async`` call
   that yields to the event loop once, as any I/O would), a trivial ``echo`` tool.
2. :func:`guard_loop`: the same plus a minimal guard: a SHA-256 of the tool name and the
   sorted JSON of its arguments per call, and a per-run counter of each fingerprint.
3. :func:`loopfuse_loop`: the same workload through a :class:`~orchestrator.runtime.Runtime`
   with every monitor on (loop monitor ``strict``, budget, context gatekeeper, progress,
   metrics recorder, the runtime's event log) and the in-process scripted model; with
   ``events=True`` also an event recorder (an observer that encodes every bus message, as
   the daemon's recorder does before it writes).

Every run is ``turns`` model calls: ``turns - 1`` of them ask for one ``echo`` call with
new arguments, the last answers in text. Each function returns a :class:`Sample`.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import anyio
from anyio.abc import TaskStatus

from actors.tools import Tool, ToolContext, default_registry
from bench.scripted_model import ECHO_TOOL, ScriptedModel, echo_script
from bus import ENCODER, Bus, Message, for_the_log
from orchestrator.config import Config, RuntimeSettings, TracingSettings
from orchestrator.runtime import ModelActor, RunSpec, Runtime

__all__ = [
    "Sample",
    "bare_loop",
    "bench_overrides",
    "bench_runtime",
    "echo_tool",
    "guard_loop",
    "loopfuse_loop",
]


class Sample(NamedTuple):
    """One timed repetition: CPU and wall seconds, and the model turns it ran."""

    cpu_seconds: float
    wall_seconds: float
    turns: int

    @property
    def cpu_us_per_turn(self) -> float:
        return self.cpu_seconds / self.turns * 1e6

    @property
    def wall_us_per_turn(self) -> float:
        return self.wall_seconds / self.turns * 1e6


class _Clock:
    def __init__(self) -> None:
        self.cpu = time.process_time()
        self.wall = time.perf_counter()

    def sample(self, turns: int) -> Sample:
        return Sample(time.process_time() - self.cpu, time.perf_counter() - self.wall, turns)


# ------------------------------------------------------------------ the bare loop


async def _bare_run(turns: int, guard: bool) -> int:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Echo the steps."}]
    seen: dict[str, int] = {}
    done = 0
    assistants = 0
    while True:
        assistants += 1
        reply = await _fake_model_fast(assistants, turns)
        done += 1
        messages.append(reply)
        calls = reply.get("tool_calls")
        if not calls:
            return done
        for call in calls:
            function = call["function"]
            arguments = json.loads(function["arguments"])
            if guard:
                key = function["name"] + json.dumps(arguments, sort_keys=True)
                fingerprint = hashlib.sha256(key.encode()).hexdigest()
                seen[fingerprint] = seen.get(fingerprint, 0) + 1
                if seen[fingerprint] > 3:
                    return done
            messages.append(
                {"role": "tool", "tool_call_id": call["id"], "content": arguments["text"]}
            )


async def _fake_model_fast(turn: int, turns: int) -> dict[str, Any]:
    await asyncio.sleep(0)  # one trip through the event loop, as a real reply would take
    if turn >= turns:
        return {"role": "assistant", "content": "done"}
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": f"call_{turn}",
                "function": {"name": ECHO_TOOL, "arguments": f'{{"text":"step {turn}"}}'},
            }
        ],
    }


async def _plain(runs: int, turns: int, guard: bool) -> Sample:
    counts: list[int] = []

    async def one() -> None:
        counts.append(await _bare_run(turns, guard))

    clock = _Clock()
    async with anyio.create_task_group() as tg:
        for _ in range(runs):
            tg.start_soon(one)
    return clock.sample(sum(counts))


async def bare_loop(runs: int, turns: int) -> Sample:
    """``runs`` concurrent bare runs of ``turns`` turns."""
    return await _plain(runs, turns, guard=False)


async def guard_loop(runs: int, turns: int) -> Sample:
    """``runs`` concurrent bare runs with the minimal guard."""
    return await _plain(runs, turns, guard=True)


# ------------------------------------------------------------------ loopfuse


def _echo(arguments: dict[str, Any], ctx: ToolContext) -> str:
    return str(arguments.get("text", ""))


async def _echo_async(arguments: dict[str, Any], ctx: ToolContext) -> str:
    return str(arguments.get("text", ""))


def echo_tool(*, asynchronous: bool = False) -> Tool[dict[str, Any]]:
    """The trivial ``echo`` tool: returns its ``text`` argument. A plain function, as the
    bare loop's inline code is: the executor answers it inside its handler, no task switch.
    ``asynchronous=True``: the same as an ``async def``, run by a pooled worker task."""
    return Tool.from_json_schema(
        ECHO_TOOL,
        "Return the text it is given.",
        {"type": "object", "properties": {"text": {"type": "string"}}},
        _echo_async if asynchronous else _echo,
    )


class _Encoding:
    """An event recorder without the disk: encodes every bus message, as the daemon's does."""

    def __init__(self, bus: Bus) -> None:
        self._bus = bus
        self.encoded = 0

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        sub = self._bus.subscribe(name="bench_event_recorder")
        task_status.started()
        await sub.serve(self._record)

    def _record(self, msg: Message) -> None:
        self.encoded += len(ENCODER.encode(for_the_log(msg)))


def bench_runtime(
    runs: int,
    turns: int,
    model: Callable[[Bus], ModelActor] | None = None,
    *,
    async_tool: bool = False,
    tracing: bool = False,
) -> Runtime:
    """A runtime with every monitor on, the echo tool and ``model`` (default: the scripted
    model playing :func:`~bench.scripted_model.echo_script`); with ``tracing``, spans of
    every run go through the SDK's batch queue and thread to an exporter that discards
    them (what tracing costs loopfuse, without a backend's network)."""
    tools = default_registry()
    tools.add(echo_tool(asynchronous=async_tool))
    config = Config(
        runtime=RuntimeSettings(max_concurrent_runs=max(runs, 1)),
        tracing=TracingSettings(enabled=tracing),
    )
    script = echo_script(turns)
    return Runtime(
        config,
        tools=tools,
        model_actor=model or (lambda bus: ScriptedModel(bus, script)),
        span_exporter=_discarding_exporter() if tracing else None,
    )


def _discarding_exporter() -> Any:
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    class Discard(SpanExporter):
        def export(self, spans: object) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    return Discard()


def bench_overrides(turns: int) -> dict[str, Any]:
    """Run settings of the workload: the echo tool, budgets out of the way."""
    return {
        "model": "scripted",
        "tools": [ECHO_TOOL],
        "loop_preset": "strict",
        "max_turns": turns + 1,
        "max_tool_calls": turns + 1,
    }


async def loopfuse_loop(
    runs: int,
    turns: int,
    *,
    events: bool = False,
    async_tool: bool = False,
    tracing: bool = False,
) -> Sample:
    """``runs`` concurrent loopfuse runs of ``turns`` turns (setup not timed); with
    ``async_tool``, the echo tool is an ``async def``; with ``tracing``, OpenTelemetry
    spans of every run (to an exporter that discards them).

    :raises RuntimeError: a run did not end as the workload expects (completed)."""
    runtime = bench_runtime(runs, turns, async_tool=async_tool, tracing=tracing)
    overrides = bench_overrides(turns)
    async with anyio.create_task_group() as tg:
        if events:  # its subscription closes with the runtime's bus
            await tg.start(_Encoding(runtime.bus).run)
        async with runtime:
            clock = _Clock()
            handles = [
                await runtime.start(RunSpec(task="Echo the steps.", overrides=overrides))
                for _ in range(runs)
            ]
            results = [await handle.result() for handle in handles]
            sample = clock.sample(sum(result.llm_requests for result in results))
    for result in results:
        if result.cause != "model.end_turn" or result.turns != turns:
            raise RuntimeError(
                f"bench run ended {result.exit_reason.value}/{result.cause} after "
                f"{result.turns} turns (expected model.end_turn after {turns})"
            )
    return sample
