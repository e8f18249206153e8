"""The LLM caller actor end to end: a real Bus, the real openai client, a real HTTP server
(the simulator, or a tiny Starlette server for frames the simulator does not script)."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from actors.llm.caller import RUN_ID_HEADER, LLMCaller
from actors.llm.settings import EndpointSettings
from bus import (
    Bus,
    ChatMessage,
    Inbox,
    Message,
    ModelCancel,
    ModelError,
    ModelReply,
    ModelRequest,
    ModelTextDelta,
    ToolSpec,
)
from orchestrator.sim.loader import load_scenario
from orchestrator.sim.server import open_simulator
from tests.loopback import open_loopback

WAIT = 10.0  # seconds any awaited event may take before the test fails
FAST = {"backoff_base_seconds": 0.01, "backoff_cap_seconds": 0.02, "connect_timeout_seconds": 2.0}


# --------------------------------------------------------------------------- harness


class Recorder:
    """Every message of the given types, in order; ``wait_for`` wakes on each arrival."""

    def __init__(self) -> None:
        self.seen: list[Message] = []
        self._changed = anyio.Event()

    def handle(self, msg: Message) -> None:
        self.seen.append(msg)
        self._changed.set()
        self._changed = anyio.Event()

    async def wait_for(self, predicate: Callable[[list[Message]], bool]) -> None:
        with anyio.fail_after(WAIT):
            while not predicate(self.seen):
                await self._changed.wait()

    def deltas(self, run_id: str) -> list[str]:
        return [m.text for m in self.seen if isinstance(m, ModelTextDelta) and m.run_id == run_id]


@asynccontextmanager
async def open_caller(base_url: str, **settings: Any) -> AsyncIterator[tuple[Bus, Recorder]]:
    """A bus with a running LLM caller for ``base_url`` and a recorder of its output."""
    bus = Bus()
    recorder = Recorder()
    watch = bus.subscribe(ModelTextDelta, ModelReply, ModelError, name="test")
    caller = LLMCaller(bus, EndpointSettings(base_url=base_url, **{**FAST, **settings}))
    async with anyio.create_task_group() as tg:
        await tg.start(watch.serve, recorder.handle)
        await tg.start(caller.run)
        try:
            yield bus, recorder
        finally:
            bus.close()


async def answers(inbox: Inbox) -> list[ModelError | ModelReply]:
    """Every answer to one request, up to its final one."""
    out: list[ModelError | ModelReply] = []
    with anyio.fail_after(WAIT):
        while True:
            msg = await inbox.receive()
            assert isinstance(msg, ModelError | ModelReply)
            out.append(msg)
            if isinstance(msg, ModelReply) or msg.final:
                return out


def request(model: str, run_id: str = "r1", **fields: Any) -> ModelRequest:
    messages = (
        ChatMessage(role="system", content="Be brief."),
        ChatMessage(role="user", content="Go"),
    )
    return ModelRequest(run_id=run_id, turn=1, model=model, messages=messages, **fields)


async def ask(bus: Bus, req: ModelRequest) -> list[ModelError | ModelReply]:
    with bus.open_inbox(req.run_id) as inbox:
        await bus.publish(req)
        return await answers(inbox)


def write_scenario(tmp_path: Path, name: str, steps: str) -> Any:
    path = tmp_path / f"{name}.toml"
    path.write_text(
        f'task = "test"\n{steps}\n[expect]\nexit_reason = "completed"\n', encoding="utf-8"
    )
    return load_scenario(path)


# --------------------------------------------------------------------------- with the simulator


@pytest.mark.asyncio
async def test_streams_text_deltas_then_one_reply(tmp_path: Path) -> None:
    text = "Hello there, this reply is streamed in small pieces."
    usage = "usage = { prompt_tokens = 11, completion_tokens = 13 }"
    scenario = write_scenario(
        tmp_path, "text", f'[[steps]]\ntext = "{text}"\nchunk_size = 5\n{usage}'
    )
    async with open_simulator([scenario]) as sim, open_caller(sim.base_url) as (bus, rec):
        (reply,) = await ask(bus, request("text"))
        assert isinstance(reply, ModelReply)
        assert reply.text == text
        assert reply.finish_reason == "stop"
        assert reply.attempts == 1
        assert not reply.aborted
        assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (11, 13)
        assert not reply.usage.estimated
        assert reply.ttft_seconds is not None
        assert 0 < reply.ttft_seconds <= reply.latency_seconds
        await rec.wait_for(lambda seen: any(isinstance(m, ModelReply) for m in seen))
        deltas = rec.deltas("r1")
        assert len(deltas) > 1
        assert "".join(deltas) == text


@pytest.mark.asyncio
async def test_tool_calls_are_assembled_and_bad_json_reported(tmp_path: Path) -> None:
    steps = """
[[steps]]
text = "Looking."
tool_calls = [
  { name = "read_file", arguments = { path = "a.txt", limit = 3 } },
  { name = "grep", raw_arguments = '{"pattern": ' },
]
"""
    tools = (
        ToolSpec(name="read_file", description="Read", parameters='{"type":"object"}'),
        ToolSpec(name="grep", description="Search", parameters='{"type":"object"}'),
    )
    scenario = write_scenario(tmp_path, "tools", steps)
    async with open_simulator([scenario]) as sim, open_caller(sim.base_url) as (bus, _):
        (reply,) = await ask(bus, request("tools", tools=tools))
    assert isinstance(reply, ModelReply)
    assert reply.text == "Looking."
    assert reply.finish_reason == "tool_calls"
    read, grep = reply.tool_calls
    assert (read.name, json.loads(read.arguments)) == ("read_file", {"path": "a.txt", "limit": 3})
    assert grep.name == "grep"
    assert reply.invalid_tool_calls == (grep.id,)


@pytest.mark.asyncio
async def test_429_with_retry_after_then_success(tmp_path: Path) -> None:
    steps = '[[steps]]\ntext = "ok"\nfaults = [{ status = 429, retry_after = 0, times = 2 }]'
    scenario = write_scenario(tmp_path, "limited", steps)
    async with open_simulator([scenario]) as sim, open_caller(sim.base_url) as (bus, _):
        first, second, reply = await ask(bus, request("limited"))
    assert isinstance(first, ModelError)
    assert isinstance(second, ModelError)
    assert (first.kind, first.final, first.attempt, first.status) == ("rate_limited", False, 1, 429)
    assert first.retry_after == 0.0
    assert second.attempt == 2
    assert isinstance(reply, ModelReply)
    assert (reply.text, reply.attempts) == ("ok", 3)


@pytest.mark.asyncio
async def test_500_forever_gives_up_after_max_attempts(tmp_path: Path) -> None:
    steps = '[[steps]]\ntext = "never"\nfaults = [{ status = 500, forever = true }]'
    scenario = write_scenario(tmp_path, "down", steps)
    async with (
        open_simulator([scenario]) as sim,
        open_caller(sim.base_url, max_attempts=3) as (
            bus,
            _,
        ),
    ):
        got = await ask(bus, request("down"))
    assert [(e.kind, e.attempt, e.final) for e in got if isinstance(e, ModelError)] == [
        ("server_error", 1, False),
        ("server_error", 2, False),
        ("server_error", 3, True),
    ]
    assert len(got) == 3


@pytest.mark.asyncio
async def test_retry_after_above_the_cap_gives_up_at_once(tmp_path: Path) -> None:
    steps = (
        '[[steps]]\ntext = "later"\nfaults = [{ status = 429, retry_after = 600, forever = true }]'
    )
    scenario = write_scenario(tmp_path, "quota", steps)
    async with (
        open_simulator([scenario]) as sim,
        open_caller(sim.base_url, retry_after_cap_seconds=30.0) as (bus, _),
    ):
        (error,) = await ask(bus, request("quota"))
    assert isinstance(error, ModelError)
    assert (error.kind, error.final, error.attempt, error.retry_after) == (
        "rate_limited",
        True,
        1,
        600.0,
    )
    assert "exceeds the cap" in error.message


@pytest.mark.asyncio
@pytest.mark.parametrize("fault", [f'kind = "context_length", shape = "{s}"' for s in (
    "openai", "deepseek", "vllm", "vllm_old", "llama_cpp")] + ["status = 413"])  # fmt: skip
async def test_context_overflow_is_never_retried(tmp_path: Path, fault: str) -> None:
    steps = f'[[steps]]\ntext = "x"\nfaults = [{{ {fault}, forever = true }}]'
    scenario = write_scenario(tmp_path, "long", steps)
    async with open_simulator([scenario]) as sim, open_caller(sim.base_url) as (bus, _):
        (error,) = await ask(bus, request("long"))
    assert isinstance(error, ModelError)
    assert (error.kind, error.final, error.attempt) == ("context_length", True, 1)
    assert error.status in (400, 413)


@pytest.mark.asyncio
async def test_the_deadline_is_absolute_despite_keep_alives(tmp_path: Path) -> None:
    steps = '[[steps]]\ntext = "late"\nlatency = 30\nkeep_alive = 0.02'
    scenario = write_scenario(tmp_path, "stall", steps)
    quick = write_scenario(tmp_path, "quick", '[[steps]]\ntext = "in time"')
    async with (
        open_simulator([scenario, quick]) as sim,
        open_caller(sim.base_url, call_deadline_seconds=0.3, timeout_seconds=0.1) as (
            bus,
            _,
        ),
    ):
        (error,) = await ask(bus, request("stall"))
        assert isinstance(error, ModelError)
        assert (error.kind, error.final, error.attempt) == ("deadline", True, 1)
        # The run's own deadline (wall clock) wins when it is sooner, even when already past.
        (past,) = await ask(bus, request("stall", run_id="r2", deadline_at=time.time() - 1))
        assert isinstance(past, ModelError)
        assert past.kind == "deadline"
        sooner = time.time() + 0.15  # sooner than the call deadline: a timer of its own
        (soon,) = await ask(bus, request("stall", run_id="r4", deadline_at=sooner))
        assert isinstance(soon, ModelError)
        assert soon.kind == "deadline"
        assert "0.3s" not in soon.message  # the run's budget, not the call deadline's
        # A run's deadline later than the call deadline: the call deadline still cuts it.
        (later,) = await ask(bus, request("stall", run_id="r5", deadline_at=time.time() + 60))
        assert isinstance(later, ModelError)
        assert (later.kind, later.final) == ("deadline", True)
        assert "0.3s" in later.message
        # The pool worker that served them serves the next call whole (a fresh cancel scope).
        (reply,) = await ask(bus, request("quick", run_id="r3"))
        assert isinstance(reply, ModelReply)
        assert (reply.text, reply.aborted) == ("in time", False)


@pytest.mark.asyncio
async def test_cancel_mid_stream_keeps_the_partial_text(tmp_path: Path) -> None:
    steps = '[[steps]]\ntext = "abcdefghijklmnopqrstuvwxyz"\nchunk_size = 2\nchunk_latency = 0.2'
    scenario = write_scenario(tmp_path, "slow", steps)
    async with open_simulator([scenario]) as sim, open_caller(sim.base_url) as (bus, rec):
        with bus.open_inbox("r1") as inbox:
            await bus.publish(request("slow"))
            await rec.wait_for(lambda seen: any(isinstance(m, ModelTextDelta) for m in seen))
            cancel = ModelCancel(run_id="r1", turn=1, reason="loop detected")
            await bus.publish(cancel)
            await bus.publish(cancel)  # idempotent
            (reply,) = await answers(inbox)
            await bus.publish(cancel)  # after the end: a no-op
            await bus.publish(ModelCancel(run_id="nobody", turn=3, reason="x"))
            (again,) = await ask(bus, request("slow", run_id="r2", max_tokens=1))
            assert inbox.pending() == 0
    assert isinstance(reply, ModelReply)
    assert reply.aborted
    assert reply.finish_reason is None
    assert reply.text
    assert "abcdefghijklmnopqrstuvwxyz".startswith(reply.text)
    assert len(reply.text) < 26
    assert reply.usage.estimated
    assert reply.usage.completion_tokens >= 1
    assert isinstance(again, ModelReply)


@pytest.mark.asyncio
async def test_length_escalates_once_when_configured(tmp_path: Path) -> None:
    steps = "[[steps]]\ntext_tokens = 40\nchunk_size = 400"
    scenario = write_scenario(tmp_path, "long_answer", steps)
    async with open_simulator([scenario]) as sim:
        async with open_caller(sim.base_url, escalated_max_tokens=64000) as (bus, _):
            (reply,) = await ask(bus, request("long_answer", max_tokens=10))
            assert isinstance(reply, ModelReply)
            assert (reply.finish_reason, reply.attempts) == ("stop", 2)
            assert len(reply.text) == 160  # the truncated text is withheld
        async with open_caller(sim.base_url) as (bus, _):
            (reply,) = await ask(bus, request("long_answer", max_tokens=10))
            assert isinstance(reply, ModelReply)
            assert (reply.finish_reason, reply.attempts) == ("length", 1)
            assert len(reply.text) == 40


@pytest.mark.asyncio
async def test_a_broken_stream_is_retried_without_duplicating_text(tmp_path: Path) -> None:
    steps = """
[[steps]]
text = "one two three four five"
chunk_size = 4
faults = [{ kind = "stream_error", after_chunks = 3 }, { kind = "drop", after_chunks = 2 }]
"""
    scenario = write_scenario(tmp_path, "flaky", steps)
    async with open_simulator([scenario]) as sim, open_caller(sim.base_url) as (bus, rec):
        *errors, reply = await ask(bus, request("flaky"))
        await rec.wait_for(lambda seen: any(isinstance(m, ModelReply) for m in seen))
    assert [(e.kind, e.final) for e in errors if isinstance(e, ModelError)] == [
        ("stream", False),
        ("stream", False),
    ]
    assert isinstance(reply, ModelReply)
    assert reply.text == "one two three four five"
    assert reply.attempts == 3
    assert len("".join(rec.deltas("r1"))) > len(reply.text)  # observers saw the partial tries


@pytest.mark.asyncio
async def test_without_streaming(tmp_path: Path) -> None:
    scenario = write_scenario(tmp_path, "plain", '[[steps]]\ntext = "whole"')
    async with (
        open_simulator([scenario]) as sim,
        open_caller(sim.base_url, stream=False) as (
            bus,
            rec,
        ),
    ):
        (reply,) = await ask(bus, request("plain"))
        await rec.wait_for(lambda seen: any(isinstance(m, ModelReply) for m in seen))
    assert isinstance(reply, ModelReply)
    assert (reply.text, reply.finish_reason) == ("whole", "stop")
    assert rec.deltas("r1") == ["whole"]


@pytest.mark.asyncio
async def test_closing_the_bus_aborts_what_is_in_flight(tmp_path: Path) -> None:
    scenario = write_scenario(tmp_path, "forever", '[[steps]]\ntext = "x"\nlatency = 30')
    async with open_simulator([scenario]) as sim, open_caller(sim.base_url) as (bus, _):
        with bus.open_inbox("r1") as inbox:
            await bus.publish(request("forever"))
            bus.close()
            (reply,) = await answers(inbox)
    assert isinstance(reply, ModelReply)
    assert reply.aborted


# --------------------------------------------------------------------------- quirky frames


class FakeServer:
    """Serves the given SSE frames (or an error) to each request in turn; records requests.
    A request that is not streamed gets the frames as one ``chat.completion`` (their text,
    last finish reason and usage)."""

    def __init__(self, *responses: list[Any] | Response) -> None:
        self._responses = list(responses)
        self.requests: list[tuple[dict[str, str], dict[str, Any]]] = []

    async def chat(self, request: Request) -> Response:
        body = await request.json()
        self.requests.append((dict(request.headers), body))
        response = self._responses.pop(0) if len(self._responses) > 1 else self._responses[0]
        if isinstance(response, Response):
            return response
        if not body.get("stream"):
            return JSONResponse(self._completion(response))
        return StreamingResponse(self._frames(response), media_type="text/event-stream")

    @staticmethod
    def _completion(frames: list[Any]) -> dict[str, Any]:
        chunks = [frame for frame in frames if isinstance(frame, dict)]
        choices = [choice for chunk in chunks for choice in chunk.get("choices") or ()]
        text = "".join((c.get("delta") or {}).get("content") or "" for c in choices)
        finish = next(
            (c["finish_reason"] for c in reversed(choices) if c.get("finish_reason")), None
        )
        usage = next((chunk["usage"] for chunk in reversed(chunks) if chunk.get("usage")), None)
        message = {"role": "assistant", "content": text}
        return {
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": usage,
        }

    @staticmethod
    async def _frames(frames: list[Any]) -> AsyncIterator[bytes]:
        for frame in frames:
            yield (
                frame.encode()
                if isinstance(frame, str)
                else b"data: " + json.dumps(frame).encode() + b"\n\n"
            )
        yield b"data: [DONE]\n\n"


def open_fake_server(fake: FakeServer) -> AbstractAsyncContextManager[str]:
    app = Starlette(routes=[Route("/v1/chat/completions", fake.chat, methods=["POST"])])
    return open_loopback(app)


def chunk(
    delta: dict[str, Any] | None = None, finish: str | None = None, **extra: Any
) -> dict[str, Any]:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return {
        "id": "x",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "m",
        "choices": choices,
        **extra,
    }


def fragment(index: int, **fields: Any) -> dict[str, Any]:
    return chunk({"tool_calls": [{"index": index, **fields}]})


@pytest.mark.asyncio
async def test_quirky_stream_and_the_request_sent() -> None:
    frames = [
        ": keep-alive\n\n",
        chunk({"role": "assistant", "content": ""}, obfuscation="pad", usage=None),
        chunk({"content": "Checking", "reasoning_content": "hmm"}),
        ": keep-alive\n\n",
        fragment(0, id="c1", type="function", function={"name": "get", "arguments": '{"k"'}),
        fragment(0, id="c1", type="function", function={"name": "get", "arguments": '{"k":1}'}),
        fragment(1, id="c2", type="function", function={"name": "put", "arguments": ""}),
        fragment(1, function={"arguments": '{"v":'}),
        fragment(1, function={"arguments": "2}"}),
        chunk({}, finish="tool_calls"),
        fragment(0, id="c1", function={"name": "get", "arguments": '{"k": 1}'}),  # summary
        chunk(),
        chunk(usage={"prompt_tokens": 7, "completion_tokens": 9, "total_tokens": 16}),
    ]
    fake = FakeServer(frames)
    spec = ToolSpec(
        name="get", description="Get", parameters='{"properties":{"k":{"type":"integer"}}}'
    )
    async with (
        open_fake_server(fake) as url,
        open_caller(
            url, api_key="sk-secret", default_max_tokens=500, extra_headers={"X-Team": "a"}
        ) as (bus, _),
    ):
        (reply,) = await ask(bus, request("m", tools=(spec,)))
    assert isinstance(reply, ModelReply)
    assert reply.text == "Checking"
    assert [(c.id, c.name, c.arguments) for c in reply.tool_calls] == [
        ("c1", "get", '{"k": 1}'),
        ("c2", "put", '{"v":2}'),
    ]
    assert reply.invalid_tool_calls == ()
    assert not reply.usage.estimated
    headers, body = fake.requests[0]
    assert headers[RUN_ID_HEADER.lower()] == "r1"
    assert headers["authorization"] == "Bearer sk-secret"
    assert headers["x-team"] == "a"
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["max_tokens"] == 500
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Go"},
    ]
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get",
                "description": "Get",
                "parameters": {"properties": {"k": {"type": "integer"}}, "type": "object"},
            },
        }
    ]


@pytest.mark.asyncio
async def test_a_stream_without_finish_reason_is_retried_and_usage_estimated() -> None:
    cut = b"data: " + json.dumps(chunk({"content": "cut"})).encode() + b"\n\n"  # no [DONE]
    fake = FakeServer(
        StreamingResponse(iter([cut]), media_type="text/event-stream"),
        [chunk({"content": "whole"}, finish="stop")],
    )
    async with open_fake_server(fake) as url, open_caller(url) as (bus, _):
        first, reply = await ask(bus, request("m"))
    assert isinstance(first, ModelError)
    assert (first.kind, first.final) == ("stream", False)
    assert isinstance(reply, ModelReply)
    assert (reply.text, reply.attempts) == ("whole", 2)
    assert reply.usage.estimated
    # "whole": 5 chars / 4, rounded up; and the cut attempt's "cut" streamed too: 1 more
    assert (reply.usage.completion_tokens, reply.usage.partial_output_tokens) == (3, 1)


@pytest.mark.asyncio
async def test_errors_never_leak_the_api_key_and_bad_tool_schemas_fail_fast() -> None:
    echo = JSONResponse({"error": {"message": "Incorrect API key provided: sk-secret"}}, 401)
    fake = FakeServer(echo)
    async with open_fake_server(fake) as url, open_caller(url, api_key="sk-secret") as (bus, _):
        (auth,) = await ask(bus, request("m"))
        bad = ToolSpec(name="broken", description="", parameters="{not json")
        (schema,) = await ask(bus, request("m", run_id="r2", tools=(bad,)))
    assert isinstance(auth, ModelError)
    assert (auth.kind, auth.final, auth.status) == ("auth", True, 401)
    assert "sk-secret" not in auth.message
    assert isinstance(schema, ModelError)
    assert (schema.kind, schema.final) == ("bad_request", True)
    assert "broken" in schema.message
    assert len(fake.requests) == 1


@pytest.mark.asyncio
async def test_many_runs_share_one_caller(tmp_path: Path) -> None:
    scenario = write_scenario(tmp_path, "busy", '[[steps]]\ntext = "hi"\nlatency = 0.05')
    runs = [f"run{n}" for n in range(25)]
    async with open_simulator([scenario]) as sim, open_caller(sim.base_url) as (bus, rec):
        for run_id in runs:
            await bus.publish(request("busy", run_id=run_id))
        await rec.wait_for(lambda seen: sum(isinstance(m, ModelReply) for m in seen) == len(runs))
    replies = {m.run_id: m for m in rec.seen if isinstance(m, ModelReply)}
    assert sorted(replies) == sorted(runs)
    assert all(r.text == "hi" and r.attempts == 1 for r in replies.values())


@pytest.mark.asyncio
async def test_an_internal_fault_still_ends_the_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(self: LLMCaller, call: object, *, aborted: bool = False) -> ModelReply:
        raise RuntimeError("bug")

    monkeypatch.setattr(LLMCaller, "_reply", broken)
    scenario = write_scenario(tmp_path, "fine", '[[steps]]\ntext = "hi"')
    async with open_simulator([scenario]) as sim, open_caller(sim.base_url) as (bus, _):
        (error,) = await ask(bus, request("fine"))
        (still,) = await ask(bus, request("fine", run_id="r2"))  # the caller lives on
    assert isinstance(error, ModelError)
    assert (error.kind, error.final) == ("stream", True)
    assert "RuntimeError('bug')" in error.message
    assert isinstance(still, ModelError)


@pytest.mark.asyncio
async def test_cancel_before_the_call_starts_and_a_duplicate_request(tmp_path: Path) -> None:
    scenario = write_scenario(tmp_path, "idle", '[[steps]]\ntext = "x"\nlatency = 30')
    async with open_simulator([scenario]) as sim, open_caller(sim.base_url) as (bus, _):
        with bus.open_inbox("r1") as inbox:
            await bus.publish(request("idle"))
            await bus.publish(request("idle"))  # the same turn again, while in flight
            await bus.publish(ModelCancel(run_id="r1", turn=1, reason="stop"))
            duplicate, reply = await answers(inbox), await answers(inbox)
    assert isinstance(duplicate[0], ModelError)
    assert (duplicate[0].kind, duplicate[0].final) == ("bad_request", True)
    (aborted,) = reply
    assert isinstance(aborted, ModelReply)
    assert (aborted.aborted, aborted.text, aborted.tool_calls) == (True, "", ())


@pytest.mark.asyncio
async def test_an_endpoint_that_refuses_the_escalated_limit_keeps_the_cut_reply() -> None:
    cut = [chunk({"role": "assistant", "content": "partial "}), chunk({}, finish="length")]
    refused = JSONResponse(
        {"error": {"message": "max_tokens is too large: 64000", "type": "invalid_request_error"}},
        status_code=400,
    )
    fake = FakeServer(cut, refused, cut)
    async with (
        open_fake_server(fake) as base_url,
        open_caller(base_url, escalated_max_tokens=64000) as (bus, _),
    ):
        (first,) = await ask(bus, request("capped", max_tokens=10))
        (second,) = await ask(bus, request("capped", run_id="r2", max_tokens=10))
    assert isinstance(first, ModelReply)
    assert isinstance(second, ModelReply)
    for reply in (first, second):
        assert (reply.text, reply.finish_reason) == ("partial ", "length")
    assert first.attempts == 2
    assert second.attempts == 1  # the model's cap is remembered: no second refusal
    sent = [body.get("max_tokens") for _, body in fake.requests]
    assert sent == [10, 64000, 10]
