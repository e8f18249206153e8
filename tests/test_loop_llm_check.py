"""The model-based loop check (gemini-cli's LLM check, opt-in): schedule, answers, strikes,
and a real run whose checking model's tokens count in the run's usage."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from actors.loop import GEMINI, STRICT, LlmCheckConfig, LoopConfig, LoopDetector
from actors.loop.llm_check import SYSTEM_PREFIX, parse_answer
from actors.loop.monitor import LoopMonitor
from actors.tools import default_registry
from bench.loops import echo_tool
from bench.scripted_model import ECHO_TOOL, ScriptedModel
from bus import (
    ModelError,
    ModelReply,
    ModelRequest,
    Notice,
    Nudge,
    StopSignal,
    ToolCall,
    ToolResult,
    Usage,
)
from orchestrator.config import Config, LoopSettings, merge_loop_overrides
from orchestrator.errors import ConfigError
from orchestrator.runtime import RunSpec, Runtime
from tests.published import Published, feed
from tests.started import run_started


def with_check(base: LoopConfig = STRICT, **keys: Any) -> LoopConfig:
    llm = LlmCheckConfig(enabled=True, **keys)
    return msgspec.structs.replace(base, llm_check=llm)


def answer(confidence: float, analysis: str = "same three calls") -> str:
    return json.dumps(
        {"unproductive_state_analysis": analysis, "unproductive_state_confidence": confidence}
    )


def test_the_check_starts_at_its_turn_and_adapts_its_interval_as_gemini() -> None:
    detector = LoopDetector(with_check())  # upstream: from turn 30, every 10, then 5..15
    asked = []
    confidences = iter([0.0, 1.0 - 0.5, 0.8])
    for turn in range(1, 80):
        if detector.llm_check_due(turn):
            asked.append(turn)
            assert detector.llm_check_answer(answer(next(confidences, 0.1))).level == "none"
    # 30; "no" at 0.0 -> round(5 + 10 * 1.0) = 15 -> 45; 0.5 -> 10 -> 55; 0.8 -> 7 -> 62; 0.1 -> 14
    assert asked == [30, 45, 55, 62, 76]


def test_one_check_at_a_time_and_errors_keep_the_interval() -> None:
    detector = LoopDetector(with_check(first_turn=2, interval=3))
    assert detector.llm_check_due(2)
    assert not detector.llm_check_due(3)  # still unanswered
    assert detector.llm_check_answer(None).level == "none"  # the check failed: no loop
    assert [t for t in range(3, 12) if detector.llm_check_due(t)] == [5]


def test_a_loop_nudges_with_gemini_s_recovery_text_then_stops() -> None:
    detector = LoopDetector(with_check(first_turn=1, interval=1, min_interval=1, max_interval=1))
    assert detector.llm_check_due(1)
    first = detector.llm_check_answer(answer(0.95, "it reads the same log again and again"))
    assert (first.level, first.detector, first.cause) == ("critical", "llm_check", "loop.llm_check")
    assert first.nudge is not None
    assert first.nudge.startswith("System: Potential loop detected. Details: A loop check")
    assert "it reads the same log again and again" in first.nudge
    assert detector.llm_check_due(2)
    assert detector.llm_check_answer(answer(0.89)).level == "none"  # below the threshold
    assert detector.llm_check_due(3)
    assert detector.llm_check_answer(answer(0.9)).level == "break"


def test_under_gemini_the_check_shares_the_strikes() -> None:
    detector = LoopDetector(with_check(GEMINI, first_turn=1, interval=1))
    for _ in range(4):
        detector.propose("read_file", '{"p": 1}')
    assert detector.propose("read_file", '{"p": 1}').level == "critical"  # strike 1
    assert detector.llm_check_due(1)
    assert detector.llm_check_answer(answer(0.99)).level == "break"  # strike 2


def test_off_by_default_in_every_preset() -> None:
    detector = LoopDetector(STRICT)
    assert not any(detector.llm_check_due(turn) for turn in range(1, 200))
    assert detector.llm_check_answer(answer(1.0)).level == "none"


@pytest.mark.parametrize(
    ("text", "confidence"),
    [
        (answer(0.93), 0.93),
        ("```json\n" + answer(0.5) + "\n```", 0.5),
        ("Sure. " + answer(0.2) + " Done.", 0.2),
        (answer(1.0), 1.0),
        (answer(0.0), 0.0),
        (answer(2.0), None),  # out of range: malformed, never certainty (#32)
        (answer(5), None),  # "5" meaning 5 %
        (answer(-0.1), None),
        ('{"unproductive_state_confidence": 0.3}', 0.3),
        ("no json here", None),
        ('{"unproductive_state_confidence": "high"}', None),
        ('{"unproductive_state_confidence": NaN}', None),
    ],
)
def test_answers_are_read_leniently_and_anything_else_is_no_loop(
    text: str, confidence: float | None
) -> None:
    verdict = parse_answer(text)
    assert (verdict.confidence if verdict else None) == confidence


def test_the_prompt_carries_the_task_and_the_recent_history() -> None:
    messages = LoopDetector.llm_check_messages("Fix the build.", ["a" * 2000, "b"])
    assert [role for role, _ in messages] == ["system", "user"]
    assert messages[0][1].startswith(SYSTEM_PREFIX)
    assert "unproductive_state_confidence" in messages[0][1]
    user = messages[1][1]
    assert "Fix the build." in user
    assert "1. " + "a" * 600 + " […]" in user  # entries are cut
    assert "2. b" in user


def test_the_monitor_asks_the_configured_model_and_acts_on_the_answers() -> None:
    published = Published()
    config = with_check(first_turn=2, interval=1, min_interval=1, max_interval=1, model="cheap")
    monitor = LoopMonitor(published.bus, config)
    handlers = monitor.handlers()
    feed(handlers, run_started(run_id="r", trace_id="t", task="Count the rows.", model="big"))
    call = ToolCall(id="c1", name="count", arguments="{}")
    feed(
        handlers,
        ModelReply(run_id="r", turn=1, text="Let me count.", tool_calls=(call,)),
        ToolResult(run_id="r", turn=1, call_id="c1", tool="count", content="41 rows"),
        ModelReply(run_id="r", turn=2, text="", tool_calls=(call,)),
    )
    requests = [m for m in published.messages if isinstance(m, ModelRequest)]
    assert len(requests) == 1
    request = requests[0]
    assert (request.turn, request.model, request.purpose, request.tools) == (
        -2, "cheap", "loop_check", ()
    )  # fmt: skip
    assert request.messages[0].content is not None
    assert request.messages[0].content.startswith(SYSTEM_PREFIX)
    prompt = request.messages[1].content or ""
    assert "Count the rows." in prompt
    assert "assistant called count({})" in prompt
    assert "count returned: 41 rows" in prompt
    feed(handlers, ModelReply(run_id="r", turn=-2, text=answer(0.97)))
    nudges = [m for m in published.messages if isinstance(m, Nudge)]
    assert [n.kind for n in nudges] == ["loop.llm_check"]
    feed(handlers, ModelReply(run_id="r", turn=3, text="", tool_calls=(call,)))
    feed(handlers, ModelError(run_id="r", turn=-3, kind="server_error", message="x", final=True))
    assert not [m for m in published.messages if isinstance(m, StopSignal)]  # error: no loop
    feed(handlers, ModelReply(run_id="r", turn=4, text="", tool_calls=(call,)))
    feed(handlers, ModelReply(run_id="r", turn=-4, text=answer(0.99)))
    stops = [m for m in published.messages if isinstance(m, StopSignal)]
    assert [(s.cause, s.reason.value) for s in stops] == [("loop.llm_check", "hook_stopped")]


def test_the_model_is_operator_config_only() -> None:
    with pytest.raises(ConfigError) as caught:
        merge_loop_overrides(STRICT, {"llm_check": {"enabled": True, "model": "x"}})
    assert caught.value.key == "config.loop.llm_check.model"
    merged = merge_loop_overrides(STRICT, {"llm_check": {"enabled": True}}, llm_check_model="m")
    assert (merged.llm_check.enabled, merged.llm_check.model) == (True, "m")


CHECK_USAGE = Usage(prompt_tokens=1000, completion_tokens=30)


def _script(request: ModelRequest) -> ModelReply:
    if request.purpose == "loop_check":
        assert request.turn < 0
        return ModelReply(
            run_id=request.run_id, turn=request.turn, text=answer(0.96), usage=CHECK_USAGE
        )
    call = ToolCall(
        id=f"c{request.turn}", name=ECHO_TOOL, arguments=f'{{"text": "{request.turn}"}}'
    )
    return ModelReply(
        run_id=request.run_id,
        turn=request.turn,
        text="",
        tool_calls=(call,),
        finish_reason="tool_calls",
        usage=Usage(prompt_tokens=10, completion_tokens=5),
    )


@pytest.mark.asyncio
async def test_a_run_stops_at_the_second_loop_and_counts_the_checks_tokens() -> None:
    tools = default_registry()
    tools.add(echo_tool())
    config = Config(loop=LoopSettings(llm_check_model="cheap-checker"))
    models: list[str] = []

    def script(request: ModelRequest) -> ModelReply:
        if request.purpose == "loop_check":
            models.append(request.model)
        return _script(request)

    async with Runtime(
        config, tools=tools, model_actor=lambda bus: ScriptedModel(bus, script)
    ) as runtime:
        result = await runtime.run(
            RunSpec(
                task="Echo forever.",
                overrides={
                    "tools": [ECHO_TOOL],
                    "max_turns": 40,
                    "loop": {
                        "llm_check": {
                            "enabled": True,
                            "first_turn": 3,
                            "interval": 2,
                            "min_interval": 2,
                            "max_interval": 2,
                        }
                    },
                },
            )
        )
    assert (result.exit_reason.value, result.cause) == ("hook_stopped", "loop.llm_check")
    assert models == ["cheap-checker", "cheap-checker"]
    # two checks (turns 3 and 5) at 1,000 + 30 tokens each, beside the turns' own 15 each
    assert result.usage.prompt_tokens - 10 * result.turns == 2 * CHECK_USAGE.prompt_tokens
    assert result.usage.completion_tokens - 5 * result.turns == 2 * CHECK_USAGE.completion_tokens


# ------------------------------------------------------------------ issue #32


def js_math_round(value: float) -> int:
    """The rule as upstream states it: gemini-cli rounds with JavaScript's Math.round,
    which rounds .5 up (towards +infinity), where Python's round() rounds to even."""
    whole = int(value // 1)
    return whole + 1 if value - whole >= 0.5 else whole


@pytest.mark.parametrize(
    ("confidence", "interval"),
    [(0.25, 13), (0.05, 15), (0.75, 8), (0.0, 15), (1.0, 5), (0.5, 10)],
)
def test_the_interval_rounds_half_up_as_upstream(confidence: float, interval: int) -> None:
    # round(12.5) == 12 and round(14.5) == 14 in Python: upstream's interval is 13 and 15
    assert js_math_round(5 + 10 * (1 - confidence)) == interval
    detector = LoopDetector(with_check(first_turn=30))
    assert detector.llm_check_due(30)
    assert detector.llm_check_answer(answer(confidence)).level in ("none", "critical")
    if confidence < 0.9:
        assert not detector.llm_check_due(30 + interval - 1)
        assert detector.llm_check_due(30 + interval)


@pytest.mark.parametrize("confidence", [k / 100 for k in range(90)])
def test_every_interval_matches_upstream_s_rounding(confidence: float) -> None:
    detector = LoopDetector(with_check(first_turn=1))
    assert detector.llm_check_due(1)
    detector.llm_check_answer(answer(confidence))
    expected = js_math_round(5 + 10 * (1 - confidence))
    assert not detector.llm_check_due(expected)
    assert detector.llm_check_due(1 + expected)


def test_a_confidence_out_of_range_never_stops_a_healthy_run() -> None:
    # a checker answering 5 (meaning 5 %) was read as 1.00 and stopped the run
    detector = LoopDetector(with_check(first_turn=1, interval=1, min_interval=1, max_interval=1))
    for turn in range(1, 10):
        assert detector.llm_check_due(turn)
        assert not LoopDetector.llm_check_readable(answer(5))
        assert detector.llm_check_answer(answer(5)).level == "none"


def test_the_monitor_asks_again_once_then_ignores_the_check_with_a_notice() -> None:
    published = Published()
    config = with_check(first_turn=2, interval=1, min_interval=1, max_interval=1)
    monitor = LoopMonitor(published.bus, config)
    handlers = monitor.handlers()
    feed(handlers, run_started(run_id="r", trace_id="t", task="Count.", model="big"))
    call = ToolCall(id="c1", name="count", arguments="{}")
    feed(handlers, ModelReply(run_id="r", turn=2, text="", tool_calls=(call,)))
    feed(handlers, ModelReply(run_id="r", turn=-2, text=answer(5)))  # malformed: asked again
    requests = [m for m in published.messages if isinstance(m, ModelRequest)]
    assert len(requests) == 2
    assert requests[1] == requests[0]
    feed(handlers, ModelReply(run_id="r", turn=-2, text=answer(7)))  # again: ignored
    notices = [m for m in published.messages if isinstance(m, Notice)]
    assert [n.kind for n in notices] == ["loop.llm_check"]
    assert "ignored" in notices[0].text
    assert not [m for m in published.messages if isinstance(m, (Nudge, StopSignal))]
    # the next check comes as scheduled, and a retry that answers is read as usual
    feed(handlers, ModelReply(run_id="r", turn=3, text="", tool_calls=(call,)))
    feed(handlers, ModelReply(run_id="r", turn=-3, text="not json"))
    feed(handlers, ModelReply(run_id="r", turn=-3, text=answer(0.97)))
    assert [m.kind for m in published.messages if isinstance(m, Nudge)] == ["loop.llm_check"]
    assert len([m for m in published.messages if isinstance(m, Notice)]) == 1


@pytest.mark.parametrize(
    ("fields", "where"),
    [
        ({"interval": 0}, "$.interval"),
        ({"confidence": 5.0}, "$.confidence"),
        ({"history": 10**9}, "$.history"),
    ],
)
def test_a_config_built_in_python_is_held_to_the_same_ranges(
    fields: dict[str, Any], where: str
) -> None:
    """The ranges are checked when a config is decoded; ``check_config`` holds a config
    built in Python (the library's way) to them too."""
    from actors.loop.config import LoopConfigError, check_config

    with pytest.raises(LoopConfigError, match=rf"^llm_check: .* - at `\{where}`$"):
        check_config(LoopConfig(llm_check=LlmCheckConfig(**fields)))
    assert check_config(LoopConfig(llm_check=LlmCheckConfig())).llm_check == LlmCheckConfig()
