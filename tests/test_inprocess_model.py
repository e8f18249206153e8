"""Scenario runs play the model in process, and end exactly as they do over HTTP.

Every shipped scenario runs twice: on a runtime without an endpoint (in-process scenarios
answered on the bus, the others through the embedded simulator) and on a runtime whose
endpoint is a simulator over loopback (every request over HTTP, as before). Results, usage,
transcripts and the bus events (streamed text joined, timings left out) must be the same.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import anyio
import msgspec
import pytest

from actors.llm.settings import endpoint_settings
from bus import Message, ModelReply, ModelRequest, ModelTextDelta, RunStarted
from orchestrator.config import Config
from orchestrator.result import RunResult
from orchestrator.runtime import Runtime
from orchestrator.scenarios.runs import expectation_mismatches, start_scenario
from orchestrator.sim import Scenario, open_simulator, parse_scenario, shipped_scenarios
from orchestrator.sim.inprocess import InProcessModel, plays_in_process

SHIPPED = shipped_scenarios()
IN_PROCESS = [s for s in SHIPPED if plays_in_process(s)]
OVER_THE_WIRE = [s for s in SHIPPED if not plays_in_process(s)]
TIMING_DEPENDENT = {"llm_loop_check", "deadline"}
"""In-process scenarios whose turns depend on how fast the model answers: the model-based
loop check asks its model beside the run, and its verdict lands at a later turn when the
answer takes a loopback round trip; a wall-clock deadline cuts the run after as many of its
0.3 s replies as fit, fewer when the machine is busy (every shipped scenario runs at once)."""
TIMINGS = {
    "at",
    "started_at",
    "deadline_at",
    "elapsed_seconds",
    "duration_seconds",
    "latency_seconds",
    "ttft_seconds",
}
TEMPORARY = re.compile(r"/\S*?loopfuse-[^/\s]+")
"""A temporary folder of a run (a pipeline's report is written to one)."""
PER_RUN = {"run_id", "trace_id", "traceparent", "folder"}
TRANSPORT = {"response_id", "in_process"}
"""What says how a reply came: the server's completion id, or that none was contacted."""


def _comparable(value: Any, folder: str = "") -> Any:
    """``value`` as plain data without per-run ids and timings, ``folder`` named alike."""
    if isinstance(value, dict):
        return {
            k: _comparable(v, folder)
            for k, v in value.items()
            if k not in TIMINGS | PER_RUN | TRANSPORT
        }
    if isinstance(value, list | tuple):
        return [_comparable(v, folder) for v in value]
    if isinstance(value, str):
        return TEMPORARY.sub("<folder>", value.replace(folder, "<folder>") if folder else value)
    return value


def _events(events: Sequence[Message]) -> list[Any]:
    """The events in order, each run of text deltas joined into one (the wire splits text
    by network read, the in-process model by attempt)."""
    out: list[Any] = []
    folder = next((e.folder or "" for e in events if isinstance(e, RunStarted)), "")
    for event in events:
        data = _comparable(msgspec.to_builtins(event), folder)
        if isinstance(event, ModelTextDelta) and out and out[-1][0] == "ModelTextDelta":
            out[-1][1]["text"] += data["text"]
            continue
        out.append([type(event).__name__, data])
    return out


async def _run(runtime: Runtime, scenario: Scenario) -> tuple[RunResult, list[Message]]:
    handle = await start_scenario(runtime, scenario)
    with anyio.fail_after(60):
        events = [event async for event in handle.events()]
        return await handle.result(), events


async def _run_all(runtime: Runtime) -> dict[str, tuple[RunResult, list[Message]]]:
    runs: dict[str, tuple[RunResult, list[Message]]] = {}

    async def one(scenario: Scenario) -> None:
        runs[scenario.name] = await _run(runtime, scenario)

    async with anyio.create_task_group() as tg:
        for scenario in SHIPPED:
            tg.start_soon(one, scenario)
    return runs


async def _all_over_http() -> dict[str, tuple[RunResult, list[Message]]]:
    async with open_simulator(SHIPPED) as simulator:
        model = msgspec.structs.replace(Config().model, base_url=simulator.base_url)
        async with Runtime(msgspec.structs.replace(Config(), model=model)) as runtime:
            return await _run_all(runtime)


@pytest.mark.asyncio
async def test_every_shipped_scenario_ends_the_same_in_process_and_over_http() -> None:
    assert {s.name for s in IN_PROCESS} >= {"completed", "dead_loop", "max_turns", "truncation"}
    async with Runtime() as runtime:
        local = await _run_all(runtime)
    remote = await _all_over_http()
    for scenario in SHIPPED:
        (result, events), (wired, wired_events) = local[scenario.name], remote[scenario.name]
        assert expectation_mismatches(scenario, result) == [], scenario.name
        assert expectation_mismatches(scenario, wired) == [], scenario.name
        if scenario in OVER_THE_WIRE or scenario.name in TIMING_DEPENDENT:
            continue  # the same path both times, or an ending that depends on timing
        assert _comparable(msgspec.to_builtins(result)) == _comparable(
            msgspec.to_builtins(wired)
        ), scenario.name
        mine, theirs = _events(events), _events(wired_events)
        for index, (event, wired_event) in enumerate(zip(mine, theirs, strict=False)):
            assert event == wired_event, (scenario.name, index)
        assert len(mine) == len(theirs), scenario.name


@pytest.mark.asyncio
async def test_in_process_scenarios_need_no_endpoint_at_all() -> None:
    """With no wire actor, a request the in-process model passed on would fail the run."""
    endpoint = endpoint_settings(Config().model, base_url="http://127.0.0.1:9/v1", api_key="")

    def model(bus: Any) -> InProcessModel:
        return InProcessModel(bus, SHIPPED, endpoint)

    async with Runtime(model_actor=model) as runtime:
        for scenario in IN_PROCESS:
            if scenario.name == "deadline":
                continue  # its last request would outlast the run's deadline: the wire's
            result, _ = await _run(runtime, scenario)
            assert expectation_mismatches(scenario, result) == [], scenario.name


@pytest.mark.asyncio
async def test_a_request_only_the_wire_can_answer_goes_to_the_simulator() -> None:
    """A script that runs out of steps: the simulator's own 400, not an in-process guess."""
    scenario = parse_scenario(
        """
task = "Say it twice."
[[steps]]
tool_calls = [{ name = "list_files", arguments = {} }]
[expect]
exit_reason = "completed"
""",
        source="short.toml",
        name="short_script",
    )
    assert plays_in_process(scenario)
    async with Runtime(scenarios=[scenario]) as runtime:
        result, _ = await _run(runtime, scenario)
    assert result.cause == "model.bad_request"
    assert "(HTTP 400): scenario 'short_script' has no step 1" in result.detail


def test_the_wire_is_chosen_from_the_scenario_file() -> None:
    expect = '[expect]\nexit_reason = "completed"\n'
    cases = {
        '[[steps]]\ntext = "hi"\n': True,
        'wire = true\n[[steps]]\ntext = "hi"\n': False,
        '[[steps]]\ntext = "hi"\nlatency = 0.1\n': True,
        '[[steps]]\ntext = "hi"\nchunk_latency = 0.01\n': False,
        '[[steps]]\ntext = "hi"\nkeep_alive = 0.5\n': False,
        '[[steps]]\ntext = "hi"\n[[steps.faults]]\nstatus = 503\n': False,
        'context_window = 100\n[[steps]]\ntext = "hi"\n': False,
        '[[branches]]\nnudge = "loop"\ntrack = "b"\n[[steps]]\ntext = "hi"\n'
        '[tracks]\nb = [{ text = "x", chunk_latency = 0.1 }]\n': False,
        '[abort]\nafter_text_chars = 5\n[[steps]]\ntext = "hi"\n': False,
        '[abort]\nafter_tool_result = "x"\n[[steps]]\ntext = "hi"\n': True,
        'server = "llama_cpp_python"\n[[steps]]\ntext = "hi"\n': False,
        '[[steps]]\ntext = "hi"\nstream = { arguments = "cumulative" }\n': False,
    }
    for body, local in cases.items():
        scenario = parse_scenario('task = "t"\n' + body + expect, source="x.toml", name="x")
        assert plays_in_process(scenario) is local, body


def _slow(latency: float) -> Scenario:
    return parse_scenario(
        f"""
task = "Answer slowly."
[[steps]]
latency = {latency}
text = "Here it is."
[expect]
exit_reason = "completed"
""",
        source="slow.toml",
        name="slow_answer",
    )


def _no_wire(scenario: Scenario, **limits: float) -> tuple[list[InProcessModel], Any]:
    """A model actor factory with no wire actor (a request passed on fails the run) and the
    models it built."""
    model_config = msgspec.structs.replace(Config().model, **limits)
    endpoint = endpoint_settings(model_config, base_url="http://127.0.0.1:9/v1", api_key="")
    built: list[InProcessModel] = []

    def model(bus: Any) -> InProcessModel:
        built.append(InProcessModel(bus, [scenario], endpoint))
        return built[0]

    return built, model


@pytest.mark.asyncio
async def test_a_step_latency_is_waited_in_process() -> None:
    scenario = _slow(0.2)
    built, model = _no_wire(scenario)
    async with Runtime(model_actor=model, scenarios=[scenario]) as runtime:
        result, events = await _run(runtime, scenario)
    assert result.exit_reason == "completed"
    assert result.output == "Here it is."
    assert built[0].answered == 1
    assert built[0].forwarded == 0
    (reply,) = [e for e in events if isinstance(e, ModelReply)]
    assert reply.latency_seconds >= 0.2  # published once the latency had passed


@pytest.mark.asyncio
async def test_a_run_aborted_while_its_model_waits_gets_the_aborted_reply_at_once() -> None:
    scenario = _slow(60.0)  # under the run's default deadline, or the wire would play it
    built, model = _no_wire(scenario, timeout_seconds=3600.0, call_deadline_seconds=3600.0)
    async with Runtime(model_actor=model, scenarios=[scenario]) as runtime:
        handle = await start_scenario(runtime, scenario)
        with anyio.fail_after(30):
            async for event in handle.events():
                if isinstance(event, ModelRequest):
                    await handle.abort("enough")
            result = await handle.result()
    assert result.exit_reason == "aborted_streaming"  # as when the caller waits on a server
    assert built[0].forwarded == 0
    assert result.usage.prompt_tokens > 0  # the aborted reply's estimate, as the caller's


@pytest.mark.asyncio
async def test_a_latency_a_timeout_would_cut_is_left_to_the_wire() -> None:
    """The caller's read timeout (and its retries) decide what such a wait ends in."""
    scenario = _slow(5.0)
    built, model = _no_wire(scenario, timeout_seconds=1.0)
    async with Runtime(model_actor=model, scenarios=[scenario]) as runtime:
        result, _ = await _run(runtime, scenario)
    assert built[0].answered == 0
    assert result.cause == "model.bad_request"
    assert "no model endpoint serves 'slow_answer'" in result.detail  # no wire actor here
