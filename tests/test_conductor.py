"""The conductor's state machine on its own: a real bus, scripted actors (tests/harness.py),
no runtime. Each test checks how the run ends and the exact sequence of messages."""

from __future__ import annotations

from collections.abc import MutableSequence, Sequence
from typing import Any

import anyio
import pytest

from bus import (
    AbortRequested,
    ActorFailed,
    ChatMessage,
    ContextAction,
    ExitReason,
    Fold,
    Message,
    ModelError,
    ModelRequest,
    Nudge,
    StopSignal,
    ToolCall,
    ToolCallProposed,
    ToolExecute,
    ToolVerdict,
    TurnEnded,
    TurnStarted,
    nudge_text,
)
from bus.messages import ModelReplied
from orchestrator.conductor import Conductor, ContextFunctions, RunInputs
from orchestrator.conductor.final_answer import ANSWER_NUDGE, ANSWER_NUDGE_KIND
from orchestrator.result import RunResult
from orchestrator.runtime.runtime import CONTEXT_FUNCTIONS
from tests.harness import RUN_ID, Harness, Script, calls, inputs, open_harness, said, settings

READ = ToolCall(id="c1", name="read_file", arguments='{"path": "a"}')
LIST = ToolCall(id="c2", name="list_dir", arguments='{"path": "."}')

START = ["RunStarted", "TurnStarted", "ModelRequest", "ModelReply", "ModelReplied"]
"""The first turn up to its reply's checkpoint."""
END = ["RunEnding", "RunFinished"]
TOOLS = ["ToolCallProposed", "ToolExecute", "ToolResult"]
"""One call proposed, run and answered."""


async def conduct(script: Script, run: RunInputs | None = None) -> tuple[RunResult, Harness]:
    async with open_harness(script) as harness:
        with anyio.fail_after(10):
            result = await Conductor(harness.bus, run or inputs(), harness.inbox).run()
        return result, harness


def stop(cause: str, *, answerable: bool = False, per_call: bool = False) -> StopSignal:
    return StopSignal(
        run_id=RUN_ID,
        reason=ExitReason.MAX_TURNS if cause.startswith("budget.") else ExitReason.HOOK_STOPPED,
        cause=cause,
        source="test_monitor",
        detail=f"stopped: {cause}",
        answerable=answerable,
        per_call=per_call,
    )


def roles(result: RunResult) -> list[str]:
    return [m.role for m in result.transcript]


@pytest.mark.asyncio
async def test_a_plain_turn_completes() -> None:
    result, harness = await conduct(Script([said("The answer.")]))
    assert (result.exit_reason, result.cause) == (ExitReason.COMPLETED, "model.end_turn")
    assert result.output == "The answer."
    assert (result.turns, result.llm_requests, result.tool_calls) == (1, 1, 0)
    assert harness.kinds() == [*START, *END]
    assert roles(result) == ["user", "assistant"]
    assert [e.state for e in result.trace] == ["PLAN", "ACT", "DONE"]


@pytest.mark.asyncio
async def test_a_tool_turn_runs_the_calls_and_goes_on() -> None:
    result, harness = await conduct(Script([calls(READ, LIST), said("Done.")]))
    assert (result.exit_reason, result.cause) == (ExitReason.COMPLETED, "model.end_turn")
    assert (result.turns, result.llm_requests, result.tool_calls) == (2, 2, 2)
    assert harness.kinds() == [
        *START,
        "ToolCallProposed",
        "ToolCallProposed",
        "ToolExecute",
        "ToolResult",
        "ToolResult",
        "TurnEnded",
        "TurnStarted",
        "ModelRequest",
        "ModelReply",
        "ModelReplied",
        *END,
    ]
    assert [m.index for m in harness.of(ToolCallProposed)] == [0, 1]
    assert roles(result) == ["user", "assistant", "tool", "tool", "assistant"]
    assert [m.content for m in result.transcript[2:4]] == [
        "result of read_file",
        "result of list_dir",
    ]
    second = harness.of(ModelRequest)[1]
    assert second.messages == result.transcript[:4]  # the results went back to the model
    assert [entry.verdict for entry in result.call_log] == ["allow", "allow"]


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("checkpoint", "kinds"),
    [
        (TurnStarted, ["RunStarted", "TurnStarted", "StopSignal", *END]),
        (ModelReplied, [*START, "StopSignal", *END]),
        (ToolCallProposed, [*START, "ToolCallProposed", "StopSignal", *END]),
        (
            TurnEnded,
            [*START, *TOOLS, "TurnEnded", "StopSignal", *END],
        ),
    ],
    ids=["before the model call", "after the reply", "before a tool", "after the turn"],
)
async def test_a_stop_at_each_checkpoint_ends_the_run_there(
    checkpoint: type[Message], kinds: list[str]
) -> None:
    script = Script([calls(READ), said("never asked")]).on(checkpoint, stop("hook.guard"))
    result, harness = await conduct(script)
    assert (result.exit_reason, result.cause) == (ExitReason.HOOK_STOPPED, "hook.guard")
    assert result.detail == "stopped: hook.guard"
    assert harness.kinds() == kinds
    assert result.trace[-2].event == "stop"  # the stop, traced once, then the ending
    assert result.trace[-1].event == "hook_stopped/hook.guard"


@pytest.mark.asyncio
async def test_a_stop_before_a_tool_leaves_the_call_not_run() -> None:
    script = Script([calls(READ)]).on(ToolCallProposed, stop("budget.deadline"))
    result, _ = await conduct(script)
    assert result.cause == "budget.deadline"
    assert result.tool_calls == 0
    assert [entry.verdict for entry in result.call_log] == ["not_run"]
    assert result.transcript[-1].content == "Error: not run: the run was stopping."


@pytest.mark.asyncio
async def test_a_per_call_stop_lets_the_calls_approved_before_it_run() -> None:
    script = Script([calls(READ, LIST)]).on(
        ToolCallProposed, stop("budget.max_tool_calls", per_call=True), index=1
    )
    result, harness = await conduct(script)
    assert (result.exit_reason, result.cause) == (ExitReason.MAX_TURNS, "budget.max_tool_calls")
    assert harness.kinds() == [
        *START,
        "ToolCallProposed",
        "ToolCallProposed",
        "StopSignal",
        "ToolExecute",
        "ToolResult",
        *END,
    ]
    assert harness.of(ToolExecute)[0].calls == (READ,)
    assert result.tool_calls == 1
    assert [entry.verdict for entry in result.call_log] == ["allow", "not_run"]


@pytest.mark.asyncio
async def test_only_the_first_stop_counts() -> None:
    script = Script([said("never asked")]).on(TurnStarted, stop("hook.first"), stop("loop.next"))
    result, harness = await conduct(script)
    assert result.cause == "hook.first"
    assert harness.kinds() == ["RunStarted", "TurnStarted", "StopSignal", "StopSignal", *END]
    assert [e.event for e in result.trace].count("stop") == 1


@pytest.mark.asyncio
async def test_a_nudge_is_injected_before_the_next_model_call() -> None:
    nudge = Nudge(run_id=RUN_ID, kind="loop.warning", text="Try something else.", source="m")
    script = Script([calls(READ), said("Done.")]).on(TurnEnded, nudge, turn=1)
    result, harness = await conduct(script)
    assert result.cause == "model.end_turn"
    assert harness.kinds() == [
        *START,
        "ToolCallProposed",
        "ToolExecute",
        "ToolResult",
        "TurnEnded",
        "Nudge",
        "TurnStarted",
        "ModelRequest",
        "ModelReply",
        "ModelReplied",
        *END,
    ]
    injected = ChatMessage(role="user", content=nudge_text("loop.warning", "Try something else."))
    assert harness.of(ModelRequest)[1].messages[-1] == injected
    assert result.nudges == 1
    assert roles(result) == ["user", "assistant", "tool", "user", "assistant"]


@pytest.mark.parametrize(
    ("kind", "keeps_answer", "output"),
    [
        ("hook.review", True, "First.\n\nSecond."),  # the flag decides, not the kind
        ("budget.continue", False, "Second."),
    ],
)
@pytest.mark.asyncio
async def test_a_continued_answer_is_kept_only_when_the_nudge_says_so(
    kind: str, keeps_answer: bool, output: str
) -> None:
    nudge = Nudge(
        run_id=RUN_ID,
        kind=kind,
        text="Go on.",
        source="m",
        continues=True,
        keeps_answer=keeps_answer,
    )
    script = Script([said("First."), said("Second.")]).on(ModelReplied, nudge, turn=1)
    result, _ = await conduct(script)
    assert (result.cause, result.turns) == ("model.end_turn", 2)
    assert result.output == output


@pytest.mark.asyncio
async def test_a_blocked_call_is_answered_with_the_verdict_and_not_run() -> None:
    block = ToolVerdict(
        run_id=RUN_ID,
        turn=1,
        call_id=READ.id,
        verdict="block",
        source="hooks",
        message="read_file is blocked here.",
    )
    warn = ToolVerdict(run_id=RUN_ID, turn=1, call_id=READ.id, verdict="warn", source="loop")
    script = Script([calls(READ, LIST), said("Done.")]).on(ToolCallProposed, block, warn, index=0)
    result, harness = await conduct(script)
    assert result.cause == "model.end_turn"
    assert harness.kinds() == [
        *START,
        "ToolCallProposed",
        "ToolVerdict",
        "ToolVerdict",
        "ToolCallProposed",
        "ToolExecute",
        "ToolResult",
        "TurnEnded",
        "TurnStarted",
        "ModelRequest",
        "ModelReply",
        "ModelReplied",
        *END,
    ]
    assert harness.of(ToolExecute)[0].calls == (LIST,)  # only the other call ran
    assert result.transcript[2].content == "Error: read_file is blocked here."
    assert [entry.verdict for entry in result.call_log] == ["block", "allow"]
    assert result.tool_calls == 1


@pytest.mark.asyncio
async def test_an_abort_while_streaming_cancels_the_request() -> None:
    abort = AbortRequested(run_id=RUN_ID, source="caller", detail="enough")
    script = Script().on(ModelRequest, abort)
    result, harness = await conduct(script)
    assert (result.exit_reason, result.cause) == (ExitReason.ABORTED_STREAMING, "abort.caller")
    assert result.detail == "enough"
    assert harness.kinds() == [
        "RunStarted",
        "TurnStarted",
        "ModelRequest",
        "AbortRequested",
        "ModelCancel",
        "ModelReply",
        *END,
    ]


@pytest.mark.asyncio
async def test_an_abort_while_tools_run_cancels_them() -> None:
    abort = AbortRequested(run_id=RUN_ID, source="api")
    script = Script([calls(READ)]).on(ToolExecute, abort)
    result, harness = await conduct(script)
    assert (result.exit_reason, result.cause) == (ExitReason.ABORTED_TOOLS, "abort.caller")
    assert harness.kinds() == [
        *START,
        "ToolCallProposed",
        "ToolExecute",
        "AbortRequested",
        "ToolsCancel",
        "ToolResult",
        *END,
    ]
    assert result.tool_calls == 0
    assert [entry.verdict for entry in result.call_log] == ["not_run"]


@pytest.mark.asyncio
async def test_an_abort_before_the_run_starts_ends_it_at_once() -> None:
    async with open_harness(Script()) as harness:
        harness.inbox.deliver(AbortRequested(run_id=RUN_ID, source="shutdown"))
        with anyio.fail_after(10):
            result = await Conductor(harness.bus, inputs(), harness.inbox).run()
    assert (result.exit_reason, result.cause) == (ExitReason.ABORTED_STREAMING, "abort.shutdown")
    assert harness.kinds() == ["RunStarted", *END]
    assert result.turns == 0


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("signal", "asks"),
    [
        (stop("budget.max_turns", answerable=True), True),
        (stop("hook.guard"), False),
    ],
    ids=["answerable", "not answerable"],
)
async def test_on_stop_answer_asks_once_only_after_an_answerable_stop(
    signal: StopSignal, asks: bool
) -> None:
    script = Script([calls(READ), said("What I found.")]).on(TurnEnded, signal)
    run = inputs(settings=settings(on_stop="answer"))
    result, harness = await conduct(script, run)
    assert result.cause == signal.cause  # the ending stays the stop's
    before = [*START, "ToolCallProposed", "ToolExecute", "ToolResult", "TurnEnded", "StopSignal"]
    if not asks:
        assert harness.kinds() == [*before, *END]
        assert not result.degraded
        return
    assert harness.kinds() == [*before, "ModelRequest", "ModelReply", *END]
    final = harness.of(ModelRequest)[-1]
    assert (final.turn, final.tools, final.max_tokens) == (2, (), 100)
    assert final.messages[-1].content == nudge_text(ANSWER_NUDGE_KIND, ANSWER_NUDGE)
    assert result.output == "What I found."
    assert result.degraded
    assert result.llm_requests == 2


@pytest.mark.asyncio
async def test_a_final_model_error_ends_the_run() -> None:
    error = ModelError(
        run_id=RUN_ID, turn=1, kind="server_error", message="down", attempt=4, final=True
    )
    result, harness = await conduct(Script().on(ModelRequest, error))
    assert (result.exit_reason, result.cause) == (ExitReason.ABORTED_STREAMING, "model.unavailable")
    assert harness.kinds() == ["RunStarted", "TurnStarted", "ModelRequest", "ModelError", *END]


@pytest.mark.asyncio
async def test_an_actor_failure_ends_the_run_as_an_internal_error() -> None:
    failed = ActorFailed(run_id=RUN_ID, actor="loop_monitor", error="boom")
    result, harness = await conduct(Script([said("x")]).on(TurnStarted, failed))
    assert (result.exit_reason, result.cause) == (ExitReason.HOOK_STOPPED, "internal.error")
    assert result.detail == "actor loop_monitor failed: boom"
    assert harness.kinds() == ["RunStarted", "TurnStarted", "ActorFailed", *END]


@pytest.mark.asyncio
async def test_an_exception_inside_a_phase_ends_the_run_as_an_internal_error() -> None:
    def broken_fold(transcript: MutableSequence[ChatMessage], folds: Sequence[Fold]) -> Any:
        raise RuntimeError("fold failed")

    functions = ContextFunctions(
        fold=broken_fold,
        compaction_prompt=CONTEXT_FUNCTIONS.compaction_prompt,
        summary=CONTEXT_FUNCTIONS.summary,
    )
    collapse = ContextAction(run_id=RUN_ID, turn=1, kind="collapse")
    script = Script([said("never asked")]).on(TurnStarted, collapse)
    result, harness = await conduct(script, inputs(context=functions))
    assert (result.exit_reason, result.cause) == (ExitReason.HOOK_STOPPED, "internal.error")
    assert "fold failed" in result.detail
    assert harness.kinds() == ["RunStarted", "TurnStarted", "ContextAction", *END]
