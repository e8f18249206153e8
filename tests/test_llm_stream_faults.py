"""What happens around a stream that fails (issue #18): an empty 200 stream, a stream cut
with ``[DONE]`` and no finish reason, a server that dies mid-stream. Each fault is played by
the simulator (``orchestrator/sim``: fault kinds ``empty_stream``, ``interrupt``, ``drop``;
``context_error = "llama_cpp_python"``) or a raw server on loopback, and read through the
real LLM caller and, for the run's ending, the real runtime."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from typing import Any

import anyio
import openai
import pytest
from anyio.abc import SocketAttribute, SocketListener, SocketStream

from actors.llm.errors import IncompleteStream
from actors.llm.stream import EmptyStream, StreamInterrupted, StreamTally, stream_end
from bus import ModelError, ModelReply
from orchestrator.config import Config, ModelSettings
from orchestrator.result import RunResult
from orchestrator.runtime import RunSpec, Runtime
from orchestrator.scenarios.runs import start_scenario
from orchestrator.sim import Scenario, open_simulator, parse_scenario
from tests.loopback import open_loopback
from tests.test_llm_caller import ask, open_caller, request

WAIT = 20.0
FAST: dict[str, Any] = {"backoff_base_seconds": 0.01, "backoff_cap_seconds": 0.02}
TEXT = "The answer is here, all of it."  # 30 characters, 4 per chunk


def scenario(name: str, body: str, *, config: str = "") -> Scenario:
    return parse_scenario(
        f'task = "Answer."\n[config]\nmax_turns = 3\n{config}\n{body}\n'
        '[expect]\nexit_reason = "completed"\n',
        source=f"{name}.toml",
        name=name,
    )


def one_step(name: str, faults: str, **config: Any) -> Scenario:
    settings = "".join(f"{key} = {value!r}\n" for key, value in config.items())
    return scenario(
        name, f'[[steps]]\ntext = "{TEXT}"\nchunk_size = 4\nfaults = [{faults}]\n', config=settings
    )


async def run_scenario(played: Scenario, **model: Any) -> RunResult:
    config = Config(model=ModelSettings(**{**FAST, **model}))
    async with Runtime(config, scenarios=[played]) as runtime:
        handle = await start_scenario(runtime, played)
        with anyio.fail_after(WAIT):
            return await handle.result()


# --------------------------------------------------------------------------- the reader


def test_why_a_stream_without_finish_reason_ended() -> None:
    tally = StreamTally()
    assert isinstance(stream_end(tally), EmptyStream)
    tally.events = 3
    cut = stream_end(tally)
    assert type(cut) is IncompleteStream
    tally.done = True
    interrupted = stream_end(tally)
    assert isinstance(interrupted, StreamInterrupted)
    assert "--interrupt_requests False" in str(interrupted)
    assert "3 chunk(s)" in str(interrupted)


# --------------------------------------------------------------------------- empty 200 stream


class EmptyThenWhole:
    """Streamed requests get an empty 200 event stream; the others a whole completion."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        sent = json.loads(body)
        self.bodies.append(sent)
        if sent["stream"]:
            headers = [(b"content-type", b"text/event-stream")]
            content = b""
        else:
            headers = [(b"content-type", b"application/json")]
            message = {"role": "assistant", "content": "whole"}
            content = json.dumps(
                {"choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}
            ).encode()
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": content})


@pytest.mark.asyncio
async def test_an_empty_stream_is_asked_again_once_without_streaming() -> None:
    app = EmptyThenWhole()
    async with open_loopback(app) as url, open_caller(url) as (bus, _):
        retry, reply = await ask(bus, request("m"))
    assert isinstance(retry, ModelError)
    assert (retry.kind, retry.final) == ("stream", False)
    assert "no event and no [DONE]" in retry.message
    assert "without streaming" in retry.message
    assert isinstance(reply, ModelReply)
    assert (reply.text, reply.attempts, reply.finish_reason) == ("whole", 2, "stop")
    assert [b["stream"] for b in app.bodies] == [True, False]
    assert "stream_options" in app.bodies[0]
    assert "stream_options" not in app.bodies[1]


@pytest.mark.asyncio
async def test_a_streamed_context_overflow_is_a_context_error_not_an_outage() -> None:
    """llama-cpp-python's shape: streamed over the window, an empty 200; not streamed, a
    400 ``context_length_exceeded``."""
    tiny = parse_scenario(
        'task = "Answer."\ncontext_window = 20\ncontext_error = "llama_cpp_python"\n'
        '[[steps]]\ntext = "ok"\n[expect]\nexit_reason = "completed"\n',
        source="tiny_window.toml",
        name="tiny_window",
    )
    long = request("tiny_window")
    async with open_simulator([tiny]) as sim, open_caller(sim.base_url) as (bus, _):
        retry, final = await ask(bus, long)
    assert isinstance(retry, ModelError)
    assert not retry.final
    assert isinstance(final, ModelError)
    assert (final.kind, final.status, final.final, final.attempt) == (
        "context_length",
        400,
        True,
        2,
    )
    assert "maximum context length is 20 tokens" in final.message


@pytest.mark.asyncio
async def test_an_empty_stream_then_another_error_goes_its_normal_way() -> None:
    played = one_step(
        "empty_then_down", '{ kind = "empty_stream" }, { status = 503, forever = true }'
    )
    async with (
        open_simulator([played]) as sim,
        open_caller(sim.base_url, max_attempts=3) as (bus, _),
    ):
        answers = await ask(bus, request("empty_then_down"))
    assert [(a.kind, a.final) for a in answers if isinstance(a, ModelError)] == [
        ("stream", False),  # the empty stream: asked again without streaming
        ("server_error", False),
        ("server_error", True),
    ]
    final = answers[-1]
    assert isinstance(final, ModelError)
    assert final.attempt == 3
    assert "gave up after 3 attempts" in final.message
    assert final.partial_text == ""


# --------------------------------------------------------------------------- interrupted


@pytest.mark.asyncio
async def test_a_stream_cut_with_done_is_interrupted_and_asked_again_unstreamed() -> None:
    played = one_step("interrupted", '{ kind = "interrupt", after_chunks = 3 }')
    async with open_simulator([played]) as sim, open_caller(sim.base_url) as (bus, _):
        cut, reply = await ask(bus, request("interrupted"))
    assert isinstance(cut, ModelError)
    assert (cut.kind, cut.final) == ("interrupted", False)
    assert "--interrupt_requests False" in cut.message
    assert isinstance(reply, ModelReply)
    assert (reply.text, reply.attempts, reply.finish_reason) == (TEXT, 2, "stop")
    # The cut attempt had streamed "The answ" (2 chunks of 4 characters: 2 tokens).
    usage = reply.usage
    assert (usage.partial_output_tokens, usage.estimated) == (2, True)
    assert usage.completion_tokens == -(-len(TEXT) // 4) + 2


@pytest.mark.asyncio
async def test_interrupted_on_every_attempt_ends_model_interrupted_with_the_text() -> None:
    played = one_step("interrupted_always", '{ kind = "interrupt", after_chunks = 3 }')
    result = await run_scenario(played, max_attempts=1)
    assert (result.exit_reason.value, result.cause) == ("aborted_streaming", "model.interrupted")
    assert result.output == "The answ"  # the role chunk, then two chunks of 4 characters
    assert (result.usage.partial_output_tokens, result.usage.completion_tokens) == (2, 2)
    assert result.usage.estimated


# --------------------------------------------------------------------------- died mid-stream


@pytest.mark.asyncio
async def test_a_stream_dropped_on_every_attempt_keeps_the_text_and_counts_it() -> None:
    played = one_step("drops", '{ kind = "drop", after_chunks = 3, forever = true }')
    result = await run_scenario(played, max_attempts=4)
    assert (result.exit_reason.value, result.cause) == ("aborted_streaming", "model.unavailable")
    assert result.output == "The answ"  # what the last attempt streamed
    usage = result.usage
    assert (usage.partial_output_tokens, usage.completion_tokens) == (8, 8)  # 4 attempts x 2
    assert usage.estimated
    assert usage.prompt_tokens > 0


@pytest.mark.asyncio
async def test_output_lost_to_a_drop_counts_in_the_output_token_budget() -> None:
    steps = (
        '[[steps]]\ntext = "Listing the folder first, please wait."\nchunk_size = 4\n'
        'tool_calls = [{ name = "list_dir", arguments = { path = "." } }]\n'
        "usage = { prompt_tokens = 50, completion_tokens = 20 }\n"
        'faults = [{ kind = "drop", after_chunks = 9 }]\n'  # 8 text chunks: 32 chars, 8 tokens
        '[[steps]]\ntext = "Done."\n'
    )
    # 20 reported + 8 lost = 28 completion tokens before the second request.
    over = await run_scenario(scenario("lost_budget", steps, config="output_token_budget = 25"))
    assert (over.exit_reason.value, over.cause) == ("max_turns", "budget.output_tokens")
    assert over.usage.partial_output_tokens == 8
    assert over.usage.completion_tokens == 28
    within = await run_scenario(scenario("lost_budget", steps, config="output_token_budget = 29"))
    assert within.cause == "model.end_turn"


@asynccontextmanager
async def dying_server(frames: list[bytes]) -> AsyncIterator[tuple[str, list[str]]]:
    """A raw HTTP server on loopback that answers its first chat-completions request with
    ``frames`` of a 200 event stream, then dies: the connection is closed mid-body and the
    port stops listening (any other request before it is answered 404). Yields its base URL
    and the paths of the requests it got."""
    listeners = await anyio.create_tcp_listener(local_host="127.0.0.1")
    (listener,) = listeners.listeners
    assert isinstance(listener, SocketListener)
    port = listener.extra(SocketAttribute.local_port)
    seen: list[str] = []

    async def serve(stream: SocketStream) -> bool:
        async with stream:
            data = b""
            while b"\r\n\r\n" not in data:
                data += await stream.receive()
            path = data.split(b" ", 2)[1].decode()
            seen.append(path)
            if not path.endswith("/chat/completions"):
                await stream.send(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
                return False
            head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            await stream.send(head + b"transfer-encoding: chunked\r\n\r\n")
            for frame in frames:
                await stream.send(b"%x\r\n%s\r\n" % (len(frame), frame))
            return True

    async def serve_until_it_dies() -> None:
        async with listeners:  # closed when it dies: nobody listens after it
            while not await serve(await listener.accept()):
                pass

    async with anyio.create_task_group() as tg:
        tg.start_soon(serve_until_it_dies)
        try:
            yield f"http://127.0.0.1:{port}/v1", seen
        finally:
            tg.cancel_scope.cancel()


def text_frame(text: str) -> bytes:
    chunk = {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


@pytest.mark.asyncio
async def test_a_server_killed_mid_stream_leaves_the_text_in_the_result() -> None:
    frames = [text_frame("Hello, "), text_frame("world, and")]
    async with dying_server(frames) as (url, seen):
        config = Config(model=ModelSettings(base_url=url, model="m", max_attempts=3, **FAST))
        async with Runtime(config) as runtime:
            with anyio.fail_after(WAIT):
                result = await runtime.run(RunSpec(task="Say hello."))
    assert [path for path in seen if path.endswith("/chat/completions")] == [
        "/v1/chat/completions"  # the retries found nobody listening
    ]
    assert (result.exit_reason.value, result.cause) == ("aborted_streaming", "model.unavailable")
    assert result.output == "Hello, world, and"
    usage = result.usage
    assert (usage.partial_output_tokens, usage.completion_tokens) == (5, 5)  # 17 chars
    assert usage.estimated


@pytest.mark.asyncio
async def test_a_run_over_a_llama_cpp_python_window_ends_with_a_context_cause() -> None:
    """Streamed, as by default: each request's empty 200 is asked again unstreamed, and
    the 400 that answers it takes the context gatekeeper's way."""
    task = " ".join(["The long task, word after word."] * 40)
    played = parse_scenario(
        f'task = "{task}"\ncontext_window = 100\ncontext_error = "llama_cpp_python"\n'
        '[[steps]]\ntext = "ok"\n[expect]\nexit_reason = "completed"\n',
        source="small_window.toml",
        name="small_window",
    )
    result = await run_scenario(played)
    assert result.cause.startswith("context."), (result.cause, result.trace)
    assert result.exit_reason.value in ("prompt_too_long", "blocking_limit")
    events = [entry.event for entry in result.trace]
    assert "model error (stream)" in events  # the empty stream, asked again unstreamed
    assert not any("unavailable" in entry.detail for entry in result.trace)


@asynccontextmanager
async def closing_after_empty_streams() -> AsyncIterator[tuple[str, list[bool]]]:
    """A raw HTTP/1.1 server as llama-cpp-python behaves on a prompt over its context: a
    streamed request gets an empty 200 event stream, complete, after which the server
    closes the connection a moment later (a client that reuses it at once finds it
    closed); a request not streamed gets the 400. Yields its URL and each request's
    ``stream`` flag."""
    listeners = await anyio.create_tcp_listener(local_host="127.0.0.1")
    (listener,) = listeners.listeners
    assert isinstance(listener, SocketListener)
    port = listener.extra(SocketAttribute.local_port)
    streams: list[bool] = []
    error = {
        "error": {
            "message": "This model's maximum context length is 512 tokens. However, you "
            "requested 630 tokens (630 in the messages, None in the completion).",
            "type": "invalid_request_error",
            "code": "context_length_exceeded",
        }
    }

    async def serve(stream: SocketStream) -> None:
        with suppress(anyio.EndOfStream, anyio.BrokenResourceError):  # the client closed it
            await answer(stream)

    async def answer(stream: SocketStream) -> None:
        async with stream:
            data = b""
            while True:
                while b"\r\n\r\n" not in data:
                    data += await stream.receive()
                head, _, data = data.partition(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                while len(data) < length:
                    data += await stream.receive()
                body, data = json.loads(data[:length]), data[length:]
                streams.append(body["stream"])
                if body["stream"]:
                    await stream.send(
                        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                        b"transfer-encoding: chunked\r\n\r\n0\r\n\r\n"
                    )
                    # The server drops this connection: a request the client sends on it
                    # is never answered (the connection closes as it arrives).
                    with suppress(anyio.EndOfStream):
                        await stream.receive()
                    return
                content = json.dumps(error).encode()
                await stream.send(
                    b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\n"
                    b"content-length: %d\r\n\r\n%s" % (len(content), content)
                )

    async with listeners, anyio.create_task_group() as tg:
        tg.start_soon(listeners.serve, serve)
        try:
            yield f"http://127.0.0.1:{port}/v1", streams
        finally:
            tg.cancel_scope.cancel()


@pytest.mark.asyncio
async def test_the_unstreamed_retry_does_not_reuse_the_connection_the_server_closes() -> None:
    """Even with one attempt allowed: the empty stream's retry goes on a new connection and
    gets the server's 400, not the closed connection's error."""
    async with (
        closing_after_empty_streams() as (url, streams),
        open_caller(url, max_attempts=1) as (bus, _),
    ):
        retry, final = await ask(bus, request("m"))
    assert isinstance(retry, ModelError)
    assert (retry.kind, retry.final) == ("stream", False)
    assert isinstance(final, ModelError)
    assert (final.kind, final.status, final.attempt) == ("context_length", 400, 2)
    assert streams == [True, False]


async def collect_text(stream: Any, into: list[str]) -> None:
    async for chunk in stream:
        into.append(chunk.choices[0].delta.content or "")


@pytest.mark.asyncio
async def test_the_fault_profiles_as_the_openai_sdk_reads_them() -> None:
    """The simulator's profiles make what the SDK itself sees from such servers."""
    played = [
        one_step("sdk_interrupt", '{ kind = "interrupt", after_chunks = 3 }'),
        one_step("sdk_empty", '{ kind = "empty_stream" }'),
        one_step("sdk_drop", '{ kind = "drop", after_chunks = 3 }'),
    ]
    messages: Any = [{"role": "user", "content": "Answer."}]
    async with (
        open_simulator(played) as sim,
        openai.AsyncOpenAI(base_url=sim.base_url, api_key="k", max_retries=0) as client,
    ):
        with anyio.fail_after(WAIT):
            cut = await client.chat.completions.create(
                model="sdk_interrupt", messages=messages, stream=True
            )
            chunks = [chunk async for chunk in cut]  # ended by [DONE]
            empty = await client.chat.completions.create(
                model="sdk_empty", messages=messages, stream=True
            )
            nothing = [chunk async for chunk in empty]
            dropped = await client.chat.completions.create(
                model="sdk_drop", messages=messages, stream=True
            )
            got: list[str] = []
            with pytest.raises(openai.APIConnectionError):  # as our stream reader raises it
                await collect_text(dropped, got)
            again = await client.chat.completions.create(model="sdk_empty", messages=messages)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "The answ"
    assert all(c.choices[0].finish_reason is None for c in chunks)
    assert nothing == []
    assert "".join(got) == "The answ"
    assert (again.choices[0].message.content, again.choices[0].finish_reason) == (TEXT, "stop")
