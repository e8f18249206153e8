"""The context gatekeeper asks the operator's server, once per model, for the model's window
(``/v1/models``, vLLM's ``max_model_len``) and its tokenizer's count of a sample
(``/extras/tokenize`` on llama-cpp-python, ``/tokenize`` on llama-server and vLLM).

Real HTTP on loopback: small Starlette apps that answer as those servers do."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from actors.context import Calibration, ContextPolicy
from actors.context.gatekeeper import ContextGatekeeper
from actors.context.server import MAX_ANSWER_BYTES, ServerEndpoint, ServerReport, probe
from bus import Bus, ContextAction, ToolSpec, TurnStarted
from bus.transcript import ChatMessage
from tests.harness import drain, serving
from tests.loopback import open_loopback
from tests.started import run_started

TOOLS = (ToolSpec(name="read", description="Read a file.", parameters='{"type":"object"}'),)


def llama_cpp_python(calls: list[str], *, key: str = "") -> Starlette:
    """``/v1/models`` without a window; ``/extras/tokenize``: one token per character."""

    def authorised(request: Request) -> bool:
        return not key or request.headers.get("authorization") == f"Bearer {key}"

    async def models(request: Request) -> Response:
        calls.append("models")
        if not authorised(request):
            return JSONResponse({"detail": "Invalid API key"}, status_code=401)
        return JSONResponse({"object": "list", "data": [{"id": "models/tiny.gguf"}]})

    async def tokenize(request: Request) -> Response:
        calls.append("extras/tokenize")
        if not authorised(request):
            return JSONResponse({"detail": "Invalid API key"}, status_code=401)
        body = await request.json()
        return JSONResponse({"tokens": list(range(len(body["input"])))})

    return Starlette(
        routes=[
            Route("/v1/models", models),
            Route("/extras/tokenize", tokenize, methods=["POST"]),
        ]
    )


def vllm(calls: list[str]) -> Starlette:
    """``max_model_len`` in ``/v1/models``; ``/tokenize`` with ``prompt``, answering ``count``."""

    async def models(request: Request) -> Response:
        calls.append("models")
        data = [{"id": "other", "max_model_len": 4096}, {"id": "qwen3-8b", "max_model_len": 40960}]
        return JSONResponse({"object": "list", "data": data})

    async def tokenize(request: Request) -> Response:
        calls.append("tokenize")
        body = await request.json()
        return JSONResponse({"count": len(body["prompt"]) // 2, "max_model_len": 40960})

    return Starlette(
        routes=[Route("/v1/models", models), Route("/tokenize", tokenize, methods=["POST"])]
    )


def silent(calls: list[str]) -> Starlette:
    """Nothing but 404s (Ollama-like for these paths) and one oversized answer."""

    async def models(request: Request) -> Response:
        calls.append("models")
        return Response(b'{"data": [' + b" " * (MAX_ANSWER_BYTES + 10) + b"]}")

    return Starlette(routes=[Route("/v1/models", models)])


@pytest.mark.asyncio
async def test_llama_cpp_python_tokenizer_is_found_and_counts_the_sample() -> None:
    calls: list[str] = []
    async with open_loopback(llama_cpp_python(calls, key="k")) as base_url:
        report = await probe(ServerEndpoint(base_url, "k"), "models/tiny.gguf", "Say hello")
    assert report == ServerReport(window=None, tokenizer="/extras/tokenize", sample_tokens=9)
    assert calls == ["models", "extras/tokenize"]


@pytest.mark.asyncio
async def test_the_key_is_sent_a_wrong_one_learns_nothing() -> None:
    calls: list[str] = []
    async with open_loopback(llama_cpp_python(calls, key="k")) as base_url:
        report = await probe(ServerEndpoint(base_url, "wrong"), "models/tiny.gguf", "Say hello")
    assert report == ServerReport()
    assert calls == ["models", "extras/tokenize"]  # and /tokenize: a 404 this app never sees


@pytest.mark.asyncio
async def test_vllm_window_and_tokenizer_are_read() -> None:
    calls: list[str] = []
    async with open_loopback(vllm(calls)) as base_url:
        report = await probe(ServerEndpoint(base_url), "qwen3-8b", "x" * 100)
    assert report == ServerReport(window=40960, tokenizer="/tokenize", sample_tokens=50)
    assert calls == ["models", "tokenize"]


@pytest.mark.asyncio
async def test_a_server_that_says_nothing_or_too_much_is_no_error() -> None:
    calls: list[str] = []
    async with open_loopback(silent(calls)) as base_url:
        report = await probe(ServerEndpoint(base_url), "m", "text")
    assert report == ServerReport()
    assert calls == ["models"]


# ------------------------------------------------------------------ through the gatekeeper


@asynccontextmanager
async def keeper_for(
    app: Starlette, policy: ContextPolicy
) -> AsyncIterator[tuple[Bus, ContextGatekeeper]]:
    async with open_loopback(app) as base_url:
        bus = Bus()
        keeper = ContextGatekeeper(
            bus, lambda run_id: policy, calibration=Calibration(), server=ServerEndpoint(base_url)
        )
        async with serving(bus, keeper):
            yield bus, keeper


async def first_turn(bus: Bus, run_id: str, model: str) -> list[ContextAction]:
    with bus.open_inbox(run_id) as inbox:
        await bus.publish_settled(
            run_started(
                run_id=run_id, trace_id="t", task="Say hello", model=model, tool_specs=TOOLS
            )
        )
        await bus.publish_settled(
            TurnStarted(
                run_id=run_id,
                turn=1,
                stage="agent",
                prompt_messages=1,
                appended=(ChatMessage(role="user", content="Say hello"),),
            )
        )
        return [msg for msg in drain(inbox) if isinstance(msg, ContextAction)]


@pytest.mark.asyncio
async def test_the_server_is_asked_once_per_model_and_its_tokenizer_calibrates() -> None:
    calls: list[str] = []
    policy = ContextPolicy(window=32_768)
    async with keeper_for(llama_cpp_python(calls), policy) as (bus, keeper):
        [first] = await first_turn(bus, "r1", "models/tiny.gguf")
        report = await keeper.server_report("models/tiny.gguf")
        [second] = await first_turn(bus, "r2", "models/tiny.gguf")
        assert keeper.estimate("r2") is not None
    assert calls == ["models", "extras/tokenize"]  # once, for two runs
    assert report is not None
    assert report.tokenizer == "/extras/tokenize"
    assert first.kind == second.kind == "counting"
    assert "bounded by the UTF-8 bytes" in first.detail
    assert "server's tokenizer (POST /extras/tokenize)" in second.detail
    assert keeper.calibration.source("models/tiny.gguf") == "tokenizer"
    # One token per character against the cl100k-based estimate: the ratio is well above 1.
    assert keeper.calibration.ratio("models/tiny.gguf") > 1.5


@pytest.mark.asyncio
async def test_a_reported_window_replaces_a_guessed_one_but_not_a_configured_one() -> None:
    calls: list[str] = []
    guessed = ContextPolicy(window=32_768)
    async with keeper_for(vllm(calls), guessed) as (bus, keeper):
        await first_turn(bus, "r1", "qwen3-8b")
        await keeper.server_report("qwen3-8b")
        await first_turn(bus, "r2", "qwen3-8b")
        windows = [keeper._runs[r].window for r in ("r1", "r2")]
    assert windows == [40960, 40960]  # the running run too
    configured = ContextPolicy(window=8_192, window_configured=True)
    async with keeper_for(vllm([]), configured) as (bus, keeper):
        await first_turn(bus, "r1", "qwen3-8b")
        await keeper.server_report("qwen3-8b")
        assert keeper._runs["r1"].window == 8_192


@pytest.mark.asyncio
async def test_an_openai_model_is_counted_exactly_and_says_so() -> None:
    async with keeper_for(silent([]), ContextPolicy(window=128_000)) as (bus, keeper):
        [counting] = await first_turn(bus, "r1", "gpt-4o")
        await keeper.server_report("gpt-4o")
    expected = "Prompt tokens of 'gpt-4o' are counted with its own vocabulary (o200k_base)."
    assert counting.detail == expected


@pytest.mark.asyncio
async def test_prepare_asks_before_the_first_run_and_once_for_concurrent_runs() -> None:
    calls: list[str] = []
    async with keeper_for(llama_cpp_python(calls), ContextPolicy(window=32_768)) as (bus, keeper):
        async with anyio.create_task_group() as tg:  # two runs of one model start at once
            for _ in range(2):
                tg.start_soon(keeper.prepare, "models/tiny.gguf", "Say hello", TOOLS)
        [counting] = await first_turn(bus, "r1", "models/tiny.gguf")
        await keeper.prepare("models/tiny.gguf", "Say hello", TOOLS)  # asked already: at once
    assert calls == ["models", "extras/tokenize"]
    assert "server's tokenizer (POST /extras/tokenize)" in counting.detail  # from turn 1


@pytest.mark.asyncio
async def test_without_an_operator_endpoint_nothing_is_asked() -> None:
    bus = Bus()
    keeper = ContextGatekeeper(bus, lambda run_id: ContextPolicy(window=32_768))
    async with serving(bus, keeper):
        await keeper.prepare("models/tiny.gguf", "Say hello", TOOLS)
        [counting] = await first_turn(bus, "r1", "models/tiny.gguf")
        assert await keeper.server_report("models/tiny.gguf") is None
    assert "bounded by the UTF-8 bytes" in counting.detail
