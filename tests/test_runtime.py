"""The runtime end to end: real openai client, real simulator on loopback, shared actors."""

from __future__ import annotations

import asyncio
import collections
from typing import Any

import anyio
import msgspec
import pytest

from actors.tools import Tool, ToolContext, default_registry
from bus import (
    ExitReason,
    ModelReply,
    ModelTextDelta,
    Outcome,
    Progress,
    RunFinished,
    RunStarted,
    ToolExecute,
    TurnStarted,
)
from orchestrator.config import Config, RuntimeSettings
from orchestrator.errors import ConfigError, RuntimeClosedError
from orchestrator.runtime import RunSpec, Runtime
from orchestrator.scenarios.runs import expectation_mismatches, run_scenario, start_scenario
from orchestrator.sim import Scenario, parse_scenario, shipped_scenarios

SHIPPED = {scenario.name: scenario for scenario in shipped_scenarios()}


def scenario(text: str, name: str = "test") -> Scenario:
    return parse_scenario(text, source=f"{name}.toml", name=name)


SLOW_STREAM = scenario(
    """
task = "Write a long essay."
[[steps]]
text_tokens = 400
chunk_size = 8
chunk_latency = 0.02
[expect]
exit_reason = "aborted_streaming"
""",
    name="slow_stream",
)


@pytest.mark.asyncio
@pytest.mark.parametrize("name", sorted(SHIPPED))
async def test_every_shipped_scenario_ends_as_it_expects(name: str) -> None:
    async with Runtime() as runtime:
        result = await run_scenario(runtime, SHIPPED[name])
    assert expectation_mismatches(SHIPPED[name], result) == []
    assert result.outcome is (
        Outcome.DONE if result.exit_reason is ExitReason.COMPLETED else Outcome.FAILED
    )
    assert result.hint
    assert result.trace[-1].state in ("DONE", "FAILED")


@pytest.mark.asyncio
async def test_path_escape_is_refused_and_the_model_recovers() -> None:
    async with Runtime() as runtime:
        result = await run_scenario(runtime, SHIPPED["path_escape"])
    first, second = result.call_log
    assert first.is_error
    assert first.error_kind == "path"
    assert not second.is_error
    tool_messages = [m.content for m in result.transcript if m.role == "tool"]
    assert tool_messages[0] is not None
    assert "outside the folder" in tool_messages[0]
    assert "root:" not in tool_messages[0]  # nothing of /etc/passwd leaked
    assert "calibrate" in result.output.lower()


@pytest.mark.asyncio
async def test_two_hundred_concurrent_runs_keep_their_results_intact() -> None:
    names = ["completed", "max_turns", "path_escape", "max_tool_calls"]
    config = Config(runtime=RuntimeSettings(max_concurrent_runs=100))
    async with Runtime(config) as runtime:
        handles = []
        for index in range(200):
            chosen = SHIPPED[names[index % len(names)]]
            handle = await start_scenario(runtime, chosen, run_id=f"run-{index:03}")
            handles.append((chosen, handle))
        with anyio.fail_after(120):
            results = [(chosen, await handle.result()) for chosen, handle in handles]
    assert len({result.run_id for _, result in results}) == 200
    for chosen, result in results:
        assert expectation_mismatches(chosen, result) == [], (chosen.name, result.run_id)
        # Each transcript is that run's own: its task and no other run's tool results.
        assert result.transcript[0].content == chosen.task
        assert all(entry.turn <= result.turns for entry in result.call_log)
    counts = collections.Counter(result.exit_reason for _, result in results)
    assert counts == {ExitReason.COMPLETED: 100, ExitReason.MAX_TURNS: 100}


@pytest.mark.asyncio
async def test_events_follow_a_run_from_start_to_finish() -> None:
    async with Runtime() as runtime:
        handle = await start_scenario(runtime, SHIPPED["completed"])
        events = [event async for event in handle.events()]
        result = await handle.result()
        replay = [event async for event in handle.events()]
    assert isinstance(events[0], RunStarted)
    assert isinstance(events[-1], RunFinished)
    assert events == replay  # a late reader replays the same events
    assert all(event.run_id == handle.run_id for event in events)
    turns = [event.turn for event in events if isinstance(event, TurnStarted)]
    assert turns == list(range(1, result.turns + 1))
    progress = [event for event in events if isinstance(event, Progress)]
    assert progress[0].status == "started"
    assert {(event.index, event.total) for event in progress} == {(1, 1)}
    assert progress[-1].status == "finished"
    assert events[-1].exit_reason is result.exit_reason


@pytest.mark.asyncio
async def test_abort_while_streaming_keeps_the_text_received_so_far() -> None:
    async with Runtime(scenarios=[SLOW_STREAM]) as runtime:
        handle = await start_scenario(runtime, SLOW_STREAM)
        streamed = ""
        with anyio.fail_after(20):
            async for event in handle.events():
                if isinstance(event, ModelTextDelta):
                    streamed += event.text
                    if len(streamed) > 40:
                        await handle.abort("enough")
                        await handle.abort("twice is harmless")
            result = await handle.result()
    assert result.exit_reason is ExitReason.ABORTED_STREAMING
    assert result.cause == "abort.caller"
    assert result.detail == "enough"
    assert result.output
    assert result.output.startswith(streamed[:40])
    assert len(result.output) < 400 * 4  # cut before the end of the 400-token answer
    assert result.transcript[-1].role == "assistant"


def _slow_registry(started: anyio.Event, quick_done: anyio.Event, finished: list[str]) -> Any:
    class Wait(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
        seconds: float

    async def wait(params: Wait, ctx: ToolContext) -> str:
        started.set()
        await anyio.sleep(params.seconds)  # the tool's own work, not a test wait
        finished.append(str(params.seconds))
        if params.seconds < 1:
            quick_done.set()
        return f"waited {params.seconds}"

    registry = default_registry()
    registry.add(Tool("wait", "Wait a while.", Wait, wait))
    return registry


SLOW_TOOLS = scenario(
    """
task = "Wait for the two jobs."
[config]
tools = ["wait"]
abort_grace_seconds = 1.0
[[steps]]
tool_calls = [
  { name = "wait", arguments = { seconds = 0.05 } },
  { name = "wait", arguments = { seconds = 60 } },
]
[[steps]]
text = "done"
[expect]
exit_reason = "aborted_tools"
""",
    name="slow_tools",
)


@pytest.mark.asyncio
async def test_abort_while_tools_run_keeps_finished_results_and_cancels_after_grace() -> None:
    started, quick_done = anyio.Event(), anyio.Event()
    finished: list[str] = []
    registry = _slow_registry(started, quick_done, finished)
    async with Runtime(tools=registry, scenarios=[SLOW_TOOLS]) as runtime:
        handle = await start_scenario(runtime, SLOW_TOOLS)
        with anyio.fail_after(20):
            async for event in handle.events():
                if isinstance(event, ToolExecute):
                    break
            await started.wait()
            await quick_done.wait()  # the quick call finishes by itself, the slow one never
            await handle.abort()
            result = await handle.result()
    assert result.exit_reason is ExitReason.ABORTED_TOOLS
    assert result.cause == "abort.caller"
    quick, slow = result.call_log
    assert not quick.is_error
    assert quick.verdict == "allow"
    assert slow.error_kind == "aborted"
    assert slow.verdict == "not_run"
    assert finished == ["0.05"]
    tool_texts = [m.content for m in result.transcript if m.role == "tool"]
    assert tool_texts[0] == "waited 0.05"


@pytest.mark.asyncio
async def test_a_queued_run_can_be_aborted_before_it_starts() -> None:
    config = Config(runtime=RuntimeSettings(max_concurrent_runs=1))
    async with Runtime(config, scenarios=[SLOW_STREAM]) as runtime:
        first = await start_scenario(runtime, SLOW_STREAM)
        queued = await start_scenario(runtime, SHIPPED["completed"])
        assert queued.status == "queued"
        await queued.abort("not needed")
        await first.abort()
        with anyio.fail_after(20):
            result = await queued.result()
    assert result.exit_reason is ExitReason.ABORTED_STREAMING
    assert result.llm_requests == 0
    assert result.detail == "not needed"


@pytest.mark.asyncio
async def test_leaving_the_runtime_aborts_active_runs_and_leaves_no_task_behind() -> None:
    before = len(asyncio.all_tasks())
    async with Runtime(scenarios=[SLOW_STREAM]) as runtime:
        handle = await start_scenario(runtime, SLOW_STREAM)
        async for event in handle.events():
            if isinstance(event, ModelTextDelta):
                break
    result = await handle.result()
    assert result.exit_reason is ExitReason.ABORTED_STREAMING
    assert result.cause == "abort.shutdown"
    assert len(asyncio.all_tasks()) == before


@pytest.mark.asyncio
async def test_a_failing_actor_fails_only_its_run() -> None:
    async with Runtime() as runtime, anyio.create_task_group() as tg:
        broken = runtime.bus.subscribe(TurnStarted, name="broken_hook", answers=True)

        def explode(msg: TurnStarted) -> None:
            if msg.run_id == "victim":
                raise RuntimeError("hook bug")

        await tg.start(broken.serve, explode)
        victim = await start_scenario(runtime, SHIPPED["completed"], run_id="victim")
        bystander = await start_scenario(runtime, SHIPPED["completed"], run_id="bystander")
        failed, fine = await victim.result(), await bystander.result()
        runtime.bus.unsubscribe(broken)
    assert failed.exit_reason is ExitReason.HOOK_STOPPED
    assert failed.cause == "internal.error"
    assert "hook bug" in failed.detail
    assert fine.exit_reason is ExitReason.COMPLETED


@pytest.mark.asyncio
async def test_bad_run_overrides_name_the_key() -> None:
    async with Runtime() as runtime:
        with pytest.raises(ConfigError, match="max_turns") as caught:
            await runtime.start(RunSpec(task="x", overrides={"max_turns": "many"}))
        assert caught.value.key == "config.max_turns"
        with pytest.raises(ConfigError, match="unknown key"):
            await runtime.start(RunSpec(task="x", overrides={"max_turnz": 3}))
        with pytest.raises(ConfigError, match="unknown tools: nope"):
            await runtime.start(RunSpec(task="x", overrides={"tools": ["nope"]}))
    with pytest.raises(RuntimeClosedError):
        await runtime.start(RunSpec(task="x"))


@pytest.mark.asyncio
async def test_library_api_in_a_dozen_lines(tmp_path: Any) -> None:
    (tmp_path / "notes.txt").write_text("Calibrate first.\n")
    async with Runtime() as runtime:
        handle = await runtime.start(RunSpec(task="Summarise the notes", folder=str(tmp_path)))
        kinds = [type(event).__name__ async for event in handle.events()]
        result = await handle.result()
    assert result.exit_reason is ExitReason.COMPLETED
    assert kinds[0] == "RunStarted"
    assert "ModelReply" in kinds
    assert kinds[-1] == "RunFinished"
    assert any(isinstance(e, ModelReply) for e in runtime.event_log.events(result.run_id))


@pytest.mark.asyncio
async def test_a_library_run_the_simulator_answers_is_marked_simulated(tmp_path: Any) -> None:
    """#30 item 3: with no model, the library says the simulator answered (as the daemon
    does); a scenario run, which the simulator is meant to play, is not marked."""
    from orchestrator.result import SIMULATOR_NOTE
    from orchestrator.scenarios.runs import run_scenario
    from orchestrator.sim import find_scenario

    async with Runtime() as runtime:
        task = await runtime.run(RunSpec(task="Summarise the notes", folder=str(tmp_path)))
        played = await run_scenario(runtime, find_scenario("completed"))
    assert task.simulated is True
    assert task.note == SIMULATOR_NOTE
    assert played.simulated is False
    assert played.note == ""


@pytest.mark.asyncio
async def test_a_run_with_a_model_actor_is_not_marked_simulated() -> None:
    from bench.scripted_model import ScriptedModel, echo_script

    async with Runtime(model_actor=lambda bus: ScriptedModel(bus, echo_script(1))) as runtime:
        result = await runtime.run(RunSpec(task="x"))
    assert result.simulated is False
