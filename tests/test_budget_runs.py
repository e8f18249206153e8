"""Token budgets and what a limit leaves behind, end to end: runtime, real openai client,
simulator on loopback."""

from __future__ import annotations

import anyio
import msgspec
import pytest

from bus import (
    NUDGE_MARKER,
    ExitReason,
    ModelReplied,
    ModelRequest,
    ModelTextDelta,
    Outcome,
    StopSignal,
)
from orchestrator.config import Config, ModelPrice
from orchestrator.errors import ConfigError
from orchestrator.result import RunResult
from orchestrator.runtime import Runtime
from orchestrator.scenarios.runs import expectation_mismatches, run_scenario, start_scenario
from orchestrator.sim import Scenario, parse_scenario, shipped_scenarios

SHIPPED = {scenario.name: scenario for scenario in shipped_scenarios()}


def scenario(text: str, name: str) -> Scenario:
    return parse_scenario(text, source=f"{name}.toml", name=name)


def nudge_texts(result: RunResult, kind: str) -> list[str]:
    prefix = f"{NUDGE_MARKER}{kind}] "
    return [
        m.content.removeprefix(prefix)
        for m in result.transcript
        if m.role == "user" and m.content is not None and m.content.startswith(prefix)
    ]


def without(base: Scenario, **config: object) -> Scenario:
    """``base`` with its config changed (a key set to None is removed) and no branches."""
    merged = {**base.config, **config}
    return msgspec.structs.replace(
        base,
        name=f"{base.name}_variant",
        config={k: v for k, v in merged.items() if v is not None},
        branches=(),
    )


# ---------------------------------------------------------------- ceiling


@pytest.mark.asyncio
async def test_token_burn_is_warned_once_at_90_percent_and_wraps_up() -> None:
    async with Runtime() as runtime:
        result = await run_scenario(runtime, SHIPPED["token_burn"])
    assert expectation_mismatches(SHIPPED["token_burn"], result) == []
    assert nudge_texts(result, "budget.warning") == [
        "Output-token budget 93% used (14,000 / 15,000); keep working, do not summarise."
    ]
    assert result.usage.completion_tokens == 14_080  # 14,000 before the wrap-up, 80 in it
    assert result.output.startswith("Report:")


@pytest.mark.asyncio
async def test_a_model_that_ignores_the_warning_is_stopped_at_the_ceiling() -> None:
    ignored = without(SHIPPED["token_burn"])
    async with Runtime(scenarios=[ignored]) as runtime:
        result = await run_scenario(runtime, ignored)
    assert (result.exit_reason, result.cause) == (ExitReason.MAX_TURNS, "budget.output_tokens")
    # 14,000 after turn 5 (warned), 17,000 after turn 6: stopped when turn 6 ended, after
    # its tool ran, before a 7th model call.
    assert (result.turns, result.llm_requests, result.tool_calls) == (6, 6, 6)
    assert result.usage.completion_tokens == 17_000
    assert result.nudges == 1
    assert "17,000 completion tokens" in result.detail
    assert result.hint.startswith("Raise budget.max_output_tokens")
    assert result.output == ""  # on_stop = "keep": the transcript and usage are kept
    assert result.transcript[-1].role == "tool"
    assert not result.degraded


@pytest.mark.asyncio
async def test_fuse_off_token_burn_runs_to_the_turn_cap() -> None:
    # (loop fuses off too: every module reads the same, which no_new_information would stop)
    unfused = without(
        SHIPPED["token_burn"], output_token_budget=None, max_turns=12, loop_preset="off"
    )
    async with Runtime(scenarios=[unfused]) as runtime:
        result = await run_scenario(runtime, unfused)
    assert (result.exit_reason, result.cause) == (ExitReason.MAX_TURNS, "budget.max_turns")
    assert result.usage.completion_tokens == 2_000 + 11 * 3_000
    assert result.nudges == 0


INPUT_HEAVY = scenario(
    """
task = "Read every page."
[config]
max_turns = 20
input_token_budget = 10000
[[tools]]
name = "page"
parameters = { n = "integer" }
results = ["text"]
[[steps]]
tool_calls = [{ name = "page", arguments = { n = "{n}" } }]
usage = { prompt_tokens = 4000, completion_tokens = 20 }
repeat = true
[expect]
exit_reason = "max_turns"
cause = "budget.input_tokens"
turns = 3
""",
    name="input_heavy",
)


@pytest.mark.asyncio
async def test_input_token_budget_sums_prompt_tokens_over_requests() -> None:
    async with Runtime(scenarios=[INPUT_HEAVY]) as runtime:
        result = await run_scenario(runtime, INPUT_HEAVY)
    assert expectation_mismatches(INPUT_HEAVY, result) == []
    assert result.usage.prompt_tokens == 12_000
    assert "12,000 prompt tokens" in result.detail


@pytest.mark.asyncio
async def test_cost_budget_uses_the_models_price_from_config() -> None:
    pricey = without(INPUT_HEAVY, input_token_budget=None, cost_budget=0.025)
    # 4,000 prompt tokens at 2.5 and 20 completion tokens at 10.0 per million: 0.0102 a turn.
    prices = {pricey.name: ModelPrice(input_per_million=2.5, output_per_million=10.0)}
    async with Runtime(Config(prices=prices), scenarios=[pricey]) as runtime:
        result = await run_scenario(runtime, pricey)
    assert (result.exit_reason, result.cause) == (ExitReason.MAX_TURNS, "budget.cost")
    assert result.turns == 3
    assert result.detail.startswith("The run cost 0.0306 ")
    assert result.hint.startswith("Raise budget.max_cost")


@pytest.mark.asyncio
async def test_a_cost_budget_for_a_model_without_a_price_names_the_key() -> None:
    unpriced = without(INPUT_HEAVY, input_token_budget=None, cost_budget=0.025)
    async with Runtime(scenarios=[unpriced]) as runtime:
        with pytest.raises(ConfigError) as caught:
            await start_scenario(runtime, unpriced)
    assert caught.value.key == 'prices."input_heavy_variant"'
    assert "input_per_million and output_per_million" in caught.value.reason


# ---------------------------------------------------------------- target


@pytest.mark.asyncio
async def test_target_mode_continues_until_90_percent_then_completes() -> None:
    async with Runtime() as runtime:
        result = await run_scenario(runtime, SHIPPED["token_target"])
    assert expectation_mismatches(SHIPPED["token_target"], result) == []
    assert nudge_texts(result, "budget.continue") == [
        "Output-token target 40% reached (4,000 / 10,000), continuation 1; keep working, "
        "do not summarise.",
        "Output-token target 70% reached (7,000 / 10,000), continuation 2; keep working, "
        "do not summarise.",
    ]
    parts = [line for line in result.output.split("\n\n") if line]
    assert [part.split(",")[0].split(":")[0] for part in parts] == [
        "Guide",
        "Part 2",
        "Part 3",
    ]


@pytest.mark.asyncio
async def test_diminishing_returns_stop_a_target_run_that_adds_little() -> None:
    async with Runtime() as runtime:
        handle = await start_scenario(runtime, SHIPPED["diminishing_returns"])
        events = [event async for event in handle.events()]
        result = await handle.result()
    assert expectation_mismatches(SHIPPED["diminishing_returns"], result) == []
    assert result.outcome is Outcome.FAILED
    increments = [e.usage.completion_tokens for e in events if isinstance(e, ModelReplied)]
    assert increments == [3_000, 3_000, 2_500, 400, 300]
    (stop,) = [e for e in events if isinstance(e, StopSignal)]
    assert stop.source == "budget_monitor"
    assert "400 and 300 completion tokens" in result.detail
    assert result.output.count("Part") == 2  # what was gathered before the stop is kept


TOOL_WORK = scenario(
    """
task = "Collect the data, then write the report (about 6,000 tokens)."
[config]
max_turns = 40
output_token_budget = 6000
budget_mode = "target"
loop_preset = "off"
[[tools]]
name = "fetch"
parameters = { item = "integer" }
results = ["42"]
[[steps]]
text = "Report, first draft."
usage = { completion_tokens = 3000 }
[[tracks.work]]
tool_calls = [{ name = "fetch", arguments = { item = "{n}" } }]
usage = { completion_tokens = 100 }
[[tracks.work]]
tool_calls = [{ name = "fetch", arguments = { item = "{n}" } }]
usage = { completion_tokens = 100 }
[[tracks.work]]
tool_calls = [{ name = "fetch", arguments = { item = "{n}" } }]
usage = { completion_tokens = 100 }
[[tracks.work]]
tool_calls = [{ name = "fetch", arguments = { item = "{n}" } }]
usage = { completion_tokens = 100 }
[[tracks.work]]
tool_calls = [{ name = "fetch", arguments = { item = "{n}" } }]
usage = { completion_tokens = 100 }
[[tracks.work]]
text = "Another section."
usage = { completion_tokens = 50 }
[[branches]]
nudge = "budget.continue"
track = "work"
[expect]
exit_reason = "completed"
""",
    name="tool_work",
)


@pytest.mark.asyncio
async def test_short_tool_calling_turns_after_a_continuation_add_up() -> None:
    """Each continuation is 5 tool-calling turns of 100 tokens and a 50-token text: 550
    tokens, not small, although every single turn is. The run reaches its target."""
    async with Runtime(scenarios=[TOOL_WORK]) as runtime:
        result = await run_scenario(runtime, TOOL_WORK)
    assert (result.exit_reason, result.cause) == (ExitReason.COMPLETED, "model.end_turn")
    # 3,000, then +550 five times: 5,750 ≥ 5,400.
    assert result.usage.completion_tokens == 5_750
    assert (result.turns, result.tool_calls, result.nudges) == (31, 25, 5)


# ---------------------------------------------------------------- on_stop = "answer"


@pytest.mark.asyncio
async def test_on_stop_answer_fills_the_output_and_keeps_the_ending() -> None:
    answered = SHIPPED["answer_on_stop"]
    kept = without(answered, on_stop="keep")
    async with Runtime(scenarios=[kept]) as runtime:
        handle = await start_scenario(runtime, answered)
        requests = [e async for e in handle.events() if isinstance(e, ModelRequest)]
        result = await handle.result()
        plain = await run_scenario(runtime, kept)
    assert expectation_mismatches(answered, result) == []
    assert (result.exit_reason, result.cause, result.outcome) == (
        ExitReason.MAX_TURNS,
        "budget.max_turns",
        Outcome.FAILED,
    )
    assert result.degraded
    assert result.output.startswith("From the first three lines")
    assert result.hint == plain.hint
    # One last request: no tools, its own max_tokens, after the 3 turns.
    assert len(requests) == 4
    assert [bool(r.tools) for r in requests] == [True, True, True, False]
    assert requests[-1].max_tokens == 1024
    assert requests[-1].turn == 4
    assert requests[-1].messages[-1].content == (
        f"{NUDGE_MARKER}stop.answer] The run has been stopped by a limit. Answer now with "
        "what you have gathered: no tools, no apology; say what is still missing."
    )
    # Its usage is added; the kept run has the same 3 turns without it.
    assert (plain.turns, plain.llm_requests, plain.output, plain.degraded) == (3, 3, "", False)
    assert result.usage.completion_tokens > plain.usage.completion_tokens
    assert result.usage.prompt_tokens > plain.usage.prompt_tokens
    assert result.transcript[-1].role == "assistant"
    assert "final answer" in [entry.event for entry in result.trace]
    assert result.trace[-1].event == "max_turns/budget.max_turns"


@pytest.mark.asyncio
async def test_a_failing_final_answer_changes_nothing_but_the_trace() -> None:
    failing = scenario(
        """
task = "Read the log."
[config]
max_turns = 2
on_stop = "answer"
[folder]
"log.txt" = "a\\nb\\nc\\n"
[[steps]]
tool_calls = [{ name = "read_file", arguments = { path = "log.txt", offset = "{n}" } }]
repeat = true
[[tracks.answer]]
text = "never"
faults = [{ status = 400, forever = true }]
[[branches]]
nudge = "stop.answer"
track = "answer"
[expect]
exit_reason = "max_turns"
""",
        name="failing_answer",
    )
    async with Runtime(scenarios=[failing]) as runtime:
        result = await run_scenario(runtime, failing)
    assert (result.exit_reason, result.cause) == (ExitReason.MAX_TURNS, "budget.max_turns")
    assert not result.degraded
    assert result.output == ""
    assert result.llm_requests == 3
    events = [entry.event for entry in result.trace]
    assert "final answer: model error (bad_request)" in events
    assert "final answer failed" in events


@pytest.mark.asyncio
async def test_on_stop_answer_follows_a_loop_stop_too() -> None:
    looping = scenario(
        """
task = "Read the notes."
[config]
max_turns = 20
on_stop = "answer"
[folder]
"notes.txt" = "calibrate first"
[[steps]]
tool_calls = [{ name = "read_file", arguments = { path = "notes.txt" } }]
repeat = true
[[tracks.answer]]
text = "The notes say: calibrate first."
[[branches]]
nudge = "stop.answer"
track = "answer"
[expect]
exit_reason = "hook_stopped"
""",
        name="looping_answer",
    )
    async with Runtime(scenarios=[looping]) as runtime:
        result = await run_scenario(runtime, looping)
    assert result.exit_reason is ExitReason.HOOK_STOPPED
    assert result.cause.startswith("loop.")
    assert result.degraded
    assert result.output == "The notes say: calibrate first."
    # The refused call got a result before the final request: the transcript stays valid.
    calls = {c.id for m in result.transcript for c in m.tool_calls}
    answered = {m.tool_call_id for m in result.transcript if m.role == "tool"}
    assert calls == answered


SLOW_ANSWERING = scenario(
    """
task = "Write a long essay."
[config]
on_stop = "answer"
[[steps]]
text_tokens = 400
chunk_size = 8
chunk_latency = 0.02
[[tracks.answer]]
text = "should never be asked"
[[branches]]
nudge = "stop.answer"
track = "answer"
[expect]
exit_reason = "aborted_streaming"
""",
    name="slow_answering",
)


@pytest.mark.asyncio
async def test_an_abort_gets_no_final_answer() -> None:
    async with Runtime(scenarios=[SLOW_ANSWERING]) as runtime:
        handle = await start_scenario(runtime, SLOW_ANSWERING)
        with anyio.fail_after(20):
            async for event in handle.events():
                if isinstance(event, ModelTextDelta):
                    await handle.abort("enough")
            result = await handle.result()
    assert (result.exit_reason, result.cause) == (ExitReason.ABORTED_STREAMING, "abort.caller")
    assert result.llm_requests == 1
    assert not result.degraded
    assert "should never" not in result.output


CUT_ANSWER = scenario(
    """
task = "Check the two files."
[config]
on_stop = "answer"
answer_max_tokens = 50
[folder]
"a.txt" = "a"
[[steps]]
tool_calls = [
  { name = "read_file", arguments = { path = "a.txt" } },
  { name = "list_dir", arguments = { path = "." } },
]
[[tracks.answer]]
text_tokens = 200
text = "Partial answer. "
[[branches]]
nudge = "stop.answer"
track = "answer"
[expect]
exit_reason = "hook_stopped"
""",
    name="cut_answer",
)


@pytest.mark.asyncio
async def test_a_stop_at_the_reply_gets_its_calls_closed_and_the_answer_is_bounded() -> None:
    """A (test) monitor stops the run when the reply with two calls arrives: neither runs;
    the final request answers both calls, and its answer is cut at answer_max_tokens."""
    async with Runtime(scenarios=[CUT_ANSWER]) as runtime, anyio.create_task_group() as tg:
        stopper = runtime.bus.subscribe(ModelReplied, name="test_stopper", answers=True)

        def stop_at_calls(msg: ModelReplied) -> None:
            if msg.tool_calls:
                runtime.bus.publish_nowait(
                    StopSignal(
                        run_id=msg.run_id,
                        reason=ExitReason.HOOK_STOPPED,
                        cause="loop.cycle",
                        source="test_stopper",
                        detail="stopped at the reply",
                        answerable=True,  # as the loop monitor publishes it
                        per_call=True,
                    )
                )

        await tg.start(stopper.serve, stop_at_calls)
        handle = await start_scenario(runtime, CUT_ANSWER)
        requests = [e async for e in handle.events() if isinstance(e, ModelRequest)]
        result = await handle.result()
        runtime.bus.unsubscribe(stopper)
    assert (result.exit_reason, result.cause) == (ExitReason.HOOK_STOPPED, "loop.cycle")
    assert result.tool_calls == 0
    final = requests[-1].messages
    assert [m.role for m in final[-4:]] == ["assistant", "tool", "tool", "user"]
    assert {m.tool_call_id for m in final[-3:-1]} == {c.id for c in final[-4].tool_calls}
    assert all(m.content == "Error: not run: the run was stopping." for m in final[-3:-1])
    assert requests[-1].max_tokens == 50
    assert result.degraded
    assert result.incomplete  # the answer hit answer_max_tokens
    assert len(result.output) == 50 * 4


DIMINISHING_ANSWER = scenario(
    """
task = "Write the design document (about 30,000 tokens)."
[config]
output_token_budget = 30000
budget_mode = "target"
on_stop = "answer"
[[steps]]
text = "Part 1."
usage = { completion_tokens = 3000 }
[[steps]]
text = "Part 2."
usage = { completion_tokens = 3000 }
[[steps]]
text = "Part 3."
usage = { completion_tokens = 2500 }
[[steps]]
text = "Note."
usage = { completion_tokens = 400 }
[[steps]]
text = "Note."
usage = { completion_tokens = 300 }
repeat = true
[[tracks.answer]]
text = "Summary."
usage = { completion_tokens = 3000 }
[[branches]]
nudge = "stop.answer"
track = "answer"
[expect]
exit_reason = "max_turns"
""",
    name="diminishing_answer",
)


@pytest.mark.asyncio
async def test_on_stop_answer_after_diminishing_returns_is_bounded_by_its_own_max_tokens() -> None:
    async with Runtime(scenarios=[DIMINISHING_ANSWER]) as runtime:
        result = await run_scenario(runtime, DIMINISHING_ANSWER)
    assert (result.exit_reason, result.cause) == (
        ExitReason.MAX_TURNS,
        "budget.diminishing_returns",
    )
    assert (result.degraded, result.output, result.llm_requests) == (True, "Summary.", 6)
    # The 3,000-token answer was cut at answer_max_tokens (1,024 by default).
    assert result.usage.completion_tokens == 9_200 + 1_024
    assert result.incomplete
