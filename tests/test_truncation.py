"""Truncation recovery in whole runs: recovery messages mild then firmer, the recovered
answer joined from its pieces, giving up with the partial text, and tool-call arguments cut
mid-JSON handled as a cut."""

from __future__ import annotations

import anyio
import pytest

from bus import NUDGE_MARKER, ExitReason, ModelReply, RunFinished, ToolCall, nudge_text
from orchestrator.conductor.model_call import TRUNCATED_CALLS_NOTE, TRUNCATION_NUDGES, cut_mid_json
from orchestrator.result import RunResult, describe_ending
from orchestrator.runtime import Runtime
from orchestrator.scenarios.runs import expectation_mismatches, start_scenario
from orchestrator.sim import Scenario, parse_scenario, shipped_scenarios

SHIPPED = {scenario.name: scenario for scenario in shipped_scenarios()}
KIND = "truncation.recover"


def scenario(text: str, name: str) -> Scenario:
    return parse_scenario(text, source=f"{name}.toml", name=name)


def nudges_given(result: RunResult) -> list[str]:
    return [
        m.content
        for m in result.transcript
        if m.role == "user" and m.content and m.content.startswith(NUDGE_MARKER)
    ]


def pieces(result: RunResult) -> list[str]:
    return [m.content or "" for m in result.transcript if m.role == "assistant"]


async def run(scenario: Scenario, *extra: Scenario) -> tuple[RunResult, list[object]]:
    async with Runtime(scenarios=[scenario, *extra]) as runtime:
        handle = await start_scenario(runtime, scenario)
        with anyio.fail_after(30):
            events: list[object] = [event async for event in handle.events()]
            return await handle.result(), events


# ---------------------------------------------------------------------------- recovery


def test_the_recovery_messages_go_from_mild_to_firmer() -> None:
    mild, firmer, last = TRUNCATION_NUDGES
    for words in ("Continue exactly where you stopped", "no apology", "no recap", "smaller pieces"):
        assert words in mild
    assert "much more concisely" in firmer
    assert "Finish now" in last
    assert len(set(TRUNCATION_NUDGES)) == 3  # deduplication by text never drops one


@pytest.mark.asyncio
async def test_cut_twice_then_complete_joins_the_pieces_and_counts_two_nudges() -> None:
    shipped = SHIPPED["truncation"]
    result, events = await run(shipped)
    assert expectation_mismatches(shipped, result) == []
    assert (result.exit_reason, result.cause, result.incomplete) == (
        ExitReason.COMPLETED,
        "model.end_turn",
        False,
    )
    assert nudges_given(result) == [
        nudge_text(KIND, TRUNCATION_NUDGES[0]),
        nudge_text(KIND, TRUNCATION_NUDGES[1]),
    ]
    assert result.nudges == 2
    texts = [step.text for step in shipped.steps]
    assert pieces(result) == texts  # the transcript keeps each piece as the model sent it
    assert result.output == "".join(texts)  # the output is the whole answer
    assert result.output.endswith("native ESM support.")
    assert [e.detail for e in result.trace if e.event == "truncated"] == [
        "recovery 1",
        "recovery 2",
    ]
    # Each cut reply had been retried once with the escalated limit before the nudge.
    replies = [e for e in events if isinstance(e, ModelReply)]
    assert [(r.finish_reason, r.attempts) for r in replies] == [
        ("length", 2),
        ("length", 2),
        ("stop", 1),
    ]


@pytest.mark.asyncio
async def test_cut_every_time_gives_up_after_three_recoveries_keeping_the_partial_text() -> None:
    shipped = SHIPPED["truncation_giveup"]
    result, events = await run(shipped)
    assert expectation_mismatches(shipped, result) == []
    assert (result.exit_reason, result.cause, result.incomplete) == (
        ExitReason.COMPLETED,
        "truncation.gave_up",
        True,
    )
    assert nudges_given(result) == [nudge_text(KIND, text) for text in TRUNCATION_NUDGES]
    assert len(pieces(result)) == 4
    assert result.output == "".join(pieces(result))
    assert "part 0" in result.output
    assert "part 3" in result.output
    assert "4 times" in result.detail
    assert "max_output_tokens" in result.hint
    finished = events[-1]
    assert isinstance(finished, RunFinished)
    assert (finished.incomplete, finished.cause) == (True, "truncation.gave_up")
    assert "[incomplete]" in describe_ending(result)


@pytest.mark.asyncio
@pytest.mark.parametrize("recoveries", [0, 1])
async def test_truncation_recoveries_sets_how_many_recovery_messages(recoveries: int) -> None:
    limited = scenario(
        f"task = 'Write it all.'\n[config]\ntruncation_recoveries = {recoveries}\n"
        + "[[steps]]\ntext = 'piece {n}; '\nfinish_reason = 'length'\nrepeat = true\n"
        + "[expect]\nexit_reason = 'completed'\n",
        "always_cut",
    )
    result, _ = await run(limited)
    assert (result.cause, result.incomplete) == ("truncation.gave_up", True)
    assert result.nudges == recoveries
    assert result.llm_requests == recoveries + 1
    assert result.output == "".join(f"piece {n}; " for n in range(recoveries + 1))


# ---------------------------------------------------------------------------- tool calls


CUT_CALL = scenario(
    """
task = "Has order A1001 arrived?"
[[tools]]
name = "query_order"
parameters = { order_id = "string" }
results = ["order A1001: delivered"]
[[steps]]
text = "Let me look it up."
tool_calls = [{ name = "query_order", raw_arguments = '{"order_id": "A10' }]
finish_reason = "tool_calls"
[[steps]]
tool_calls = [{ name = "query_order", arguments = { order_id = "A1001" } }]
[[steps]]
text = "It was delivered."
[expect]
exit_reason = "completed"
""",
    "cut_call",
)


@pytest.mark.asyncio
async def test_tool_call_arguments_cut_mid_json_are_a_truncation() -> None:
    result, events = await run(CUT_CALL)
    assert (result.exit_reason, result.cause, result.incomplete) == (
        ExitReason.COMPLETED,
        "model.end_turn",
        False,
    )
    # The cut call never ran; the model was told so, then made it again in full.
    assert [(e.turn, e.arguments) for e in result.call_log] == [(2, '{"order_id":"A1001"}')]
    assert nudges_given(result) == [nudge_text(KIND, TRUNCATION_NUDGES[0] + TRUNCATED_CALLS_NOTE)]
    first = result.transcript[1]
    assert (first.role, first.content, first.tool_calls) == ("assistant", "Let me look it up.", ())
    assert [e.detail for e in result.trace if e.event == "truncated"] == [
        "recovery 1, 1 tool call(s) dropped"
    ]
    # The server said "tool_calls", not "length": no escalation retry for this cut.
    assert [e.attempts for e in events if isinstance(e, ModelReply)] == [1, 1, 1]
    assert result.output == "It was delivered."  # tool calls ended the cut answer


MALFORMED_CALL = scenario(
    """
task = "Has order A1001 arrived?"
[[tools]]
name = "query_order"
parameters = { order_id = "string" }
results = ["order A1001: delivered"]
[[steps]]
tool_calls = [{ name = "query_order", raw_arguments = '{"order_id": "A1001",}' }]
[[steps]]
text = "I could not look it up."
[expect]
exit_reason = "completed"
""",
    "malformed_call",
)


@pytest.mark.asyncio
async def test_complete_but_malformed_arguments_are_not_a_truncation() -> None:
    result, _ = await run(MALFORMED_CALL)
    assert result.nudges == 0
    (entry,) = result.call_log
    assert (entry.is_error, entry.error_kind) == (True, "invalid_arguments")
    assert result.cause == "model.end_turn"


LENGTH_WITH_CALLS = scenario(
    """
task = "Has order A1001 arrived?"
[[tools]]
name = "query_order"
parameters = { order_id = "string" }
results = ["order A1001: delivered"]
[[steps]]
tool_calls = [{ name = "query_order", arguments = { order_id = "A1001" } }]
finish_reason = "length"
[[steps]]
text = "Delivered."
[expect]
exit_reason = "completed"
""",
    "length_with_calls",
)


@pytest.mark.asyncio
async def test_complete_calls_of_a_reply_cut_by_length_do_not_run() -> None:
    result, _ = await run(LENGTH_WITH_CALLS)
    assert result.call_log == ()
    assert result.tool_calls == 0
    assert nudges_given(result) == [nudge_text(KIND, TRUNCATION_NUDGES[0] + TRUNCATED_CALLS_NOTE)]
    assert result.output == "Delivered."


@pytest.mark.parametrize(
    ("arguments", "cut"),
    [
        ('{"order_id": "A10', True),
        ('{"order_id": "A1001", "lines": [1, 2', True),
        ('{"order_id": "say \\"hi', True),  # an escaped quote does not close the string
        ('{"a": {"b": 1}', True),
        ('{"order_id":', True),
        ('{"order_id": "A1001",}', False),  # malformed, but complete
        ('{"order_id": "A1001"} trailing', False),
        ('{"text": "a } or ] inside"', True),
        ('{"order_id": "A1001"}', False),
    ],
)
def test_cut_mid_json_means_unclosed_not_malformed(arguments: str, cut: bool) -> None:
    call = ToolCall(id="c1", name="query_order", arguments=arguments)
    reply = ModelReply(run_id="r", turn=1, text="", tool_calls=(call,), invalid_tool_calls=("c1",))
    assert cut_mid_json(reply) is cut
    valid = ModelReply(run_id="r", turn=1, text="", tool_calls=(call,))
    assert cut_mid_json(valid) is False  # only calls the caller found invalid count
