"""Bounded configuration: every numeric setting has a range, enforced at decode.

The settings are enumerated from the types (``msgspec.inspect``), so a numeric field added
without an upper bound fails here. For every numeric key a run's config can set, its
largest and its smallest allowed value each go into a real run, which must end (a
generous CPU-per-turn ceiling catches unbounded work, not slowness), and one step past
either bound is refused with an error naming the key and the range.
"""

from __future__ import annotations

import math
import re
import time
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

from actors.hooks import HookDecision, HookInput
from actors.loop import LoopConfig, LoopDetector
from actors.loop.config import (
    CONTENT_HISTORY_MAX,
    CONTENT_THRESHOLD_MAX,
    CYCLE_WINDOW_MAX,
    HISTORY_MAX,
    PERIOD_MAX,
    THRESHOLD_MAX,
    ContentConfig,
    CycleConfig,
    GenericRepeatConfig,
    GlobalBreakerConfig,
    PingPongConfig,
    PollConfig,
)
from actors.loop.cycle import Cycle
from actors.loop.generic import GenericRepeat
from actors.loop.global_breaker import GlobalBreaker
from actors.loop.history import CallRecord, Window
from actors.loop.ping_pong import PingPong
from actors.loop.poll import PollNoProgress
from orchestrator.config import Config, RunSettings, load_config
from orchestrator.config_ranges import NumericRange
from orchestrator.errors import ConfigError
from orchestrator.runtime import Runtime
from orchestrator.scenarios.runs import start_scenario
from orchestrator.sim import Scenario, shipped_scenarios
from tests.config_docs import config_roots, doc_tables, numeric_ranges

DOCS = Path(__file__).resolve().parent.parent / "docs"
SHIPPED = {scenario.name: scenario for scenario in shipped_scenarios()}

CPU_PER_TURN_CEILING = 1.0
"""Seconds of CPU a turn may take with a setting at its bound: a hang detector (a turn
takes milliseconds), not a speed target."""
RUN_TIMEOUT = 60.0

UNBOUNDED_ALLOWED: dict[str, str] = {}
"""Numeric keys allowed to have no upper bound, each with the reason."""


def all_ranges() -> list[NumericRange]:
    return [found for prefix, kind in config_roots() for found in numeric_ranges(kind, prefix)]


def run_ranges() -> list[NumericRange]:
    """Every numeric key a run's config can set (``config.*``, ``config.loop.*``)."""
    return [found for found in all_ranges() if found.key.startswith("config.")]


# ---------------------------------------------------------------------------- the types


def test_every_numeric_setting_has_an_upper_bound() -> None:
    ranges = all_ranges()
    unbounded = [r.key for r in ranges if not r.bounded and r.key not in UNBOUNDED_ALLOWED]
    assert unbounded == [], f"numeric settings without a range: {unbounded}"
    keys = {r.key for r in ranges}
    assert set(UNBOUNDED_ALLOWED) <= keys, "the allowlist names keys that no longer exist"


def test_the_enumeration_reaches_every_detector_and_the_run_keys() -> None:
    keys = {r.key for r in run_ranges()}
    numbers = (msgspec.inspect.IntType, msgspec.inspect.FloatType)
    info = msgspec.inspect.type_info(RunSettings)
    assert isinstance(info, msgspec.inspect.StructType)
    numeric_run_fields = {
        f"config.{field.name}"
        for field in info.fields
        if isinstance(field.type, numbers)
        or (
            isinstance(field.type, msgspec.inspect.UnionType)
            and any(isinstance(member, numbers) for member in field.type.types)
        )
    }
    assert len(numeric_run_fields) >= 20
    assert numeric_run_fields <= keys
    for key in (
        "config.loop.cycle.max_period",
        "config.loop.content.max_history",
        "config.loop.history_size",
        "config.hooks.N.timeout_seconds",
        "config.context_window",
    ):
        assert key in keys


def test_the_docs_table_is_generated_from_the_types() -> None:
    text = (DOCS / "security.md").read_text(encoding="utf-8")
    section = text.split("## Bounded configuration", 1)[1].split("\n## ", 1)[0]
    for table in doc_tables():
        assert table in section, (
            "docs/security.md is out of date: regenerate its tables with "
            "`python -m tests.config_docs`"
        )


# ---------------------------------------------------------------------------- values


def _above(found: NumericRange) -> Any:
    """One step past the upper bound."""
    if found.lt is not None:
        return found.lt
    assert found.le is not None
    return found.le + 1 if found.kind == "integer" else math.nextafter(found.le, math.inf)


def _below(found: NumericRange) -> Any:
    """One step past the lower bound."""
    if found.gt is not None:
        return found.gt
    assert found.ge is not None
    return found.ge - 1 if found.kind == "integer" else math.nextafter(found.ge, -math.inf)


def _largest(found: NumericRange) -> Any:
    if found.le is not None:
        return found.le if found.kind == "number" else int(found.le)
    assert found.lt is not None
    return found.lt - 1 if found.kind == "integer" else math.nextafter(found.lt, -math.inf)


def _smallest(found: NumericRange) -> Any:
    if found.ge is not None:
        return found.ge if found.kind == "number" else int(found.ge)
    assert found.gt is not None
    return found.gt + 1 if found.kind == "integer" else math.nextafter(found.gt, math.inf)


def _error_key(key: str) -> str:
    return key.replace(".N.", ".0.")


# ---------------------------------------------------------------------------- overrides

HOOK = "allow_all"

# Quick to run: the same paragraph streamed at once, in 64-character pieces.
CONTENT_SCENARIO = msgspec.structs.replace(
    SHIPPED["content_loop"],
    name="bounded_content",
    steps=tuple(
        msgspec.structs.replace(step, text_tokens=2_000, chunk_size=64, chunk_latency=0.0)
        for step in SHIPPED["content_loop"].steps
    ),
)
SCENARIOS = {**SHIPPED, CONTENT_SCENARIO.name: CONTENT_SCENARIO}

# The scenario that exercises a loop section (the rest run dead_loop).
LOOP_SCENARIOS = {
    "history_size": "ping_pong",
    "warning_bucket": "ping_pong",
    "generic_repeat": "dead_loop",
    "poll_no_progress": "poll_no_progress",
    "ping_pong": "ping_pong",
    "global_breaker": "poll_no_progress",
    "cycle": "cycle3",
    "strikes": "cycle3",
    "content": CONTENT_SCENARIO.name,
    "no_new_information": "dead_loop",
    "unknown_tool": "dead_loop",
    "error_streak": "dead_loop",
    "refusal_limit": "ping_pong",
    "tool_stagnation": "dead_loop",
    "shell_stagnation": "dead_loop",
    "read_loop": "dead_loop",
    "call_cap": "dead_loop",
    "llm_check": "dead_loop",  # left off: the scenario's model does not answer checks
}
SWITCHED_ON = ("cycle", "tool_stagnation", "shell_stagnation", "read_loop", "call_cap")
"""Sections off in their scenario's preset: on, so that the bound is exercised."""
LEVELS = ("warn_at", "block_at", "break_at")
WIDE = {"context_window": 10_000_000, "max_output_tokens": None}
"""Room for the largest reservations: the largest window, no per-request cap."""

# Other keys a value needs to be valid at all (cross-key rules, e.g. a cost budget needs
# prices; the window must leave room for the reservations).
COMPANIONS: dict[str, dict[str, Any]] = {
    "context_safety_buffer": WIDE,
    "context_output_reserve": WIDE,
    "max_output_tokens": {"context_window": 10_000_000},
    "escalated_max_tokens": {"context_window": 10_000_000},
    "answer_max_tokens": {**WIDE, "on_stop": "answer"},
    "answer_deadline_seconds": {"on_stop": "answer"},
    "cost_budget": {"input_price_per_million": 1.0, "output_price_per_million": 1.0},
}


def _merged(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merged(merged[key], value)
        else:
            merged[key] = value
    return merged


def _overrides(key: str, value: Any) -> tuple[str, dict[str, Any]]:
    """The scenario to run and the run overrides that set ``key`` to ``value`` (with what
    else that value needs to be valid)."""
    parts = key.split(".")[1:]
    if parts[0] == "hooks":
        hook = {"kind": "python", "name": "h", "function": HOOK, parts[2]: value}
        return "dead_loop", {"max_turns": 8, "hooks": [hook]}
    if parts[0] != "loop":
        (name,) = parts
        overrides = {"max_turns": 8, **COMPANIONS.get(name, {})}
        if name == "context_window" and value == 1:
            overrides.update(context_safety_buffer=0, context_output_reserve=0)
            overrides["max_output_tokens"] = None
        return "dead_loop", {**overrides, name: value}
    section, field = parts[1], parts[-1]
    setting: dict[str, Any] = {field: value}
    if field in LEVELS:  # levels must be ordered: this one alone
        setting = dict.fromkeys(LEVELS) | setting
    if section in SWITCHED_ON:
        setting["enabled"] = True
    if section == "llm_check":  # max_interval must not be below min_interval
        if field == "min_interval":
            setting["max_interval"] = max(value, 15)
        elif field == "max_interval":
            setting["min_interval"] = max(min(value, 5), 1)
    if section == "cycle":
        if field == "min_period":  # max_period must not be below it
            setting["max_period"] = min(max(value, 5), PERIOD_MAX)
        elif field == "max_period":  # nor min_period above it
            setting["min_period"] = max(min(value, 2), 1)
    loop = setting if len(parts) == 2 else {section: setting}
    return LOOP_SCENARIOS[section], {"max_turns": 8, "loop": loop}


def _scenario(name: str, overrides: dict[str, Any]) -> Scenario:
    scenario = SCENARIOS[name]
    return msgspec.structs.replace(scenario, config=_merged(dict(scenario.config), overrides))


async def _allow(call: HookInput) -> HookDecision:
    return HookDecision()


def _past(found: NumericRange) -> list[Any]:
    """Values one step past each bound, and ones no bound admits."""
    far = (math.inf, -math.inf, math.nan) if found.kind == "number" else (10**30, -(10**30))
    return [_above(found), _below(found), *far]


@pytest.mark.asyncio
@pytest.mark.parametrize("found", run_ranges(), ids=lambda found: found.key)
async def test_a_setting_at_either_bound_runs_to_its_end_and_one_past_is_refused(
    found: NumericRange,
) -> None:
    async with Runtime(scenarios=[CONTENT_SCENARIO], hook_functions={HOOK: _allow}) as runtime:
        for value in (_largest(found), _smallest(found)):
            name, overrides = _overrides(found.key, value)
            cpu = time.process_time()
            with anyio.fail_after(RUN_TIMEOUT):
                handle = await start_scenario(runtime, _scenario(name, overrides))
                result = await handle.result()
            cpu = time.process_time() - cpu
            assert result.exit_reason is not None
            assert cpu / max(result.turns, 1) < CPU_PER_TURN_CEILING, (value, cpu)
        active = runtime.active_runs
        for value in _past(found):
            name, overrides = _overrides(found.key, value)
            with pytest.raises(ConfigError) as caught:
                await start_scenario(runtime, _scenario(name, overrides))
            assert caught.value.key == _error_key(found.key), value
            assert found.describe() in caught.value.reason, value
        assert runtime.active_runs <= active  # none of them started


def test_the_probe_is_refused_with_the_key_and_the_range() -> None:
    from actors.loop import STRICT
    from orchestrator.config import merge_loop_overrides

    with pytest.raises(ConfigError) as caught:
        merge_loop_overrides(STRICT, {"cycle": {"enabled": True, "max_period": 10**30}})
    assert str(caught.value) == (
        "run: config key 'config.loop.cycle.max_period': Expected `int` <= 100 "
        "(a positive integer, at most 100)"
    )


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("[budget]\nmax_turns = 10001", "budget.max_turns"),
        ("[budget]\ndeadline_seconds = inf", "budget.deadline_seconds"),
        ("[model]\ntimeout_seconds = nan", "model.timeout_seconds"),
        ("[tools]\ncache_ttl_seconds = 1e300", "tools.cache_ttl_seconds"),
        ("[context]\ndefault_window = 10000001", "context.default_window"),
        ("[context.windows]\ngpt = 10000001", 'context.windows."gpt"'),
        ('[prices."m"]\ninput_per_million = inf\noutput_per_million = 1', 'prices."m"'),
        ("[daemon]\nevent_cap = 10000001", "daemon.event_cap"),
        ("[[hooks]]\nkind = 'python'\nname = 'h'\nfunction = 'f'\ntimeout_seconds = inf", "hooks"),
    ],
)
def test_the_config_file_is_bounded_too(tmp_path: Path, text: str, key: str) -> None:
    path = tmp_path / "loopfuse.toml"
    path.write_text(text + "\n", encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_config(path, environ={})
    assert caught.value.key.startswith(key)
    assert re.search(r"at most|<", caught.value.reason) or "nan" in text


def test_every_in_range_default_still_loads() -> None:
    assert load_config(environ={}) == Config()


# ---------------------------------------------------------------------------- worst cases


def _cpu(call: Any) -> float:
    start = time.process_time()
    call()
    return time.process_time() - start


def test_the_tool_call_detectors_at_their_bounds_with_full_windows_answer_a_call() -> None:
    """Each tool-call detector with every size at its bound and its window full of a
    sequence that makes it look hardest (period 7, identical results: every other period
    is tried, every streak runs the whole window); one proposed call each."""
    never = THRESHOLD_MAX
    window = Window(HISTORY_MAX)
    cycle = Cycle(
        CycleConfig(
            enabled=True,
            min_period=1,
            max_period=PERIOD_MAX,
            window=CYCLE_WINDOW_MAX,
            block_at=never,
        )
    )
    for n in range(max(HISTORY_MAX, CYCLE_WINDOW_MAX)):
        record = CallRecord("poll", f"call {n % 7}", f"c{n}", True, result="same")
        window.append(record)
        cycle.record(record)
    detectors = (
        cycle,
        GenericRepeat(GenericRepeatConfig(scope="window", warn_at=never)),
        PollNoProgress(PollConfig(warn_at=never)),
        PingPong(PingPongConfig(warn_at=never)),
        GlobalBreaker(GlobalBreakerConfig(break_at=never)),
    )
    proposed = CallRecord("poll", "call 0", "last", True)
    for detector in detectors:
        cpu = _cpu(lambda d=detector: d.check(proposed, window))
        assert cpu < CPU_PER_TURN_CEILING, type(detector).__name__


def test_the_content_detector_at_its_bounds_reads_a_reply_in_bounded_time() -> None:
    """The content detector at its largest sizes, fed text built to make it compare the
    most: every character recurs about every 100 characters, never twice alike."""
    import random

    config = LoopConfig(
        content=ContentConfig(
            enabled=True,
            chunk_size=1,
            threshold=CONTENT_THRESHOLD_MAX,
            max_history=CONTENT_HISTORY_MAX,
            max_mean_distance=CONTENT_HISTORY_MAX,
            max_distinct_periods=1,
        )
    )
    detector = LoopDetector(config)
    shuffled = random.Random(7)
    alphabet = [chr(0x4E00 + n) for n in range(100)]
    pieces: list[str] = []
    for _ in range(100):
        shuffled.shuffle(alphabet)
        pieces.append("".join(alphabet))
    text = "".join(pieces)  # 10,000 characters

    def feed() -> None:
        for start in range(0, len(text), 32):
            detector.feed_text(text[start : start + 32])

    assert _cpu(feed) < CPU_PER_TURN_CEILING
