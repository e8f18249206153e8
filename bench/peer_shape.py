"""The peer harness's like-for-like ``loopfuse`` row, without the peer frameworks.

``../shared/bench-peers/peer_overhead.py`` (row ``loopfuse``) measures loopfuse as the
other frameworks are measured: one long-lived runtime with every monitor on (loop monitor
``strict``, budget, context gatekeeper, progress, metrics, event log, hooks, tool executor
with its cache), ``max_concurrent_runs`` 100,000, the fake model an actor shaped like the
LLM caller (an inline subscription handing each request to a pooled worker, which yields
once to the event loop and publishes the reply), and the harness's ``async def echo`` as a
:class:`~actors.tools.Tool` with a msgspec parameter struct. The fake decides from the
last message only; usage grows with the prompt. This module rebuilds that shape so the
budget check (``bench.budget``) can guard it; runs are sequential (R=1).
"""

from __future__ import annotations

import asyncio
import functools
import json
from typing import Any

import anyio
import msgspec
from anyio.abc import TaskStatus

from actors.tools import Tool, ToolContext, default_registry
from actors.workers import Workers
from bus import Bus, Message, ModelReply, ModelRequest, ToolCall, Usage
from orchestrator.config import Config, RuntimeSettings
from orchestrator.runtime import RunSpec, Runtime

__all__ = ["PooledFakeModel", "peer_loop", "peer_runtime"]


class EchoParams(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    n: int


async def _echo(params: EchoParams, ctx: ToolContext) -> str:
    return f"echo:{params.n}"


def _reply_to(request: ModelRequest, turns: int) -> ModelReply:
    last = request.messages[-1]
    k = int(last.content[5:]) if last.role == "tool" and last.content else 0
    usage = Usage(prompt_tokens=60 + 14 * len(request.messages), completion_tokens=5)
    if k + 1 >= turns:
        text = f"done after {turns} turns"
        return ModelReply(
            run_id=request.run_id, turn=request.turn, text=text, finish_reason="stop", usage=usage
        )
    n = k + 1
    call = ToolCall(id=f"call_{n}", name="echo", arguments=json.dumps({"n": n}))
    return ModelReply(
        run_id=request.run_id,
        turn=request.turn,
        text="",
        tool_calls=(call,),
        finish_reason="tool_calls",
        usage=usage,
    )


class PooledFakeModel:
    """The harness's fake model actor: inline subscription, one pooled worker per call."""

    def __init__(self, bus: Bus, turns: int) -> None:
        self._bus = bus
        self._turns = turns
        self._workers: Workers | None = None

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        sub = self._bus.subscribe(ModelRequest, name="fake_model", inline=True)
        try:
            async with anyio.create_task_group() as tg:
                self._workers = Workers(tg)
                task_status.started()
                try:
                    await sub.serve(self._handle)
                finally:
                    self._workers.close()
        finally:
            self._bus.unsubscribe(sub)
            self._workers = None

    def _handle(self, msg: Message) -> None:
        if isinstance(msg, ModelRequest) and self._workers is not None:
            self._workers.submit(functools.partial(self._answer, msg))

    async def _answer(self, request: ModelRequest) -> None:
        await asyncio.sleep(0)  # the harness's _model_io(): one event-loop round-trip
        self._bus.publish_nowait(_reply_to(request, self._turns))


def peer_runtime(turns: int) -> Runtime:
    """The harness's runtime: every monitor on, the async echo tool, the pooled fake."""
    tools = default_registry()
    tools.add(Tool("echo", "Echo the number back.", EchoParams, _echo))
    config = Config(runtime=RuntimeSettings(max_concurrent_runs=100_000))
    return Runtime(config, tools=tools, model_actor=lambda bus: PooledFakeModel(bus, turns))


async def peer_loop(runs: int, turns: int) -> int:
    """``runs`` runs of ``turns`` turns, one after another (R=1); returns the turns run.

    :raises RuntimeError: a run did not end as the harness asserts."""
    overrides: dict[str, Any] = {
        "model": "scripted",
        "tools": ["echo"],
        "loop_preset": "strict",
        "max_turns": turns + 1,
        "max_tool_calls": turns + 1,
    }
    done = 0
    async with peer_runtime(turns) as runtime:
        for _ in range(runs):
            handle = await runtime.start(RunSpec(task="go", overrides=overrides))
            result = await handle.result()
            if (
                result.cause != "model.end_turn"
                or result.turns != turns
                or result.tool_calls != turns - 1
            ):
                raise RuntimeError(
                    f"peer-shape run ended {result.cause} after {result.turns} turns, "
                    f"{result.tool_calls} tool calls (expected model.end_turn, {turns}, "
                    f"{turns - 1})"
                )
            done += result.turns
    return done
