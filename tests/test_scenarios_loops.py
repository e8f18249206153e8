"""The loop scenarios end to end (real openai client, real simulator), per-run loop overrides,
recorded refusals in the engine, and the waste bench on a small cap."""

from __future__ import annotations

from typing import Any

import anyio
import msgspec
import pytest

from actors.loop import (
    GEMINI_RECOVERY_TEXT,
    OPENCLAW,
    PRESETS,
    STRICT,
    STRICT_NUDGE_TEXT,
    LoopDetector,
    PollTool,
)
from bench.waste import fuses_off, measure_waste
from bus import (
    NUDGE_MARKER,
    ExitReason,
    Message,
    ModelCancel,
    ModelReply,
    ModelTextDelta,
    StopSignal,
)
from orchestrator.config import merge_loop_overrides
from orchestrator.errors import ConfigError
from orchestrator.result import RunResult
from orchestrator.runtime import RunSpec, Runtime
from orchestrator.scenarios.runs import expectation_mismatches, start_scenario
from orchestrator.sim import Scenario, shipped_scenarios

SHIPPED = {scenario.name: scenario for scenario in shipped_scenarios()}
LOOP_SCENARIOS = (
    "dead_loop",
    "dead_loop_recovers",
    "ping_pong",
    "ping_pong_progress",
    "poll_no_progress",
    "poll_progress",
    "cycle3",
    "content_loop",
    "long_legit_read",
)


def with_config(scenario: Scenario, **config: Any) -> Scenario:
    return msgspec.structs.replace(scenario, config={**scenario.config, **config})


async def run_with_events(scenario: Scenario) -> tuple[RunResult, list[Message]]:
    async with Runtime() as runtime:
        handle = await start_scenario(runtime, scenario)
        with anyio.fail_after(60):
            events = [event async for event in handle.events()]
            result = await handle.result()
    return result, events


async def run_shipped(name: str) -> tuple[RunResult, list[Message]]:
    result, events = await run_with_events(SHIPPED[name])
    assert expectation_mismatches(SHIPPED[name], result) == []
    return result, events


def verdicts(result: RunResult) -> list[str]:
    return [entry.verdict for entry in result.call_log]


def nudge_kinds(result: RunResult) -> list[str]:
    return [
        m.content[len(NUDGE_MARKER) :].split("]", 1)[0]
        for m in result.transcript
        if m.role == "user" and m.content is not None and m.content.startswith(NUDGE_MARKER)
    ]


def tool_messages(result: RunResult) -> dict[str, str]:
    return {m.tool_call_id or "": m.content or "" for m in result.transcript if m.role == "tool"}


def asked_again_after(result: RunResult, call_id: str) -> bool:
    """True when the model was asked again after it was given ``call_id``'s tool message."""
    roles = [(m.role, m.tool_call_id) for m in result.transcript]
    index = roles.index(("tool", call_id))
    return any(role == "assistant" for role, _ in roles[index + 1 :])


def test_every_loop_scenario_is_shipped_with_expectations() -> None:
    for name in LOOP_SCENARIOS:
        scenario = SHIPPED[name]
        assert scenario.description
        assert scenario.expect.nudges is not None, name
        assert scenario.expect.llm_requests is not None, name


# --------------------------------------------------------------------------- overrides


def test_loop_overrides_merge_onto_the_preset_table_by_table() -> None:
    merged = merge_loop_overrides(
        OPENCLAW,
        {
            "record_blocked": True,
            "ping_pong": {"break_at": 30},
            "poll_tools": [{"name": "job_status"}],
        },
    )
    assert merged.record_blocked is True
    assert merged.ping_pong == msgspec.structs.replace(OPENCLAW.ping_pong, break_at=30)
    assert merged.poll_tools == (PollTool(name="job_status"),)  # arrays replace
    assert merged.generic_repeat == OPENCLAW.generic_repeat
    assert merge_loop_overrides(STRICT, {}) is STRICT


@pytest.mark.parametrize(
    ("overrides", "key", "reason"),
    [
        ({"ping_pong": {"brek_at": 3}}, "config.loop.ping_pong.brek_at", "unknown key"),
        ({"nope": 1}, "config.loop.nope", "unknown key"),
        ({"result_patterns": [{"pattern": "x"}]}, "config.loop.result_patterns", "operator"),
        ({"history_size": 0}, "config.loop.history_size", "positive"),
        ({"ping_pong": 3}, "config.loop.ping_pong", "Expected `object`"),
        ({"poll_tools": [{"nam": "x"}]}, "config.loop.poll_tools.0.nam", "unknown key"),
        ({"poll_tools": [{}]}, "config.loop.poll_tools.0", "missing required field `name`"),
    ],
)
def test_a_bad_loop_override_names_its_key(
    overrides: dict[str, Any], key: str, reason: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        merge_loop_overrides(OPENCLAW, overrides)
    assert caught.value.key == key
    assert reason in caught.value.reason


def test_levels_that_do_not_increase_are_clamped_as_openclaw_does(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level("WARNING", logger="loopfuse.loop"):
        merged = merge_loop_overrides(OPENCLAW, {"ping_pong": {"break_at": 5}})
    assert merged.ping_pong.break_at == 21  # block_at (20) + 1, not refused
    assert "ping_pong.break_at = 5 is not above ping_pong.block_at (20): using 21" in caplog.text


@pytest.mark.asyncio
async def test_the_runtime_rejects_a_bad_loop_override_before_the_run_starts() -> None:
    async with Runtime() as runtime:
        with pytest.raises(ConfigError) as caught:
            await runtime.start(
                RunSpec(task="x", overrides={"loop": {"generic_repeat": {"warn_at": "3"}}})
            )
        assert caught.value.key == "config.loop.generic_repeat.warn_at"
        assert runtime.active_runs == 0


@pytest.mark.asyncio
async def test_loop_overrides_change_how_a_run_is_judged() -> None:
    # dead_loop with the nudge moved to the 2nd call and the stop to the 3rd
    scenario = with_config(
        SHIPPED["dead_loop"], loop={"generic_repeat": {"warn_at": 2, "break_at": 3}}
    )
    result, _ = await run_with_events(scenario)
    assert result.cause == "loop.generic_repeat"
    assert verdicts(result) == ["allow", "warn", "not_run"]
    assert result.llm_requests == 3


# --------------------------------------------------------------------------- engine


def test_a_recorded_refusal_counts_as_no_progress_so_the_breaker_is_reachable() -> None:
    config = merge_loop_overrides(
        OPENCLAW, {"record_blocked": True, "poll_tools": [{"name": "job_status"}]}
    )
    detector = LoopDetector(config)
    levels: list[tuple[int, str, str | None]] = []
    for n in range(1, 40):
        decision = detector.propose("job_status", '{"job": "7"}')
        if decision.level != "none":
            levels.append((n, decision.level, decision.detector))
        if decision.level == "break":
            break
        if decision.level in ("none", "warning"):
            detector.record_result(decision.call_id, "running")
    assert levels[0] == (11, "warning", "poll_no_progress")
    assert [n for n, level, _ in levels if level == "critical"] == list(range(21, 31))
    assert levels[-1] == (31, "break", "global_breaker")
    # without recorded refusals (OpenClaw as shipped, no refusal limit) the 31st is
    # refused, never stopped; with the refusal limit (every preset, #32) it stops the run
    plain = LoopDetector(msgspec.structs.replace(config, record_blocked=False, refusal_limit=None))
    limited = LoopDetector(msgspec.structs.replace(config, record_blocked=False))
    for _ in range(30):
        for detector in (plain, limited):
            decision = detector.propose("job_status", '{"job": "7"}')
            if decision.level in ("none", "warning"):
                detector.record_result(decision.call_id, "running")
    assert plain.propose("job_status", '{"job": "7"}').level == "critical"
    stop = limited.propose("job_status", '{"job": "7"}')
    assert (stop.level, stop.cause) == ("break", "loop.poll_no_progress")


def test_a_recorded_refusal_keeps_a_ping_pong_tail_growing() -> None:
    config = merge_loop_overrides(
        OPENCLAW,
        {"record_blocked": True, "ping_pong": {"warn_at": 4, "block_at": 6, "break_at": 8}},
    )
    detector = LoopDetector(config)
    seen: list[str] = []
    for n in range(1, 20):
        call = ("read_file", '{"path": "a"}') if n % 2 else ("write_file", '{"path": "a"}')
        decision = detector.propose(*call)
        seen.append(decision.level)
        if decision.level == "break":
            break
        if decision.level in ("none", "warning"):
            detector.record_result(decision.call_id, "same")
    assert seen == ["none"] * 3 + ["warning"] * 2 + ["critical", "critical", "break"]


def test_gemini_still_counts_a_refusal_of_calls_without_results() -> None:
    detector = LoopDetector(PRESETS["gemini"])
    calls = [("a", "{}"), ("b", "{}")] * 5
    decisions = [detector.propose(*call) for call in calls]
    assert decisions[-1].level == "critical"  # 10th call of A,B: gemini's strike 1
    assert detector.propose("a", "{}").level == "break"  # the refusal was counted


# --------------------------------------------------------------------------- scenarios


@pytest.mark.asyncio
async def test_dead_loop_is_nudged_once_then_stopped_before_the_fifth_call() -> None:
    result, events = await run_shipped("dead_loop")
    assert result.exit_reason is ExitReason.HOOK_STOPPED
    assert verdicts(result) == ["allow", "allow", "warn", "allow", "not_run"]
    assert nudge_kinds(result) == ["loop.generic_repeat"]
    nudge = next(m for m in result.transcript if (m.content or "").startswith(NUDGE_MARKER))
    assert nudge.content is not None
    assert nudge.content.endswith(STRICT_NUDGE_TEXT)
    # the nudge went in after the 3rd call's result, before the 4th request
    roles = [m.role for m in result.transcript]
    assert roles.index("user", 1) == 1 + 3 * 2  # task, then 3 × (assistant, tool)
    stops = [e for e in events if isinstance(e, StopSignal)]
    assert [(s.cause, s.source) for s in stops] == [("loop.generic_repeat", "loop_monitor")]
    assert result.tool_calls == 4
    assert result.llm_requests <= 6


@pytest.mark.asyncio
async def test_dead_loop_recovers_after_exactly_one_nudge() -> None:
    result, _ = await run_shipped("dead_loop_recovers")
    assert result.exit_reason is ExitReason.COMPLETED
    assert nudge_kinds(result) == ["loop.generic_repeat"]
    assert [e.tool for e in result.call_log] == ["read_file"] * 3 + ["finish_exploration"]
    assert verdicts(result) == ["allow", "allow", "warn", "allow"]
    assert "Plate reader run 14" in result.output


@pytest.mark.asyncio
async def test_ping_pong_is_warned_then_refused_with_a_reason_then_stopped() -> None:
    result, _ = await run_shipped("ping_pong")
    assert result.exit_reason is ExitReason.HOOK_STOPPED
    got = verdicts(result)
    # the 11th call (a read) is warned, calls 21..29 are refused, the 30th stops the run
    assert got[10] == "warn"
    assert [i + 1 for i, v in enumerate(got) if v == "block"] == list(range(21, 30))
    assert got[29:] == ["not_run"]
    assert got.count("warn") == 1
    assert nudge_kinds(result) == ["loop.ping_pong"]
    blocked = [e for e in result.call_log if e.verdict == "block"]
    assert {e.tool for e in blocked} == {"read_source", "replace_in_file"}
    message = tool_messages(result)[blocked[0].call_id]
    assert message.startswith("Error: CRITICAL: You are alternating")
    assert "with no progress" in message
    assert "This call was not run" in message
    assert asked_again_after(result, blocked[0].call_id)  # the model read why
    assert "alternated 30 times" in result.detail


@pytest.mark.asyncio
async def test_ping_pong_whose_file_changes_is_not_a_loop() -> None:
    result, events = await run_shipped("ping_pong_progress")
    assert result.exit_reason is ExitReason.COMPLETED
    assert set(verdicts(result)) == {"allow"}
    assert len(result.call_log) == 20
    assert nudge_kinds(result) == []
    assert not any(isinstance(e, StopSignal) for e in events)


@pytest.mark.asyncio
async def test_the_same_read_write_with_unchanged_results_under_the_progress_config() -> None:
    # ping_pong_progress's script with every result frozen: the same config now refuses
    progress = SHIPPED["ping_pong_progress"]
    frozen = msgspec.structs.replace(
        progress,
        name="ping_pong_frozen",
        tools=tuple(
            msgspec.structs.replace(tool, name=f"{tool.name}_frozen", results=tool.results[:1])
            for tool in progress.tools
        ),
        steps=tuple(
            msgspec.structs.replace(
                step,
                tool_calls=tuple(
                    msgspec.structs.replace(call, name=f"{call.name}_frozen")
                    for call in step.tool_calls
                ),
            )
            for step in progress.steps
        ),
    )
    async with Runtime(scenarios=[frozen]) as runtime:
        handle = await start_scenario(runtime, frozen)
        with anyio.fail_after(60):
            result = await handle.result()
    got = verdicts(result)
    assert got[10] == "warn"  # the 11th call: a ping-pong with no progress
    assert result.nudges == 1
    assert result.exit_reason is ExitReason.COMPLETED  # the script ends before the block


@pytest.mark.asyncio
async def test_a_poll_that_never_changes_is_warned_refused_and_stopped() -> None:
    result, _ = await run_shipped("poll_no_progress")
    got = verdicts(result)
    assert got[10] == "warn"
    assert [i + 1 for i, v in enumerate(got) if v == "block"] == list(range(21, 31))
    assert got[30:] == ["not_run"]
    assert nudge_kinds(result) == ["loop.poll_no_progress"]
    blocked = next(e for e in result.call_log if e.verdict == "block")
    message = tool_messages(result)[blocked.call_id]
    assert message.startswith(
        "Error: CRITICAL: Called job_status with identical arguments and no progress 20 times."
    )
    assert "stop polling" in message
    assert asked_again_after(result, blocked.call_id)
    assert "global circuit breaker" in result.detail


@pytest.mark.asyncio
async def test_a_poll_that_makes_progress_is_never_warned() -> None:
    result, _ = await run_shipped("poll_progress")
    assert result.exit_reason is ExitReason.COMPLETED
    assert set(verdicts(result)) == {"allow"}
    assert len(result.call_log) == 15
    assert nudge_kinds(result) == []


@pytest.mark.asyncio
async def test_a_poll_not_marked_as_one_gets_openclaws_generic_warning() -> None:
    # the same script without the poll-tool override: 15 identical calls warn at the 11th
    scenario = with_config(SHIPPED["poll_progress"], loop={})
    result, _ = await run_with_events(scenario)
    assert result.exit_reason is ExitReason.COMPLETED
    assert verdicts(result).index("warn") == 10
    assert nudge_kinds(result) == ["loop.generic_repeat"]


@pytest.mark.asyncio
async def test_a_cycle_of_three_calls_is_refused_then_stopped() -> None:
    result, _ = await run_shipped("cycle3")
    got = verdicts(result)
    assert got[:14] == ["allow"] * 14
    assert got[14] == "block"  # the 15th call: period 3 repeated 5 times
    assert got[15:] == ["not_run"] * 3  # the run stops at the 16th; its turn runs nothing
    assert nudge_kinds(result) == ["loop.cycle"]
    block = tool_messages(result)[result.call_log[14].call_id]
    assert block.startswith("Error: Not run: potential loop detected.")
    assert "cycle of 3 tool calls" in block
    nudge = next(m.content for m in result.transcript if (m.content or "").startswith(NUDGE_MARKER))
    assert nudge is not None
    assert GEMINI_RECOVERY_TEXT.split("{detail}")[0] in nudge


@pytest.mark.asyncio
async def test_a_content_loop_is_cut_mid_stream_nudged_then_stopped() -> None:
    scenario = SHIPPED["content_loop"]
    full = scenario.steps[0].text_tokens * 4
    result, events = await run_shipped("content_loop")
    replies = [e for e in events if isinstance(e, ModelReply)]
    assert [r.turn for r in replies] == [1, 2]
    assert all(r.aborted for r in replies)
    for reply in replies:
        streamed = "".join(
            e.text for e in events if isinstance(e, ModelTextDelta) and e.turn == reply.turn
        )
        assert reply.text == streamed
        assert 0 < len(streamed) < full // 10  # cut long before the end
        assert scenario.steps[0].text[:40] in streamed
    cancels = [e for e in events if isinstance(e, ModelCancel)]
    assert {(c.turn, c.reason) for c in cancels} >= {(1, "loop.content"), (2, "loop.content")}
    assert nudge_kinds(result) == ["loop.content"]
    # the cut reply is kept, then the nudge, then the second cut reply
    roles = [m.role for m in result.transcript]
    assert roles == ["user", "assistant", "user", "assistant"]
    assert result.output == replies[-1].text
    assert any(t.event == "stream cut" for t in result.trace)


@pytest.mark.asyncio
@pytest.mark.parametrize("preset", ["strict", "openclaw", "gemini"])
async def test_a_long_read_in_continued_pieces_is_never_warned(preset: str) -> None:
    scenario = with_config(SHIPPED["long_legit_read"], loop_preset=preset)
    result, _ = await run_with_events(scenario)
    assert result.exit_reason is ExitReason.COMPLETED
    assert len(result.call_log) == 10
    assert set(verdicts(result)) == {"allow"}
    assert len({e.fingerprint for e in result.call_log}) == 10
    assert nudge_kinds(result) == []
    pieces = [tool_messages(result)[entry.call_id] for entry in result.call_log]
    assert pieces[0].startswith("time_s,temp_c,pressure_kpa")
    assert "\n2940," in pieces[-1]  # the file's last line: the whole file was read


# --------------------------------------------------------------------------- bench


def test_fuses_off_leaves_only_the_turn_cap() -> None:
    off = fuses_off(SHIPPED["ping_pong"], max_turns=20)
    assert off.config["loop_preset"] == "off"
    assert off.config["loop"] == {}
    assert off.config["cache_max_entries"] == 0
    assert off.config["max_turns"] == 20
    assert off.steps == SHIPPED["ping_pong"].steps


@pytest.mark.asyncio
async def test_waste_bench_measures_a_dead_loop_with_a_small_cap() -> None:
    with anyio.fail_after(60):
        (row,) = await measure_waste(["dead_loop"], max_turns=20)
    assert (row.on.cause, row.on.llm_requests, row.on.tool_calls) == ("loop.generic_repeat", 5, 4)
    assert (row.off.cause, row.off.llm_requests, row.off.tool_calls) == ("budget.max_turns", 20, 20)
    assert row.reached_cap
    assert row.requests_ratio == 4.0
    # every request re-sends the growing transcript: tokens grow faster than requests
    assert row.off.total_tokens > 4 * row.on.total_tokens
    assert row.tokens_ratio == round(row.off.total_tokens / row.on.total_tokens, 2)
