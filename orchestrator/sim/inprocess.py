"""The simulator's scripted model in process: scenario replies straight onto the bus, no HTTP.

A scenario that needs nothing of HTTP (:func:`plays_in_process`) is answered inside the bus
handler of its request, as the simulator and the LLM caller together answer it over
loopback: the same step (position from the conversation, tracks and branches), the same
reply (text, tool calls and their ids, finish reason, invalid arguments), the same usage
(the prompt estimated from the body the caller would send, images by their pixel size), the
same escalation of a truncated reply. Its text comes as one delta per attempt instead of
one per network read.

Everything else goes to the wire actor (the LLM caller on a bus of its own, whose answers
are forwarded in order): scenarios that ask for the wire, models that are no in-process
scenario, and a request the script cannot answer (its 400 then comes from the simulator,
word for word).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Final, Protocol

import anyio
import msgspec
from anyio.abc import TaskStatus

from actors.llm.accumulator import ReplyAccumulator
from actors.llm.settings import EndpointSettings
from actors.llm.wire import RequestShapes, ToolSchemaError, WireTools
from bus import (
    Bus,
    Message,
    ModelCancel,
    ModelError,
    ModelReply,
    ModelRequest,
    ModelTextDelta,
    Usage,
)
from orchestrator.sim.content import ContentError, request_images
from orchestrator.sim.scenario import MAIN_TRACK, Scenario, Step
from orchestrator.sim.script import locate, step_at
from orchestrator.sim.wire import build_reply, estimate_tokens

__all__ = ["InProcessModel", "WireActor", "plays_in_process"]

_INCLUDE_USAGE: Final = {"include_usage": True}
_encode = msgspec.json.Encoder().encode


class WireActor(Protocol):
    """An actor answering model requests over HTTP (the LLM caller)."""

    async def run(self, *, task_status: TaskStatus[None] = ...) -> None: ...


def plays_in_process(scenario: Scenario) -> bool:
    """Whether ``scenario`` can be played without HTTP: it does not say ``wire = true``, and
    nothing in it needs the wire: no faults, latencies, keep-alives or stream shapes in any
    step, no context window of the simulator's own (an overflow is an HTTP error), no server
    profile but OpenAI's, no abort on streamed text (it watches text arrive)."""
    if scenario.wire or scenario.context_window is not None or scenario.server != "openai":
        return False
    if scenario.abort is not None and scenario.abort.after_text_chars is not None:
        return False
    steps = (*scenario.steps, *(step for track in scenario.tracks.values() for step in track))
    return not any(_needs_wire(step) for step in steps)


def _needs_wire(step: Step) -> bool:
    return bool(
        step.faults
        or step.latency
        or step.chunk_latency
        or step.keep_alive
        or step.stream is not None
    )


class InProcessModel:
    """The model actor of a runtime without an endpoint: in-process scenarios answered at
    once, every other request handed to the wire actor (``wire``, built on a bus of its
    own; ``None``: such requests fail as ``bad_request``)."""

    def __init__(
        self,
        bus: Bus,
        scenarios: Iterable[Scenario],
        endpoint: EndpointSettings,
        *,
        wire: Callable[[Bus], WireActor] | None = None,
    ) -> None:
        self._bus = bus
        self._endpoint = endpoint
        self._scenarios = {s.name: s for s in scenarios if plays_in_process(s)}
        self._make_wire = wire
        self._wire_bus: Bus | None = None
        self._tools = WireTools()
        self._shapes = RequestShapes(endpoint)
        self.answered = 0
        """Requests answered in process."""
        self.forwarded = 0
        """Requests handed to the wire actor."""

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Answer requests until the bus subscription closes (the wire actor with it)."""
        handlers = self.handlers()
        sub = self._bus.subscribe(*handlers, name="scenario_model", inline=True)
        try:
            if self._make_wire is None:
                await sub.serve_by_type(handlers, task_status=task_status)
                return
            wire_bus = Bus()
            forward = wire_bus.subscribe(
                ModelReply, ModelError, ModelTextDelta, name="wire_forwarder"
            )
            async with anyio.create_task_group() as tg:
                tg.start_soon(forward.serve, self._bus.publish)
                await tg.start(self._make_wire(wire_bus).run)
                self._wire_bus = wire_bus
                try:
                    await sub.serve_by_type(handlers, task_status=task_status)
                finally:
                    self._wire_bus = None
                    wire_bus.close()
        finally:
            self._bus.unsubscribe(sub)

    def handlers(self) -> dict[type[Message], Callable[[Any], None]]:
        """The function of each message type the actor handles."""
        return {ModelRequest: self._request, ModelCancel: self._cancel}

    def _request(self, request: ModelRequest) -> None:
        scenario = self._scenarios.get(request.model)
        track = MAIN_TRACK
        if scenario is None and "/" in request.model:  # a pipeline stage: SCENARIO/TRACK
            name, _, track = request.model.partition("/")
            scenario = self._scenarios.get(name)
            if scenario is not None and track not in scenario.tracks:
                scenario = None
        answer = self._play(scenario, track, request) if scenario is not None else None
        if answer is None:
            self._to_wire(request)
            return
        self.answered += 1
        publish = self._bus.publish_nowait
        for msg in answer:
            publish(msg)

    def _cancel(self, msg: ModelCancel) -> None:
        if self._wire_bus is not None:  # an in-process request is never in flight
            self._wire_bus.publish_nowait(msg)

    def _to_wire(self, request: ModelRequest) -> None:
        if self._wire_bus is None:
            self._bus.publish_nowait(
                ModelError(
                    run_id=request.run_id,
                    turn=request.turn,
                    kind="bad_request",
                    message=f"no model endpoint serves {request.model!r}",
                    attempt=1,
                    final=True,
                )
            )
            return
        self.forwarded += 1
        self._wire_bus.publish_nowait(request)

    def _play(self, scenario: Scenario, track: str, request: ModelRequest) -> list[Message] | None:
        """The deltas and reply of ``request``, as the wire would give them; ``None`` when
        only the wire can answer it (an error of the simulator's)."""
        started = anyio.current_time()
        shape = self._shapes(request.model)
        try:
            params = shape.params(request, self._tools)  # the caller's body, bar the attempt's
            messages = params["messages"]
            images = request_images((m["role"], m["content"]) for m in messages)
        except (ToolSchemaError, ContentError):
            return None
        position = locate(
            scenario, ((m["role"], _text(m["content"])) for m in messages), track=track
        )
        step = step_at(scenario, position)
        if step is None or images.images < step.require_images:
            return None
        endpoint = self._endpoint
        max_tokens = request.max_tokens or endpoint.default_max_tokens
        escalate = request.escalated_max_tokens or endpoint.escalated_max_tokens
        out: list[Message] = []
        attempts = 0
        while True:
            attempts += 1
            body = dict(params)  # as the caller sends it: the simulator's prompt estimate
            if max_tokens is not None:
                body[endpoint.max_tokens_param] = max_tokens
            body["stream"] = shape.stream
            if shape.stream:
                body["stream_options"] = _INCLUDE_USAGE
            reply = build_reply(
                step,
                call_prefix=f"call_{position.replies}",
                n=position.step,
                prompt_tokens=estimate_tokens(len(_encode(body)) - images.url_chars)
                + images.tokens,
                max_tokens=max_tokens,
            )
            text = reply.full_text()
            if text:
                out.append(ModelTextDelta(run_id=request.run_id, turn=request.turn, text=text))
            if (
                reply.finish_reason == "length"
                and escalate is not None
                and attempts == 1
                and (max_tokens is None or max_tokens < escalate)
            ):
                max_tokens = escalate  # the caller's one retry with a higher output limit
                continue
            break
        acc = ReplyAccumulator()
        acc.add_text(text)
        for index, call in enumerate(reply.calls):
            acc.add_tool_fragment(index, id=call.id, name=call.name, arguments=call.arguments)
        assembled = acc.assemble()
        elapsed = anyio.current_time() - started
        out.append(
            ModelReply(
                run_id=request.run_id,
                turn=request.turn,
                text=text,
                tool_calls=assembled.tool_calls,
                finish_reason=reply.finish_reason,
                usage=Usage(
                    prompt_tokens=reply.prompt_tokens, completion_tokens=reply.completion_tokens
                ),
                attempts=attempts,
                latency_seconds=elapsed,
                ttft_seconds=elapsed if text or reply.calls else None,
                invalid_tool_calls=assembled.invalid,
            )
        )
        return out


def _text(content: Any) -> str:
    """The text of a message's content (a string or a list of parts), as the simulator
    reads it to find nudges."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""
