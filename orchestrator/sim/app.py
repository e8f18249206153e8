"""The simulator's ASGI app: an OpenAI-compatible chat-completions endpoint playing scenarios.

Routes: ``POST /v1/chat/completions`` (and ``/chat/completions``), ``GET /v1/models``
(and ``/models``), ``GET /healthz``. The request's ``model`` names the scenario; the step is
derived from the request (:mod:`orchestrator.sim.script`); attempts are counted per run,
keyed by the ``X-Loopfuse-Run-Id`` header (a hash of the body when it is missing).
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import Any, Final

import anyio
import msgspec
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from orchestrator.sim import llama, wire
from orchestrator.sim.content import ContentError, content_text, request_images
from orchestrator.sim.responses import DropConnection, EventStream, TruncatedResponse
from orchestrator.sim.scenario import Fault, Scenario, Step, StreamShape
from orchestrator.sim.script import AttemptCounter, fault_for, find_track, locate, step_at

__all__ = ["RUN_ID_HEADER", "make_app"]

RUN_ID_HEADER: Final = "x-loopfuse-run-id"


class _Message(msgspec.Struct):
    role: str
    content: Any = None


class _StreamOptions(msgspec.Struct):
    include_usage: bool = False


class _ChatRequest(msgspec.Struct):
    model: str
    messages: list[_Message]
    stream: bool = False
    stream_options: _StreamOptions | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    tools: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw)  # not decoded
    tool_choice: Any = None


_DECODER: Final = msgspec.json.Decoder(_ChatRequest)


def make_app(scenarios: Iterable[Scenario]) -> Starlette:
    """An ASGI app serving ``scenarios`` by name; names must be unique."""
    player = _Player(scenarios)
    routes = [Route("/healthz", _healthz, methods=["GET"])]
    for prefix in ("/v1", ""):  # the OpenAI paths, with and without /v1
        routes.append(Route(f"{prefix}/chat/completions", player.chat, methods=["POST"]))
        routes.append(Route(f"{prefix}/models", player.models, methods=["GET"]))
    return Starlette(routes=routes)


async def _healthz(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


class _Player:
    """Answers requests from the scenarios; its only state is the attempt counters."""

    def __init__(self, scenarios: Iterable[Scenario]) -> None:
        self._scenarios: dict[str, Scenario] = {}
        for scenario in scenarios:
            if scenario.name in self._scenarios:
                raise ValueError(f"two scenarios are named {scenario.name!r}")
            self._scenarios[scenario.name] = scenario
        self._attempts = AttemptCounter()

    async def models(self, request: Request) -> Response:
        data = [
            {"id": name, "object": "model", "created": 0, "owned_by": "loopfuse-sim"}
            for name in sorted(self._scenarios)
        ]
        return JSONResponse({"object": "list", "data": data})

    async def chat(self, request: Request) -> Response:
        body = await request.body()
        try:
            req = _DECODER.decode(body)
        except msgspec.DecodeError as exc:
            return _error(400, f"Invalid request body: {exc}", code="invalid_request_body")
        try:
            images = request_images((m.role, m.content) for m in req.messages)
        except ContentError as exc:
            return _error(400, f"Invalid message content: {exc}", code="invalid_content")
        found = find_track(self._scenarios, req.model)
        if found is None:
            message = f"The model `{req.model}` does not exist or you do not have access to it."
            return _error(404, message, code="model_not_found")
        scenario, track = found
        as_llama = scenario.server == "llama_cpp_python"
        if as_llama and (refused := llama.validation_error(body)) is not None:
            return JSONResponse(refused, status_code=500)
        # An image costs its pixel size's tokens, not the characters of its data URL.
        prompt_tokens = wire.estimate_tokens(len(body) - images.url_chars) + images.tokens
        window = scenario.context_window
        if window is not None and prompt_tokens > window:
            if req.stream and scenario.context_error == "llama_cpp_python":
                return EventStream(_no_events(), headers={})  # its streamed overflow: 200, empty
            overflow = Fault(kind="context_length", shape=scenario.context_error)
            return _context_error(overflow, prompt_tokens, window)
        messages = ((m.role, content_text(m.content)) for m in req.messages)
        position = locate(scenario, messages, track=track)
        step = step_at(scenario, position)
        if step is None:
            message = (
                f"scenario {scenario.name!r} has no step {position.step} on track "
                f"{position.track!r} (add steps or make the last one repeat)"
            )
            return _error(400, message, code="scenario_exhausted")
        if images.images < step.require_images:
            message = (
                f"scenario {scenario.name!r} step {position.step} on track {position.track!r} "
                f"requires {step.require_images} image(s) in the request; it has {images.images}"
            )
            return _error(400, message, code="scenario_expectation")
        run = request.headers.get(RUN_ID_HEADER) or hashlib.blake2b(body, digest_size=16).digest()
        attempt = self._attempts.next((scenario.name, run, position.track, position.step))
        fault = fault_for(step, attempt)
        max_tokens = req.max_completion_tokens or req.max_tokens
        reply = wire.build_reply(step, position, prompt_tokens=prompt_tokens, max_tokens=max_tokens)
        completion_id = f"chatcmpl-{uuid.uuid4().hex[:24]}"
        headers = {"x-request-id": f"req_{uuid.uuid4().hex[:24]}"}
        if as_llama:
            shaped = llama.shape_reply(
                reply,
                offers_tools=bytes(req.tools) not in (b"", b"null", b"[]"),
                tool_choice=req.tool_choice,
                stream=req.stream,
                completion_id=completion_id,
            )
            if shaped == "empty_stream":
                return EventStream(_no_events(), headers=headers)
            if not isinstance(shaped, wire.Reply):  # "failed_assertion"
                return JSONResponse(llama.internal_error(), status_code=500, headers=headers)
            reply = shaped
        if fault is not None and fault.kind in ("status", "context_length"):
            if fault.kind == "context_length":
                return _context_error(fault, prompt_tokens, window or wire.DEFAULT_CONTEXT_WINDOW)
            status, extra, error = wire.fault_error(fault)
            return JSONResponse(error, status_code=status, headers={**headers, **extra})
        if req.stream:
            if fault is not None and fault.kind == "empty_stream":
                return EventStream(_no_events(), headers=headers)
            usage = req.stream_options is not None and req.stream_options.include_usage
            shape = llama.LlamaFrames if as_llama else wire.Frames
            frames = shape(completion_id, req.model, int(time.time()), usage and not as_llama)
            return EventStream(_play(step, reply, frames, fault), headers=headers)
        await anyio.sleep(step.latency)
        if fault is not None and fault.kind == "stream_error":
            status, extra, error = wire.fault_error(fault)
            return JSONResponse(error, status_code=status, headers={**headers, **extra})
        build = llama.completion if as_llama else wire.completion
        result = build(completion_id, req.model, int(time.time()), reply)
        if fault is not None and fault.kind == "drop":
            return TruncatedResponse(wire.encode(result), headers=headers)
        return Response(wire.encode(result), media_type="application/json", headers=headers)


async def _play(
    step: Step, reply: wire.Reply, frames: wire.Frames, fault: Fault | None
) -> AsyncIterator[bytes]:
    """The frames of a streamed reply, with its latencies, keep-alives and fault."""
    deadline = anyio.current_time() + step.latency
    while step.keep_alive and anyio.current_time() + step.keep_alive < deadline:
        await anyio.sleep(step.keep_alive)
        yield wire.KEEP_ALIVE
    await anyio.sleep(max(0.0, deadline - anyio.current_time()))
    for sent, frame in enumerate(_frames(reply, frames, step.stream)):
        if fault is not None and sent == fault.after_chunks:
            break
        if sent:  # a checkpoint even at zero latency, so endless output never hogs the loop
            await anyio.sleep(step.chunk_latency)
        yield frame
    if fault is None or fault.kind == "interrupt":
        yield wire.DONE  # on interrupt (llama-cpp-python's --interrupt_requests): no finish chunk
        return
    if fault.kind == "drop":
        raise DropConnection
    _, _, error = wire.fault_error(fault)
    yield b"data: " + wire.encode(error) + b"\n\n"


def _frames(reply: wire.Reply, frames: wire.Frames, stream: StreamShape | None) -> Iterator[bytes]:
    yield frames.chunk({"role": "assistant", "content": "" if reply.text_chars else None})
    for piece in reply.pieces():
        yield frames.chunk({"content": piece})
    yield from frames.tool_call_chunks(reply, stream)
    yield frames.chunk({}, reply.finish_reason)
    if frames.include_usage:
        yield frames.usage(reply)


async def _no_events() -> AsyncIterator[bytes]:
    """A stream of no event and no ``[DONE]``."""
    nothing: tuple[bytes, ...] = ()
    for frame in nothing:
        yield frame


def _error(status: int, message: str, *, code: str) -> Response:
    return JSONResponse(wire.error_body(status, message, code=code), status_code=status)


def _context_error(fault: Fault, prompt_tokens: int, window: int) -> Response:
    status, body = wire.context_error(fault, prompt_tokens, window)
    return JSONResponse(body, status_code=status)
