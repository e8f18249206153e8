"""The scenario format's second generation (issue #19): cycling steps, ``{n}`` in tool
results, streamed chunk shapes (over a real server, and through a real run), several runs
in one file, per-call expectations and expectations on the detail and hint."""

from __future__ import annotations

import textwrap
from typing import Literal

import anyio
import msgspec
import openai
import pytest
from openai.types.chat import ChatCompletionChunk, ChatCompletionUserMessageParam

from orchestrator.result import CallLogEntry, RunResult
from orchestrator.runtime import Runtime
from orchestrator.scenarios.runs import expectation_mismatches, run_scenario
from orchestrator.sim import (
    Scenario,
    ScenarioError,
    ToolDef,
    open_simulator,
    parse_scenario,
)
from orchestrator.sim.script import Position, step_at

USER: list[ChatCompletionUserMessageParam] = [{"role": "user", "content": "go"}]
EXPECT = '\n[expect]\nexit_reason = "completed"\n'


def scenario(body: str, name: str = "m") -> Scenario:
    return parse_scenario(textwrap.dedent(body), source=f"{name}.toml", name=name)


def test_a_cycling_track_starts_over_after_its_last_step() -> None:
    cycling = scenario(
        'task = "t"\n[[steps]]\ntext = "a"\n[[steps]]\ntext = "b"\n[[steps]]\ntext = "c"\n'
        "cycle = true\n" + EXPECT
    )
    played = [step_at(cycling, Position("main", n, n)) for n in range(7)]
    assert [step.text for step in played if step is not None] == list("abcabca")


@pytest.mark.parametrize(
    ("steps", "reason"),
    [
        ('[[steps]]\ntext = "a"\ncycle = true\n[[steps]]\ntext = "b"\n', "only the last step"),
        ('[[steps]]\ntext = "a"\ncycle = true\nrepeat = true\n', "not both"),
        ('[[steps]]\ntext = "a"\nstream = { splits = [5, 3] }\n', "increasing offsets"),
        ('[[steps]]\ntext = "a"\nstream = { arguments = "whole" }\n', "delta, cumulative"),
    ],
)
def test_bad_new_step_keys_are_named(steps: str, reason: str) -> None:
    with pytest.raises(ScenarioError) as caught:
        scenario('task = "t"\n' + steps + EXPECT)
    assert reason in str(caught.value)


def test_n_in_a_tool_result_is_the_calls_index() -> None:
    tool = msgspec.convert(
        {"name": "status", "results": ["running, session s-{n}", {"error": "gone {n}"}]},
        ToolDef,
    )
    assert tool.reply({}, 0).text == "running, session s-0"
    assert tool.reply({}, 1).error == "gone 1"
    assert tool.reply({}, 4).error == "gone 4"  # the last result repeats, with its own n


CALL = '{ name = "read_file", arguments = { path = "notes.txt", offset = 10 } }'
ARGUMENTS = '{"path":"notes.txt","offset":10}'


async def stream_of(shape: str) -> list[ChatCompletionChunk]:
    shaped = scenario(f'task = "t"\n[[steps]]\ntool_calls = [{CALL}]\nstream = {shape}\n' + EXPECT)
    async with (
        open_simulator([shaped]) as sim,
        openai.AsyncOpenAI(base_url=sim.base_url, api_key="k", max_retries=0) as c,
    ):
        stream = await c.chat.completions.create(model="m", messages=USER, stream=True)
        async with stream:
            return [chunk async for chunk in stream]


def fragments(chunks: list[ChatCompletionChunk]) -> list[tuple[str | None, str | None, str]]:
    return [
        (
            tc.id,
            tc.function.name if tc.function else None,
            (tc.function and tc.function.arguments) or "",
        )
        for chunk in chunks
        if chunk.choices
        for tc in chunk.choices[0].delta.tool_calls or ()
    ]


@pytest.mark.asyncio
async def test_cumulative_arguments_with_the_head_repeated_at_chosen_boundaries() -> None:
    with anyio.fail_after(10):
        chunks = await stream_of(
            '{ arguments = "cumulative", repeat_head = true, splits = [8, 20] }'
        )
    assert fragments(chunks) == [
        ("call_0_0", "read_file", ""),
        ("call_0_0", "read_file", ARGUMENTS[:8]),
        ("call_0_0", "read_file", ARGUMENTS[:20]),
        ("call_0_0", "read_file", ARGUMENTS),
    ]


@pytest.mark.asyncio
async def test_delta_arguments_at_chosen_boundaries_without_the_head() -> None:
    with anyio.fail_after(10):
        chunks = await stream_of("{ splits = [1, 2, 30] }")
    assert fragments(chunks) == [
        ("call_0_0", "read_file", ""),
        (None, None, ARGUMENTS[:1]),
        (None, None, ARGUMENTS[1:2]),
        (None, None, ARGUMENTS[2:30]),
        (None, None, ARGUMENTS[30:]),
    ]


@pytest.mark.asyncio
async def test_a_run_reassembles_cumulative_repeated_chunks_into_one_valid_call() -> None:
    shaped = scenario(
        f"""
        task = "Read the notes."
        wire = true
        [folder]
        "notes.txt" = "line\\n"
        [[steps]]
        tool_calls = [{CALL}]
        stream = {{ arguments = "cumulative", repeat_head = true, splits = [3, 9, 17] }}
        [[steps]]
        text = "Done."
        [expect]
        exit_reason = "completed"
        tool_calls = 1
        calls = [{{ call = 1, verdict = "allow", tool = "read_file" }}]
        """,
        name="shaped_run",
    )
    async with Runtime(scenarios=[shaped]) as runtime:
        with anyio.fail_after(30):
            result = await run_scenario(runtime, shaped)
    assert expectation_mismatches(shaped, result) == []
    [entry] = result.call_log
    assert msgspec.json.decode(entry.arguments) == {"path": "notes.txt", "offset": 10}
    assert not entry.is_error


MULTI = """
task = "Wait for the job."
[config]
max_turns = 9
loop = { generic_repeat = { warn_at = 3 } }
[[steps]]
text = "done"
[[runs]]
label = "strict"
[[runs]]
label = "openclaw"
config = { loop_preset = "openclaw", loop = { record_blocked = true } }
task = "Wait again."
expect = { exit_reason = "max_turns", cause = "budget.max_turns" }
[expect]
exit_reason = "completed"
"""


def test_several_runs_in_one_file_expand_into_named_scenarios() -> None:
    file = scenario(MULTI, name="multi")
    strict, openclaw = file.expand()
    assert (strict.name, openclaw.name) == ("multi.strict", "multi.openclaw")
    assert strict.config == file.config
    assert strict.expect == file.expect
    assert openclaw.config == {
        "max_turns": 9,
        "loop_preset": "openclaw",
        "loop": {"generic_repeat": {"warn_at": 3}, "record_blocked": True},
    }
    assert openclaw.task == "Wait again."
    assert openclaw.expect.cause == "budget.max_turns"
    assert strict.runs == openclaw.runs == ()


def test_a_file_of_runs_needs_an_expect_per_run_or_its_own() -> None:
    body = MULTI.replace('[expect]\nexit_reason = "completed"\n', "")
    with pytest.raises(ScenarioError) as caught:
        scenario(body)
    assert "runs[0].expect" in str(caught.value)
    with pytest.raises(ScenarioError) as caught:
        scenario(MULTI.replace('label = "openclaw"', 'label = "strict"'))
    assert "duplicate label 'strict'" in str(caught.value)


Verdict = Literal["allow", "warn", "block", "not_run"]


def result_with(calls: list[Verdict], detail: str = "d", hint: str = "h") -> RunResult:
    log = tuple(
        CallLogEntry(
            turn=i + 1, call_id=f"c{i}", tool="t", arguments="{}", fingerprint="f", verdict=v
        )
        for i, v in enumerate(calls)
    )
    return msgspec.convert(
        {
            "run_id": "r",
            "trace_id": "t",
            "exit_reason": "completed",
            "cause": "model.end_turn",
            "outcome": "done",
            "detail": detail,
            "hint": hint,
            "turns": 1,
            "llm_requests": 1,
            "tool_calls": len(calls),
            "usage": {},
            "output": "",
            "incomplete": False,
            "degraded": False,
            "nudges": 0,
            "trace": [],
            "call_log": [msgspec.to_builtins(entry) for entry in log],
        },
        RunResult,
    )


def test_per_call_and_text_expectations_report_each_mismatch() -> None:
    checked = scenario(
        """
        task = "t"
        [[steps]]
        text = "x"
        [expect]
        exit_reason = "completed"
        calls = [{ call = 1, verdict = "allow" }, { call = 2, verdict = "warn", tool = "u" },
                 { call = 4, verdict = "block" }]
        detail_contains = ["identical"]
        hint_contains = ["Raise"]
        """
    )
    assert expectation_mismatches(checked, result_with(["allow", "warn", "allow"])) == [
        "calls[2].tool: expected 'u', got 't'",
        "calls[4]: the run proposed 3 call(s)",
        "detail: 'identical' not in 'd'",
        "hint: 'Raise' not in 'h'",
    ]
    good = result_with(["allow", "warn", "allow", "block"], "5 identical calls", "Raise it")
    checked_tool = msgspec.structs.replace(
        checked,
        expect=msgspec.structs.replace(
            checked.expect, calls=(checked.expect.calls[0], checked.expect.calls[2])
        ),
    )
    assert expectation_mismatches(checked_tool, good) == []
