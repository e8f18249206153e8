"""Streaming through a real uvicorn server on 127.0.0.1:0 and the real ``openai`` client.

Covers the SSE grammar (text, tool-call deltas, usage chunk, length), latency, keep-alive
comments, the mid-stream error frame, a dropped connection, and that chunks are not buffered.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator

import anyio
import httpx2
import openai
import pytest
from openai.types.chat import ChatCompletionChunk, ChatCompletionUserMessageParam

from orchestrator.sim import (
    RunningSimulator,
    Scenario,
    open_simulator,
    parse_scenario,
    serve_simulator,
)

USER: list[ChatCompletionUserMessageParam] = [{"role": "user", "content": "go"}]


def scenario(steps: str, name: str = "m") -> Scenario:
    text = f'task = "t"\n{steps}\n[expect]\nexit_reason = "completed"\n'
    return parse_scenario(text, source=f"{name}.toml", name=name)


@contextlib.asynccontextmanager
async def serving(*scenarios: Scenario) -> AsyncIterator[openai.AsyncOpenAI]:
    async with open_simulator(scenarios) as sim:
        assert sim.base_url == f"http://127.0.0.1:{sim.port}/v1"
        async with openai.AsyncOpenAI(base_url=sim.base_url, api_key="sim", max_retries=0) as c:
            yield c


async def collect(
    client: openai.AsyncOpenAI, max_tokens: int | None = None
) -> list[ChatCompletionChunk]:
    stream = await client.chat.completions.create(
        model="m",
        messages=USER,
        stream=True,
        stream_options={"include_usage": True},
        max_tokens=max_tokens,
    )
    async with stream:
        return [chunk async for chunk in stream]


@pytest.mark.asyncio
async def test_text_stream_with_usage_chunk() -> None:
    greeting = scenario(
        '[[steps]]\ntext = "Hello, streaming world!"\nchunk_size = 5\n'
        "usage = { prompt_tokens = 9, completion_tokens = 6 }"
    )
    with anyio.fail_after(10):
        async with serving(greeting) as client:
            chunks = await collect(client)
    assert chunks[0].choices[0].delta.role == "assistant"
    pieces = [c.choices[0].delta.content for c in chunks[1:-2]]
    assert pieces == ["Hello", ", str", "eamin", "g wor", "ld!"]
    assert chunks[-2].choices[0].finish_reason == "stop"
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (9, 6)
    assert len({c.id for c in chunks}) == 1


CALLS = """
[[steps]]
chunk_size = 7
tool_calls = [
    { name = "read_file", arguments = { path = "notes.txt", offset = 10 } },
    { name = "list_dir", arguments = { path = "." } },
]
"""


@pytest.mark.asyncio
async def test_tool_call_deltas_are_fragmented_by_index_and_assembled_by_the_sdk() -> None:
    with anyio.fail_after(10):
        async with serving(scenario(CALLS)) as client:
            chunks = await collect(client)
            async with client.chat.completions.stream(model="m", messages=USER) as stream:
                final = await stream.get_final_completion()
    fragments = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or ()]
    first = fragments[0]
    assert (first.index, first.id, first.type) == (0, "call_0_0", "function")
    assert first.function is not None
    assert (first.function.name, first.function.arguments) == ("read_file", "")
    later = [f for f in fragments[1:] if f.index == 0]
    assert later
    assert all(f.id is None and f.function and f.function.name is None for f in later)
    assert "".join(f.function.arguments or "" for f in later if f.function) == (
        '{"path":"notes.txt","offset":10}'
    )
    assert chunks[-2].choices[0].finish_reason == "tool_calls"

    message = final.choices[0].message
    assert final.choices[0].finish_reason == "tool_calls"
    calls = [
        (c.id, c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or ()
    ]
    assert calls == [
        ("call_0_0", "read_file", {"path": "notes.txt", "offset": 10}),
        ("call_0_1", "list_dir", {"path": "."}),
    ]


@pytest.mark.asyncio
async def test_max_tokens_cuts_a_stream_with_finish_reason_length() -> None:
    burner = scenario("[[steps]]\ntext_tokens = 3000\nchunk_size = 64")
    with anyio.fail_after(10):
        async with serving(burner) as client:
            chunks = await collect(client, max_tokens=50)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(text) == 200
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 50


@pytest.mark.asyncio
async def test_an_error_frame_mid_stream_raises_api_error() -> None:
    broken = scenario(
        '[[steps]]\ntext = "abcdefgh"\nchunk_size = 2\n'
        'faults = [{ kind = "stream_error", after_chunks = 3, message = "overloaded mid-way" }]'
    )
    received: list[str] = []
    with anyio.fail_after(10):
        async with serving(broken) as client:
            with pytest.raises(openai.APIError) as caught:
                await collect_into(client, received)
            retried: list[str] = []
            await collect_into(client, retried)
    assert not isinstance(caught.value, openai.APIStatusError)
    assert "overloaded mid-way" in caught.value.message
    assert received == ["", "ab", "cd"]
    assert "".join(retried) == "abcdefgh"


async def collect_into(client: openai.AsyncOpenAI, received: list[str]) -> None:
    stream = await client.chat.completions.create(model="m", messages=USER, stream=True)
    async with stream:
        async for chunk in stream:
            received.append(chunk.choices[0].delta.content or "")


@pytest.mark.asyncio
async def test_a_dropped_connection_ends_the_stream_without_done() -> None:
    dropped = scenario(
        '[[steps]]\ntext = "abcdefgh"\nchunk_size = 2\n'
        'faults = [{ kind = "drop", after_chunks = 2 }]'
    )
    received: list[str] = []
    with anyio.fail_after(10):
        async with serving(dropped) as client:
            with pytest.raises(openai.APIConnectionError) as caught:
                await collect_into(client, received)
            assert isinstance(caught.value.__cause__, httpx2.RemoteProtocolError)
            with pytest.raises(openai.APIConnectionError):
                await client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "other"}]
                )
    assert received == ["", "ab"]


@pytest.mark.asyncio
async def test_chunks_are_sent_as_they_are_made_not_buffered() -> None:
    # The second chunk is due a minute after the first: reading the first within the
    # deadline proves nothing holds chunks back.
    slow = scenario('[[steps]]\ntext = "ab"\nchunk_size = 1\nchunk_latency = 60.0')
    with anyio.fail_after(10):
        async with serving(slow) as client:
            stream = await client.chat.completions.create(model="m", messages=USER, stream=True)
            async with stream:
                first = await anext(aiter(stream))
    assert first.choices[0].delta.role == "assistant"


@pytest.mark.asyncio
async def test_latency_comes_before_the_first_chunk_with_keep_alive_comments() -> None:
    stalled = scenario('[[steps]]\ntext = "late"\nlatency = 0.3\nkeep_alive = 0.05')
    with anyio.fail_after(10):
        async with open_simulator([stalled]) as sim, httpx2.AsyncClient() as http:
            started = anyio.current_time()
            body = {"model": "m", "messages": USER, "stream": True}
            async with http.stream("POST", f"{sim.base_url}/chat/completions", json=body) as r:
                assert r.headers["content-type"].startswith("text/event-stream")
                lines = [line async for line in r.aiter_lines() if line]
            waited = anyio.current_time() - started
            async with openai.AsyncOpenAI(base_url=sim.base_url, api_key="x", max_retries=0) as c:
                chunks = await collect(c)
    assert waited >= 0.3
    comments = [line for line in lines if line.startswith(":")]
    assert comments
    assert set(comments) == {": keep-alive"}
    assert lines.index(comments[-1]) < lines.index(next(x for x in lines if x.startswith("data:")))
    assert lines[-1] == "data: [DONE]"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "late"


@pytest.mark.asyncio
async def test_endless_output_stops_when_the_client_leaves() -> None:
    endless = scenario('[[steps]]\ntext = "The same paragraph. "\ntext_tokens = 100000000')
    with anyio.fail_after(10):
        async with open_simulator([endless]) as sim:
            async with openai.AsyncOpenAI(base_url=sim.base_url, api_key="x", max_retries=0) as c:
                stream = await c.chat.completions.create(model="m", messages=USER, stream=True)
                async with stream:
                    text = ""
                    async for chunk in stream:
                        text += chunk.choices[0].delta.content or ""
                        if len(text) > 2000:
                            break
            async with httpx2.AsyncClient() as http:
                health = await http.get(sim.base_url.removesuffix("/v1") + "/healthz")
    assert text.startswith("The same paragraph. The same paragraph. ")
    assert health.json() == {"status": "ok"}


@pytest.mark.asyncio
async def test_serve_simulator_runs_until_cancelled(capsys: pytest.CaptureFixture[str]) -> None:
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            running: RunningSimulator = await tg.start(
                serve_simulator, [scenario('[[steps]]\ntext = "x"')], "127.0.0.1", 0
            )
            async with httpx2.AsyncClient() as http:
                models = await http.get(f"{running.base_url}/models")
            tg.cancel_scope.cancel()
    assert models.json()["data"][0]["id"] == "m"
    assert f"loopfuse simulator on {running.base_url} serving m" in capsys.readouterr().out
