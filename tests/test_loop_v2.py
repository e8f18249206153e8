"""Loop monitor v2 (issue #19): result-aware defaults, result normalisation, no new
information, unknown tools, OpenClaw's current release, qwen-code, snapshots.

The differential tests compare the engine with small reference models of the upstream rules
(written here from docs/loop-detection.md's table and /work/shared/notes/loop_anchors.md),
on generated call sequences.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.loop import (
    GEMINI,
    OPENCLAW,
    OPENCLAW_CURRENT,
    PRESETS,
    QWEN,
    STRICT,
    GenericRepeatConfig,
    LoopConfig,
    LoopConfigError,
    LoopDetector,
    ResultPattern,
    load_config,
)
from actors.loop.normalise import Normaliser
from actors.loop.presets import OFF
from actors.loop.qwen import is_git_overview

Call = tuple[str, str]

READ: Call = ("read_file", '{"path": "a.txt"}')
STATUS: Call = ("deploy_status", '{"id": "web"}')
UNKNOWN: Call = ("nope", '{"x": 1}')
SHELL = "run_shell_command"
GIT_OUTPUT = "On branch main\nnothing to commit, working tree clean"
ROTATION = [
    "git status", "git log -1", "git diff --stat", "git branch", "git remote -v",
    "git stash list", "git tag", "git log --oneline -3", "git show --stat", "ls",
    "pwd", "git rev-parse HEAD",
]  # fmt: skip


def shell(command: str) -> Call:
    return (SHELL, json.dumps({"command": command}))


@dataclass
class Seen:
    n: int
    level: str
    detector: str | None


def play(
    config: LoopConfig,
    calls: Sequence[Call],
    results: Sequence[str],
    *,
    unknown: Sequence[bool] = (),
    stop_at_break: bool = True,
) -> list[Seen]:
    """Propose each call; run (record the result of) the ones allowed."""
    detector = LoopDetector(config)
    seen: list[Seen] = []
    for n, (call, result) in enumerate(zip(calls, results, strict=True), 1):
        decision = detector.propose(*call)
        if decision.level != "none":
            seen.append(Seen(n, decision.level, decision.detector))
        if decision.level == "break" and stop_at_break:
            break
        if decision.level in ("none", "warning"):
            is_unknown = bool(unknown) and unknown[n - 1]
            detector.record_result(decision.call_id, result, unknown_tool=is_unknown)
    return seen


def first(seen: list[Seen], level: str) -> Seen | None:
    return next((s for s in seen if s.level == level), None)


def upstream(config: LoopConfig) -> LoopConfig:
    """``config`` without issue #32's fuses (unknown-tool storms, error streaks, the end of
    refusals, qwen's progress): the rules upstream states, for the differential tests."""
    replace = msgspec.structs.replace
    return replace(
        config,
        refusal_limit=None,
        unknown_tool=replace(
            config.unknown_tool, storm_warn_at=None, storm_block_at=None, storm_break_at=None
        ),
        error_streak=replace(config.error_streak, enabled=False),
        tool_stagnation=replace(config.tool_stagnation, progress_resets=False),
        shell_stagnation=replace(config.shell_stagnation, progress_resets=False),
        read_loop=replace(config.read_loop, count_no_progress=False),
        call_cap=replace(config.call_cap, count_no_progress=False),
    )


# --------------------------------------------------------------------------- normalisation


NORMALISER = Normaliser(LoopConfig())


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("still running (session 7f3a9c21e4, pid 4411, 3.2 s)",
         "still running (session 91b0cc7d52, pid 4412, 6.5 s)"),
        ("job 123e4567-e89b-12d3-a456-426614174000 queued",
         "job 9b2f7c1e-0d4a-4f3e-8a6b-1c2d3e4f5a6b queued"),
        ("started 2026-12-03T12:23:08Z", "started 2026-12-04T01:02:03.5+02:00"),
        ("checked at 12:23:08", "checked at 12:24:59"),
        ("built in 1520ms", "built in 980ms"),
        ("written to /tmp/tmpa1b2c3/out.log", "written to /tmp/tmpzz9x8y/out.log"),
        ('{"request_id": "r-93", "status": "pending"}',
         '{"request_id": "r-94", "status": "pending"}'),
        ("digest sha256:9f86d081884c7d65", "digest sha256:a3f5b0c2d4e6f809"),
        ("stamp 1764764588123", "stamp 1764764599999"),
    ],
)  # fmt: skip
def test_volatile_parts_do_not_make_a_result_new(a: str, b: str) -> None:
    assert a != b
    assert NORMALISER.normalise(a) == NORMALISER.normalise(b)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("42% done", "57% done"),
        ("step 3 of 10", "step 4 of 10"),
        ("downloaded 1048576 bytes", "downloaded 2097152 bytes"),
        ("status: building", "status: deploying"),
        ("line 12: x = 5", "line 12: x = 6"),
        ("3 tests failed", "2 tests failed"),
    ],
)
def test_progress_stays_progress(a: str, b: str) -> None:
    assert NORMALISER.normalise(a) != NORMALISER.normalise(b)


def test_a_result_without_volatile_parts_is_kept_as_is() -> None:
    text = "nothing to normalise here, just words"
    assert NORMALISER.normalise(text) is text


def test_long_results_are_normalised_at_both_ends_only() -> None:
    middle = "x" * 20_000
    a = f"pid 1 {middle} pid 2"
    b = f"pid 7 {middle} pid 8"
    assert NORMALISER.normalise(a) == NORMALISER.normalise(b)
    assert NORMALISER.normalise("a" + middle + "b") != NORMALISER.normalise("a" + middle + "c")


def test_operator_patterns_are_applied_after_the_built_in_ones() -> None:
    config = msgspec.structs.replace(
        STRICT, result_patterns=(ResultPattern(pattern=r"build #\d+", replacement="build"),)
    )
    normaliser = Normaliser(config)
    assert normaliser.normalise("build #17 ok") == normaliser.normalise("build #18 ok")
    off = msgspec.structs.replace(STRICT, normalise_results=False)
    assert not Normaliser(off)
    assert Normaliser(off).normalise("pid 1") == "pid 1"


def test_bad_or_too_many_patterns_are_named() -> None:
    with pytest.raises(LoopConfigError, match=r"result_patterns\.0\.pattern: not a regular"):
        load_config({"result_patterns": [{"pattern": "(unclosed"}]})
    with pytest.raises(LoopConfigError, match="result_patterns"):
        load_config({"result_patterns": [{"pattern": "x"}] * 33})
    with pytest.raises(LoopConfigError, match="result_patterns"):
        load_config({"result_patterns": [{"pattern": "x" * 201}]})


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300))
def test_normalising_is_idempotent_and_never_raises(text: str) -> None:
    once = NORMALISER.normalise(text)
    assert NORMALISER.normalise(once) == once


# --------------------------------------------------------------------------- result-aware strict


def test_strict_lets_a_poll_whose_status_changes_run_to_the_progress_ceiling() -> None:
    calls = [STATUS] * 60
    results = [f"deploy: step {n} of 60" for n in range(60)]
    seen = play(STRICT, calls, results)
    assert [s for s in seen if s.detector == "generic_repeat"] == []
    assert first(seen, "warning") == Seen(20, "warning", "progress_ceiling")
    assert first(seen, "break") == Seen(50, "break", "progress_ceiling")


def test_strict_volatile_still_running_results_are_a_repeat() -> None:
    results = [
        f"still running (session {n:08x}ab, pid {4000 + n}, elapsed {n * 3} s)" for n in range(10)
    ]
    seen = play(STRICT, [STATUS] * 10, results)
    assert first(seen, "warning") == Seen(3, "warning", "generic_repeat")
    assert first(seen, "break") == Seen(5, "break", "generic_repeat")


def test_strict_a_changed_result_restarts_the_count() -> None:
    results = ["building", "building", "deploying", "deploying", "deploying", "done", *["done"] * 5]
    seen = play(STRICT, [STATUS] * len(results), results)
    # 3rd call: 2 identical before it -> nudge; the change at 3 restarts it; 5th call: "deploying"
    # twice (calls 3, 4) + this one -> 3; break needs 5 identical: calls 6..10 are "done"
    assert first(seen, "break") == Seen(10, "break", "generic_repeat")


@settings(max_examples=150, deadline=None)
@given(st.integers(min_value=1, max_value=49))
def test_strict_never_calls_progress_a_repeat(polls: int) -> None:
    # every result differs from the one before it (even if it comes back later)
    results = [f"status {'AB'[n % 2]} {n % 3}" for n in range(polls)]
    seen = play(STRICT, [STATUS] * polls, results)
    assert all(s.detector == "progress_ceiling" for s in seen)
    assert first(seen, "break") is None


@pytest.mark.parametrize(("config", "level"), [(GEMINI, "critical"), (QWEN, "break")])
def test_gemini_and_qwen_stop_the_fifth_consecutive_identical_call_with_identical_results(
    config: LoopConfig, level: str
) -> None:
    seen = play(config, [STATUS] * 6, ["deploy: waiting for the lock"] * 6)
    assert seen[0] == Seen(5, level, "generic_repeat")


def test_gemini_and_qwen_count_calls_still_waiting_for_their_result_as_repeats() -> None:
    for config, level in ((GEMINI, "critical"), (QWEN, "break")):
        detector = LoopDetector(config)
        levels = [detector.propose(*STATUS).level for _ in range(5)]
        assert levels == ["none"] * 4 + [level], config.name


@pytest.mark.parametrize(("config", "level"), [(GEMINI, "critical"), (QWEN, "break")])
def test_gemini_and_qwen_normalise_volatile_still_running_results_into_a_repeat(
    config: LoopConfig, level: str
) -> None:
    results = [
        f"still running (session {n:08x}ab, pid {4000 + n}, elapsed {n * 3} s)" for n in range(6)
    ]
    assert play(config, [STATUS] * 6, results)[0] == Seen(5, level, "generic_repeat")


def test_gemini_lets_a_poll_whose_status_changes_run_to_the_progress_ceiling() -> None:
    # deliberate difference: gemini-cli refuses the 5th consecutive call whatever its result
    results = [f"deploy: step {n} of 60" for n in range(60)]
    seen = play(GEMINI, [STATUS] * 60, results)
    assert seen == [Seen(50, "critical", "progress_ceiling"), Seen(51, "break", "progress_ceiling")]


def test_qwen_lets_a_poll_whose_status_changes_run_to_the_progress_ceiling() -> None:
    # deliberate difference: qwen-code is result-aware for task_list only, and its action
    # stagnation (8 calls of one tool) is reset by a changed result for task_list only
    results = [f"deploy: step {n} of 60" for n in range(60)]
    seen = play(QWEN, [STATUS] * 60, results)
    assert {s.detector for s in seen} == {"progress_ceiling"}
    assert first(seen, "warning") == Seen(20, "warning", "progress_ceiling")
    assert first(seen, "break") == Seen(50, "break", "progress_ceiling")


@settings(max_examples=150, deadline=None)
@given(
    st.sampled_from(["gemini", "qwen"]),
    st.integers(min_value=1, max_value=49),
    st.lists(st.integers(0, 2), min_size=49, max_size=49),
)
def test_gemini_and_qwen_never_stop_a_changing_poll_before_the_progress_ceiling(
    name: str, polls: int, shape: list[int]
) -> None:
    # every result differs from the one before it (an old one may come back), normalised
    # parts (times, ids) included
    results = [f"status {'ABC'[k]} {n % 2} at 12:{n:02d}:00" for n, k in enumerate(shape)]
    results = [r if n == 0 or r != results[n - 1] else r + "+" for n, r in enumerate(results)]
    seen = play(PRESETS[name], [STATUS] * polls, results[:polls])
    assert all(s.detector == "progress_ceiling" and s.level == "warning" for s in seen)


# --------------------------------------------------------------------------- no new information


def test_a_twelve_command_rotation_with_one_output_stops_long_before_the_budget() -> None:
    calls = [shell(c) for c in ROTATION] * 5
    seen = play(STRICT, calls, [GIT_OUTPUT] * len(calls))
    assert first(seen, "warning") == Seen(6, "warning", "no_new_information")
    assert first(seen, "break") == Seen(11, "break", "no_new_information")


def test_no_new_information_blocks_then_breaks_when_configured() -> None:
    config = msgspec.structs.replace(
        STRICT,
        no_new_information=msgspec.structs.replace(
            STRICT.no_new_information, warn_at=3, block_at=5, break_at=8
        ),
    )
    calls = [shell(c) for c in ROTATION]
    seen = play(config, calls, [GIT_OUTPUT] * len(calls))
    levels = [(s.n, s.level) for s in seen if s.detector == "no_new_information"]
    # refusals bring nothing new either: they extend the streak, so break is reachable
    assert levels == [(4, "warning"), (5, "warning"), (6, "critical"), (7, "critical"),
                      (8, "critical"), (9, "break")]  # fmt: skip


def test_short_results_neither_count_nor_break_the_streak() -> None:
    calls = [shell(c) for c in ROTATION]
    results = [GIT_OUTPUT if n % 2 else "" for n in range(len(calls))]
    seen = play(STRICT, calls, results)
    assert all(s.detector == "no_new_information" for s in seen)
    assert first(seen, "warning") == Seen(11, "warning", "no_new_information")  # 5 long ones


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["read_file", "grep", "list_dir", SHELL]), st.integers(0, 30)),
        min_size=1,
        max_size=60,
    )
)
def test_distinct_results_never_trip_no_new_information(steps: list[tuple[str, int]]) -> None:
    calls = [(tool, json.dumps({"arg": arg})) for tool, arg in steps]
    # each result different from the one before it
    results = [f"content of read number {n} with enough characters" for n in range(len(calls))]
    seen = play(STRICT, calls, results)
    assert not [s for s in seen if s.detector == "no_new_information"]


@settings(max_examples=100, deadline=None)
@given(st.integers(min_value=2, max_value=12), st.integers(min_value=11, max_value=40))
def test_one_output_under_many_calls_always_stops(commands: int, length: int) -> None:
    calls = [shell(f"cmd {n % commands}") for n in range(length)]
    seen = play(STRICT, calls, [GIT_OUTPUT] * length)
    stop = first(seen, "break")
    assert stop is not None
    assert stop.n <= 11


# --------------------------------------------------------------------------- unknown tool


def test_openclaw_current_refuses_the_eleventh_attempt_of_a_missing_tool() -> None:
    n = 14
    config = upstream(OPENCLAW_CURRENT)
    seen = play(config, [UNKNOWN] * n, ["unknown tool 'nope'"] * n, unknown=[True] * n)
    assert first(seen, "critical") == Seen(11, "critical", "unknown_tool")
    # the same call with the same (error) result is also a generic repeat; unknown-tool is first
    assert {s.detector for s in seen if s.level == "critical"} == {"unknown_tool"}


def test_strict_unknown_tool_nudges_at_the_third_attempt_and_stops_at_the_fifth() -> None:
    calls = [("nope", json.dumps({"x": n})) for n in range(8)]
    seen = play(STRICT, calls, [f"unknown tool 'nope' ({n})" for n in range(8)], unknown=[True] * 8)
    assert first(seen, "warning") == Seen(3, "warning", "unknown_tool")
    assert first(seen, "break") == Seen(5, "break", "unknown_tool")


def test_a_known_tool_result_ends_the_unknown_tool_streak() -> None:
    calls = [UNKNOWN, UNKNOWN, READ, UNKNOWN, UNKNOWN, READ] * 2
    unknown = [c is UNKNOWN for c in calls]
    results = [f"r{n}" for n in range(len(calls))]
    seen = play(upstream(STRICT), calls, results, unknown=unknown)
    assert not [s for s in seen if s.detector == "unknown_tool"]
    # but the run's unknown-tool results add up (issue #32): the 6th stops the next call
    seen = play(STRICT, calls, results, unknown=unknown)
    assert first(seen, "break") == Seen(9, "break", "unknown_tool")


# --------------------------------------------------------------------------- OpenClaw current


def test_openclaw_current_refuses_the_21st_identical_call_with_identical_results() -> None:
    seen = play(OPENCLAW_CURRENT, [READ] * 25, ["same text"] * 25)
    assert first(seen, "warning") == Seen(11, "warning", "generic_repeat")
    assert first(seen, "critical") == Seen(21, "critical", "generic_repeat")
    # classic never blocks the generic repeat: the breaker at the 31st is its only stop
    assert first(play(OPENCLAW, [READ] * 25, ["same text"] * 25), "critical") is None


def test_openclaw_current_only_warns_while_results_change() -> None:
    seen = play(OPENCLAW_CURRENT, [READ] * 40, [f"text {n}" for n in range(40)])
    assert {(s.level, s.detector) for s in seen} == {("warning", "generic_repeat")}


def test_thresholds_that_do_not_increase_are_clamped_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="loopfuse.loop"):
        config = load_config({"generic_repeat": {"warn_at": 10, "block_at": 10, "break_at": 3}})
    assert (config.generic_repeat.block_at, config.generic_repeat.break_at) == (11, 12)
    assert "generic_repeat.block_at = 10 is not above generic_repeat.warn_at (10)" in caplog.text
    # the detector uses the clamped values
    detector = LoopDetector(
        LoopConfig(ping_pong=OPENCLAW.ping_pong.__class__(warn_at=5, block_at=2))
    )
    assert detector.config.ping_pong.block_at == 6


# --------------------------------------------------------------------------- qwen-code


def test_qwen_stops_the_fifth_consecutive_identical_call() -> None:
    seen = play(QWEN, [READ] * 8, ["the same file"] * 8)
    assert first(seen, "break") == Seen(5, "break", "generic_repeat")


def test_qwen_a_changed_result_restarts_one_tool_s_streak() -> None:
    # qwen-code's stateful-read reset of action stagnation, for every tool in the preset;
    # a call counts once its result shows no progress (r0 and r1 are new at calls 1-2)
    calls = [("grep", json.dumps({"q": n % 2})) for n in range(12)]
    results = [f"r{n % 2}" for n in range(6)] + ["changed 0", "changed 1"] + ["r0", "r1"] * 2
    assert play(QWEN, calls, results) == []
    assert play(QWEN, calls, [f"r{n % 2}" for n in range(12)]) == [
        Seen(10, "break", "tool_stagnation")
    ]
    assert play(QWEN, calls, ["one result"] * 12) == [Seen(8, "break", "tool_stagnation")]


def test_qwen_stateful_read_tool_whose_results_change_is_not_a_loop() -> None:
    board: Call = ("task_list", "{}")
    assert play(QWEN, [board] * 7, [f"board v{n}" for n in range(7)]) == []
    seen = play(QWEN, [board] * 7, ["board v1"] * 7)
    assert first(seen, "break") == Seen(5, "break", "generic_repeat")


def test_qwen_git_overview_commands_stop_at_the_eighth_even_when_their_text_varies() -> None:
    commands = [
        "git status",
        "git diff",
        "git status --short",
        "git ls-files",
        "git diff HEAD~1",
        "git --no-pager diff --stat",
        "git status && git diff",
        "git diff a1b2c3d..HEAD",
    ]
    seen = play(QWEN, [shell(c) for c in commands], [GIT_OUTPUT] * 8)
    assert seen == [Seen(8, "break", "shell_stagnation")]
    # each printing something new is progress (issue #32): not stagnation
    assert play(QWEN, [shell(c) for c in commands], [f"out {n}" for n in range(8)]) == []


@pytest.mark.parametrize(
    ("command", "overview"),
    [
        ("git status", True), ("git diff --stat HEAD", True), ("git ls-files", True),
        ("git -C repo status", True), ("git status; git diff", True),
        ("git diff src/app.py", False), ("git diff -- src", False), ("git add -A", False),
        ("git status && make", False), ("ls", False), ("", False),
    ],
)  # fmt: skip
def test_what_counts_as_a_git_overview_command(command: str, overview: bool) -> None:
    assert is_git_overview(command) is overview


def test_qwen_any_other_call_ends_the_shell_streak() -> None:
    calls = [shell("git status")] * 7 + [READ] + [shell("git status")] * 7
    seen = play(QWEN, calls, [f"out {n}" for n in range(len(calls))])
    assert not [s for s in seen if s.detector == "shell_stagnation"]


def test_qwen_one_tool_eight_times_in_a_row_with_varying_arguments() -> None:
    calls = [("grep", json.dumps({"q": n})) for n in range(10)]
    seen = play(QWEN, calls, ["no match"] * 10)
    assert seen == [Seen(8, "break", "tool_stagnation")]
    # a wandering search, each query finding something new, is progress (issue #32)
    assert play(QWEN, calls, [f"r{n}" for n in range(10)]) == []


def test_qwen_read_loop_waits_for_a_non_read_call() -> None:
    reads = [
        ("read_file", json.dumps({"path": f"f{n}"}))
        if n % 2
        else ("list_directory", json.dumps({"p": n}))
        for n in range(14)
    ]
    assert play(QWEN, reads, [f"r{n}" for n in range(14)]) == []  # cold start: exploring
    calls = [("write_file", "{}"), *reads]
    seen = play(QWEN, calls, ["the same text"] * len(calls))
    assert seen == [Seen(9, "break", "read_loop")]  # the 8th read after the write
    # reads that each bring something new are progress, not a loop (issue #32)
    assert play(QWEN, calls, [f"r{n}" for n in range(len(calls))]) == []


def test_qwen_thirty_distinct_reads_and_a_paginated_read_are_not_stagnation() -> None:
    # issue #32: qwen stopped these legitimate runs at the 8th call
    files = [("read_file", json.dumps({"path": f"src/m{n}.py"})) for n in range(30)]
    calls = [("write_file", "{}"), *files]
    assert play(QWEN, calls, [f"contents {n}" for n in range(len(calls))]) == []
    pages = [("read_file", json.dumps({"path": "big.log", "offset": 100 * n})) for n in range(40)]
    assert play(QWEN, pages, [f"lines {100 * n}-{100 * n + 99}" for n in range(40)]) == []
    # the same reads each failing, or each returning one text, are stopped
    seen = play(QWEN, calls, ["No such file"] * len(calls))
    assert first(seen, "break") is not None
    assert first(seen, "break").n <= 9  # type: ignore[union-attr]


def test_qwen_call_cap_is_adaptive() -> None:
    tools = ["a", "b", "c", "d", "e", "f", "g"]  # no tool twice in a row, no read-like names
    diverse = [(tools[n % 7], json.dumps({"n": n})) for n in range(1100)]
    seen = play(QWEN, diverse, ["one output"] * 1100)
    assert seen == [Seen(1001, "break", "call_cap")]
    stuck = [(tools[n % 7], "{}") for n in range(300)]  # each call made every 7th time
    seen = play(QWEN, stuck, ["one output"] * 300)
    assert seen == [Seen(101, "break", "call_cap")]  # past 100, a call made >= 6 times
    # issue #32: the cap counts calls without progress, so calls that each bring something
    # new run on (a 112-call run polling a changing status 10 times stopped at call 101)
    assert play(QWEN, diverse, [f"r{n}" for n in range(1100)]) == []
    legit = [*diverse[:102], *[("a", '{"status": 1}')] * 10]
    legit = [legit[n] for n in (*range(0, 112, 2), *range(1, 112, 2))]
    assert play(QWEN, legit, [f"r{n}" for n in range(112)]) == []


# --------------------------------------------------------------------------- every preset


SIGNATURES: dict[str, tuple[list[Call], list[str], str]] = {
    "strict": ([READ] * 6, ["same"] * 6, "generic_repeat"),
    "openclaw": ([READ] * 35, ["same"] * 35, "global_breaker"),
    "openclaw-current": ([UNKNOWN] * 12, ["unknown tool"] * 12, "unknown_tool"),
    "gemini": ([READ, STATUS] * 8, ["same"] * 16, "cycle"),
    "qwen": ([shell("git status")] * 9, [GIT_OUTPUT] * 9, "generic_repeat"),
}


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_through_the_standalone_api(name: str) -> None:
    calls, results, detector = SIGNATURES[name]
    seen = play(PRESETS[name], calls, results, unknown=[c is UNKNOWN for c in calls])
    assert detector in {s.detector for s in seen if s.level in ("critical", "break")}
    assert play(OFF, calls, results) == []


# --------------------------------------------------------------------------- snapshots


CALL_POOL = [READ, STATUS, UNKNOWN, shell("git status"), shell("git log -1"), ("task_list", "{}")]


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from(sorted(PRESETS)),
    st.lists(st.tuples(st.integers(0, len(CALL_POOL) - 1), st.integers(0, 2)), max_size=40),
    st.integers(0, 40),
)
def test_a_restored_detector_decides_as_if_never_stopped(
    name: str, steps: list[tuple[int, int]], cut: int
) -> None:
    config = PRESETS[name]
    outputs = [GIT_OUTPUT, "another long enough output text", "x"]

    def step(detector: LoopDetector, index: int, result: int) -> tuple[str, str | None]:
        call = CALL_POOL[index]
        decision = detector.propose(*call)
        if decision.level in ("none", "warning"):
            detector.record_result(decision.call_id, outputs[result], unknown_tool=call is UNKNOWN)
        return decision.level, decision.detector

    straight = LoopDetector(config)
    expected = [step(straight, i, r) for i, r in steps]
    first_half = LoopDetector(config)
    got = [step(first_half, i, r) for i, r in steps[:cut]]
    resumed = LoopDetector(config)
    resumed.restore(first_half.snapshot())
    got += [step(resumed, i, r) for i, r in steps[cut:]]
    assert got == expected


_NUDGED_SNAPSHOT = """
from actors.loop import LoopDetector
from actors.loop.presets import PRESETS

detector = LoopDetector(PRESETS["strict"])
for _ in range(12):
    for call in (("read_file", '{"path": "a"}'), ("status", '{"id": "web"}'), ("ls", '{"p": 1}')):
        decision = detector.propose(*call)
        if decision.level in ("none", "warning"):
            detector.record_result(decision.call_id, "same output text")
print(detector.snapshot().decode())
"""


def test_a_snapshot_is_the_same_bytes_in_every_process() -> None:
    """The nudged warning keys are kept in a set: a snapshot writes them sorted, so the
    same state gives the same bytes whatever the process's string hashing."""
    snapshots = {
        subprocess.run(
            [sys.executable, "-c", _NUDGED_SNAPSHOT],
            env={**os.environ, "PYTHONHASHSEED": str(seed)},
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout
        for seed in range(8)
    }
    assert len(snapshots) == 1
    assert len(json.loads(snapshots.pop())["nudged"]) >= 2


def test_a_snapshot_of_another_config_is_refused() -> None:
    with pytest.raises(ValueError, match="does not fit"):
        LoopDetector(GEMINI).restore(LoopDetector(STRICT).snapshot())
    with pytest.raises(ValueError, match="not a loop detector snapshot"):
        LoopDetector(STRICT).restore(b"{}")


# --------------------------------------------------------------------------- differential: OpenClaw


@dataclass
class _OcRecord:
    sig: str
    tool: str
    result: str | None = None
    unknown: bool = False


def _oc_current(history: list[_OcRecord], tool: str, sig: str, poll: bool) -> tuple[str, str]:
    """OpenClaw's current detectToolCallLoop (no argument churn, as its newest version),
    written from the rules in loop_anchors.md §1: (level, detector) of a proposed call."""
    unknown = 0
    for r in reversed(history):
        if r.tool != tool or not r.unknown:
            break
        unknown += 1
    if unknown >= 10:
        return "critical", "unknown_tool"
    streak, latest = 0, None
    for r in reversed(history):
        if r.sig != sig or r.result is None:
            continue
        if latest is None:
            latest = r.result
        elif r.result != latest:
            break
        streak += 1
    if streak >= 30:
        return "critical", "global_breaker"
    if poll and streak >= 20:
        return "critical", "poll_no_progress"
    if poll and streak >= 10:
        return "warning", "poll_no_progress"
    pp = 0
    evidence = False
    if history:
        a = history[-1].sig
        b = next((r.sig for r in reversed(history[:-1]) if r.sig != a), None)
        if b is not None and sig == b:
            tail = 0
            for r in reversed(history):
                if r.sig != (a if tail % 2 == 0 else b):
                    break
                tail += 1
            if tail >= 2:
                pp = tail + 1
                seen: dict[str, str] = {}
                evidence = (
                    all(
                        r.result is not None and seen.setdefault(r.sig, r.result) == r.result
                        for r in history[-tail:]
                    )
                    and len(seen) == 2
                )
    if pp >= 20 and evidence:
        return "critical", "ping_pong"
    if pp >= 10:
        return "warning", "ping_pong"
    if not poll and streak >= 20:
        return "critical", "generic_repeat"
    if not poll and sum(r.sig == sig for r in history) >= 10:
        return "warning", "generic_repeat"
    return "none", ""


OC_CALLS = [READ, STATUS, ("command_status", '{"id": 7}'), UNKNOWN]


@settings(max_examples=120, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, len(OC_CALLS) - 1), st.integers(0, 1), st.integers(1, 25)),
        min_size=1,
        max_size=8,
    )
)
def test_openclaw_current_matches_upstream_rules(runs: list[tuple[int, int, int]]) -> None:
    detector = LoopDetector(upstream(OPENCLAW_CURRENT))
    history: list[_OcRecord] = []
    results = ["same output", "other output"]
    for index, result, repeat in runs:
        for _ in range(repeat):
            tool, args = OC_CALLS[index]
            sig = f"{tool}:{args}"
            expected = _oc_current(history, tool, sig, tool == "command_status")
            decision = detector.propose(tool, args)
            level = "critical" if decision.level == "break" else decision.level
            assert (level, decision.detector or "") == expected, (len(history), expected)
            if decision.level in ("critical", "break"):
                continue  # refused: not recorded (classic enforcement)
            history.append(_OcRecord(sig, tool, results[result], tool == "nope"))
            history[:] = history[-30:]
            detector.record_result(decision.call_id, results[result], unknown_tool=tool == "nope")


# --------------------------------------------------------------------------- differential: qwen


def _qwen_halts(calls: list[Call]) -> int | None:
    """The call at which qwen-code's always-on guards and heuristics halt (loop_anchors §3),
    for tools without a stateful read carve-out, or None."""
    last, consecutive, same_name, shell_streak = None, 0, 0, 0
    names: list[str] = []
    seen_other = False
    reads = {"read_file", "read_many_files", "list_directory", "zoom_image"}
    for n, (tool, args) in enumerate(calls, 1):
        key = f"{tool}:{args}"
        consecutive = consecutive + 1 if key == last else 1
        same_name = same_name + 1 if names and names[-1] == tool else 1
        last = key
        command = json.loads(args).get("command") if tool == SHELL else None
        shell_streak = shell_streak + 1 if command and is_git_overview(command) else 0
        read = tool in reads or tool.startswith(("read_", "list_"))
        seen_other = seen_other or not read
        names.append(tool)
        window = names[-15:]
        read_count = sum(t in reads or t.startswith(("read_", "list_")) for t in window)
        if (
            consecutive >= 5
            or shell_streak >= 8
            or same_name >= 8
            or (seen_other and read_count >= 8)
        ):
            return n
    return None


QWEN_CALLS = [READ, ("grep", '{"q": 1}'), ("grep", '{"q": 2}'), shell("git status"),
              shell("git diff"), ("write_file", "{}"), ("list_dir", '{"p": 1}')]  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, len(QWEN_CALLS) - 1), min_size=1, max_size=60))
def test_qwen_matches_upstream_rules(indexes: list[int]) -> None:
    # every call returns one result (a tool that tells nothing new), so the preset's
    # result awareness (a deliberate difference: a result that is new in the run or changed
    # for its call is progress) changes nothing; with a result per call, only the rules
    # upstream states
    calls = [QWEN_CALLS[i] for i in indexes]
    seen = play(QWEN, calls, ["one output for every call"] * len(calls))
    stop = first(seen, "break")
    assert (stop.n if stop else None) == _qwen_halts(calls)
    seen = play(upstream(QWEN), calls, [f"result of {tool} {args}" for tool, args in calls])
    stop = first(seen, "break")
    assert (stop.n if stop else None) == _qwen_halts(calls)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, len(QWEN_CALLS) - 1), st.integers(0, 2)), min_size=1, max_size=60
    )
)
def test_qwen_never_stops_before_upstream(steps: list[tuple[int, int]]) -> None:
    # results that may change: a changed result only delays a stop (it is progress)
    calls = [QWEN_CALLS[i] for i, _ in steps]
    results = [f"result {r} of {QWEN_CALLS[i][0]}" for i, r in steps]
    stop = first(play(QWEN, calls, results), "break")
    upstream = _qwen_halts(calls)
    if stop is not None:
        assert upstream is not None
        assert stop.n >= upstream


# --------------------------------------------------------------------------- differential: gemini


GEMINI_ONLY_REPEAT = msgspec.structs.replace(
    GEMINI, cycle=msgspec.structs.replace(GEMINI.cycle, enabled=False)
)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 2), min_size=1, max_size=40))
def test_gemini_consecutive_rule_matches_upstream(indexes: list[int]) -> None:
    # each call always returns the same result, so the preset's result awareness (a
    # deliberate difference) changes nothing: upstream's rule call by call
    calls = [[READ, STATUS, UNKNOWN][i] for i in indexes]
    detector = LoopDetector(GEMINI_ONLY_REPEAT)
    streak, last = 0, None
    for call in calls:
        streak = streak + 1 if call == last else 1  # gemini counts refused calls too
        last = call
        decision = detector.propose(*call)
        expected = "critical" if streak >= 5 else "none"
        if decision.level == "break":
            assert streak >= 5
            return
        assert decision.level == expected
        detector.record_result(decision.call_id, f"result of {call[0]}")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 2)), min_size=1, max_size=60))
def test_gemini_refuses_only_where_upstream_would(steps: list[tuple[int, int]]) -> None:
    # results that may change: a refusal needs upstream's streak of 5, and 5 identical
    # results at its end (or the progress ceiling's 50 calls)
    detector = LoopDetector(GEMINI_ONLY_REPEAT)
    streak, last = 0, None
    tail: list[str] = []
    for index, result in steps:
        call = [READ, STATUS, UNKNOWN][index]
        text = f"result {result} of {call[0]}"
        streak = streak + 1 if call == last else 1
        last = call
        decision = detector.propose(*call)
        if decision.level == "none":
            tail = [*tail, text] if streak > 1 else [text]
            detector.record_result(decision.call_id, text)
            continue
        assert streak >= 5
        if decision.detector == "generic_repeat":
            assert len(set(tail[-4:])) == 1
            assert len(tail) >= 4
        if decision.level == "break":
            return
        tail = [*tail, tail[-1]] if tail else tail  # a refusal counts as no progress


def test_a_run_table_cannot_choose_normalisation_patterns() -> None:
    from orchestrator.config import merge_loop_overrides
    from orchestrator.errors import ConfigError

    with pytest.raises(ConfigError) as caught:
        merge_loop_overrides(STRICT, {"result_patterns": [{"pattern": "(a+)+$"}]})
    assert caught.value.key == "config.loop.result_patterns"
    operator = (ResultPattern(pattern=r"build #\d+", replacement="build"),)
    merged = merge_loop_overrides(STRICT, {}, result_patterns=operator)
    assert merged.result_patterns == operator
    assert (
        merge_loop_overrides(STRICT, {"history_size": 40}, result_patterns=operator).result_patterns
        == operator
    )


def test_generic_repeat_config_defaults_ignore_results() -> None:
    assert not GenericRepeatConfig().stop_needs_no_progress
    assert STRICT.generic_repeat.stop_needs_no_progress


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("preset", "cause", "turns"),
    [("qwen", "budget.max_turns", 12), ("openclaw-current", "budget.max_turns", 12)],
)
async def test_the_new_presets_are_accepted_by_a_run(preset: str, cause: str, turns: int) -> None:
    from actors.tools import default_registry
    from bench.loops import echo_tool
    from bench.scripted_model import ECHO_TOOL, ScriptedModel, echo_script
    from orchestrator.runtime import RunSpec, Runtime

    tools = default_registry()
    tools.add(echo_tool())
    script = echo_script(100)  # one echo call per turn, new arguments each time
    async with Runtime(tools=tools, model_actor=lambda bus: ScriptedModel(bus, script)) as rt:
        result = await rt.run(
            RunSpec(
                task="Echo.",
                overrides={"tools": [ECHO_TOOL], "max_turns": 12, "loop_preset": preset},
            )
        )
    assert (result.cause, result.turns) == (cause, turns)
