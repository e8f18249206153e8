"""Named presets: each behaves like that system's detection, off-by-ones included.

``STRICT`` (the default: the writing agent's result-aware breaker, seed 000), ``OPENCLAW``,
``OPENCLAW_CURRENT``, ``GEMINI`` and ``QWEN``; each also has issue #32's fuses (error
streak, unknown-tool storm, end of refusals). ``OFF`` disables every detector and is not in
``PRESETS``, which holds the presets that detect something. Every threshold, and each
deliberate difference from upstream: ``docs/loop-detection.md`` (Presets).
"""

from __future__ import annotations

from typing import Final

import msgspec

from actors.loop.config import (
    SECTIONS,
    CallCapConfig,
    ContentConfig,
    CycleConfig,
    ErrorStreakConfig,
    GenericRepeatConfig,
    GlobalBreakerConfig,
    LoopConfig,
    NoNewInformationConfig,
    PingPongConfig,
    PollConfig,
    PollTool,
    ReadLoopConfig,
    ShellStagnationConfig,
    StrikesConfig,
    ToolStagnationConfig,
    UnknownToolConfig,
)

__all__ = [
    "GEMINI",
    "GEMINI_RECOVERY_TEXT",
    "OFF",
    "OPENCLAW",
    "OPENCLAW_CURRENT",
    "PRESETS",
    "QWEN",
    "STRICT",
    "STRICT_NUDGE_TEXT",
]

STRICT_NUDGE_TEXT: Final = (
    "You are calling the same tool with the same arguments again. What you have read is "
    "enough: call finish_exploration now and give your conclusions."
)

GEMINI_RECOVERY_TEXT: Final = (
    "System: Potential loop detected. Details: {detail}. Please take a step back and confirm "
    "you're making forward progress. If not, take a step back, analyze your previous actions "
    "and rethink how you're approaching the problem. Avoid repeating the same tool calls or "
    "responses without new results."
)

_OFF_POLL: Final = PollConfig(enabled=False)
_OFF_PING_PONG: Final = PingPongConfig(enabled=False)
_OFF_GLOBAL: Final = GlobalBreakerConfig(enabled=False)

# Issue #32's fuses, in every preset: failing calls in a row, and unknown-tool results of
# any name, each nudged at 3 and stopped at 6 (why: docs/loop-detection.md, Presets).
_ERROR_STREAK: Final = ErrorStreakConfig(enabled=True, warn_at=3, break_at=6)
_UNKNOWN_TOOL: Final = UnknownToolConfig(
    enabled=True, block_at=None, storm_warn_at=3, storm_break_at=6
)

STRICT: Final = LoopConfig(
    name="strict",
    exempt_tools=("finish_exploration",),
    warning_bucket=None,
    nudge_once_per_kind=True,
    generic_repeat=GenericRepeatConfig(
        scope="run",
        include_proposed=True,
        skip_poll_tools=False,
        warn_at=3,
        break_at=5,
        warn_text=STRICT_NUDGE_TEXT,
        warn_needs_no_progress=True,
        stop_needs_no_progress=True,
        progress_warn_at=20,
        progress_break_at=50,
    ),
    poll_no_progress=_OFF_POLL,
    ping_pong=_OFF_PING_PONG,
    global_breaker=_OFF_GLOBAL,
    no_new_information=NoNewInformationConfig(enabled=True, warn_at=5, break_at=10),
    unknown_tool=msgspec.structs.replace(_UNKNOWN_TOOL, warn_at=2, break_at=4),
    error_streak=_ERROR_STREAK,
)

OPENCLAW: Final = LoopConfig(
    name="openclaw",
    history_size=30,
    poll_tools=(PollTool(name="command_status"), PollTool(name="process", actions=("poll", "log"))),
    warning_bucket=10,
    generic_repeat=GenericRepeatConfig(scope="window", warn_at=10),
    poll_no_progress=PollConfig(warn_at=10, block_at=20),
    ping_pong=PingPongConfig(warn_at=10, block_at=20),
    global_breaker=GlobalBreakerConfig(mode="streak", break_at=30),
    unknown_tool=_UNKNOWN_TOOL,
    error_streak=_ERROR_STREAK,
)

GEMINI: Final = LoopConfig(
    name="gemini",
    record_blocked=True,
    warning_bucket=None,
    generic_repeat=GenericRepeatConfig(
        scope="consecutive",
        include_proposed=True,
        skip_poll_tools=False,
        warn_at=None,
        block_at=5,
        stop_needs_no_progress=True,  # deliberate: gemini-cli ignores results
        progress_block_at=50,  # a strike, as every finding under strikes
    ),
    poll_no_progress=_OFF_POLL,
    ping_pong=_OFF_PING_PONG,
    global_breaker=_OFF_GLOBAL,
    cycle=CycleConfig(enabled=True, min_period=2, max_period=5, window=25, block_at=5),
    content=ContentConfig(enabled=True),
    strikes=StrikesConfig(stop_at=2, text=GEMINI_RECOVERY_TEXT),
    # every finding is a strike: one level, refused (strike 1) after 5 failures in a row
    unknown_tool=UnknownToolConfig(enabled=True, block_at=None, storm_block_at=5),
    error_streak=ErrorStreakConfig(enabled=True, warn_at=None, block_at=5, break_at=None),
)

OPENCLAW_CURRENT: Final = msgspec.structs.replace(
    OPENCLAW,
    name="openclaw-current",
    generic_repeat=GenericRepeatConfig(
        scope="window", warn_at=10, block_at=20, stop_needs_no_progress=True
    ),
    unknown_tool=msgspec.structs.replace(OPENCLAW.unknown_tool, block_at=10),
)

QWEN: Final = LoopConfig(
    name="qwen",
    warning_bucket=None,
    generic_repeat=GenericRepeatConfig(
        scope="consecutive",
        include_proposed=True,
        skip_poll_tools=False,
        warn_at=None,
        break_at=5,
        warn_needs_no_progress=True,
        stop_needs_no_progress=True,  # deliberate: qwen-code does this for task_list only
        progress_warn_at=20,
        progress_break_at=50,
    ),
    poll_no_progress=_OFF_POLL,
    ping_pong=_OFF_PING_PONG,
    global_breaker=_OFF_GLOBAL,
    # deliberate: a call whose result made progress is not counted by any stagnation rule
    tool_stagnation=ToolStagnationConfig(enabled=True, break_at=8, progress_resets=True),
    shell_stagnation=ShellStagnationConfig(enabled=True, break_at=8, progress_resets=True),
    read_loop=ReadLoopConfig(enabled=True, break_at=8, count_no_progress=True),
    call_cap=CallCapConfig(
        enabled=True, soft_cap=100, stuck_repeats=6, hard_cap=1000, count_no_progress=True
    ),
    unknown_tool=_UNKNOWN_TOOL,
    error_streak=_ERROR_STREAK,
    content=ContentConfig(
        enabled=True,
        max_history=1000,
        max_mean_distance=75,
        max_distinct_periods=None,
        stop_at_offence=1,
    ),
)

PRESETS: Final[dict[str, LoopConfig]] = {
    preset.name: preset for preset in (STRICT, OPENCLAW, OPENCLAW_CURRENT, GEMINI, QWEN)
}

OFF: Final = LoopConfig(
    name="off",
    **{
        name: msgspec.structs.replace(getattr(LoopConfig(), name), enabled=False)
        for name in SECTIONS
    },
)
"""Loop detection off: what ``loop_preset = "off"`` runs with (and a run with no config)."""
