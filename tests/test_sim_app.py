"""The simulator app through the real ``openai.AsyncOpenAI`` client, in process (ASGI).

The in-process transport buffers whole responses, so only request/response behaviour is
tested here; streaming, latency and dropped connections are in ``test_sim_stream.py``.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator

import anyio
import httpx2
import openai
import pytest
from openai.types.chat import (
    ChatCompletionAssistantMessageParam,
    ChatCompletionMessageParam,
    ChatCompletionUserMessageParam,
)

from bus import nudge_text
from orchestrator.sim import RUN_ID_HEADER, Scenario, make_app, parse_scenario


def scenario(text: str, name: str = "m") -> Scenario:
    return parse_scenario(text, source=f"{name}.toml", name=name)


@contextlib.asynccontextmanager
async def client_for(*scenarios: Scenario) -> AsyncIterator[openai.AsyncOpenAI]:
    http = openai.DefaultAsyncHttpxClient(transport=httpx2.ASGITransport(app=make_app(scenarios)))
    async with openai.AsyncOpenAI(
        base_url="http://sim/v1", api_key="sim", max_retries=0, http_client=http
    ) as client:
        yield client


def user(text: str = "go") -> ChatCompletionUserMessageParam:
    return {"role": "user", "content": text}


ASSISTANT: ChatCompletionAssistantMessageParam = {"role": "assistant", "content": "ok"}

TWO_STEPS = scenario(
    """
task = "t"
[[steps]]
tool_calls = [
    { name = "list_dir", arguments = { path = "." } },
    { name = "read_file", arguments = { path = "a{n}.txt", offset = "{n}" }, id = "call_x" },
]
usage = { prompt_tokens = 11, completion_tokens = 7 }
[[steps]]
text = "All done."
[expect]
exit_reason = "completed"
"""
)


@pytest.mark.asyncio
async def test_tool_calls_then_text_without_streaming() -> None:
    async with client_for(TWO_STEPS) as client:
        first = await client.chat.completions.create(model="m", messages=[user()])
        choice = first.choices[0]
        assert choice.finish_reason == "tool_calls"
        calls = choice.message.tool_calls or []
        assert [c.function.name for c in calls] == ["list_dir", "read_file"]  # type: ignore[union-attr]
        assert json.loads(calls[1].function.arguments) == {"path": "a0.txt", "offset": 0}  # type: ignore[union-attr]
        assert calls[1].id == "call_x"
        assert first.usage is not None
        assert (first.usage.prompt_tokens, first.usage.completion_tokens) == (11, 7)
        assert first.usage.total_tokens == 18

        second = await client.chat.completions.create(model="m", messages=[user(), ASSISTANT])
        assert second.choices[0].message.content == "All done."
        assert second.choices[0].finish_reason == "stop"
        assert second.usage is not None
        assert second.usage.completion_tokens == 3  # estimated: 9 characters / 4


@pytest.mark.asyncio
async def test_filler_tokens_and_the_max_tokens_cut() -> None:
    burner = scenario(
        'task = "t"\n[[steps]]\ntext_tokens = 3000\nrepeat = true\n'
        '[expect]\nexit_reason = "completed"'
    )
    async with client_for(burner) as client:
        full = await client.chat.completions.create(model="m", messages=[user()])
        assert full.usage is not None
        assert full.usage.completion_tokens == 3000
        assert len(full.choices[0].message.content or "") == 12_000

        cut = await client.chat.completions.create(model="m", messages=[user()], max_tokens=100)
        assert cut.choices[0].finish_reason == "length"
        assert len(cut.choices[0].message.content or "") == 400
        assert cut.usage is not None
        assert cut.usage.completion_tokens == 100


FAULTS = """
task = "t"
[[steps]]
text = "finally"
faults = [{{ {fault} }}]
[expect]
exit_reason = "completed"
"""


@pytest.mark.asyncio
async def test_rate_limit_shows_retry_after_then_succeeds() -> None:
    limited = scenario(
        FAULTS.format(fault="status = 429, times = 2, retry_after = 3, retry_after_ms = 2500")
    )
    async with client_for(limited) as client:
        for _ in range(2):
            with pytest.raises(openai.RateLimitError) as caught:
                await client.chat.completions.create(model="m", messages=[user()])
            assert caught.value.response.headers["retry-after"] == "3"
            assert caught.value.response.headers["retry-after-ms"] == "2500"
            assert caught.value.code == "rate_limit_exceeded"
        ok = await client.chat.completions.create(model="m", messages=[user()])
        assert ok.choices[0].message.content == "finally"


@pytest.mark.parametrize(
    ("fault", "exception", "status"),
    [
        ("status = 413", openai.APIStatusError, 413),
        ("status = 500", openai.InternalServerError, 500),
        ("status = 503", openai.InternalServerError, 503),
        ("status = 400, code = 'invalid_value'", openai.BadRequestError, 400),
        ("kind = 'stream_error'", openai.InternalServerError, 500),
    ],
)
@pytest.mark.asyncio
async def test_error_statuses_map_to_sdk_exceptions(
    fault: str, exception: type[openai.APIStatusError], status: int
) -> None:
    async with client_for(scenario(FAULTS.format(fault=fault))) as client:
        with pytest.raises(exception) as caught:
            await client.chat.completions.create(model="m", messages=[user()])
        assert caught.value.status_code == status
        if status == 413:
            assert type(caught.value) is openai.APIStatusError
        assert caught.value.response.headers["x-request-id"].startswith("req_")


@pytest.mark.parametrize(
    ("shape", "code", "type_"),
    [
        ("openai", "context_length_exceeded", "invalid_request_error"),
        ("deepseek", "invalid_request_error", "invalid_request_error"),
        ("vllm", "400", "BadRequestError"),
        ("vllm_old", "400", "BadRequestError"),
        ("llama_cpp", "400", "exceed_context_size_error"),
    ],
)
@pytest.mark.asyncio
async def test_context_overflow_in_each_server_shape(shape: str, code: str, type_: str) -> None:
    faulty = scenario(FAULTS.format(fault=f"kind = 'context_length', shape = '{shape}'"))
    async with client_for(faulty) as client:
        with pytest.raises(openai.BadRequestError) as caught:
            await client.chat.completions.create(model="m", messages=[user()])
    assert caught.value.code == code
    assert caught.value.type == type_
    assert "context" in caught.value.message


@pytest.mark.asyncio
async def test_a_context_window_refuses_long_prompts() -> None:
    small = scenario(
        'task = "t"\ncontext_window = 50\n[[steps]]\ntext = "a"\n'
        '[expect]\nexit_reason = "completed"'
    )
    async with client_for(small) as client:
        await client.chat.completions.create(model="m", messages=[user()])
        with pytest.raises(openai.BadRequestError) as caught:
            await client.chat.completions.create(model="m", messages=[user("x" * 400)])
    assert caught.value.code == "context_length_exceeded"
    assert "maximum context length is 50 tokens" in caught.value.message


NUDGED = scenario(
    """
task = "t"
[[steps]]
text = "burning {n}"
repeat = true
[[tracks.heeded]]
text = "Short summary."
[[branches]]
nudge = "budget.warning"
track = "heeded"
[expect]
exit_reason = "completed"
"""
)


@pytest.mark.asyncio
async def test_a_nudge_switches_track() -> None:
    async with client_for(NUDGED) as client:
        messages: list[ChatCompletionMessageParam] = [user(), ASSISTANT, ASSISTANT]
        before = await client.chat.completions.create(model="m", messages=messages)
        assert before.choices[0].message.content == "burning 2"
        messages.append(user(nudge_text("budget.warning", "90% of the budget is used")))
        after = await client.chat.completions.create(model="m", messages=messages)
        assert after.choices[0].message.content == "Short summary."
        ignored = await client.chat.completions.create(
            model="m", messages=[*messages[:-1], user(nudge_text("loop.warning", "stop"))]
        )
        assert ignored.choices[0].message.content == "burning 2"
        with pytest.raises(openai.BadRequestError) as caught:
            await client.chat.completions.create(model="m", messages=[*messages, ASSISTANT])
        assert caught.value.code == "scenario_exhausted"
        assert "no step 1 on track 'heeded'" in caught.value.message


FLAKY = scenario(
    """
task = "t"
[[steps]]
text = "first"
faults = [{ status = 429, times = 2, retry_after = 0 }]
[[steps]]
text = "second"
faults = [{ status = 503 }]
[expect]
exit_reason = "completed"
"""
)


async def drive(client: openai.AsyncOpenAI, run_id: str, outcomes: dict[str, list[str]]) -> None:
    """Play FLAKY to the end, retrying each step; record what every attempt got."""
    seen = outcomes.setdefault(run_id, [])
    messages: list[ChatCompletionMessageParam] = [user()]
    scoped = client.with_options(default_headers={RUN_ID_HEADER: run_id})
    while len(messages) < 3:
        try:
            reply = await scoped.chat.completions.create(model="m", messages=messages)
        except openai.APIStatusError as exc:
            seen.append(str(exc.status_code))
            continue
        seen.append(reply.choices[0].message.content or "")
        messages.append(ASSISTANT)


@pytest.mark.asyncio
async def test_attempts_are_counted_per_run_under_concurrency() -> None:
    outcomes: dict[str, list[str]] = {}
    async with client_for(FLAKY) as client, anyio.create_task_group() as tg:
        for i in range(200):
            tg.start_soon(drive, client, f"run-{i}", outcomes)
    expected = ["429", "429", "first", "503", "second"]
    assert outcomes == {f"run-{i}": expected for i in range(200)}


@pytest.mark.asyncio
async def test_without_a_run_id_attempts_are_keyed_by_the_body() -> None:
    async with client_for(FLAKY) as client:
        with pytest.raises(openai.RateLimitError):
            await client.chat.completions.create(model="m", messages=[user("a")])
        with pytest.raises(openai.RateLimitError):
            await client.chat.completions.create(model="m", messages=[user("b")])
        with pytest.raises(openai.RateLimitError):
            await client.chat.completions.create(model="m", messages=[user("a")])
        ok = await client.chat.completions.create(model="m", messages=[user("a")])
        assert ok.choices[0].message.content == "first"


@pytest.mark.asyncio
async def test_models_health_unknown_model_and_bad_body() -> None:
    async with client_for(TWO_STEPS, scenario(FAULTS.format(fault="status=500"), "z")) as client:
        models = await client.models.list()
        assert [m.id for m in models.data] == ["m", "z"]
        with pytest.raises(openai.NotFoundError) as caught:
            await client.chat.completions.create(model="nope", messages=[user()])
        assert caught.value.code == "model_not_found"
        health = await client.get("http://sim/healthz", cast_to=httpx2.Response)
        assert health.json() == {"status": "ok"}
        with pytest.raises(openai.BadRequestError) as bad:
            await client.post("http://sim/chat/completions", body={"model": "m"}, cast_to=object)
        assert bad.value.code == "invalid_request_body"
        assert "missing required field `messages`" in bad.value.message


def test_duplicate_scenario_names_are_refused() -> None:
    with pytest.raises(ValueError, match="two scenarios are named 'm'"):
        make_app([TWO_STEPS, TWO_STEPS])
