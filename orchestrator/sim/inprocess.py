"""The simulator's scripted model in process: scenario replies straight onto the bus, no HTTP.

A scenario that needs nothing of HTTP (:func:`plays_in_process`) is answered inside the bus
handler of its request by the simulator's rules, as the simulator and the LLM caller together
answer it over loopback (same step, reply, usage and escalation; one text delta per attempt).
A step's ``latency`` is waited in process unless the wait would reach the caller's read
timeout, its call deadline or the request's ``deadline_at``. Everything else goes to the wire
actor (the LLM caller on a bus of its own, whose answers are forwarded in order). The rules:
``docs/scenarios.md`` ("In process or over the wire").
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import anyio
import msgspec
from anyio.abc import TaskGroup, TaskStatus

from actors.llm.accumulator import ReplyAccumulator
from actors.llm.caller import LLMCaller
from actors.llm.settings import EndpointSettings
from actors.llm.wire import RequestShapes, ToolSchemaError, WireTools, estimate_usage, prompt_chars
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
from orchestrator.sim.content import ContentError, content_text, request_images
from orchestrator.sim.scenario import Scenario
from orchestrator.sim.script import find_track, locate, step_at
from orchestrator.sim.wire import build_reply, estimate_tokens

__all__ = ["InProcessModel", "plays_in_process"]

_encode = msgspec.json.Encoder().encode


def plays_in_process(scenario: Scenario) -> bool:
    """Whether ``scenario`` can be played without HTTP: it does not say ``wire = true``, and
    nothing in it needs the wire: no faults, chunk latencies, keep-alives or stream shapes in
    any step (a plain ``latency`` is waited in process), no context window of the
    simulator's own (an overflow is an HTTP error), no server profile but OpenAI's, no abort
    on streamed text (it watches text arrive)."""
    if scenario.wire or scenario.context_window is not None or scenario.server != "openai":
        return False
    if scenario.abort is not None and scenario.abort.after_text_chars is not None:
        return False
    steps = (*scenario.steps, *(step for track in scenario.tracks.values() for step in track))
    return not any(s.faults or s.chunk_latency or s.keep_alive or s.stream for s in steps)


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
        wire: Callable[[Bus], LLMCaller] | None = None,
    ) -> None:
        self._bus = bus
        self._endpoint = endpoint
        self._scenarios = {s.name: s for s in scenarios if plays_in_process(s)}
        self._make_wire = wire
        self._wire_bus: Bus | None = None
        self._tools = WireTools()
        self._shapes = RequestShapes(endpoint)
        self._tg: TaskGroup | None = None
        self._waiting: dict[tuple[str, int], _Waiting] = {}
        # A wait this long would meet the caller's read timeout or call deadline.
        self._wait_limit = min(endpoint.timeout_seconds, endpoint.call_deadline_seconds)
        self.answered = 0
        """Requests answered in process."""
        self.forwarded = 0
        """Requests handed to the wire actor."""

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Answer requests until the bus subscription closes (the wire actor with it)."""
        handlers = self.handlers()
        sub = self._bus.subscribe(*handlers, name="scenario_model", inline=True)
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                try:
                    if self._make_wire is not None:
                        wire_bus = Bus()
                        forward = wire_bus.subscribe(
                            ModelReply, ModelError, ModelTextDelta, name="wire_forwarder"
                        )
                        tg.start_soon(forward.serve, self._bus.publish)
                        await tg.start(self._make_wire(wire_bus).run)
                        self._wire_bus = wire_bus
                    await sub.serve_by_type(handlers, task_status=task_status)
                finally:
                    if self._wire_bus is not None:
                        self._wire_bus.close()
                    self._wire_bus = None
                    self._tg = None
                    tg.cancel_scope.cancel()  # replies still waiting: the runtime is closing
        finally:
            self._bus.unsubscribe(sub)

    def handlers(self) -> dict[type[Message], Callable[[Any], None]]:
        """The function of each message type the actor handles."""
        return {ModelRequest: self._request, ModelCancel: self._cancel}

    def _request(self, request: ModelRequest) -> None:
        found = find_track(self._scenarios, request.model)
        played = self._play(*found, request) if found is not None else None
        if played is None:
            self._to_wire(request)
            return
        answer, latency = played
        if latency > 0.0:
            remaining = self._wait_limit
            if request.deadline_at is not None:
                remaining = min(remaining, request.deadline_at - time.time())
            key = (request.run_id, request.turn)
            if latency >= remaining or self._tg is None or key in self._waiting:
                self._to_wire(request)  # a timeout or deadline would cut it: the caller's
                return
            waiting = self._waiting[key] = _Waiting(request, answer)
            self._tg.start_soon(self._answer_later, key, waiting, latency)
            return
        self._publish(answer)

    async def _answer_later(self, key: tuple[str, int], waiting: _Waiting, latency: float) -> None:
        with waiting.scope:
            await anyio.sleep(latency)
        if self._waiting.get(key) is not waiting:
            return  # answered already (cancelled)
        del self._waiting[key]
        self._publish(waiting.answer)

    def _publish(self, answer: list[Message]) -> None:
        self.answered += 1
        publish = self._bus.publish_nowait
        for msg in answer:
            publish(msg)

    def _cancel(self, msg: ModelCancel) -> None:
        waiting = self._waiting.pop((msg.run_id, msg.turn), None)
        if waiting is not None:  # nothing has arrived yet: what the caller replies when
            # cancelled so: no text, the prompt's usage estimated, ``aborted``
            waiting.scope.cancel()
            self.answered += 1
            request = waiting.request
            tools = sum(len(t.name) + len(t.description) + len(t.parameters) for t in request.tools)
            self._bus.publish_nowait(
                ModelReply(
                    run_id=request.run_id,
                    turn=request.turn,
                    text="",
                    tool_calls=(),
                    finish_reason=None,
                    usage=estimate_usage(prompt_chars(request.messages) + tools, 0),
                    attempts=1,
                    latency_seconds=anyio.current_time() - waiting.started,
                    ttft_seconds=None,
                    aborted=True,
                    in_process=True,
                )
            )
            return
        if self._wire_bus is not None:
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

    def _play(
        self, scenario: Scenario, track: str, request: ModelRequest
    ) -> tuple[list[Message], float] | None:
        """The deltas and reply of ``request``, as the wire would give them, and the step's
        latency; ``None`` when only the wire can answer it (an error of the simulator's)."""
        started = anyio.current_time()
        shape = self._shapes(request.model)
        try:
            params = shape.params(request, self._tools)  # the caller's body, bar the attempt's
            messages = params["messages"]
            images = request_images((m["role"], m["content"]) for m in messages)
        except (ToolSchemaError, ContentError):
            return None
        pairs = ((m["role"], content_text(m["content"])) for m in messages)
        position = locate(scenario, pairs, track=track)
        step = step_at(scenario, position)
        if step is None or images.images < step.require_images:
            return None
        endpoint = self._endpoint
        max_tokens = request.max_tokens or endpoint.default_max_tokens
        escalate = request.escalated_max_tokens or endpoint.escalated_max_tokens
        out: list[Message] = []
        for attempts in (1, 2):
            body = {**params, "stream": shape.stream}  # as the caller sends it
            if max_tokens is not None:
                body[endpoint.max_tokens_param] = max_tokens
            if shape.stream:
                body["stream_options"] = {"include_usage": True}
            # the simulator's prompt estimate of that body
            prompt_tokens = estimate_tokens(len(_encode(body)) - images.url_chars) + images.tokens
            reply = build_reply(step, position, prompt_tokens=prompt_tokens, max_tokens=max_tokens)
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
            else:
                break
        acc = ReplyAccumulator()
        for index, call in enumerate(reply.calls):
            acc.add_tool_fragment(index, id=call.id, name=call.name, arguments=call.arguments)
        assembled = acc.assemble()
        elapsed = anyio.current_time() - started + step.latency
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
                response_model=request.model,
                in_process=True,
            )
        )
        return out, step.latency


@dataclass(slots=True)
class _Waiting:
    """A reply waiting out its step's latency."""

    request: ModelRequest
    answer: list[Message]
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    started: float = field(default_factory=anyio.current_time)
