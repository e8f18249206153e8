"""What loopfuse sends a model endpoint, and what it makes of a refusal (issue #18, C):
assistant tool-call turns with ``"content": ""``; ``model.stream``, ``model.tool_choice`` and
``model.reset_tool_choice`` (and per model); no tool schemas for a run without a folder;
two calls under one id both kept; ``stream_options.include_usage``; a request refused as
invalid is not retried. Requests are recorded as the simulator receives them; the simulator's
``llama_cpp_python`` profile answers as that server does (notes/interop.md).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx2
import msgspec
import openai
import pytest

from actors.llm.errors import classify
from actors.tools import Tool, default_registry
from actors.tools.context import ToolContext
from bus import ExitReason
from orchestrator.config import Config, ModelCapabilities, ModelSettings, load_config
from orchestrator.errors import ConfigError
from orchestrator.result import RunResult
from orchestrator.runtime import RunSpec, Runtime
from orchestrator.scenarios.runs import run_scenario
from orchestrator.sim import Scenario, make_app, parse_scenario
from tests.loopback import open_loopback

WAIT = 30.0
FAST: dict[str, Any] = {"backoff_base_seconds": 0.01, "backoff_cap_seconds": 0.02}

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class Recorder:
    """An ASGI wrapper that keeps the JSON body of every chat-completions request."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.bodies: list[dict[str, Any]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].endswith("/chat/completions"):
            await self.app(scope, receive, send)
            return
        parts, more = [], True
        while more:
            message = await receive()
            parts.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(parts)
        self.bodies.append(json.loads(body))
        replayed = False

        async def replay() -> MutableMapping[str, Any]:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)


@asynccontextmanager
async def serving(*scenarios: Scenario) -> AsyncIterator[tuple[str, Recorder]]:
    recorder = Recorder(make_app(scenarios))
    async with open_loopback(recorder) as base_url:
        yield base_url, recorder


def scenario(name: str, body: str) -> Scenario:
    return parse_scenario(body, source=f"<{name}>", name=name)


def config(base_url: str, model: str, **settings: Any) -> Config:
    models = settings.pop("models", {})
    return Config(
        model=ModelSettings(base_url=base_url, model=model, **FAST, **settings),
        models={name: ModelCapabilities(**caps) for name, caps in models.items()},
    )


async def run(cfg: Config, scen: Scenario) -> RunResult:
    async with Runtime(cfg) as runtime:
        with anyio.fail_after(WAIT):
            return await run_scenario(runtime, scen)


def assistant_turns(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [m for m in body["messages"] if m["role"] == "assistant" and "tool_calls" in m]


# A model that reads a file, then answers.
READS_THEN_ANSWERS = """
task = "What does notes.txt say?"
server = "{server}"
[folder]
"notes.txt" = "the yield was 42"
[[steps]]
tool_calls = [{{ name = "read_file", arguments = {{ path = "notes.txt" }} }}]
[[steps]]
text = "It says the yield was 42."
[expect]
exit_reason = "completed"
"""


HELLO = """
task = "Say hello."
[[steps]]
text = "Hello."
[expect]
exit_reason = "completed"
"""


# ---------------------------------------------------------------- the assistant turn


@pytest.mark.asyncio
async def test_llama_profile_refuses_null_content_with_a_validation_dump_like_the_server() -> None:
    """The simulator profile answers ``content: null`` as llama-cpp-python does (a 500 with
    FastAPI's dump), and ``""`` normally; through the real ``openai`` client."""
    scen = scenario("strict_null", READS_THEN_ANSWERS.format(server="llama_cpp_python"))
    call = {"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}
    turn: list[Any] = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "x"},
    ]
    async with serving(scen) as (base_url, _):
        client = openai.AsyncOpenAI(base_url=base_url, api_key="k", max_retries=0)
        with pytest.raises(openai.InternalServerError) as refused:
            await client.chat.completions.create(model="strict_null", messages=turn)
        turn[1]["content"] = ""
        accepted = await client.chat.completions.create(model="strict_null", messages=turn)
        await client.close()
    error = refused.value
    assert error.status_code == 500
    assert error.type == "internal_server_error"
    assert isinstance(error.body, dict)
    dump = error.body["message"]
    assert dump.startswith("7 validation errors:\n  {'type': 'literal_error'")
    assert "'ChatCompletionRequestAssistantMessage', 'content')" in dump
    assert accepted.choices[0].finish_reason in ("stop", "tool_calls")
    # loopfuse reads that 500 as a request refused as invalid: not retried, the dump summed up.
    failure = classify(error, streaming=False)
    assert (failure.kind, failure.retryable, failure.status) == ("bad_request", False, 500)
    assert failure.message == (
        "the server refused the request as invalid (HTTP 500): 7 validation errors: "
        "messages.1.ChatCompletionRequestAssistantMessage.content: Input should be a valid string"
    )


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("settings", "stream"),
    [({"stream": False}, False), ({"tool_choice": "read_file"}, True)],
    ids=["not-streamed-auto", "streamed-forced-then-reset"],
)
async def test_a_tool_run_completes_against_the_llama_profile(
    settings: dict[str, Any], stream: bool
) -> None:
    """Against the strict server, a run that calls a tool completes: the assistant turn goes
    back with ``"content": ""`` and the tool is called because ``tool_choice`` is sent."""
    scen = scenario("strict_tool", READS_THEN_ANSWERS.format(server="llama_cpp_python"))
    async with serving(scen) as (base_url, recorder):
        result = await run(config(base_url, "strict_tool", **settings), scen)
    assert (result.exit_reason, result.cause) == (ExitReason.COMPLETED, "model.end_turn")
    assert result.output == "It says the yield was 42."
    assert result.tool_calls == 1
    first, second = recorder.bodies[0], recorder.bodies[-1]
    assert first["stream"] is stream
    assert first["tool_choice"] == (
        "auto" if not stream else {"type": "function", "function": {"name": "read_file"}}
    )
    (turn,) = assistant_turns(second)
    assert turn["content"] == ""
    assert turn["tool_calls"][0]["id"].startswith("call__0_read_file_cmpl-")  # the server's id
    assert second["tool_choice"] == "auto"  # reset once the model had called a tool


@pytest.mark.asyncio
async def test_without_tool_choice_the_llama_profile_calls_no_tool() -> None:
    """What loopfuse could not change before: this server treats an omitted ``tool_choice``
    as ``"none"``. ``"none"`` sent on purpose gives the same answer."""
    scen = scenario("strict_none", READS_THEN_ANSWERS.format(server="llama_cpp_python"))
    async with serving(scen) as (base_url, recorder):
        result = await run(config(base_url, "strict_none", tool_choice="none"), scen)
        client = openai.AsyncOpenAI(base_url=base_url, api_key="k", max_retries=0)
        omitted = await client.chat.completions.create(
            model="strict_none",
            messages=[{"role": "user", "content": "hi"}],
            tools=[{"type": "function", "function": {"name": "read_file", "parameters": {}}}],
        )
        await client.close()
    assert recorder.bodies[0]["tool_choice"] == "none"
    assert result.tool_calls == 0
    assert omitted.choices[0].message.tool_calls is None


# ---------------------------------------------------------------- settings on the wire


@pytest.mark.asyncio
async def test_defaults_stream_with_usage_and_send_auto_beside_tools_only() -> None:
    scen = scenario("plain_tool", READS_THEN_ANSWERS.format(server="openai"))
    hello = scenario("hello", HELLO)
    async with serving(scen, hello) as (base_url, recorder):
        result = await run(config(base_url, "plain_tool"), scen)
        async with Runtime(config(base_url, "hello")) as runtime:
            with anyio.fail_after(WAIT):
                said = await runtime.run(RunSpec(task="Say hello."))  # no folder: no tools
    assert said.output == "Hello."
    assert result.exit_reason is ExitReason.COMPLETED
    assert result.usage.estimated is False  # the usage chunk include_usage asked for
    tooled, answered, plain = recorder.bodies
    for body in recorder.bodies:
        assert body["stream"] is True
        assert body["stream_options"] == {"include_usage": True}
    assert tooled["tool_choice"] == answered["tool_choice"] == "auto"
    assert [t["function"]["name"] for t in tooled["tools"]] == [
        "list_dir",
        "read_file",
        "finish_exploration",
    ]
    assert "tools" not in plain
    assert "tool_choice" not in plain
    for body in recorder.bodies:  # no sampling settings: the server's own
        assert "temperature" not in body
        assert "seed" not in body


@pytest.mark.asyncio
async def test_temperature_and_seed_are_sent_with_every_request_when_set() -> None:
    scen = scenario("sampled", READS_THEN_ANSWERS.format(server="openai"))
    async with serving(scen) as (base_url, recorder):
        result = await run(config(base_url, "sampled", temperature=0.0, seed=42), scen)
    assert result.exit_reason is ExitReason.COMPLETED
    assert len(recorder.bodies) == 2
    assert all(b["temperature"] == 0.0 and b["seed"] == 42 for b in recorder.bodies)


@pytest.mark.asyncio
async def test_not_streamed_asks_for_no_stream_options_and_reads_whole_usage() -> None:
    scen = scenario("whole", READS_THEN_ANSWERS.format(server="openai"))
    async with serving(scen) as (base_url, recorder):
        result = await run(config(base_url, "whole", stream=False), scen)
    assert result.exit_reason is ExitReason.COMPLETED
    assert result.usage.estimated is False
    assert all(b["stream"] is False and "stream_options" not in b for b in recorder.bodies)


@pytest.mark.asyncio
async def test_required_is_reset_to_auto_after_a_call_unless_told_not_to() -> None:
    body = """
task = "Read, then answer."
[folder]
"a.txt" = "a"
[[steps]]
tool_calls = [{ name = "read_file", arguments = { path = "a.txt" } }]
[[steps]]
tool_calls = [{ name = "read_file", arguments = { path = "a.txt", offset = 1 } }]
[[steps]]
text = "Done."
[expect]
exit_reason = "completed"
"""
    scen = scenario("forced", body)
    async with serving(scen) as (base_url, recorder):
        await run(config(base_url, "forced", tool_choice="required"), scen)
        reset = [b["tool_choice"] for b in recorder.bodies]
        recorder.bodies.clear()
        await run(config(base_url, "forced", tool_choice="required", reset_tool_choice=False), scen)
        kept = [b["tool_choice"] for b in recorder.bodies]
    assert reset == ["required", "auto", "auto"]
    assert kept == ["required", "required", "required"]


@pytest.mark.asyncio
async def test_per_model_settings_override_the_model_section() -> None:
    scen = scenario("own", READS_THEN_ANSWERS.format(server="openai"))
    other = scenario("other", READS_THEN_ANSWERS.format(server="openai"))
    own = {"stream": False, "tool_choice": "read_file", "reset_tool_choice": False}
    async with serving(scen, other) as (base_url, recorder):
        cfg = config(base_url, "own", tool_choice="none", models={"own": own})
        await run(cfg, scen)
        mine = list(recorder.bodies)
        recorder.bodies.clear()
        await run(cfg, other)
    forced = {"type": "function", "function": {"name": "read_file"}}
    assert [(b["stream"], b["tool_choice"]) for b in mine] == [(False, forced), (False, forced)]
    # (the default profile calls the scripted tool whatever the choice says)
    assert [(b["stream"], b["tool_choice"]) for b in recorder.bodies] == [(True, "none")] * 2


# ---------------------------------------------------------------- settings as config


def write(tmp_path: Any, text: str) -> str:
    path = tmp_path / "loopfuse.toml"
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_the_settings_load_with_their_defaults_and_per_model(tmp_path: Any) -> None:
    defaults = load_config(environ={})
    assert (
        defaults.model.stream,
        defaults.model.tool_choice,
        defaults.model.reset_tool_choice,
    ) == (True, "auto", True)
    loaded = load_config(
        write(
            tmp_path,
            '[model]\nstream = false\ntool_choice = "required"\n'
            '[models."models/tiny.gguf"]\ntool_choice = "read_file"\nreset_tool_choice = false\n',
        ),
        environ={"LOOPFUSE_MODEL__RESET_TOOL_CHOICE": "false"},
    )
    assert (loaded.model.stream, loaded.model.tool_choice) == (False, "required")
    assert loaded.model.reset_tool_choice is False
    own = loaded.models["models/tiny.gguf"]
    assert (own.stream, own.tool_choice, own.reset_tool_choice) == (None, "read_file", False)


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ('[model]\ntool_choice = "read file; rm -rf"\n', "model.tool_choice"),
        ("[model]\ntool_choice = 1\n", "model.tool_choice"),
        (f'[model]\ntool_choice = "{"x" * 65}"\n', "model.tool_choice"),
        ('[model]\nstream = "yes"\n', "model.stream"),
        ("[model]\nreset_tool_choice = 0\n", "model.reset_tool_choice"),
        ('[models."m"]\ntool_choice = ""\n', 'models."m".tool_choice'),
        ('[models."m"]\nstream = 2\n', 'models."m".stream'),
        ("[model]\ntemperature = 2.5\n", "model.temperature"),
        ("[model]\nseed = -1\n", "model.seed"),
    ],
)
def test_a_bad_value_names_its_key(tmp_path: Any, text: str, key: str) -> None:
    with pytest.raises(ConfigError) as refused:
        load_config(write(tmp_path, text), environ={})
    assert refused.value.key == key


@pytest.mark.asyncio
async def test_a_tool_choice_naming_a_tool_the_run_lacks_is_refused_at_run_start() -> None:
    cfg = Config(model=ModelSettings(tool_choice="wirte_file"))
    per_model = Config(
        model=ModelSettings(model="m"), models={"m": ModelCapabilities(tool_choice="nope")}
    )
    async with Runtime(cfg) as runtime:
        with pytest.raises(ConfigError) as refused:
            await runtime.start(RunSpec(task="x", folder="."))
        assert refused.value.key == "model.tool_choice"
        assert "'wirte_file'" in str(refused.value)
        assert "read_file" in str(refused.value)
        # A run without tools sends no tool_choice: nothing to refuse.
        handle = await runtime.start(RunSpec(task="x", overrides={"tools": []}))
        with anyio.fail_after(WAIT):
            await handle.result()
    async with Runtime(per_model) as runtime:
        with pytest.raises(ConfigError) as refused:
            await runtime.start(RunSpec(task="x", folder="."))
        assert refused.value.key == 'models."m".tool_choice'


class NoArgs(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pass


def clock(params: NoArgs, ctx: ToolContext) -> str:
    return "12:00"


@pytest.mark.asyncio
async def test_a_forced_folder_tool_in_a_run_without_a_folder_is_refused() -> None:
    registry = default_registry()
    registry.add(Tool("clock", "The time.", NoArgs, clock))
    tools = {"tools": ["read_file", "clock"]}
    cfg = Config(model=ModelSettings(tool_choice="read_file"))
    async with Runtime(cfg, tools=registry) as runtime:
        await runtime.start(RunSpec(task="x", folder=".", overrides=tools))  # offered
        with pytest.raises(ConfigError) as refused:
            await runtime.start(RunSpec(task="x", overrides=tools))  # clock only
        # No folder and only folder tools: no tools at all, so no tool_choice to refuse.
        handle = await runtime.start(RunSpec(task="x"))
        with anyio.fail_after(WAIT):
            await handle.result()
    assert refused.value.key == "model.tool_choice"
    assert "(clock)" in str(refused.value)


# ---------------------------------------------------------------- tools only when usable


@pytest.mark.asyncio
async def test_a_run_without_a_folder_is_offered_no_folder_tools_but_its_own() -> None:
    scripted = """
task = "What time is it?"
[[tools]]
name = "clock"
results = ["12:00"]
[[steps]]
tool_calls = [{ name = "clock", arguments = {} }]
[[steps]]
text = "Noon."
[expect]
exit_reason = "completed"
"""
    scen = scenario("no_folder", scripted)
    async with (
        serving(scen) as (base_url, recorder),
        Runtime(config(base_url, "no_folder")) as runtime,
    ):
        with anyio.fail_after(WAIT):
            tools = runtime.add_scenario_tools(scen)
            overrides = {"model": "no_folder", "tools": ["list_dir", "read_file", *tools]}
            result = await runtime.run(RunSpec(task=scen.task, overrides=overrides))
            hello = await runtime.run(RunSpec(task="Say hello.", overrides={"model": "no_folder"}))
    assert result.exit_reason is ExitReason.COMPLETED
    assert result.output == "Noon."
    first = recorder.bodies[0]
    assert [t["function"]["name"] for t in first["tools"]] == ["clock"]
    assert hello.exit_reason is ExitReason.COMPLETED
    assert "tools" not in recorder.bodies[-1]


# ---------------------------------------------------------------- two calls, one id


@pytest.mark.asyncio
@pytest.mark.parametrize("server", ["openai", "llama_cpp_python"])
async def test_two_calls_under_one_id_both_run_and_go_back_under_the_servers_id(
    server: str,
) -> None:
    body = f"""
task = "Look around."
server = "{server}"
[folder]
"notes.txt" = "n"
[[steps]]
tool_calls = [
  {{ name = "list_dir", id = "call_0", arguments = {{ path = "." }} }},
  {{ name = "read_file", id = "call_0", arguments = {{ path = "notes.txt" }} }},
]
[[steps]]
text = "Done."
[expect]
exit_reason = "completed"
"""
    scen = scenario(f"same_id_{server}", body)
    async with serving(scen) as (base_url, recorder):
        result = await run(config(base_url, scen.name, stream=False), scen)
    assert result.exit_reason is ExitReason.COMPLETED
    assert [entry.tool for entry in result.call_log] == ["list_dir", "read_file"]
    if server == "llama_cpp_python":
        return  # it numbers its ids itself: call__0_…, call__1_…
    sent = recorder.bodies[-1]["messages"]
    (turn,) = [m for m in sent if m["role"] == "assistant" and "tool_calls" in m]
    assert [c["id"] for c in turn["tool_calls"]] == ["call_0", "call_0"]
    assert [m["tool_call_id"] for m in sent if m["role"] == "tool"] == ["call_0", "call_0"]
    ours = [c.id for m in result.transcript for c in m.tool_calls]
    assert len(set(ours)) == 2


# ---------------------------------------------------------------- refused or down


def failing(status: int, message: str, type_: str, *, forever: bool = True) -> Scenario:
    times = "forever = true" if forever else "times = 2"
    body = f"""
task = "Anything."
[[steps]]
text = "Fine."
faults = [{{ status = {status}, type = "{type_}", message = '''{message}''', {times} }}]
[expect]
exit_reason = "completed"
"""
    return scenario(f"failing_{status}_{len(message)}", body)


DUMP = (
    "1 validation error:\n  {'type': 'string_type', 'loc': ('body', 'messages', 1, "
    "'ChatCompletionRequestAssistantMessage', 'content'), 'msg': 'Input should be a valid "
    "string', 'input': None}"
)


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("status", "message", "type_"),
    [
        (500, DUMP, "internal_server_error"),
        (500, "Unsupported value: messages[1].role", "invalid_request_error"),
        (422, "Unprocessable: tool_choice", "invalid_request_error"),
        (400, "Unknown parameter: 'temprature'.", "invalid_request_error"),
    ],
)
async def test_a_request_refused_as_invalid_is_not_retried(
    status: int, message: str, type_: str
) -> None:
    scen = failing(status, message, type_)
    async with serving(scen) as (base_url, recorder):
        result = await run(config(base_url, scen.name), scen)
    assert (result.exit_reason, result.cause) == (
        ExitReason.ABORTED_STREAMING,
        "model.bad_request",
    )
    assert len(recorder.bodies) == 1
    assert f"refused the request as invalid (HTTP {status})" in result.detail
    quoted = "Input should be a valid string" if status == 500 and "loc" in message else message
    assert quoted in result.detail
    assert "not retried" in result.hint


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("status", "message", "type_"),
    [
        (500, "The server had an error while processing your request.", "server_error"),
        (500, "Internal Server Error", "internal_server_error"),
        (502, "Bad gateway", "server_error"),
        (503, "The server is overloaded or not ready yet.", "server_error"),
        # A validation dump about the server's own response is its bug, not the request's.
        (500, DUMP.replace("'body'", "'response'"), "internal_server_error"),
    ],
)
async def test_an_outage_is_retried(status: int, message: str, type_: str) -> None:
    scen = failing(status, message, type_, forever=False)
    async with serving(scen) as (base_url, recorder):
        result = await run(config(base_url, scen.name), scen)
    assert (result.exit_reason, result.output) == (ExitReason.COMPLETED, "Fine.")
    assert len(recorder.bodies) == 3  # two failures, then the answer


@pytest.mark.asyncio
async def test_a_long_refusal_is_quoted_cut_at_a_word_boundary() -> None:
    words = " ".join(f"word{i:04d}" for i in range(400))  # 3,599 characters
    scen = failing(400, words, "invalid_request_error")
    async with serving(scen) as (base_url, _):
        result = await run(config(base_url, scen.name), scen)
    assert result.cause == "model.bad_request"
    quoted = result.detail.split("(HTTP 400): ", 1)[1]
    assert quoted.endswith("…")
    kept = quoted.removesuffix("…")
    assert words.startswith(kept)
    assert words[len(kept)] == " "  # whole words only
    assert len(quoted) < 500


def test_classify_a_fastapi_422_and_an_unrelated_500() -> None:
    request = httpx2.Request("POST", "http://127.0.0.1/v1/chat/completions")
    detail = {"detail": [{"type": "missing", "loc": ["body", "model"], "msg": "Field required"}]}
    response = httpx2.Response(422, json=detail, request=request)
    failure = classify(
        openai.APIStatusError("Error code: 422", response=response, body=detail), streaming=False
    )
    assert (failure.kind, failure.retryable) == ("bad_request", False)
    assert failure.message.endswith("(HTTP 422): 1 validation error: model: Field required")
    # "validation" in a 5xx that is not a dump about the request: an outage.
    body = {"message": "upstream validation service unavailable", "type": "server_error"}
    response = httpx2.Response(503, json={"error": body}, request=request)
    failure = classify(
        openai.APIStatusError("Error code: 503", response=response, body=body), streaming=False
    )
    assert (failure.kind, failure.retryable) == ("server_error", True)


# ---------------------------------------------------------------- streams and usage


@pytest.mark.asyncio
async def test_include_usage_is_honoured_by_default_and_ignored_by_the_llama_profile() -> None:
    plain = scenario("usage_plain", HELLO)
    strict = scenario("usage_strict", 'server = "llama_cpp_python"\n' + HELLO)
    user: Any = [{"role": "user", "content": "Say hello."}]
    async with serving(plain, strict) as (base_url, _):
        client = openai.AsyncOpenAI(base_url=base_url, api_key="k", max_retries=0)
        seen: dict[tuple[str, bool], list[Any]] = {}
        for model in ("usage_plain", "usage_strict"):
            for asked in (True, False):
                stream = await client.chat.completions.create(
                    model=model,
                    messages=user,
                    stream=True,
                    stream_options={"include_usage": asked},
                )
                seen[model, asked] = [c.usage async for c in stream if c.usage is not None]
        await client.close()
    (usage,) = seen["usage_plain", True]
    assert usage.completion_tokens > 0
    assert seen["usage_plain", False] == []
    assert seen["usage_strict", True] == seen["usage_strict", False] == []


@pytest.mark.asyncio
async def test_the_llama_profile_streams_a_forced_call_with_its_head_in_every_chunk() -> None:
    scen = scenario("strict_stream", READS_THEN_ANSWERS.format(server="llama_cpp_python"))
    tools: Any = [{"type": "function", "function": {"name": "read_file", "parameters": {}}}]
    choice: Any = {"type": "function", "function": {"name": "read_file"}}
    async with serving(scen) as (base_url, _):
        client = openai.AsyncOpenAI(base_url=base_url, api_key="k", max_retries=0)
        stream = await client.chat.completions.create(
            model="strict_stream",
            messages=[{"role": "user", "content": "Read it."}],
            tools=tools,
            tool_choice=choice,
            stream=True,
        )
        deltas = [c.choices[0].delta async for c in stream if c.choices]
        auto = await client.chat.completions.with_raw_response.create(
            model="strict_stream",
            messages=[{"role": "user", "content": "Read it."}],
            tools=tools,
            tool_choice="auto",
            stream=True,
        )
        nothing = await auto.http_response.aread()
        await client.close()
    fragments = [d.tool_calls[0] for d in deltas if d.tool_calls]
    assert len(fragments) >= 3
    assert {(f.index, f.id, f.type, f.function.name) for f in fragments if f.function} == {
        (0, fragments[0].id, "function", "read_file")
    }
    assert (fragments[0].id or "").startswith("call__0_read_file_cmpl-")
    assert "" in [f.function.arguments for f in fragments if f.function]
    assert "".join(f.function.arguments or "" for f in fragments if f.function) == (
        '{"path":"notes.txt"}'
    )
    # "auto" streamed: 200, an event stream, and not one event (no [DONE] either).
    assert auto.http_response.status_code == 200
    assert auto.http_response.headers["content-type"].startswith("text/event-stream")
    assert nothing == b""


@pytest.mark.asyncio
async def test_a_folder_run_without_a_system_prompt_starts_with_the_folder_one(
    tmp_path: Any,
) -> None:
    """llama-cpp-python's chatml-function-calling shows a model its tools only inside a
    system message (docs/servers.md, the real-model tier): a folder run brings one."""
    from orchestrator.runtime import FOLDER_SYSTEM_PROMPT

    (tmp_path / "a.txt").write_text("a")
    scen = scenario("hello", HELLO)
    folder = str(tmp_path)
    async with serving(scen) as (base_url, recorder), Runtime(config(base_url, "hello")) as rt:
        with anyio.fail_after(WAIT):
            await rt.run(RunSpec(task="Say hello.", folder=folder))
            await rt.run(RunSpec(task="Say hello.", folder=folder, system=""))
            await rt.run(RunSpec(task="Say hello.", folder=folder, system="Be."))
            await rt.run(RunSpec(task="Say hello."))  # no folder, no tools
    told, untold, own, folderless = (body["messages"] for body in recorder.bodies)
    assert told[0] == {"role": "system", "content": FOLDER_SYSTEM_PROMPT}
    assert [m["role"] for m in untold] == ["user"]
    assert own[0] == {"role": "system", "content": "Be."}
    assert [m["role"] for m in folderless] == ["user"]
