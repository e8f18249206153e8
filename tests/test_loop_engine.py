"""The loop detector engine: rate limiting, nudge dedup, exempt and poll tools, config."""

from __future__ import annotations

import json

import msgspec
import pytest

import actors.loop
from actors.loop import (
    GEMINI,
    OPENCLAW,
    PRESETS,
    STRICT,
    CycleConfig,
    GenericRepeatConfig,
    GlobalBreakerConfig,
    LoopConfig,
    LoopConfigError,
    LoopDetector,
    PingPongConfig,
    PollConfig,
    PollTool,
    load_config,
)

READ = ("read_file", '{"path": "a.txt"}')


def test_public_api_is_pinned() -> None:
    assert sorted(actors.loop.__all__) == sorted(
        [
            "DETECTORS", "GEMINI", "GEMINI_RECOVERY_TEXT", "OPENCLAW", "OPENCLAW_CURRENT",
            "PRESETS", "QWEN", "STRICT", "STRICT_NUDGE_TEXT", "CallCapConfig", "ContentConfig",
            "CycleConfig", "Decision", "Detector", "GenericRepeatConfig", "GlobalBreakerConfig",
            "Level", "LlmCheckConfig", "LoopConfig", "LoopConfigError", "LoopDetector",
            "NoNewInformationConfig", "PingPongConfig", "PollConfig", "PollTool",
            "ReadLoopConfig", "ResultPattern", "ShellStagnationConfig", "StrikesConfig",
            "ToolStagnationConfig", "UnknownToolConfig", "check_config", "load_config",
        ]
    )  # fmt: skip
    for name in actors.loop.__all__:
        assert getattr(actors.loop, name) is not None


def test_presets_are_frozen_and_valid() -> None:
    assert set(PRESETS) == {"strict", "openclaw", "openclaw-current", "gemini", "qwen"}
    for name, preset in PRESETS.items():
        assert preset.name == name
        assert LoopDetector(preset).config is preset
        with pytest.raises(AttributeError):
            preset.history_size = 3  # type: ignore[misc]
        assert load_config(msgspec.to_builtins(preset)) == preset


def test_config_rejects_unknown_keys_and_bad_thresholds() -> None:
    with pytest.raises(LoopConfigError, match="warn_after"):
        load_config({"generic_repeat": {"warn_after": 3}})
    with pytest.raises(LoopConfigError, match=r"cycle\.window"):
        LoopDetector(LoopConfig(cycle=CycleConfig(window=0)))
    with pytest.raises(LoopConfigError, match=r"history_size"):
        LoopDetector(LoopConfig(history_size=0))
    with pytest.raises(LoopConfigError, match=r"cycle\.max_period"):
        load_config({"cycle": {"min_period": 4, "max_period": 3}})


def _quiet(**sections: object) -> LoopConfig:
    """Every detector off except the ones given."""
    off = {
        "generic_repeat": GenericRepeatConfig(enabled=False),
        "poll_no_progress": PollConfig(enabled=False),
        "ping_pong": PingPongConfig(enabled=False),
        "global_breaker": GlobalBreakerConfig(enabled=False),
    }
    return msgspec.structs.replace(LoopConfig(), **{**off, **sections})


def test_warnings_are_rate_limited_per_bucket_and_key() -> None:
    detector = LoopDetector(OPENCLAW)
    calls = [("read_file", json.dumps({"path": p})) for p in "abc"]
    emitted = []
    for n in range(1, 21):
        for call in calls:
            decision = detector.propose(*call)
            detector.record_result(decision.call_id, f"{n}")
            if decision.nudge is not None:
                emitted.append((n, call[1]))
            elif decision.level == "warning":
                assert decision.rate_limited
    # the window holds 10 of each: every key warns once, at its own 11th call, then is
    # rate-limited (bucket 1 already given) for the rest of the run
    assert emitted == [(11, call[1]) for call in calls]


def test_unbucketed_warnings_are_given_once_per_key() -> None:
    config = msgspec.structs.replace(
        _quiet(generic_repeat=GenericRepeatConfig(warn_at=2, include_proposed=True)),
        warning_bucket=None,
    )
    detector = LoopDetector(config)
    given = [detector.propose(*READ).nudge is not None for _ in range(6)]
    assert given == [False, True, False, False, False, False]
    assert detector.propose("read_file", '{"path": "z"}').nudge is None
    assert detector.propose("read_file", '{"path": "z"}').nudge is not None


def test_exempt_tools_are_never_counted() -> None:
    config = msgspec.structs.replace(OPENCLAW, exempt_tools=("heartbeat",))
    detector = LoopDetector(config)
    assert all(detector.propose("heartbeat", "{}").level == "none" for _ in range(100))


def test_a_tool_can_be_marked_as_a_poll_tool() -> None:
    config = msgspec.structs.replace(
        OPENCLAW, poll_tools=(PollTool(name="job", actions=("status",)),)
    )
    detector = LoopDetector(config)
    levels = []
    for _ in range(21):
        decision = detector.propose("job", '{"action": "status"}')
        detector.record_result(decision.call_id, "running")
        levels.append((decision.level, decision.detector))
    assert levels[10] == ("warning", "poll_no_progress")
    assert levels[20] == ("critical", "poll_no_progress")
    # other actions of the same tool are not polls: generic warning only
    other = LoopDetector(config)
    for _ in range(25):
        decision = other.propose("job", '{"action": "start"}')
        other.record_result(decision.call_id, "started")
        assert decision.detector in (None, "generic_repeat")


def test_global_breaker_total_mode_counts_no_progress_calls_of_the_run() -> None:
    config = _quiet(global_breaker=GlobalBreakerConfig(mode="total", break_at=4))
    detector = LoopDetector(config)
    calls = [("read_file", json.dumps({"path": p})) for p in "abcabcab"]
    levels = []
    for call in calls:
        decision = detector.propose(*call)
        levels.append(decision.level)
        detector.record_result(decision.call_id, "unchanged")
    # a, b, c are new; the repeats of a, b, c, a are the 4 no-progress calls
    assert levels == ["none"] * 7 + ["break"]


def test_a_changed_result_is_progress_for_the_total_breaker() -> None:
    detector = LoopDetector(_quiet(global_breaker=GlobalBreakerConfig(mode="total", break_at=2)))
    for n in range(20):
        decision = detector.propose(*READ)
        assert decision.level == "none"
        detector.record_result(decision.call_id, f"line {n}")


def test_cycle_detector_levels_in_repetitions() -> None:
    config = _quiet(cycle=CycleConfig(enabled=True, warn_at=2, block_at=3, break_at=4))
    detector = LoopDetector(msgspec.structs.replace(config, record_blocked=True))
    calls = [("a", "{}"), ("b", "{}"), ("c", "{}")] * 4
    levels = [detector.propose(*call).level for call in calls]
    assert levels == ["none"] * 5 + ["warning"] * 3 + ["critical"] * 3 + ["break"]


def test_results_of_unknown_calls_are_ignored_and_reset_forgets() -> None:
    detector = LoopDetector(OPENCLAW)
    detector.record_result("nope", "x")
    for _ in range(10):
        detector.propose(*READ)
    assert detector.propose(*READ).level == "warning"
    detector.reset()
    assert detector.propose(*READ).level == "none"


def test_key_order_never_changes_verdicts() -> None:
    hypothesis = pytest.importorskip("hypothesis")
    st = hypothesis.strategies

    args = st.dictionaries(st.sampled_from("abcde"), st.integers(0, 2), min_size=1)

    @hypothesis.settings(max_examples=60, deadline=None)  # type: ignore[untyped-decorator]
    @hypothesis.given(  # type: ignore[untyped-decorator]
        st.lists(st.tuples(st.sampled_from(["r", "w"]), args), max_size=40)
    )
    def check(calls: list[tuple[str, dict[str, int]]]) -> None:
        for preset in PRESETS.values():
            forward, backward = LoopDetector(preset), LoopDetector(preset)
            for n, (tool, arguments) in enumerate(calls):
                reordered = dict(reversed(list(arguments.items())))
                one = forward.propose(tool, json.dumps(arguments))
                two = backward.propose(tool, json.dumps(reordered))
                assert (one.level, one.detector, one.count) == (two.level, two.detector, two.count)
                forward.record_result(one.call_id, str(n % 3))
                backward.record_result(two.call_id, str(n % 3))

    check()


def _levels(detector: LoopDetector, calls: list[tuple[str, str]]) -> list[tuple[str, str | None]]:
    out: list[tuple[str, str | None]] = []
    for n, call in enumerate(calls):
        decision = detector.propose(*call)
        out.append((decision.level, decision.detector))
        detector.record_result(decision.call_id, f"result {n % 2}")
    return out


def test_interleaved_detectors_of_one_config_keep_their_own_state() -> None:
    # stateless detectors are shared by every run of a config: no run may see another's calls
    calls = [("read_file", json.dumps({"path": p})) for p in "abab"] * 12
    for preset in PRESETS.values():
        lone = _levels(LoopDetector(preset), calls)
        one, two = LoopDetector(preset), LoopDetector(preset)
        both: tuple[list[tuple[str, str | None]], list[tuple[str, str | None]]] = ([], [])
        for n, call in enumerate(calls):
            for detector, seen in zip((one, two), both, strict=True):
                decision = detector.propose(*call)
                seen.append((decision.level, decision.detector))
                detector.record_result(decision.call_id, f"result {n % 2}")
        assert both == (lone, lone), preset.name
        assert any(level != "none" for level, _ in lone), preset.name  # the calls do loop


def test_results_are_kept_only_when_an_enabled_detector_reads_them() -> None:
    assert LoopDetector(STRICT).reads_results  # result-aware since issue #19
    assert LoopDetector(GEMINI).reads_results  # result-aware repeats (deliberate)
    gemini_cycles = msgspec.structs.replace(
        GEMINI,
        generic_repeat=msgspec.structs.replace(GEMINI.generic_repeat, enabled=False),
        unknown_tool=msgspec.structs.replace(GEMINI.unknown_tool, enabled=False),
        error_streak=msgspec.structs.replace(GEMINI.error_streak, enabled=False),
    )
    assert not LoopDetector(gemini_cycles).reads_results  # its cycles ignore results
    assert LoopDetector(OPENCLAW).reads_results
    assert not LoopDetector(_quiet(generic_repeat=GenericRepeatConfig(scope="run"))).reads_results
    total = _quiet(global_breaker=GlobalBreakerConfig(mode="total", break_at=2))
    assert LoopDetector(total).reads_results
    # strict: a repeat whose result changed is progress (results alternate here)...
    calls = [READ] * 5
    assert _levels(LoopDetector(STRICT), calls) == [("none", None)] * 5
    # ...and calls still waiting for their result count as repeats (no evidence of progress)
    detector = LoopDetector(STRICT)
    assert [(d.level, d.detector) for d in (detector.propose(*READ) for _ in range(5))] == [
        ("none", None), ("none", None), ("warning", "generic_repeat"),
        ("warning", "generic_repeat"), ("break", "generic_repeat"),
    ]  # fmt: skip


def test_many_configs_each_judge_by_their_own_thresholds() -> None:
    # more configs than the detector keeps worked out, each a fresh object (per-run overrides)
    for round_ in range(2):
        for warn_at in range(2, 102):
            config = _quiet(
                generic_repeat=GenericRepeatConfig(
                    scope="run", warn_at=warn_at, include_proposed=True
                )
            )
            detector = LoopDetector(config)
            assert detector.config is config
            levels = [detector.propose(*READ).level for _ in range(warn_at)]
            assert levels == ["none"] * (warn_at - 1) + ["warning"], (round_, warn_at)


def test_the_window_forgets_calls_older_than_history_size() -> None:
    config = msgspec.structs.replace(
        _quiet(generic_repeat=GenericRepeatConfig(scope="window", warn_at=2)),
        history_size=3,
        warning_bucket=None,
    )
    detector = LoopDetector(config)
    levels = [detector.propose(tool, "{}").level for tool in "aaabcda"]
    # the third a sees two in the window; the last a sees none (b, c, d pushed them out),
    # where a count over the whole run would see three
    assert levels == ["none", "none", "warning", "none", "none", "none", "none"]
