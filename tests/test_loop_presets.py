"""The presets' exact call numbers (off-by-ones included), pinned against the upstream tests."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import NamedTuple

import msgspec
import pytest

from actors.loop import (
    GEMINI,
    GEMINI_RECOVERY_TEXT,
    OPENCLAW,
    OPENCLAW_CURRENT,
    PRESETS,
    STRICT,
    STRICT_NUDGE_TEXT,
    Decision,
    LoopConfig,
    LoopDetector,
)
from actors.loop.presets import OFF

Call = tuple[str, str]
Result = Callable[[int, Call], str]


def same(_: int, __: Call) -> str:
    return "same result"


def changing(n: int, _: Call) -> str:
    return f"result {n}"


def changing_for(poll: Call) -> Result:
    """``poll`` always answers the same; every other call something new."""
    return lambda n, call: "same result" if call == poll else f"result {n}"


class Event(NamedTuple):
    n: int
    level: str
    detector: str | None
    nudged: bool


def drive(
    config: LoopConfig, calls: Sequence[Call], result: Result = same
) -> tuple[list[Event], LoopDetector]:
    """Propose each call in turn, run the ones allowed, stop at a break."""
    detector = LoopDetector(config)
    events: list[Event] = []
    for n, call in enumerate(calls, 1):
        decision = detector.propose(*call)
        if decision.level != "none":
            events.append(Event(n, decision.level, decision.detector, decision.nudge is not None))
        if decision.level == "break":
            break
        if decision.level in ("none", "warning"):
            detector.record_result(decision.call_id, result(n, call))
    return events, detector


def nudges(events: list[Event]) -> list[tuple[int, str | None]]:
    return [(e.n, e.detector) for e in events if e.nudged]


def first(events: list[Event], level: str) -> Event | None:
    return next((e for e in events if e.level == level), None)


A: Call = ("read_file", '{"path": "a.txt"}')
B: Call = ("write_file", '{"path": "a.txt", "text": "x"}')
C: Call = ("list_dir", '{"path": "."}')
D: Call = ("grep", '{"q": "x"}')
E: Call = ("stat", '{"path": "b"}')
POLL: Call = ("command_status", '{"id": 7}')
PROCESS_POLL: Call = ("process", '{"action": "poll", "id": 7}')


# --------------------------------------------------------------------------- openclaw (§1.3)


class OcCase(NamedTuple):
    name: str
    calls: list[Call]
    result: Result
    warnings: list[tuple[int, str]]
    critical: tuple[int, str] | None
    stop: tuple[int, str] | None


OC_CASES = [
    # generic: 10 already in the window -> the 11th; warn-only; warnings at counts 10/20/30
    OcCase("generic changing results", [A] * 45, changing,
           [(11, "generic_repeat"), (21, "generic_repeat"), (31, "generic_repeat")], None, None),
    # identical results: the breaker at the 31st (30 identical outcomes before it)
    OcCase("generic identical results", [A] * 45, same,
           [(11, "generic_repeat"), (21, "generic_repeat")], None, (31, "global_breaker")),
    # poll: warning at the 11th, refused from the 21st, never a generic warning
    OcCase("poll no progress", [POLL] * 25, same,
           [(11, "poll_no_progress")], (21, "poll_no_progress"), None),
    OcCase("process poll no progress", [PROCESS_POLL] * 25, same,
           [(11, "poll_no_progress")], (21, "poll_no_progress"), None),
    # ping-pong: the proposed call counted -> warning at the 10th, refused at the 20th
    OcCase("ping-pong no progress", [A, B] * 10, same,
           [(10, "ping_pong")], (20, "ping_pong"), None),
]  # fmt: skip


@pytest.mark.parametrize("case", OC_CASES, ids=lambda c: c.name)
def test_openclaw_call_numbers(case: OcCase) -> None:
    events, _ = drive(OPENCLAW, case.calls, case.result)
    assert nudges(events) == case.warnings
    crit = first(events, "critical")
    assert (crit and (crit.n, crit.detector)) == (case.critical or None)
    stop = first(events, "break")
    assert (stop and (stop.n, stop.detector)) == (case.stop or None)


def test_openclaw_generic_repeat_never_blocks_when_results_change() -> None:
    events, _ = drive(OPENCLAW, [A] * 100, changing)
    assert {e.level for e in events} == {"warning"}
    assert {e.detector for e in events} == {"generic_repeat"}


def test_openclaw_poll_keeps_refusing_and_refused_calls_are_not_recorded() -> None:
    upstream = msgspec.structs.replace(OPENCLAW, refusal_limit=None)  # OpenClaw as shipped
    events, detector = drive(upstream, [POLL] * 40, same)
    assert [e.n for e in events if e.level == "critical"] == list(range(21, 41))
    # the streak stays at 20: refusals are not recorded, so the breaker is never reached
    assert {e.detector for e in events if e.level == "critical"} == {"poll_no_progress"}
    assert first(events, "break") is None
    assert detector.propose(*POLL).count == 20


@pytest.mark.parametrize(
    ("preset", "call", "detector"),
    [
        (OPENCLAW, POLL, "poll_no_progress"),
        (OPENCLAW_CURRENT, POLL, "poll_no_progress"),
        (OPENCLAW_CURRENT, A, "generic_repeat"),
    ],
    ids=["openclaw-poll", "openclaw-current-poll", "openclaw-current-repeat"],
)
def test_every_refusal_has_an_end(preset: LoopConfig, call: Call, detector: str) -> None:
    # issue #32: openclaw-current refused a stuck poll from call 21 and never stopped it;
    # after 10 refusals in a row the next one stops the run, with the refusing detector's
    # cause (call 31: where OpenClaw's global breaker would have fired)
    events, _ = drive(preset, [call] * 60, same)
    assert [e.n for e in events if e.level == "critical"] == list(range(21, 31))
    assert first(events, "break") == Event(31, "break", detector, False)


def test_a_call_that_runs_ends_the_refusals_in_a_row() -> None:
    # refused 5 times, then a call that runs: never 11 refusals in a row
    calls = [POLL] * 20 + ([POLL] * 5 + [A, B]) * 5
    events, _ = drive(OPENCLAW, calls, changing_for(POLL))
    assert first(events, "critical") is not None
    assert first(events, "break") is None


def test_openclaw_poll_progress_resets_the_streak() -> None:
    events, _ = drive(OPENCLAW, [POLL] * 60, lambda n, _: f"{n // 15}% done")
    assert all(e.level == "warning" for e in events)  # 15 identical results at most


def test_openclaw_ping_pong_warns_once_for_both_tools() -> None:
    # results change on the A side: a warning at 10 and 20, never a block
    events, _ = drive(OPENCLAW, [A, B] * 15, lambda n, c: f"{n}" if c == A else "ok")
    assert nudges(events) == [(10, "ping_pong"), (20, "ping_pong"), (30, "ping_pong")]
    assert first(events, "critical") is None
    assert all(e.detector == "ping_pong" for e in events)


def test_openclaw_ping_pong_needs_both_sides_stable_to_block() -> None:
    events, _ = drive(OPENCLAW, [A, B] * 15, lambda n, c: f"{n}" if c == B else "same")
    assert first(events, "critical") is None


def test_openclaw_read_modify_write_that_changes_the_file_is_not_a_loop() -> None:
    calls = [c for i in range(40) for c in (A, ("write_file", json.dumps({"text": f"v{i}"})))]
    events, _ = drive(OPENCLAW, calls, changing)
    # the reads repeat (generic warning, as upstream), but nothing is refused or stopped
    assert {e.level for e in events} <= {"warning"}
    assert {e.detector for e in events} <= {"generic_repeat"}


def test_openclaw_a_batch_of_distinct_calls_is_quiet() -> None:
    calls = [("read_file", json.dumps({"path": f"f{i}.txt"})) for i in range(200)]
    assert drive(OPENCLAW, calls, same)[0] == []


def test_openclaw_warning_texts_match_upstream() -> None:
    detector = LoopDetector(OPENCLAW)
    for _ in range(10):
        detector.record_result(detector.propose(*A).call_id, "x")
    warning = detector.propose(*A)
    assert warning.nudge == (
        "WARNING: You have called read_file 10 times with identical arguments. If this is not "
        "making progress, stop retrying and report the task as failed."
    )


# --------------------------------------------------------------------------- gemini


@pytest.mark.parametrize(
    ("name", "calls", "strike_at", "detector", "results"),
    [
        ("5 identical", [A] * 9, 5, "generic_repeat", same),
        ("A/B alternation", [A, B] * 9, 10, "cycle", changing),
        ("period 3", [A, B, C] * 9, 15, "cycle", changing),
        ("period 5", [A, B, C, D, E] * 9, 25, "cycle", changing),
    ],
)
def test_gemini_strike_one_then_stop(
    name: str,
    calls: list[Call],
    strike_at: int,
    detector: str,
    results: Callable[[int, Call], str],
) -> None:
    # cycles ignore outcomes, as upstream; the 5 identical calls need identical results
    # (a deliberate difference: a repeat whose result changed is progress)
    events, _ = drive(GEMINI, calls, results)
    assert events == [
        Event(strike_at, "critical", detector, True),
        Event(strike_at + 1, "break", detector, False),
    ]


def test_gemini_identical_calls_whose_results_change_are_progress() -> None:
    events, _ = drive(GEMINI, [A] * 9, changing)
    assert events == []


def test_gemini_four_identical_then_another_call_is_fine() -> None:
    events, _ = drive(GEMINI, [A, A, A, A, B, A, A, A, A, B], same)
    assert events == []


def test_gemini_recovery_text_carries_the_detail() -> None:
    detector = LoopDetector(GEMINI)
    decisions = [detector.propose(*A) for _ in range(5)]
    nudge = decisions[-1].nudge
    detail = 'Repeated tool call: read_file with arguments {"path": "a.txt"}'
    assert nudge == GEMINI_RECOVERY_TEXT.replace("{detail}", detail)
    assert decisions[-1].cause == "loop.generic_repeat"


def test_gemini_strikes_are_shared_with_content() -> None:
    detector = LoopDetector(GEMINI)
    assert detector.feed_text("The same sentence, over and over again. " * 20).level == "critical"
    detector.new_stream()
    decisions = [detector.propose(*A) for _ in range(5)]
    assert decisions[-1].level == "break"


# --------------------------------------------------------------------------- strict (seed 000)


def test_strict_nudges_at_the_third_and_stops_at_the_fifth() -> None:
    events, _ = drive(STRICT, [A] * 10, same)
    assert events == [
        Event(3, "warning", "generic_repeat", True),
        Event(4, "warning", "generic_repeat", False),
        Event(5, "break", "generic_repeat", False),
    ]


def test_strict_counts_occurrences_not_streaks() -> None:
    # documented choice: the same call anywhere in the run counts
    events, _ = drive(STRICT, [A, B] * 10, same)
    assert (events[0].n, events[0].nudged) == (5, True)  # the 3rd A
    assert first(events, "break") == Event(9, "break", "generic_repeat", False)  # the 5th A


def test_strict_nudges_once_per_run() -> None:
    events, _ = drive(STRICT, [A, A, A, B, B, B, C, C], same)
    assert nudges(events) == [(3, "generic_repeat")]
    assert first(events, "break") is None


def test_strict_nudge_text_and_exempt_finish() -> None:
    detector = LoopDetector(STRICT)
    decisions = [detector.propose(*A) for _ in range(3)]
    assert decisions[-1].nudge == STRICT_NUDGE_TEXT
    finish = ("finish_exploration", '{"experiment": "x", "goal": "y", "key_findings": "z"}')
    assert all(detector.propose(*finish).level == "none" for _ in range(20))


def test_strict_continued_reads_at_other_offsets_are_distinct() -> None:
    calls = [("read_file", json.dumps({"path": "big.csv", "offset": 100 * i})) for i in range(10)]
    assert drive(STRICT, calls, changing)[0] == []
    # key order and integral floats do not make a call new
    same_call = [
        '{"path": "a", "offset": 1}',
        '{"offset": 1.0, "path": "a"}',
        '{"offset":1,"path":"a"}',
    ]
    detector = LoopDetector(STRICT)
    levels = [detector.propose("read_file", args).level for args in same_call]
    assert levels == ["none", "none", "warning"]


def test_strict_stops_a_collapsed_model_within_five_proposals() -> None:
    detector = LoopDetector(STRICT)
    proposals = 0
    decision = Decision()
    while decision.level != "break":
        decision = detector.propose(*A)
        proposals += 1
    assert proposals == 5


# --------------------------------------------------------------------------- off


def test_off_detects_nothing() -> None:
    # every preset stops these calls (gemini also the chanting): off lets all of them through
    for calls in ([A] * 100, [A, B] * 50, [A, B, C] * 30, [POLL] * 100):
        assert drive(OFF, calls)[0] == []
    detector = LoopDetector(OFF)
    chant = "The same sentence again and again. " * 400
    levels = {detector.feed_text(chant[i : i + 50]).level for i in range(0, len(chant), 50)}
    assert levels == {"none"}
    assert OFF.name == "off"
    assert OFF not in PRESETS.values()  # PRESETS holds the presets that detect something


@pytest.mark.parametrize("preset", [OPENCLAW, OPENCLAW_CURRENT], ids=lambda p: p.name)
def test_a_refused_ping_pong_goes_on_counting_and_ends(preset: LoopConfig) -> None:
    # issue #32: the refused call is not recorded, so upstream's alternation restarts after
    # each refusal: a stuck A,B rotation was refused every 20th call and never stopped. The
    # refused call now counts toward the ping-pong (its partner is refused next), so the
    # refusals come in a row and the end of refusals stops the run
    events, _ = drive(preset, [A, B] * 50, same)
    assert [e.n for e in events if e.level == "critical"] == list(range(20, 30))
    assert {e.detector for e in events if e.level == "critical"} == {"ping_pong"}
    assert first(events, "break") == Event(30, "break", "ping_pong", False)


def test_without_an_end_of_refusals_ping_pong_refuses_every_20th_call_as_upstream() -> None:
    upstream = msgspec.structs.replace(OPENCLAW, refusal_limit=None)  # OpenClaw as shipped
    events, _ = drive(upstream, [A, B] * 50, same)
    assert [e.n for e in events if e.level == "critical"] == [20, 40, 60, 80, 100]
    assert first(events, "break") is None


def test_a_refused_ping_pong_restarts_when_another_call_runs() -> None:
    # after the refusal the model runs something else: the alternation starts afresh
    calls = [A, B] * 10 + [C] + [A, B] * 5
    events, _ = drive(OPENCLAW, calls, same)
    assert [e.n for e in events if e.level == "critical"] == [20]
    assert first(events, "break") is None


def test_a_refused_ping_pong_survives_a_snapshot() -> None:
    straight, _ = drive(OPENCLAW, [A, B] * 20, same)
    detector = LoopDetector(OPENCLAW)
    for n, call in enumerate([A, B] * 11, 1):  # refused at 20, 21 and 22
        decision = detector.propose(*call)
        if decision.level in ("none", "warning"):
            detector.record_result(decision.call_id, "same result")
        assert (decision.level == "critical") == (n >= 20)
    resumed = LoopDetector(OPENCLAW)
    resumed.restore(detector.snapshot())
    levels = [resumed.propose(*call).level for call in [A, B] * 4][:8]
    assert levels == ["critical"] * 7 + ["break"]  # calls 23-29 refused, 30 stopped
    assert first(straight, "break") == Event(30, "break", "ping_pong", False)


@pytest.mark.parametrize("preset", [OPENCLAW, OPENCLAW_CURRENT], ids=lambda p: p.name)
@pytest.mark.parametrize(
    "pattern", [[POLL, C], [A, B] * 10 + [C]], ids=["poll-then-other", "ping-pong-then-other"]
)
def test_refusals_between_calls_without_progress_have_an_end(
    preset: LoopConfig, pattern: list[Call]
) -> None:
    # issue #32: a refusal, then a call that runs but changes nothing, then a refusal…
    # never came in a row, so the run was refused without end (400 calls: 20 refusals).
    # Only progress ends refusals now: the 11th refusal without progress stops the run
    events, _ = drive(preset, pattern * 400, same)
    stop = first(events, "break")
    assert stop is not None
    assert stop.n <= 240
    assert stop.detector in ("poll_no_progress", "ping_pong")
    assert sum(e.level == "critical" for e in events) == 10


def test_progress_between_refusals_ends_them() -> None:
    # the same refusals, but the call between them returns something new each time
    events, _ = drive(OPENCLAW, [POLL] * 20 + ([POLL] * 3 + [C]) * 50, changing_for(POLL))
    assert sum(e.level == "critical" for e in events) > 10
    assert first(events, "break") is None
