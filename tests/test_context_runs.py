"""Context limits end to end: real runs on the simulator (real openai client over HTTP)."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import TypeVar

import anyio
import pytest

from actors.context import SUMMARY_NUDGE_KIND
from bus import (
    NUDGE_MARKER,
    ContextAction,
    ExitReason,
    Message,
    ModelRequest,
    PromptRejected,
    StopSignal,
    TurnStarted,
)
from orchestrator.config import Config, ContextSettings, load_config
from orchestrator.errors import ConfigError
from orchestrator.result import RunResult
from orchestrator.runtime import RunSpec, Runtime
from orchestrator.scenarios.runs import expectation_mismatches, start_scenario
from orchestrator.sim import Scenario, parse_scenario, shipped_scenarios
from tests.pairing import pairing_problems

SHIPPED = {scenario.name: scenario for scenario in shipped_scenarios()}


def prose(paragraphs: int, seed: int = 0) -> str:
    """Deterministic report-like text, about 450 characters a paragraph."""
    topics = ["inoculation", "plate layout", "incubation", "readings", "calibration", "export"]
    return "\n\n".join(
        textwrap.fill(
            f"Part {seed}.{i}, {topics[(i + seed) % len(topics)]}. The team followed the "
            "standard operating procedure and recorded every deviation in the shared "
            "notebook. Each replicate was handled by the same person at the same bench, so "
            "the comparison between strains stays fair, and every open choice was written "
            "down before the measurement, not after it.",
            90,
        )
        for i in range(paragraphs)
    )


def scenario(name: str, text: str) -> Scenario:
    return parse_scenario(textwrap.dedent(text), source=f"{name}.toml", name=name)


async def run(
    chosen: Scenario, *, config: Config | None = None, serve: bool = True
) -> tuple[RunResult, list[Message], Runtime]:
    async with Runtime(config, scenarios=[chosen] if serve else ()) as runtime:
        handle = await start_scenario(runtime, chosen)
        with anyio.fail_after(60):
            events = [event async for event in handle.events()]
            result = await handle.result()
    return result, events, runtime


T = TypeVar("T")


def of_type(events: list[Message], kind: type[T]) -> list[T]:
    return [event for event in events if isinstance(event, kind)]


def actions(events: list[Message]) -> list[str]:
    """The gatekeeper's actions on the prompt (``counting`` notes left out)."""
    return [f"{e.kind}{'!' if e.reactive else ''}" for e in changes(events)]


def changes(events: list[Message]) -> list[ContextAction]:
    return [e for e in of_type(events, ContextAction) if e.kind != "counting"]


def assert_every_request_is_valid(events: list[Message]) -> None:
    for request in of_type(events, ModelRequest):
        assert pairing_problems(request.messages) == [], request.turn


# --------------------------------------------------------------------------- blocking_limit


@pytest.mark.asyncio
async def test_the_blocked_turns_request_never_goes_out() -> None:
    result, events, _ = await run(SHIPPED["blocking_limit"], serve=False)
    assert expectation_mismatches(SHIPPED["blocking_limit"], result) == []
    requests = of_type(events, ModelRequest)
    assert [r.turn for r in requests] == [1, 2, 3] == list(range(1, result.llm_requests + 1))
    assert [t.turn for t in of_type(events, TurnStarted)] == [1, 2, 3, 4]
    assert actions(events) == ["blocked"]
    stop = of_type(events, StopSignal)[-1]
    assert stop.source == "context_gatekeeper"
    assert "No request was sent" in result.detail
    assert result.hint.startswith(
        "The prompt would not fit the model's window (no request was sent)"
    )
    assert any(entry.event == "context blocked" for entry in result.trace)


@pytest.mark.asyncio
async def test_a_task_too_long_for_the_window_sends_nothing() -> None:
    huge = scenario(
        "huge_task",
        f'''
        task = """{prose(60)}"""
        [config]
        context_window = 5000
        max_output_tokens = 500
        [[steps]]
        text = "never asked"
        [expect]
        exit_reason = "blocking_limit"
        ''',
    )
    result, events, _ = await run(huge)
    assert (result.exit_reason, result.cause) == (
        ExitReason.BLOCKING_LIMIT,
        "context.blocking_limit",
    )
    assert result.llm_requests == 0
    assert of_type(events, ModelRequest) == []
    assert result.turns == 1


# --------------------------------------------------------------------------- refusals


@pytest.mark.asyncio
async def test_one_413_is_fixed_by_folding_the_answered_result() -> None:
    result, events, _ = await run(SHIPPED["prompt_too_long_recovers"], serve=False)
    assert expectation_mismatches(SHIPPED["prompt_too_long_recovers"], result) == []
    assert [(p.attempt, p.status) for p in of_type(events, PromptRejected)] == [(1, 413)]
    assert actions(events) == ["collapse!"]
    refused, retried = of_type(events, ModelRequest)[2:]
    assert refused.turn == retried.turn == 3
    assert len(refused.messages) == len(retried.messages)
    [collapse] = changes(events)
    [fold] = collapse.folds
    protocol = refused.messages[fold.index].content or ""
    assert retried.messages[fold.index].content == fold.stub
    assert fold.stub == f"[folded: read_file result, {len(protocol):,} chars, turn 1]"
    assert sum(len(m.content or "") for m in retried.messages) < sum(
        len(m.content or "") for m in refused.messages
    )
    assert_every_request_is_valid(events)


@pytest.mark.asyncio
async def test_an_endpoint_with_a_smaller_window_accepts_the_collapsed_prompt() -> None:
    fits_after_folding = scenario(
        "smaller_window",
        f'''
        task = "Read big.txt and medium.txt, then answer."
        context_window = 1850  # the server's real window; loopfuse is told 128k
        [config]
        context_window = 128000
        [folder]
        "big.txt" = """{prose(11, 1)}"""
        "medium.txt" = """{prose(7, 2)}"""
        [[steps]]
        tool_calls = [{{ name = "read_file", arguments = {{ path = "big.txt" }} }}]
        [[steps]]
        tool_calls = [{{ name = "read_file", arguments = {{ path = "medium.txt" }} }}]
        [[steps]]
        text = "Both files describe the procedure."
        [expect]
        exit_reason = "completed"
        ''',
    )
    result, events, _ = await run(fits_after_folding)
    assert (result.exit_reason, result.llm_requests, result.tool_calls) == (
        ExitReason.COMPLETED,
        4,
        2,
    )
    [refusal] = of_type(events, PromptRejected)
    assert "maximum context length is 1850 tokens" in refusal.message
    assert actions(events) == ["collapse!"]
    assert_every_request_is_valid(events)


@pytest.mark.asyncio
async def test_when_folding_is_not_enough_compaction_makes_room() -> None:
    talk = prose(6, 3)
    compacts = scenario(
        "compacts",
        f'''
        task = "Think aloud while you list the folder three times, then answer."
        context_window = 2000
        [config]
        context_window = 128000
        context_keep_turns = 1
        [[steps]]
        text = """{talk}"""
        tool_calls = [{{ name = "list_dir", arguments = {{ path = "." }} }}]
        [[steps]]
        text = """{talk}"""
        tool_calls = [{{ name = "list_dir", arguments = {{ path = "." }} }}]
        [[steps]]
        text = """{talk}"""
        tool_calls = [{{ name = "list_dir", arguments = {{ path = "." }} }}]
        [[steps]]
        text = "never played: the retry runs on the 'after' track"
        [[tracks.summary]]
        text = "Turns 1-2: the model listed the empty folder twice and thought aloud."
        [[tracks.after]]
        text = "never played: the kept turn 3 is step 0 of this track"
        [[tracks.after]]
        text = "The folder is empty."
        [[branches]]
        nudge = "context.compact"
        track = "summary"
        [[branches]]
        nudge = "context.summary"
        track = "after"
        [expect]
        exit_reason = "completed"
        ''',
    )
    result, events, _ = await run(compacts)
    assert result.exit_reason is ExitReason.COMPLETED, result.detail
    assert result.output == "The folder is empty."
    # Small list_dir results are not worth folding: straight to compaction.
    assert actions(events) == ["compact!"]
    compaction = [r for r in of_type(events, ModelRequest) if r.purpose == "compact"]
    assert len(compaction) == 1
    assert compaction[0].tools == ()
    assert result.llm_requests == 6  # 3 turns, the refused 4th, the summary, the retry
    summaries = [
        m
        for m in result.transcript
        if (m.content or "").startswith(f"{NUDGE_MARKER}{SUMMARY_NUDGE_KIND}]")
    ]
    assert len(summaries) == 1
    assert "turns 1-2" in (summaries[0].content or "")
    assert "listed the empty folder twice" in (summaries[0].content or "")
    assert sum(m.role == "assistant" for m in result.transcript) == 2  # turn 3 and the answer
    assert pairing_problems(result.transcript) == []
    assert_every_request_is_valid(events)
    assert any(entry.event == "context compacted" for entry in result.trace)


@pytest.mark.asyncio
async def test_too_long_after_collapse_and_compaction_stops_prompt_too_long() -> None:
    result, events, _ = await run(SHIPPED["prompt_too_long"], serve=False)
    assert expectation_mismatches(SHIPPED["prompt_too_long"], result) == []
    assert [p.attempt for p in of_type(events, PromptRejected)] == [1, 2, 3]
    assert actions(events) == ["collapse!", "compact!"]
    purposes = [(r.turn, r.purpose) for r in of_type(events, ModelRequest)]
    assert purposes[3:] == [(4, "turn"), (4, "turn"), (4, "compact"), (4, "turn")]
    stop = of_type(events, StopSignal)[-1]
    assert (stop.reason, stop.source) == (ExitReason.PROMPT_TOO_LONG, "context_gatekeeper")
    assert "after collapsing and compacting" in result.detail
    assert_every_request_is_valid(events)


@pytest.mark.asyncio
async def test_without_a_gatekeeper_a_refusal_ends_the_run_at_once() -> None:
    chosen = SHIPPED["prompt_too_long_recovers"]
    async with Runtime() as runtime:
        handle = await start_scenario(runtime, chosen)
        runtime._live.pop(handle.run_id)  # before the run's first message: no policy
        with anyio.fail_after(60):
            result = await handle.result()
    assert (result.exit_reason, result.cause) == (
        ExitReason.PROMPT_TOO_LONG,
        "context.prompt_too_long",
    )
    assert result.llm_requests == 3


# --------------------------------------------------------------------------- while running


# Twelve turns, each reading the next page ("{n}" is the step's index); each page's text
# differs ("Page {n}." in the result), or twelve identical results are no new information.
READ_PAGE_STEPS = "\n        ".join(
    ["[[steps]]", 'tool_calls = [{ name = "read_page", arguments = { page = "{n}" } }]'] * 12
)


@pytest.mark.asyncio
async def test_near_the_limit_old_results_are_folded_and_the_run_goes_on() -> None:
    reads = scenario(
        "many_pages",
        f'''
        task = "Read twelve pages, then summarise."
        [config]
        max_turns = 20
        context_window = 14000
        max_output_tokens = 1000
        [[tools]]
        name = "read_page"
        parameters = {{ page = "integer" }}
        results = ["""Page {{n}}. {prose(9, 4)}"""]
        {READ_PAGE_STEPS}
        [[steps]]
        text = "Twelve pages of procedure."
        [expect]
        exit_reason = "completed"
        ''',
    )
    result, events, runtime = await run(reads)
    assert result.exit_reason is ExitReason.COMPLETED, result.detail
    assert result.tool_calls == 12
    collapses = changes(events)
    assert collapses
    assert {(c.kind, c.reactive) for c in collapses} == {("collapse", False)}
    assert all(c.after_tokens < c.limit_tokens * 0.6 for c in collapses)
    assert_every_request_is_valid(events)
    last = of_type(events, ModelRequest)[-1]
    folds = sum(len(c.folds) for c in collapses)
    stubs = [m for m in last.messages if (m.content or "").startswith("[folded: read_page")]
    assert len(stubs) == folds >= 3
    # Incremental: 4 tool schemas (3 texts each) and the task once, then 4 texts per turn
    # (call name, arguments, call id, result) and 4 per fold (planned, then applied);
    # re-counting the transcript every turn would be over 150.
    stats = runtime.context_gatekeeper.statistics()
    assert stats.texts_counted == 12 + 1 + 4 * (result.turns - 1) + 4 * folds


@pytest.mark.asyncio
async def test_a_prompt_the_endpoint_cut_silently_is_flagged_and_the_run_completes() -> None:
    cut = scenario(
        "silently_cut",
        f'''
        task = "Read notes.txt and answer."
        [folder]
        "notes.txt" = """{prose(12, 5)}"""
        [[steps]]
        tool_calls = [{{ name = "read_file", arguments = {{ path = "notes.txt" }} }}]
        [[steps]]
        text = "The notes describe a procedure."
        usage = {{ prompt_tokens = 300 }}   # like Ollama at num_ctx: the start was dropped
        [expect]
        exit_reason = "completed"
        ''',
    )
    result, events, runtime = await run(cut)
    assert result.exit_reason is ExitReason.COMPLETED
    [flag] = changes(events)
    assert (flag.kind, flag.turn, flag.reported_tokens) == ("silent_truncation", 2, 300)
    assert flag.estimate_tokens > 1_000
    assert any(entry.event == "context silent truncation" for entry in result.trace)
    assert runtime.context_gatekeeper.calibration.samples("silently_cut") == 1  # turn 1 only


# --------------------------------------------------------------------------- configuration


@pytest.mark.asyncio
async def test_context_settings_out_of_range_name_the_key() -> None:
    async with Runtime() as runtime:
        # a window the fixed 3,000 + 8,192 left no room in: the reserves scale with it now
        small = await runtime.run(RunSpec(task="x", overrides={"context_window": 10_000}))
        with pytest.raises(ConfigError) as bad_share:
            await runtime.start(RunSpec(task="x", overrides={"context_collapse_at": 1.5}))
        with pytest.raises(ConfigError) as zero:
            await runtime.start(RunSpec(task="x", overrides={"context_keep_turns": 0}))
    assert small.exit_reason is ExitReason.COMPLETED
    assert bad_share.value.key == "config.context_collapse_at"
    assert zero.value.key == "config.context_keep_turns"


def test_context_config_errors_name_the_key(tmp_path: Path) -> None:
    def error(body: str) -> ConfigError:
        path = tmp_path / "loopfuse.toml"
        path.write_text(textwrap.dedent(body), encoding="utf-8")
        with pytest.raises(ConfigError) as caught:
            load_config(path, environ={})
        return caught.value

    assert error('[context.windows]\n"gpt-4o" = 0\n').key == 'context.windows."gpt-4o"'
    assert error('[context.windows]\n"x" = "big"\n').key == 'context.windows."x"'
    assert error("[context]\nsafety_buffer_tokens = -1\n").key == "context.safety_buffer_tokens"
    assert error("[context]\nsilent_truncation_ratio = 1.0\n").key == (
        "context.silent_truncation_ratio"
    )
    assert error("[context]\nwindowz = 1\n").key == "context.windowz"
    config = load_config(
        environ={"LOOPFUSE_CONTEXT__DEFAULT_WINDOW": "50000", "LOOPFUSE_CONTEXT__COLLAPSE_AT": "0"}
    )
    assert (config.context.default_window, config.context.collapse_at) == (50_000, 0.0)


@pytest.mark.asyncio
async def test_the_collapse_target_follows_a_lower_trigger_and_must_be_positive() -> None:
    config = Config(context=ContextSettings(collapse_at=0.5, collapse_to=0.6))
    async with Runtime(config) as runtime:
        handle = await runtime.start(RunSpec(task="x", overrides={"context_collapse_at": 0.4}))
        assert runtime._live[handle.run_id].policy.collapse_to == 0.4
        await handle.abort()
        await handle.result()
        broken = Runtime(Config(context=ContextSettings(collapse_to=0.0)))
    async with broken:
        with pytest.raises(ConfigError) as caught:
            await broken.start(RunSpec(task="x"))
    assert caught.value.key == "context.collapse_to"


@pytest.mark.asyncio
async def test_a_5_mb_tool_result_on_a_32k_window_is_cut_and_the_run_completes() -> None:
    row = "id=000123 status=queued region=eu-west-1 size=4096 checksum=9f86d081884c7d65\n"
    huge = row * (5_000_000 // len(row))
    dump = scenario(
        "huge_dump",
        f'''
        task = "Dump the job table and tell me how many jobs are queued."
        [config]
        context_window = 32768
        max_output_tokens = 8192
        [[tools]]
        name = "dump_jobs"
        results = ["""{huge}"""]
        [[steps]]
        tool_calls = [{{ name = "dump_jobs", arguments = {{}} }}]
        [[steps]]
        text = "Every job shown is queued."
        [expect]
        exit_reason = "completed"
        ''',
    )
    result, events, _ = await run(dump)
    assert result.exit_reason is ExitReason.COMPLETED, result.detail
    [cut] = changes(events)
    assert cut.kind == "collapse"
    assert cut.detail.startswith("Cut the result of dump_jobs (1 result(s)) to ")
    assert cut.estimate_tokens > cut.limit_tokens  # whole, it would have been blocked
    assert cut.after_tokens <= cut.limit_tokens
    last = of_type(events, ModelRequest)[-1]
    shown = last.messages[-1].content or ""
    assert shown.startswith(row)
    assert "[result cut to fit the context window: the first " in shown
    assert "ask for it in smaller pieces" in shown
    assert any(entry.event == "context collapse" for entry in result.trace)
    counting = [e.detail for e in of_type(events, ContextAction) if e.kind == "counting"]
    assert counting[0].startswith("Prompt tokens of 'huge_dump' are bounded by the UTF-8 bytes")
    assert "are estimated from the usage the server reported (1 reply)" in counting[-1]
    assert "context counting" in [entry.event for entry in result.trace]
