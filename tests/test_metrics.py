"""The metrics recorder: closed label sets, zero series, what each message records, seams,
exemplars, and that it never slows or ends a run. A fresh registry in every test."""

from __future__ import annotations

import re
from typing import Any

import anyio
import pytest
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

import orchestrator.metrics as metrics_api
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
    RunFinished,
    RunStarted,
    StopSignal,
    ToolCall,
    ToolCallProposed,
    ToolResult,
    ToolVerdict,
    TurnStarted,
    Usage,
    Verdict,
)
from orchestrator.metrics import OTHER, SUBSCRIBER, MetricsRecorder, RunCounts, new_registry
from orchestrator.metrics.labels import EXIT_REASONS, MESSAGE_TYPE_NAMES, exemplar, expected_pairs
from tests.harness import serving
from tests.started import run_started

MODEL = "gpt-test"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def recorder(**kwargs: Any) -> tuple[MetricsRecorder, CollectorRegistry]:
    registry = new_registry(process=False)
    kwargs.setdefault("models", (MODEL,))
    kwargs.setdefault("tools", ("read_file", "list_dir"))
    return MetricsRecorder(Bus(), registry, **kwargs), registry


def openmetrics(registry: CollectorRegistry) -> str:
    text: bytes = generate_openmetrics(registry)  # type: ignore[no-untyped-call]
    return text.decode()


def value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def started(run_id: str = "r1", model: str = MODEL) -> RunStarted:
    return run_started(run_id=run_id, trace_id="t" * 32, task="x", model=model)


def finished(
    run_id: str = "r1",
    reason: ExitReason = ExitReason.COMPLETED,
    cause: str = "model.end_turn",
    turns: int = 1,
) -> RunFinished:
    return RunFinished(
        run_id=run_id,
        exit_reason=reason,
        cause=cause,
        outcome=Outcome.DONE if reason is ExitReason.COMPLETED else Outcome.FAILED,
        detail="",
        hint="",
        turns=turns,
        llm_requests=1,
        tool_calls=0,
        usage=Usage(),
    )


def call(call_id: str, name: str = "read_file") -> ToolCall:
    return ToolCall(id=call_id, name=name, arguments="{}")


def replied(run_id: str = "r1", finish_reason: str | None = "stop") -> ModelReplied:
    return ModelReplied(
        run_id=run_id,
        turn=1,
        text_chars=1,
        tool_calls=0,
        finish_reason=finish_reason,
        usage=Usage(),
        total_usage=Usage(),
    )


# --------------------------------------------------------------------------- series


def test_every_closed_label_set_has_zero_series_before_anything_happens() -> None:
    _, registry = recorder()
    for reason, cause in expected_pairs():
        outcome = "done" if reason == "completed" else "failed"
        assert (
            value(
                registry,
                "loopfuse_runs_finished_total",
                exit_reason=reason,
                cause=cause,
                outcome=outcome,
            )
            == 0
        )
    assert ("max_turns", "budget.deadline") in expected_pairs()
    assert ("hook_stopped", "loop.ping_pong") in expected_pairs()
    assert {reason for reason, _ in expected_pairs()} == set(EXIT_REASONS)
    for name in MESSAGE_TYPE_NAMES:
        assert value(registry, "loopfuse_bus_messages_total", type=name) == 0
    for model in (MODEL, OTHER):
        assert value(registry, "loopfuse_model_requests_total", model=model, outcome="ok") == 0
        assert value(registry, "loopfuse_model_requests_total", model=model, outcome="timeout") == 0
        assert value(registry, "loopfuse_model_tokens_total", model=model, token_type="input") == 0
        assert value(registry, "loopfuse_model_request_duration_seconds_count", model=model) == 0
    for tool in ("read_file", "list_dir", OTHER):
        assert value(registry, "loopfuse_tool_calls_total", tool=tool, outcome="blocked") == 0
    assert value(registry, "loopfuse_loop_detections_total", detector="cycle", level="break") == 0
    assert value(registry, "loopfuse_truncation_recoveries_total", step="gave_up") == 0
    assert value(registry, "loopfuse_context_actions_total", action="compact") == 0
    assert value(registry, "loopfuse_runs_active") == 0
    assert value(registry, "loopfuse_store_write_duration_seconds_count") == 0


def test_each_recorder_has_its_own_registry_and_the_global_one_is_untouched() -> None:
    _, first = recorder()
    _, second = recorder()  # the same names on another registry: no DuplicateTimeseries
    assert first is not second
    assert REGISTRY.get_sample_value("loopfuse_runs_started_total") is None
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        MetricsRecorder(Bus(), first)


def test_the_public_api_is_what_the_package_lists() -> None:
    assert metrics_api.__all__ == [
        "MAX_TRACKED_RUNS",
        "METRICS_MAILBOX_SIZE",
        "OTHER",
        "SUBSCRIBER",
        "BoundedLabel",
        "Metrics",
        "MetricsRecorder",
        "RunCounts",
        "StateCollector",
        "new_registry",
    ]


def test_a_scrape_passes_promtool_style_naming_rules() -> None:
    _, registry = recorder()
    text = generate_latest(registry).decode()
    for line in text.splitlines():
        if line.startswith("# TYPE loopfuse_"):
            _, _, name, kind = line.split()
            assert re.fullmatch(r"loopfuse_[a-z0-9_]+", name), name
            assert name.endswith("_total") == (kind == "counter"), line
        if line.startswith("# HELP loopfuse_"):
            assert len(line.split(" ", 3)) == 4, f"no help text: {line}"


# --------------------------------------------------------------------------- one run


def test_a_run_is_recorded_from_start_to_finish() -> None:
    clock = Clock()
    rec, registry = recorder(clock=clock)
    rec.handle(started())
    rec.handle(TurnStarted(run_id="r1", turn=1, stage="agent", prompt_messages=1))
    rec.handle(ModelRequest(run_id="r1", turn=1, model=MODEL, messages=()))
    rec.handle(ModelError(run_id="r1", turn=1, kind="rate_limited", message="429", attempt=1))
    rec.handle(
        ModelReply(
            run_id="r1",
            turn=1,
            text="",
            tool_calls=(call("c1"), call("c2", "list_dir")),
            usage=Usage(prompt_tokens=1200, completion_tokens=30),
            attempts=2,
            latency_seconds=1.5,
            ttft_seconds=0.25,
        )
    )
    rec.handle(replied(finish_reason="tool_calls"))
    for index, name in enumerate(("read_file", "list_dir")):
        rec.handle(
            ToolCallProposed(
                run_id="r1", turn=1, call=call(f"c{index + 1}", name), fingerprint="f", index=index
            )
        )
    rec.handle(ToolVerdict(run_id="r1", turn=1, call_id="c2", verdict="block", source="hook.x"))
    rec.handle(ToolVerdict(run_id="r1", turn=1, call_id="c2", verdict="block", source="hook.y"))
    rec.handle(
        ToolResult(
            run_id="r1", turn=1, call_id="c1", tool="read_file", content="x", duration_seconds=0.2
        )
    )
    clock.now += 7.0
    rec.handle(finished(reason=ExitReason.MAX_TURNS, cause="budget.max_turns", turns=1))

    assert value(registry, "loopfuse_runs_started_total") == 1
    assert (
        value(
            registry,
            "loopfuse_runs_finished_total",
            exit_reason="max_turns",
            cause="budget.max_turns",
            outcome="failed",
        )
        == 1
    )
    assert value(registry, "loopfuse_run_duration_seconds_sum", exit_reason="max_turns") == 7.0
    assert value(registry, "loopfuse_run_turns_sum", exit_reason="max_turns") == 1
    assert value(registry, "loopfuse_turns_total") == 1
    requests = "loopfuse_model_requests_total"
    assert value(registry, requests, model=MODEL, outcome="rate_limited") == 1
    assert value(registry, requests, model=MODEL, outcome="ok") == 1
    assert value(registry, "loopfuse_truncation_recoveries_total", step="escalate") == 0
    assert value(registry, "loopfuse_model_request_duration_seconds_sum", model=MODEL) == 1.5
    assert value(registry, "loopfuse_model_time_to_first_token_seconds_sum", model=MODEL) == 0.25
    tokens = "loopfuse_model_tokens_total"
    assert value(registry, tokens, model=MODEL, token_type="input") == 1200
    assert value(registry, tokens, model=MODEL, token_type="output") == 30
    assert value(registry, "loopfuse_model_prompt_tokens_bucket", model=MODEL, le="1024.0") == 0
    assert value(registry, "loopfuse_model_prompt_tokens_bucket", model=MODEL, le="4096.0") == 1
    calls = "loopfuse_tool_calls_total"
    assert value(registry, calls, tool="read_file", outcome="ok") == 1
    assert value(registry, calls, tool="list_dir", outcome="blocked") == 1  # once, two blocks
    assert value(registry, "loopfuse_tool_duration_seconds_sum", tool="read_file") == 0.2
    assert value(registry, "loopfuse_tool_duration_seconds_count", tool="list_dir") == 0
    assert value(registry, "loopfuse_bus_messages_total", type="ToolVerdict") == 2
    assert rec.tracked_runs() == 0


def test_open_values_fall_into_other_and_run_ids_never_become_labels() -> None:
    rec, registry = recorder()
    rec.handle(started("run-SECRET-ID", model="some-unconfigured-model"))
    rec.handle(ModelReply(run_id="run-SECRET-ID", turn=1, text="", usage=Usage(prompt_tokens=5)))
    rec.handle(
        ToolResult(
            run_id="run-SECRET-ID",
            turn=1,
            call_id="c",
            tool="mystery_tool",
            content="",
            is_error=True,
        )
    )
    rec.handle(finished("run-SECRET-ID", ExitReason.HOOK_STOPPED, "made.up_cause"))
    assert value(registry, "loopfuse_model_requests_total", model=OTHER, outcome="ok") == 1
    assert value(registry, "loopfuse_tool_calls_total", tool=OTHER, outcome="error") == 1
    assert (
        value(
            registry,
            "loopfuse_runs_finished_total",
            exit_reason="hook_stopped",
            cause=OTHER,
            outcome="failed",
        )
        == 1
    )
    text = generate_latest(registry).decode()
    assert "some-unconfigured-model" not in text
    assert "mystery_tool" not in text
    assert "SECRET" not in text  # the text format carries no exemplars


def test_tool_outcomes_are_told_apart() -> None:
    rec, registry = recorder()
    results: dict[str, dict[str, Any]] = {
        "ok": {},
        "cache_hit": {"cache": "hit"},
        "error": {"is_error": True, "error_kind": "path"},
        "timeout": {"is_error": True, "error_kind": "timeout"},
        "invalid_arguments": {
            "is_error": True,
            "error_kind": "invalid_arguments",
            "executed": False,
        },
        "unknown_tool": {"is_error": True, "error_kind": "unknown_tool", "executed": False},
        "aborted": {"is_error": True, "error_kind": "aborted", "executed": False},
    }
    for index, fields in enumerate(results.values()):
        rec.handle(
            ToolResult(
                run_id="r", turn=1, call_id=f"c{index}", tool="read_file", content="", **fields
            )
        )
    for outcome in results:
        assert value(registry, "loopfuse_tool_calls_total", tool="read_file", outcome=outcome) == 1
    # Only calls that really ran (not cached, not refused) have a duration.
    assert value(registry, "loopfuse_tool_duration_seconds_count", tool="read_file") == 3


# --------------------------------------------------------------------------- fuses


def test_loop_detections_are_counted_by_detector_and_level() -> None:
    rec, registry = recorder()

    def verdict(call_id: str, level: Verdict, cause: str) -> ToolVerdict:
        return ToolVerdict(
            run_id="r", turn=1, call_id=call_id, verdict=level, source=LOOP_MONITOR, cause=cause
        )

    # a warning: the verdict names its detector; its nudge is not counted again
    rec.handle(verdict("a", "warn", "loop.generic_repeat"))
    rec.handle(Nudge(run_id="r", kind="loop.generic_repeat", text="t", source=LOOP_MONITOR))
    # critical with a nudge (gemini strikes), and without one (openclaw's refusals)
    rec.handle(verdict("b", "block", "loop.cycle"))
    rec.handle(Nudge(run_id="r", kind="loop.cycle", text="t", source=LOOP_MONITOR))
    rec.handle(verdict("c", "block", "loop.ping_pong"))
    # a hook's block is not a loop detection
    rec.handle(ToolVerdict(call_id="d", verdict="block", run_id="r", turn=1, source="hook.x"))
    # a streamed-content loop: cut and nudged (critical), then stopped (break)
    rec.handle(Nudge(run_id="r", kind="loop.content", text="t", source=LOOP_MONITOR))
    rec.handle(
        StopSignal(
            run_id="r", reason=ExitReason.HOOK_STOPPED, cause="loop.content", source=LOOP_MONITOR
        )
    )
    rec.handle(
        StopSignal(
            run_id="r", reason=ExitReason.MAX_TURNS, cause="budget.max_turns", source="budget"
        )
    )

    def detections(detector: str, level: str) -> float | None:
        return value(registry, "loopfuse_loop_detections_total", detector=detector, level=level)

    assert detections("generic_repeat", "warning") == 1
    assert detections("cycle", "critical") == 1
    assert detections("ping_pong", "critical") == 1
    assert detections(OTHER, "critical") == 0  # the hook's block is not a loop
    assert detections("content", "critical") == 1
    assert detections("content", "break") == 1
    total = sum(
        sample.value
        for family in registry.collect()
        if family.name == "loopfuse_loop_detections"
        for sample in family.samples
        if sample.name.endswith("_total")
    )
    assert total == 5
    assert value(registry, "loopfuse_nudges_total", kind="loop.generic_repeat") == 1
    assert value(registry, "loopfuse_nudges_total", kind="loop.content") == 1


def test_nudge_kinds_are_a_closed_set() -> None:
    rec, registry = recorder()
    for kind in ("budget.warning", "hook.lint", "free text kind"):
        rec.handle(Nudge(run_id="r", kind=kind, text="t", source="s"))
    assert value(registry, "loopfuse_nudges_total", kind="budget.warning") == 1
    assert value(registry, "loopfuse_nudges_total", kind="hook.lint") == 1
    assert value(registry, "loopfuse_nudges_total", kind=OTHER) == 1


@pytest.mark.parametrize(
    ("cause", "steps"),
    [
        ("truncation.gave_up", {"recover_1": 1, "recover_2": 1, "recover_3": 0, "gave_up": 1}),
        ("model.end_turn", {"recover_1": 1, "recover_2": 1, "recover_3": 1, "gave_up": 0}),
    ],
)
def test_truncation_recovery_steps(cause: str, steps: dict[str, int]) -> None:
    rec, registry = recorder()
    rec.handle(started())
    for _ in range(3):
        rec.handle(replied(finish_reason="length"))
    rec.handle(replied(finish_reason="stop"))
    rec.handle(finished(cause=cause))
    for step, count in steps.items():
        assert value(registry, "loopfuse_truncation_recoveries_total", step=step) == count
    recovered = steps["recover_1"] + steps["recover_2"] + steps["recover_3"]
    assert value(registry, "loopfuse_nudges_total", kind="truncation.recover") == recovered


def test_a_silent_retry_with_a_higher_limit_is_an_escalation() -> None:
    rec, registry = recorder()
    rec.handle(started())
    rec.handle(ModelRequest(run_id="r1", turn=1, model=MODEL, messages=()))
    rec.handle(ModelError(run_id="r1", turn=1, kind="server_error", message="500"))
    # three attempts: one failed (seen above), one cut and escalated, one answered
    rec.handle(ModelReply(run_id="r1", turn=1, text="x", attempts=3))
    assert value(registry, "loopfuse_truncation_recoveries_total", step="escalate") == 1
    requests = "loopfuse_model_requests_total"
    assert value(registry, requests, model=MODEL, outcome="ok") == 2
    assert value(registry, requests, model=MODEL, outcome="server_error") == 1


def test_blocked_requests_are_counted_per_model() -> None:
    rec, registry = recorder()
    rec.handle(started())
    rec.handle(finished(reason=ExitReason.BLOCKING_LIMIT, cause="context.blocking_limit"))
    assert value(registry, "loopfuse_context_blocked_requests_total", model=MODEL) == 1


def test_spend_is_usage_times_the_runs_prices() -> None:
    rec, registry = recorder()
    rec.handle(
        run_started(
            run_id="r1",
            trace_id="t",
            task="x",
            model=MODEL,
            input_price_per_million=2.0,
            output_price_per_million=10.0,
        )
    )
    usage = Usage(prompt_tokens=500_000, completion_tokens=100_000)
    rec.handle(ModelReply(run_id="r1", turn=1, text="", usage=usage))
    assert value(registry, "loopfuse_model_cost_total", model=MODEL) == pytest.approx(2.0)
    rec.handle(started("free"))  # no prices: no spend
    rec.handle(ModelReply(run_id="free", turn=1, text="", usage=usage))
    assert value(registry, "loopfuse_model_cost_total", model=MODEL) == pytest.approx(2.0)


def test_context_actions_and_the_window_ratio_from_the_gatekeepers_table() -> None:
    rec, registry = recorder(models=("gpt-4o",))
    for kind in ("collapse", "compact", "compact", "silent_truncation", "blocked"):
        rec.handle(ContextAction(run_id="r1", turn=1, kind=kind))
    actions = "loopfuse_context_actions_total"
    assert value(registry, actions, action="collapse") == 1
    assert value(registry, actions, action="compact") == 2
    assert value(registry, actions, action="silent_truncation") == 1
    rec.handle(started(model="gpt-4o"))
    rec.handle(ModelReply(run_id="r1", turn=1, text="", usage=Usage(prompt_tokens=64_000)))
    ratio = "loopfuse_model_prompt_window_ratio_sum"
    assert value(registry, ratio, model="gpt-4o") == 0.5  # gpt-4o: 128,000 tokens
    rec.handle(started("r2", model="unknown-model"))
    rec.handle(ModelReply(run_id="r2", turn=1, text="", usage=Usage(prompt_tokens=16_384)))
    assert value(registry, ratio, model=OTHER) == 0.5  # the default window: 32,768


# --------------------------------------------------------------------------- seams


def test_seams_for_what_the_bus_does_not_carry_yet() -> None:
    rec, registry = recorder()
    rec.set_context_window(MODEL, 8000)
    rec.record_cost(MODEL, 0.25)
    rec.record_cost("unknown-model", 0.5)
    rec.record_cost(MODEL, 0.0)
    assert value(registry, "loopfuse_model_cost_total", model=MODEL) == 0.25
    assert value(registry, "loopfuse_model_cost_total", model=OTHER) == 0.5
    rec.record_context_action("collapse")
    rec.record_context_action("compact")
    rec.record_context_action("compact")
    assert value(registry, "loopfuse_context_actions_total", action="compact") == 2
    with pytest.raises(ValueError, match="'fold' is not one of"):
        rec.record_context_action("fold")
    rec.observe_store_write(0.003)
    assert value(registry, "loopfuse_store_write_duration_seconds_count") == 1
    rec.handle(started())
    rec.handle(ModelReply(run_id="r1", turn=1, text="", usage=Usage(prompt_tokens=6000)))
    assert value(registry, "loopfuse_model_prompt_window_ratio_sum", model=MODEL) == 0.75
    assert value(registry, "loopfuse_model_prompt_window_ratio_bucket", model=MODEL, le="0.7") == 0
    assert value(registry, "loopfuse_model_prompt_window_ratio_bucket", model=MODEL, le="0.8") == 1
    with pytest.raises(ValueError, match="must be positive"):
        rec.set_context_window(MODEL, 0)


def test_runs_and_mailboxes_are_read_at_scrape_time() -> None:
    counts = RunCounts(active=2, queued=5, limit=4)
    _, registry = recorder(runs=lambda: counts)
    assert value(registry, "loopfuse_runs_active") == 2
    assert value(registry, "loopfuse_runs_queued") == 5
    assert value(registry, "loopfuse_runs_max_concurrent") == 4
    counts = RunCounts(active=0, queued=0, limit=4)
    assert value(registry, "loopfuse_runs_queued") == 0


# --------------------------------------------------------------------------- exemplars


def test_exemplars_link_samples_to_runs_in_openmetrics_only() -> None:
    texts = []
    for run_id in ("run-42", "r" * 200):
        rec, registry = recorder()
        rec.handle(started(run_id))
        rec.handle(ModelReply(run_id=run_id, turn=1, text="", latency_seconds=2.0))
        rec.handle(finished(run_id))
        texts.append(openmetrics(registry))
        assert run_id[:20] not in generate_latest(registry).decode()
    lines = texts[0].splitlines()
    for metric in (
        "loopfuse_runs_finished_total{",
        "loopfuse_run_duration_seconds_bucket{",
        "loopfuse_model_request_duration_seconds_bucket{",
    ):
        assert any(
            line.startswith(metric) and '# {run_id="run-42",trace_id="' in line for line in lines
        ), metric
    # Shortened (and without the trace id) to fit OpenMetrics' 128 characters.
    assert '# {run_id="' + "r" * 122 + '"}' in texts[1]


def test_exemplar_fits_the_openmetrics_limit() -> None:
    assert exemplar("a", "b" * 32) == {"run_id": "a", "trace_id": "b" * 32}
    assert exemplar("a", "b" * 200) == {"run_id": "a"}
    shortened = exemplar("x" * 500)
    assert sum(len(k) + len(v) for k, v in shortened.items()) == 128


# --------------------------------------------------------------------------- on the bus


@pytest.mark.asyncio
async def test_the_recorder_handles_each_message_inside_the_publish() -> None:
    bus = Bus()
    registry = new_registry(process=False)
    rec = MetricsRecorder(bus, registry, mailbox_size=10)
    async with serving(bus, rec):
        with anyio.fail_after(5):
            # No checkpoint between publishes: a queued recorder could not drain and would
            # drop past its capacity. Inline, each message is counted during its publish.
            for index in range(25):
                await bus.publish(started(f"r{index}"))
                assert value(registry, "loopfuse_runs_started_total") == index + 1
        assert value(registry, "loopfuse_bus_dropped_messages_total", subscriber=SUBSCRIBER) == 0
        assert value(registry, "loopfuse_bus_mailbox_depth", subscriber=SUBSCRIBER) == 0
    assert value(registry, "loopfuse_runs_started_total") == 25


@pytest.mark.asyncio
async def test_a_recorder_fault_is_counted_and_never_ends_a_run() -> None:
    bus = Bus()
    registry = new_registry(process=False)

    def broken() -> float:
        raise RuntimeError("bug in the recorder")

    rec = MetricsRecorder(bus, registry, clock=broken)  # read at RunStarted
    with bus.open_inbox("r1") as inbox:
        async with serving(bus, rec):
            await bus.publish(started())
        assert inbox.receive_nowait() is None  # no ActorFailed reached the run
    assert value(registry, "loopfuse_metrics_recorder_errors_total") == 1


def test_state_is_bounded_when_run_endings_are_lost() -> None:
    rec, _ = recorder(max_runs=3)
    for index in range(10):
        rec.handle(started(f"r{index}"))
    assert rec.tracked_runs() == 3
