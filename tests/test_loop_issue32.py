"""Issue #32's detector rules: error streaks, unknown-tool storms, refusals that end, in
every preset; each fuse tried on legitimate work as hard as on loops."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import msgspec
import pytest

from actors.loop import PRESETS, STRICT, LoopConfig, LoopDetector

Call = tuple[str, str]


@dataclass(frozen=True)
class Out:
    """What a call returns."""

    text: str
    error: bool = False
    unknown: bool = False


@dataclass
class Seen:
    n: int
    level: str
    detector: str | None
    nudge: str | None


def play(config: LoopConfig, steps: Sequence[tuple[Call, Out]]) -> list[Seen]:
    """Propose each call; run the ones allowed (record their result); stop at a break."""
    detector = LoopDetector(config)
    seen: list[Seen] = []
    for n, (call, out) in enumerate(steps, 1):
        decision = detector.propose(*call)
        if decision.level != "none":
            seen.append(Seen(n, decision.level, decision.detector, decision.nudge))
        if decision.level == "break":
            break
        if decision.level in ("none", "warning"):
            detector.record_result(decision.call_id, out.text, out.error, unknown_tool=out.unknown)
    return seen


def read(path: str, **more: int) -> Call:
    return ("read_file", json.dumps({"path": path, **more}))


def missing(path: str) -> Out:
    return Out(f"error: no such file or directory: {path!r}", error=True)


PRESET_NAMES = sorted(PRESETS)

# ------------------------------------------------------------------ stuck runs


def invented_paths(n: int) -> list[tuple[Call, Out]]:
    """A small model reading sensor files at paths it invents: each call different, each
    failing (issue #32, item 9)."""
    paths = [f"data/sensor_{k}.csv" if k % 2 else f"sensors/s{k}.txt" for k in range(n)]
    return [(read(p), missing(p)) for p in paths]


def rotating_names(n: int) -> list[tuple[Call, Out]]:
    return [
        ((f"tool_{k}", "{}"), Out(f"unknown tool 'tool_{k}'", error=True, unknown=True))
        for k in range(n)
    ]


@pytest.mark.parametrize("name", PRESET_NAMES)
def test_an_error_streak_is_stopped_before_call_21_in_every_preset(name: str) -> None:
    seen = play(PRESETS[name], invented_paths(40))
    stop = next(s for s in seen if s.level == "break")
    assert stop.detector == "error_streak"
    assert stop.n <= 9


@pytest.mark.parametrize("name", [n for n in PRESET_NAMES if n != "gemini"])
def test_an_error_streak_nudges_with_the_errors_then_stops_at_the_seventh_call(name: str) -> None:
    seen = play(PRESETS[name], invented_paths(40))
    mine = [s for s in seen if s.detector == "error_streak"]
    assert [(s.n, s.level) for s in mine if s.level == "break" or s.nudge] == [
        (4, "warning"),
        (7, "break"),
    ]
    nudge = mine[0].nudge
    assert nudge is not None
    assert "your last 3 tool calls failed" in nudge
    assert "no such file or directory: 'sensors/s2.txt'" in nudge  # what went wrong


def test_gemini_refuses_once_with_its_recovery_text_then_stops() -> None:
    seen = play(PRESETS["gemini"], invented_paths(40))
    assert [(s.n, s.level, s.detector) for s in seen] == [
        (6, "critical", "error_streak"),  # strike 1: after 5 failures, not run
        (8, "break", "error_streak"),  # call 7 ran (its try) and failed: strike 2
    ]
    assert seen[0].nudge is not None
    assert "Potential loop detected" in seen[0].nudge


@pytest.mark.parametrize("name", PRESET_NAMES)
def test_rotating_invented_tool_names_are_stopped_with_a_loop_cause(name: str) -> None:
    seen = play(PRESETS[name], rotating_names(40))
    stop = next(s for s in seen if s.level == "break")
    assert stop.detector == "unknown_tool"
    assert stop.n <= 8


@pytest.mark.parametrize("name", PRESET_NAMES)
def test_unknown_names_between_real_calls_add_up(name: str) -> None:
    # a storm dodging the error streak: every other call is a real one that works
    steps: list[tuple[Call, Out]] = []
    for k, unknown in enumerate(rotating_names(30)):
        steps += [unknown, (read(f"f{k}.txt"), Out(f"contents of f{k}.txt"))]
    seen = play(PRESETS[name], steps)
    stop = next(s for s in seen if s.level == "break")
    assert stop.detector == "unknown_tool"
    assert stop.n <= 20


# ------------------------------------------------------------------ legitimate runs


def recovering(rounds: int) -> list[tuple[Call, Out]]:
    """Two failures, then the model finds the right path: a real run's recovery."""
    steps: list[tuple[Call, Out]] = []
    for k in range(rounds):
        steps += [
            (read(f"guess/{k}.csv"), missing(f"guess/{k}.csv")),
            (read(f"data/{k}.csv"), missing(f"data/{k}.csv")),
            (("list_dir", json.dumps({"path": f"d{k}"})), Out(f"sensor_{k}.csv notes.txt")),
            (read(f"d{k}/sensor_{k}.csv"), Out(f"t,v\n0,{k}.5\n1,{k}.7")),
        ]
    return steps


LEGIT: dict[str, list[tuple[Call, Out]]] = {
    "distinct successful calls": [
        (read(f"src/module_{k}.py"), Out(f"def f{k}(): return {k}")) for k in range(40)
    ],
    "a long paginated read": [
        (read("big.log", offset=100 * k), Out(f"lines {100 * k}..{100 * k + 99}: ok"))
        for k in range(60)
    ],
    "recovering after 2 errors": recovering(10),
    "one unknown tool then real ones": [
        (("search_web", "{}"), Out("unknown tool 'search_web'", error=True, unknown=True)),
        *[(read(f"f{k}"), Out(f"text {k}")) for k in range(20)],
        (("grep_all", "{}"), Out("unknown tool 'grep_all'", error=True, unknown=True)),
        *[(read(f"g{k}"), Out(f"more {k}")) for k in range(20)],
    ],
}


@pytest.mark.parametrize("case", sorted(LEGIT))
@pytest.mark.parametrize("name", PRESET_NAMES)
def test_legitimate_work_gets_no_verdict_in_any_preset(name: str, case: str) -> None:
    assert play(PRESETS[name], LEGIT[case]) == []


def test_the_error_streak_warns_once_per_streak_and_a_success_ends_it() -> None:
    steps = [*invented_paths(4), (read("ok.csv"), Out("t,v")), *invented_paths(5)[1:]]
    seen = play(STRICT, steps)
    # calls 1-4 fail (the 4th is warned), the 5th works, 6-8 fail: the 9th is warned again
    assert [(s.n, s.level) for s in seen] == [(4, "warning"), (9, "warning")]
    assert all(s.nudge is not None and "failed" in s.nudge for s in seen)


def test_error_streak_levels_are_configurable_and_clamped() -> None:
    config = msgspec.structs.replace(
        STRICT,
        error_streak=msgspec.structs.replace(STRICT.error_streak, warn_at=2, break_at=2),
    )
    detector = LoopDetector(config)
    assert detector.config.error_streak.break_at == 3


# ------------------------------------------------------------------ a real run


SENSORS = """
task = "Read the six sensor files."
[config]
max_turns = 30
loop_preset = "PRESET"
[folder]
"sensor_1.csv" = "t,v"
"readme.txt" = "six sensors"
[[steps]]
tool_calls = [{ name = "read_file", arguments = { path = "data/sensor_{n}.csv" } }]
repeat = true
[expect]
exit_reason = "hook_stopped"
cause = "loop.error_streak"
"""


@pytest.mark.asyncio
@pytest.mark.parametrize("name", PRESET_NAMES)
async def test_a_run_inventing_paths_is_told_the_real_listing_then_stopped(name: str) -> None:
    import anyio

    from orchestrator.runtime import Runtime
    from orchestrator.scenarios.runs import run_scenario
    from orchestrator.sim import parse_scenario

    scenario = parse_scenario(SENSORS.replace("PRESET", name), source="<sensors>", name="s")
    async with Runtime(scenarios=[scenario]) as runtime:
        with anyio.fail_after(60):
            result = await run_scenario(runtime, scenario)
    assert (result.exit_reason, result.cause) == ("hook_stopped", "loop.error_streak")
    assert result.tool_calls <= 8
    told = [
        m.content for m in result.transcript if m.role == "user" and "failed" in (m.content or "")
    ]
    assert told, "the model was not told what went wrong"
    if name != "gemini":  # gemini's strike text carries the detail, not the listing
        assert any("readme.txt, sensor_1.csv" in (text or "") for text in told)


@pytest.mark.asyncio
async def test_a_clamped_threshold_is_said_in_the_result_and_an_event() -> None:
    import anyio

    from bus import Notice
    from orchestrator.runtime import Runtime
    from orchestrator.scenarios.runs import run_scenario
    from orchestrator.sim import shipped_scenarios

    dead_loop = next(s for s in shipped_scenarios() if s.name == "dead_loop")
    loop = {"generic_repeat": {"warn_at": 3, "break_at": 2}}  # runs as break_at = 4
    config = {**dict(dead_loop.config), "loop": loop}
    scenario = msgspec.structs.replace(dead_loop, config=config)
    async with Runtime(scenarios=[scenario]) as runtime:
        with anyio.fail_after(60):
            result = await run_scenario(runtime, scenario)
        events = runtime.event_log.events(result.run_id)
    said = (
        "loop config generic_repeat.break_at = 2 is not above generic_repeat.warn_at (3): using 4"
    )
    assert result.notes == (said,)
    assert [(e.kind, e.text) for e in events if isinstance(e, Notice)] == [("loop.config", said)]
    assert result.cause == "loop.generic_repeat"
    assert result.llm_requests == 4  # stopped before the 4th call, as break_at = 4 says
