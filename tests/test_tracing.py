"""OpenTelemetry traces (``orchestrator/tracing``) at the unit level: real runs through a
runtime whose trace exporter ends its spans into the SDK's in-memory exporter; the
``traceparent`` header parsed, sent with the model requests and read by the daemon; drops
counted when the export queue is full; nothing loaded or subscribed with tracing off.

The same against a real backend (Arize Phoenix): ``tests/test_tracing_phoenix.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from prometheus_client import generate_latest

from actors.llm.settings import EndpointSettings
from actors.llm.transport import ChatTransport
from orchestrator.config import Config, ModelSettings, TracingSettings
from orchestrator.daemon import open_daemon
from orchestrator.daemon.client import DaemonClient
from orchestrator.errors import ConfigError
from orchestrator.runtime import RunSpec, Runtime
from orchestrator.scenarios.runs import start_scenario
from orchestrator.sim import shipped_scenarios
from orchestrator.tracing import TraceParent, parse_traceparent
from orchestrator.tracing.exporter import SUBSCRIBER
from orchestrator.tracing.provider import CountingProcessor
from tests.daemon_support import daemon_config, wait_ended
from tests.loopback import open_loopback
from tests.test_llm_transport import OK_STREAM, SSE, Server

SCENARIOS = {scenario.name: scenario for scenario in shipped_scenarios()}
WAIT = 60.0
PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def traced(**settings: Any) -> Config:
    return Config(tracing=TracingSettings(enabled=True, **settings))


async def run_scenario(name: str, config: Config) -> tuple[Any, list[ReadableSpan]]:
    exporter = InMemorySpanExporter()
    with anyio.fail_after(WAIT):
        async with Runtime(config, span_exporter=exporter) as runtime:
            result = await (await start_scenario(runtime, SCENARIOS[name])).result()
    return result, list(exporter.get_finished_spans())


def by_name(spans: Sequence[ReadableSpan], prefix: str) -> list[ReadableSpan]:
    return [span for span in spans if span.name.startswith(prefix)]


# ------------------------------------------------------------------ spans of a run


@pytest.mark.asyncio
async def test_a_loop_run_as_spans_of_the_genai_conventions() -> None:
    result, spans = await run_scenario("dead_loop", traced())
    (run,) = by_name(spans, "invoke_agent ")
    chats, tools = by_name(spans, "chat "), by_name(spans, "execute_tool ")
    assert len(spans) == 1 + len(chats) + len(tools)

    # The run: a root span whose trace id is the run's.
    assert run.name == "invoke_agent loopfuse"
    assert run.parent is None
    assert f"{run.context.trace_id:032x}" == result.trace_id
    assert run.kind is SpanKind.INTERNAL
    attributes = dict(run.attributes or {})
    assert attributes["gen_ai.operation.name"] == "invoke_agent"
    assert attributes["loopfuse.run_id"] == result.run_id
    assert attributes["loopfuse.exit_reason"] == result.exit_reason.value == "hook_stopped"
    assert attributes["loopfuse.cause"] == result.cause == "loop.generic_repeat"
    assert attributes["loopfuse.turns"] == result.turns
    assert attributes["gen_ai.usage.input_tokens"] == result.usage.prompt_tokens
    assert attributes["loopfuse.budget.max_turns"] == SCENARIOS["dead_loop"].config.get(
        "max_turns", 20
    )
    assert run.status.status_code is StatusCode.ERROR
    events = [(event.name, dict(event.attributes or {})) for event in run.events]
    names = [name for name, _ in events]
    assert "loopfuse.verdict" in names
    assert "loopfuse.nudge" in names
    assert names[-1] == "loopfuse.stop"
    assert events[-1][1]["loopfuse.cause"] == "loop.generic_repeat"
    verdict = next(attrs for name, attrs in events if name == "loopfuse.verdict")
    assert verdict["loopfuse.verdict"] in ("warn", "block")
    assert verdict["loopfuse.source"] == "loop_monitor"

    # A chat span per model request, a tool span per executed call, children of the run.
    assert len(chats) == result.llm_requests
    assert len(tools) == result.tool_calls
    for span in (*chats, *tools):
        assert span.parent is not None
        assert span.parent.span_id == run.context.span_id
        assert span.context.trace_id == run.context.trace_id
        assert run.start_time is not None
        assert span.start_time is not None
        assert span.end_time is not None
        assert run.end_time is not None
        assert run.start_time <= span.start_time < span.end_time <= run.end_time
    chat = dict(chats[0].attributes or {})
    assert chats[0].name == "chat dead_loop"
    assert chats[0].kind is SpanKind.CLIENT
    assert chat["gen_ai.operation.name"] == "chat"
    assert chat["gen_ai.request.model"] == "dead_loop"
    assert chat["gen_ai.response.finish_reasons"] == ("tool_calls",)
    # played in process: no server was contacted, and the provider is the simulator
    assert "server.address" not in chat
    assert "server.port" not in chat
    assert chat["gen_ai.provider.name"] == "loopfuse.simulator"
    assert attributes["gen_ai.provider.name"] == "loopfuse.simulator"
    assert chat["gen_ai.response.model"] == "dead_loop"
    assert sum(c.attributes["gen_ai.usage.input_tokens"] for c in chats) == (  # type: ignore[index,misc]
        result.usage.prompt_tokens
    )
    call_ids = [entry.call_id for entry in result.call_log if entry.verdict != "not_run"]
    assert [t.attributes["gen_ai.tool.call.id"] for t in tools] == call_ids  # type: ignore[index]
    assert {t.name for t in tools} == {"execute_tool read_file"}
    assert {t.attributes["gen_ai.tool.name"] for t in tools} == {"read_file"}  # type: ignore[index]


@pytest.mark.asyncio
async def test_content_stays_off_the_spans_unless_the_operator_asks() -> None:
    content_keys = {
        "gen_ai.input.messages",
        "gen_ai.output.messages",
        "gen_ai.tool.call.arguments",
        "gen_ai.tool.call.result",
        "loopfuse.task",
    }
    _, spans = await run_scenario("dead_loop", traced())
    seen = {key for span in spans for key in (span.attributes or {})}
    seen |= {key for span in spans for event in span.events for key in (event.attributes or {})}
    assert not seen & content_keys
    assert "loopfuse.text" not in seen
    assert "loopfuse.detail" not in seen

    _result, spans = await run_scenario("dead_loop", traced(capture_content=True))
    chat = by_name(spans, "chat ")[0]
    prompt = json.loads(str(chat.attributes["gen_ai.input.messages"]))  # type: ignore[index]
    assert prompt[-1]["role"] == "user"
    assert SCENARIOS["dead_loop"].task in prompt[-1]["parts"][0]["content"]
    reply = json.loads(str(chat.attributes["gen_ai.output.messages"]))  # type: ignore[index]
    assert reply[0]["parts"][0]["type"] == "tool_call"
    tool = by_name(spans, "execute_tool ")[0]
    assert json.loads(str(tool.attributes["gen_ai.tool.call.arguments"]))  # type: ignore[index]
    assert "gen_ai.tool.call.result" in (tool.attributes or {})
    (run,) = by_name(spans, "invoke_agent ")
    nudge = next(e for e in run.events if e.name == "loopfuse.nudge")
    assert (nudge.attributes or {})["loopfuse.text"]


@pytest.mark.asyncio
async def test_a_failed_model_request_is_an_error_span() -> None:
    result, spans = await run_scenario("api_down", traced())
    assert result.outcome.value == "failed"
    chats = by_name(spans, "chat ")
    assert chats
    last = chats[-1]
    assert last.status.status_code is StatusCode.ERROR
    assert (last.attributes or {})["error.type"] == (last.status.description or "")
    assert [e.name for e in last.events].count("loopfuse.model_error") >= 1


@pytest.mark.asyncio
async def test_a_run_spec_with_a_traceparent_is_a_child_of_the_callers_span() -> None:
    exporter = InMemorySpanExporter()
    with anyio.fail_after(WAIT):
        async with Runtime(traced(), span_exporter=exporter) as runtime:
            result = await runtime.run(RunSpec(task="Say hello.", traceparent=PARENT))
    parent = parse_traceparent(PARENT)
    assert parent is not None
    assert result.trace_id == parent.trace_id
    (run,) = by_name(exporter.get_finished_spans(), "invoke_agent ")
    assert run.parent is not None
    assert run.parent.is_remote
    assert f"{run.parent.span_id:016x}" == parent.span_id
    assert f"{run.context.trace_id:032x}" == parent.trace_id


# ------------------------------------------------------------------ traceparent


def test_traceparent_is_parsed_strictly() -> None:
    trace, span = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
    assert parse_traceparent(PARENT) == TraceParent(trace, span, 1)
    assert parse_traceparent(f" {PARENT}\t") == TraceParent(trace, span, 1)
    assert parse_traceparent(f"00-{trace}-{span}-00") == TraceParent(trace, span, 0)
    future = parse_traceparent(f"01-{trace}-{span}-03-what-comes-next")
    assert future == TraceParent(trace, span, 3)
    assert future.sampled
    assert TraceParent(trace, span, 1).header() == PARENT
    refused = [
        None,
        "",
        PARENT.upper(),  # lowercase hex only
        f"ff-{trace}-{span}-01",  # version ff is invalid
        f"00-{'0' * 32}-{span}-01",
        f"00-{trace}-{'0' * 16}-01",
        f"00-{trace}-{span}-01-extra",  # version 00 is exactly 55 characters
        f"01-{trace}-{span}-01extra",
        f"00-{trace[:-1]}-{span}-01",
        f"00_{trace}_{span}_01",
        f"00-{trace}-{span}-0g",
        "x" * 10_000,
    ]
    for value in refused:
        assert parse_traceparent(value) is None, value


def chat_requests(server: Server) -> list[tuple[str, list[tuple[str, str]], bytes]]:
    """The chat completions requests ``server`` saw (the context gatekeeper also asks the
    operator's server, once per model, for its window and tokenizer)."""
    return [request for request in server.seen if request[0].endswith("/chat/completions")]


@pytest.mark.asyncio
async def test_model_requests_carry_a_traceparent_naming_their_chat_span() -> None:
    server = Server((200, SSE, OK_STREAM))
    exporter = InMemorySpanExporter()
    async with open_loopback(server) as url:
        config = Config(
            model=ModelSettings(base_url=url, model="m", max_attempts=1),
            tracing=TracingSettings(enabled=True),
        )
        with anyio.fail_after(WAIT):
            async with Runtime(config, span_exporter=exporter) as runtime:
                result = await runtime.run(RunSpec(task="Say hi.", traceparent=PARENT))
    assert result.exit_reason.value == "completed"
    (chat,) = by_name(exporter.get_finished_spans(), "chat ")
    ids = chat.context
    expected = f"00-{ids.trace_id:032x}-{ids.span_id:016x}-01"
    (request,) = chat_requests(server)
    assert dict(request[1])["traceparent"] == expected
    assert expected.split("-")[1] == PARENT.split("-")[1]  # the caller's trace, end to end


@pytest.mark.asyncio
async def test_the_transport_sends_the_header_with_and_without_a_cookie() -> None:
    """The ``traceparent`` goes out with the transport's own headers, also once the server
    has set a cookie (which changes them)."""
    server = Server((200, [*SSE, (b"set-cookie", b"session=1")], OK_STREAM), (200, SSE, OK_STREAM))
    headers = ((b"traceparent", PARENT.encode()),)
    async with open_loopback(server) as url:
        transport = ChatTransport(EndpointSettings(base_url=url, api_key="k"))
        try:
            with anyio.fail_after(WAIT):
                await (await transport.post(b"{}", "r1", stream=True, headers=headers)).aclose()
                await (await transport.post(b"{}", "r2", stream=True, headers=headers)).aclose()
        finally:
            await transport.aclose()
    sent = [dict(request[1]) for request in server.seen]
    assert [h["traceparent"] for h in sent] == [PARENT, PARENT]
    assert sent[1]["cookie"] == "session=1"


@pytest.mark.asyncio
async def test_no_traceparent_header_with_tracing_off() -> None:
    server = Server((200, SSE, OK_STREAM))
    async with open_loopback(server) as url:
        config = Config(model=ModelSettings(base_url=url, model="m", max_attempts=1))
        with anyio.fail_after(WAIT):
            async with Runtime(config) as runtime:
                await runtime.run(RunSpec(task="Say hi."))
    (request,) = chat_requests(server)
    assert "traceparent" not in dict(request[1])


@pytest.mark.asyncio
async def test_the_daemon_takes_the_callers_trace_and_ignores_a_malformed_one(
    tmp_path: Path,
) -> None:
    """Without tracing too: the run's trace id is the caller's (logs and exemplars)."""
    async with (
        open_daemon(daemon_config(tmp_path)) as daemon,
        httpx.AsyncClient(base_url=daemon.url, timeout=WAIT) as http,
    ):

        async def submit(*headers: tuple[str, str]) -> dict[str, Any]:
            response = await http.post(
                "/v1/runs", json={"scenario": "completed"}, headers=list(headers)
            )
            assert response.status_code == 202, response.text
            body: dict[str, Any] = response.json()
            return body

        child = await submit(("traceparent", PARENT))
        assert child["trace_id"] == PARENT.split("-")[1]
        for bad in ("00-xyz", PARENT.upper(), "ff" + PARENT[2:]):
            run = await submit(("traceparent", bad))
            assert len(run["trace_id"]) == 32
            assert run["trace_id"] != PARENT.split("-")[1]
        twice = await submit(("traceparent", PARENT), ("traceparent", PARENT))
        assert twice["trace_id"] != PARENT.split("-")[1]  # repeated: ignored
        async with DaemonClient(daemon.url) as client:
            ended = await wait_ended(client, child["id"])
        assert ended["trace_id"] == PARENT.split("-")[1]


@pytest.mark.asyncio
async def test_tracing_settings_cannot_come_from_a_request(tmp_path: Path) -> None:
    async with (
        open_daemon(daemon_config(tmp_path)) as daemon,
        httpx.AsyncClient(base_url=daemon.url, timeout=WAIT) as http,
    ):
        for config in ({"tracing": {"enabled": True}}, {"capture_content": True}):
            response = await http.post("/v1/runs", json={"task": "Hi.", "config": config})
            assert response.status_code == 422, response.text
            assert response.json()["error"]["key"].startswith("config.")


# ------------------------------------------------------------------ cost and faults


class BlockedExporter(SpanExporter):
    """Holds every export until released: a backend that does not answer."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.spans: list[ReadableSpan] = []

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.release.wait(WAIT)
        self.spans.extend(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self.release.set()


def test_a_full_export_queue_drops_and_counts_instead_of_waiting() -> None:
    backend = BlockedExporter()
    processor = CountingProcessor(backend, queue_size=2, schedule_delay_millis=10)
    provider = TracerProvider()
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("test")
    for n in range(10):  # returns at once, the backend stuck on its first batch
        tracer.start_span(f"span {n}").end()
    counts = processor.counts()
    assert counts.queued + counts.dropped == 10
    assert counts.queued <= 2 + 2  # the queue, and the one batch the thread took
    assert counts.dropped >= 6
    backend.release.set()
    provider.shutdown()
    assert processor.counts().exported == counts.queued == len(backend.spans)


@pytest.mark.asyncio
async def test_drops_are_metrics_and_runs_never_wait_for_the_backend() -> None:
    backend = BlockedExporter()
    config = traced(queue_size=1, export_delay_seconds=0.01)
    try:
        with anyio.fail_after(WAIT):
            async with Runtime(config, span_exporter=backend) as runtime:
                result = await (await start_scenario(runtime, SCENARIOS["dead_loop"])).result()
                assert result.cause == "loop.generic_repeat"  # ended as without tracing
                text = generate_latest(runtime.metrics_registry).decode()
                assert runtime.tracing is not None
                stats = runtime.tracing.statistics()
                backend.release.set()
    finally:
        backend.release.set()
    assert stats.dropped > 0
    assert stats.errors == 0
    assert stats.runs == 0
    assert f"loopfuse_trace_spans_dropped_total {float(stats.dropped)}" in text


@pytest.mark.asyncio
async def test_tracing_off_subscribes_nothing_and_exports_nothing() -> None:
    exporter = InMemorySpanExporter()
    with anyio.fail_after(WAIT):
        async with Runtime(Config(), span_exporter=exporter) as runtime:
            await (await start_scenario(runtime, SCENARIOS["dead_loop"])).result()
            subscribers = {stats.name for stats in runtime.bus.statistics()}
            assert runtime.tracing is None
    assert SUBSCRIBER not in subscribers
    assert exporter.get_finished_spans() == ()


def test_tracing_off_loads_no_opentelemetry_sdk() -> None:
    """A run with the default config imports neither the SDK nor the exporter (a fresh
    interpreter: this test process has loaded them)."""
    code = (
        "import sys, anyio\n"
        "from orchestrator.runtime import Runtime, RunSpec\n"
        "from orchestrator.daemon import open_daemon\n"
        "async def main():\n"
        "    async with Runtime() as runtime:\n"
        "        await runtime.run(RunSpec(task='Hi.'))\n"
        "anyio.run(main)\n"
        "print(sorted(m for m in sys.modules if m.startswith(('opentelemetry.sdk', "
        "'opentelemetry.exporter', 'orchestrator.tracing.exporter'))))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=WAIT, check=True
    )
    assert done.stdout.strip() == "[]", done.stdout + done.stderr


def test_tracing_without_the_extra_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http", None)
    with pytest.raises(ConfigError) as caught:
        Runtime(traced())
    assert caught.value.key == "tracing.enabled"
    assert "loopfuse[otel]" in caught.value.reason


# ------------------------------------------------------------------ #30 item 12


WIRED = """
task = "Look at the folder."
wire = true
[folder]
"a.txt" = "x"
[[steps]]
tool_calls = [{ name = "list_dir", arguments = { path = "." } }]
[[steps]]
text = "One file."
[expect]
exit_reason = "completed"
"""


@pytest.mark.asyncio
async def test_a_chat_span_names_the_server_the_response_id_and_model() -> None:
    from orchestrator.sim import parse_scenario

    scenario = parse_scenario(WIRED, source="wired.toml", name="wired")
    exporter = InMemorySpanExporter()
    with anyio.fail_after(WAIT):
        async with Runtime(traced(), scenarios=[scenario], span_exporter=exporter) as rt:
            result = await (await start_scenario(rt, scenario)).result()
    chats = by_name(list(exporter.get_finished_spans()), "chat ")
    assert len(chats) == result.llm_requests == 2
    ids = set()
    for chat in chats:
        attributes = dict(chat.attributes or {})
        assert attributes["server.address"] == "127.0.0.1"  # over HTTP: it was contacted
        assert isinstance(attributes["server.port"], int)
        assert attributes["gen_ai.response.model"] == "wired"
        assert str(attributes["gen_ai.response.id"]).startswith("chatcmpl-")
        ids.add(attributes["gen_ai.response.id"])
    assert len(ids) == 2


def test_the_provider_name_comes_from_the_endpoint() -> None:
    from orchestrator.tracing.gen_ai_provider import provider_of

    assert provider_of(None) == "loopfuse.simulator"
    assert provider_of("https://api.openai.com/v1") == "openai"
    assert provider_of("https://api.deepseek.com/v1") == "deepseek"
    assert provider_of("https://lab.openai.azure.com/openai/v1") == "azure.ai.openai"
    assert provider_of("http://127.0.0.1:8080/v1") == "openai_compatible"


@pytest.mark.asyncio
async def test_the_operator_names_the_provider() -> None:
    _, spans = await run_scenario("completed", traced(provider_name="vllm"))
    named = [s for s in spans if not s.name.startswith("execute_tool ")]  # no provider there
    assert {(s.attributes or {}).get("gen_ai.provider.name") for s in named} == {"vllm"}
    with pytest.raises(ConfigError):
        load_config_text('[tracing]\nprovider_name = "Not A Name"\n')


def load_config_text(text: str) -> Config:
    import tempfile

    from orchestrator.config import load_config

    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as file:
        file.write(text)
    return load_config(file.name, environ={})


@pytest.mark.asyncio
async def test_a_pipeline_s_stage_runs_are_children_of_its_workflow_span() -> None:
    result, spans = await run_scenario("report", traced())
    (workflow,) = by_name(spans, "invoke_workflow ")
    stages = by_name(spans, "invoke_agent ")
    assert len(stages) >= 3  # explore, draft, reflect (finalize is code)
    assert workflow.parent is None
    assert (workflow.attributes or {})["loopfuse.run_id"] == result.run_id
    assert (workflow.attributes or {})["loopfuse.exit_reason"] == result.exit_reason.value
    assert f"{workflow.context.trace_id:032x}" == result.trace_id
    for stage in stages:
        assert stage.parent is not None
        assert stage.parent.span_id == workflow.context.span_id
    assert [s for s in spans if s.parent is None] == [workflow]


@pytest.mark.asyncio
async def test_a_hook_s_block_names_its_cause() -> None:
    _, spans = await run_scenario("hook_blocks", traced())
    (run,) = by_name(spans, "invoke_agent ")
    verdicts = [dict(e.attributes or {}) for e in run.events if e.name == "loopfuse.verdict"]
    hooks = [v for v in verdicts if str(v["loopfuse.source"]).startswith("hook.")]
    assert hooks
    for verdict in hooks:
        assert verdict["loopfuse.cause"] == verdict["loopfuse.source"]  # hook.<name>


@pytest.mark.asyncio
async def test_every_gen_ai_attribute_is_a_name_of_the_conventions() -> None:
    """loopfuse's own attributes live under ``loopfuse.*``: ``gen_ai.*`` is the
    conventions' namespace (the installed opentelemetry-semantic-conventions' names)."""
    from opentelemetry.semconv._incubating.attributes import gen_ai_attributes

    known = {
        value
        for name, value in vars(gen_ai_attributes).items()
        if name.startswith("GEN_AI_") and isinstance(value, str)
    }
    seen: set[str] = set()
    for name in ("dead_loop", "report", "hook_blocks"):
        _, spans = await run_scenario(name, traced(capture_content=True))
        for span in spans:
            seen |= set(span.attributes or {})
            seen |= {key for event in span.events for key in (event.attributes or {})}
    ours = {key for key in seen if key.startswith("gen_ai.")}
    assert ours - known == set()
    assert {key.split(".")[0] for key in seen} <= {"gen_ai", "loopfuse", "server", "error", "http"}
