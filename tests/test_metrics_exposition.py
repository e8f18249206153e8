"""The recorder's exposition, byte for byte: a scripted sequence of messages and seam calls
that touches every metric, scraped in the text format and in OpenMetrics, against fixtures
taken from the prometheus_client objects the recorder used before its plain-Python state.

Timestamps (``_created`` samples, exemplars) are frozen, and the build labels replaced, so
the fixtures do not depend on the clock or the installed versions. To regenerate them after
a deliberate change: ``python -m tests.test_metrics_exposition``.
"""

from __future__ import annotations

import platform
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Final

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

from actors.loop.monitor import SOURCE as LOOP_MONITOR
from bus import (
    Bus,
    ContextAction,
    ExitReason,
    ModelError,
    ModelReplied,
    ModelReply,
    ModelRequest,
    Nudge,
    Outcome,
    Progress,
    RunFinished,
    StopSignal,
    ToolCall,
    ToolCallProposed,
    ToolResult,
    ToolVerdict,
    TurnEnded,
    TurnStarted,
    Usage,
)
from orchestrator.metrics import MetricsRecorder, new_registry
from tests.started import run_started

FROZEN: Final = 1_700_000_000.5
HERE: Final = Path(__file__).parent
TEXT_FIXTURE: Final = HERE / "test_metrics_exposition.txt"
OPENMETRICS_FIXTURE: Final = HERE / "test_metrics_exposition.openmetrics.txt"


class _Clock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


def _finished(
    run_id: str, reason: ExitReason, cause: str, turns: int, outcome: Outcome | None = None
) -> RunFinished:
    if outcome is None:
        outcome = Outcome.DONE if reason is ExitReason.COMPLETED else Outcome.FAILED
    return RunFinished(
        run_id=run_id,
        exit_reason=reason,
        cause=cause,
        outcome=outcome,
        detail="",
        hint="",
        turns=turns,
        llm_requests=turns,
        tool_calls=0,
        usage=Usage(),
    )


def _replied(run_id: str, finish_reason: str) -> ModelReplied:
    return ModelReplied(
        run_id=run_id,
        turn=1,
        text_chars=1,
        tool_calls=0,
        finish_reason=finish_reason,
        usage=Usage(),
        total_usage=Usage(),
    )


def _call(call_id: str, name: str) -> ToolCall:
    return ToolCall(id=call_id, name=name, arguments="{}")


def scripted_registry() -> CollectorRegistry:
    """A recorder fed a sequence that touches every metric, every seam and the ``other``
    buckets; its registry."""
    clock = _Clock()
    tools = {"read_file", "list_dir"}  # a live container, as the tool registry is
    registry = new_registry(process=False)
    rec = MetricsRecorder(Bus(), registry, models=("gpt-4o", "gpt-test"), tools=tools, clock=clock)
    rec.set_context_window("gpt-test", 8000)

    # r1: priced, two turns, a retried error, an escalation, tools of every outcome.
    rec.handle(
        run_started(
            run_id="r1",
            trace_id="t" * 32,
            task="x",
            model="gpt-test",
            input_price_per_million=2.0,
            output_price_per_million=10.0,
        )
    )
    rec.handle(TurnStarted(run_id="r1", turn=1, stage="agent", prompt_messages=1))
    rec.handle(ModelRequest(run_id="r1", turn=1, model="gpt-test", messages=()))
    rec.handle(ModelError(run_id="r1", turn=1, kind="rate_limited", message="429", attempt=1))
    rec.handle(
        ModelReply(
            run_id="r1",
            turn=1,
            text="",
            tool_calls=(_call("c1", "read_file"), _call("c2", "list_dir")),
            usage=Usage(prompt_tokens=1200, completion_tokens=30),
            attempts=3,
            latency_seconds=1.28,  # on a bucket's bound: counted in it
            ttft_seconds=0.25,
        )
    )
    rec.handle(_replied("r1", "tool_calls"))
    for index, name in enumerate(("read_file", "list_dir", "read_file", "read_file")):
        rec.handle(
            ToolCallProposed(
                run_id="r1", turn=1, call=_call(f"c{index + 1}", name), fingerprint="f", index=index
            )
        )
    rec.handle(ToolVerdict(run_id="r1", turn=1, call_id="c1", verdict="allow", source="x"))
    rec.handle(ToolVerdict(run_id="r1", turn=1, call_id="c2", verdict="block", source="hook.x"))
    rec.handle(ToolVerdict(run_id="r1", turn=1, call_id="c2", verdict="block", source="hook.y"))
    rec.handle(
        ToolVerdict(
            run_id="r1",
            turn=1,
            call_id="c3",
            verdict="warn",
            source=LOOP_MONITOR,
            cause="loop.generic_repeat",
        )
    )
    rec.handle(
        ToolVerdict(
            run_id="r1", turn=1, call_id="c4", verdict="block", source=LOOP_MONITOR, cause="loop.x"
        )
    )
    rec.handle(
        ToolResult(
            run_id="r1", turn=1, call_id="c1", tool="read_file", content="x", duration_seconds=0.2
        )
    )
    rec.handle(
        ToolResult(
            run_id="r1",
            turn=1,
            call_id="c3",
            tool="read_file",
            content="x",
            cache="hit",
            duration_seconds=0.5,
        )
    )
    rec.handle(TurnEnded(run_id="r1", turn=1, tool_calls=2))
    rec.handle(Progress(run_id="r1", stage="agent", index=1, total=2, status="finished"))
    rec.handle(TurnStarted(run_id="r1", turn=2, stage="agent", prompt_messages=5))
    rec.handle(ModelRequest(run_id="r1", turn=2, model="gpt-4o", messages=()))  # model changed
    rec.handle(
        ModelReply(
            run_id="r1",
            turn=2,
            text="done",
            usage=Usage(prompt_tokens=64_000, completion_tokens=500),
            latency_seconds=400.0,  # beyond the last bound: +Inf only
            ttft_seconds=0.001,
        )
    )
    rec.handle(_replied("r1", "stop"))
    clock.now += 7.5
    rec.handle(_finished("r1", ExitReason.MAX_TURNS, "budget.max_turns", 2))

    # r2: an unconfigured model, truncation recovery that gives up, a silent truncation.
    rec.handle(run_started(run_id="r2", trace_id="u" * 200, task="x", model="mystery-model"))
    for _ in range(5):
        rec.handle(_replied("r2", "length"))
        rec.handle(ModelReply(run_id="r2", turn=1, text="", usage=Usage(prompt_tokens=16_384)))
    rec.handle(ContextAction(run_id="r2", turn=1, kind="silent_truncation"))
    rec.handle(ContextAction(run_id="r2", turn=1, kind="blocked"))
    rec.handle(ModelError(run_id="r2", turn=1, kind="timeout", message="t", final=True))
    clock.now += 1800.0
    rec.handle(_finished("r2", ExitReason.COMPLETED, "truncation.gave_up", 5))

    # r3: loops, nudges of every kind, a stop, a blocking limit.
    rec.handle(run_started(run_id="r3" * 70, trace_id="v" * 32, task="x", model="gpt-4o"))
    rec.handle(Nudge(run_id="r3" * 70, kind="loop.content", text="t", source=LOOP_MONITOR))
    rec.handle(Nudge(run_id="r3" * 70, kind="budget.warning", text="t", source="budget"))
    rec.handle(Nudge(run_id="r3" * 70, kind="hook.lint", text="t", source="hook.lint"))
    rec.handle(Nudge(run_id="r3" * 70, kind="free text", text="t", source="x"))
    rec.handle(
        StopSignal(
            run_id="r3" * 70,
            reason=ExitReason.HOOK_STOPPED,
            cause="loop.ping_pong",
            source=LOOP_MONITOR,
        )
    )
    rec.handle(
        StopSignal(run_id="r3" * 70, reason=ExitReason.MAX_TURNS, cause="budget.cost", source="b")
    )
    rec.handle(_finished("r3" * 70, ExitReason.BLOCKING_LIMIT, "context.blocking_limit", 3))

    # Messages of runs never started; endings with unexpected pairs; tools added later.
    rec.handle(ToolResult(run_id="r9", turn=1, call_id="z", tool="mystery_tool", content=""))
    tools.add("grep")
    rec.handle(
        ToolResult(
            run_id="r9",
            turn=1,
            call_id="g",
            tool="grep",
            content="",
            is_error=True,
            error_kind="timeout",
            duration_seconds=30.0,
        )
    )
    rec.add_tools(("write_file",))
    rec.add_models(("late-model",))
    for error_kind in ("invalid_arguments", "unknown_tool", "aborted", "path"):
        rec.handle(
            ToolResult(
                run_id="r9",
                turn=1,
                call_id="e",
                tool="write_file",
                content="",
                is_error=True,
                error_kind=error_kind,
                executed=error_kind == "path",
            )
        )
    rec.handle(ModelReply(run_id="r9", turn=1, text="", aborted=True, attempts=1))
    rec.handle(_finished("r9", ExitReason.COMPLETED, "hook.odd", 1))
    rec.handle(_finished("r8", ExitReason.ABORTED_TOOLS, "abort.caller", 0))
    rec.handle(
        _finished("r7", ExitReason.PROMPT_TOO_LONG, "model.end_turn", 4, outcome=Outcome.DONE)
    )

    # The seams.
    rec.record_cost("gpt-4o", 0.125)
    rec.record_cost("nobody", 0.5)
    rec.record_context_action("collapse")
    rec.record_context_action("compact")
    for seconds in (0.0004, 0.0005, 0.003, 9.0):
        rec.observe_store_write(seconds)
    return registry


def normalised(text: str) -> str:
    """``text`` with the build labels replaced by placeholders."""
    version = metadata.version("loopfuse")  # what the build_info metric reads
    return text.replace(f'version="{version}"', 'version="<version>"').replace(
        f'python_version="{platform.python_version()}"', 'python_version="<python>"'
    )


def expositions() -> tuple[str, str]:
    """The scripted recorder's text-format and OpenMetrics scrapes, normalised."""
    registry = scripted_registry()
    text = generate_latest(registry).decode()
    openmetrics: bytes = generate_openmetrics(registry)  # type: ignore[no-untyped-call]
    return normalised(text), normalised(openmetrics.decode())


@pytest.fixture
def frozen_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(time, "time", lambda: FROZEN)


@pytest.mark.usefixtures("frozen_time")
def test_the_text_exposition_is_unchanged() -> None:
    text, _ = expositions()
    assert text == TEXT_FIXTURE.read_text()


@pytest.mark.usefixtures("frozen_time")
def test_the_openmetrics_exposition_with_exemplars_is_unchanged() -> None:
    _, openmetrics = expositions()
    assert openmetrics == OPENMETRICS_FIXTURE.read_text()


def _regenerate() -> None:
    time.time = lambda: FROZEN
    text, openmetrics = expositions()
    TEXT_FIXTURE.write_text(text)
    OPENMETRICS_FIXTURE.write_text(openmetrics)
    print(f"wrote {TEXT_FIXTURE.name} and {OPENMETRICS_FIXTURE.name}", file=sys.stderr)


if __name__ == "__main__":
    _regenerate()
