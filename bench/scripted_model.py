"""An in-process model actor: answers each :class:`bus.ModelRequest` at once from a script.

No HTTP, no streaming, no latency: with it, a benchmark measures loopfuse's own overhead,
and a test can run a thousand scenario runs in seconds. Plug it into a runtime with
``Runtime(model_actor=lambda bus: ScriptedModel(bus, script))``.

Two scripts come with it: :func:`echo_script` (the benchmark workload: one ``echo`` call per
turn with new arguments, then an answer) and :func:`scenario_script` (plays shipped
simulator scenarios in process, by the same rules as the simulator: position from the
conversation, reply built by the scenario's step; faults and latencies are not played).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Final, assert_never

import anyio
from anyio.abc import TaskStatus

from bus import (
    Bus,
    ExitReason,
    ModelCancel,
    ModelReply,
    ModelRequest,
    Outcome,
    RunFinished,
    ToolCall,
    Usage,
)
from orchestrator.sim import Scenario
from orchestrator.sim.script import locate, step_at
from orchestrator.sim.wire import build_reply, estimate_tokens

__all__ = [
    "ECHO_TOOL",
    "Script",
    "ScriptedModel",
    "echo_script",
    "finished_run",
    "scenario_script",
]

Script = Callable[[ModelRequest], ModelReply]
"""Turns a request into its reply (must not block)."""

ECHO_TOOL: Final = "echo"
"""The trivial tool of the benchmark workload (``bench.loops.echo_tool`` registers it)."""


class ScriptedModel:
    """The model actor: one reply per request, published from inside the handler."""

    def __init__(self, bus: Bus, script: Script) -> None:
        self._bus = bus
        self._script = script
        self.requests = 0

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Answer requests until the bus subscription closes."""
        sub = self._bus.subscribe(ModelRequest, ModelCancel, name="scripted_model")
        try:
            await sub.serve(self._handle, task_status=task_status)
        finally:
            self._bus.unsubscribe(sub)

    def _handle(self, msg: ModelRequest | ModelCancel) -> None:
        match msg:
            case ModelRequest():
                self.requests += 1
                self._bus.publish_nowait(self._script(msg))
            case ModelCancel():
                pass  # every request is answered at once: nothing is ever in flight
            case _:
                assert_never(msg)


def echo_script(turns: int) -> Script:
    """``turns - 1`` turns of one ``echo`` call each (new arguments every turn, so no loop
    fuse trips), then a text answer that ends the run. The prompt tokens reported grow with
    the transcript as an endpoint's would (about 14 per short message, plus the tool's
    schema), so the context gatekeeper sees no silent truncation."""

    def script(request: ModelRequest) -> ModelReply:
        usage = Usage(prompt_tokens=60 + 14 * len(request.messages), completion_tokens=5)
        if request.turn >= turns:
            return ModelReply(
                run_id=request.run_id,
                turn=request.turn,
                text="done",
                finish_reason="stop",
                usage=usage,
            )
        call = ToolCall(
            id=f"call_{request.turn}",
            name=ECHO_TOOL,
            arguments=f'{{"text":"step {request.turn}"}}',
        )
        return ModelReply(
            run_id=request.run_id,
            turn=request.turn,
            text="",
            tool_calls=(call,),
            finish_reason="tool_calls",
            usage=usage,
        )

    return script


def scenario_script(scenarios: Iterable[Scenario]) -> Script:
    """Plays ``scenarios`` (the request's model names one) as the simulator would, minus
    faults and latencies; prompt tokens are the prompt's characters / 4."""
    by_name = {scenario.name: scenario for scenario in scenarios}

    def script(request: ModelRequest) -> ModelReply:
        scenario = by_name[request.model]
        pairs = [(m.role, m.content or "") for m in request.messages]
        position = locate(scenario, pairs)
        step = step_at(scenario, position)
        if step is None:
            raise ValueError(f"scenario {scenario.name!r} has no step {position.step}")
        chars = sum(len(text) for _, text in pairs)
        reply = build_reply(
            step,
            position,
            prompt_tokens=estimate_tokens(chars),
            max_tokens=request.max_tokens,
        )
        calls = tuple(ToolCall(id=c.id, name=c.name, arguments=c.arguments) for c in reply.calls)
        return ModelReply(
            run_id=request.run_id,
            turn=request.turn,
            text=reply.full_text(),
            tool_calls=calls,
            finish_reason=reply.finish_reason,
            usage=Usage(
                prompt_tokens=reply.prompt_tokens, completion_tokens=reply.completion_tokens
            ),
        )

    return script


def finished_run(run_id: str, turns: int, tool_calls: int = 0) -> RunFinished:
    """A ``RunFinished`` for a run that completed after ``turns`` turns (for benchmarks that
    drive an actor with hand-made messages)."""
    return RunFinished(
        run_id=run_id,
        exit_reason=ExitReason.COMPLETED,
        cause="model.end_turn",
        outcome=Outcome.DONE,
        detail="",
        hint="",
        turns=turns,
        llm_requests=turns,
        tool_calls=tool_calls,
        usage=Usage(),
    )
