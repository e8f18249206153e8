"""Named presets: each behaves like that system's detection, off-by-ones included.

* ``STRICT`` (the default): the writing agent's breaker (seed 000), result-aware. The same
  call with the same result, anywhere in the run (not necessarily consecutive), nudges once
  at its 3rd occurrence and stops the run at its 5th, before it runs; a repeat whose result
  changed is progress (a poll reporting its status), capped only by the progress ceiling
  (nudge at the 20th call, stop at the 50th). Different calls returning the same result
  nudge when 5 in a row did and stop at 10 (no new information); a tool that does not
  exist nudges at its 3rd attempt and stops at its 5th. ``finish_exploration`` is exempt;
  different arguments (a continued read at another offset) are different calls.
* ``OPENCLAW``: OpenClaw's tool-loop detection (four detectors) with its enforcement:
  a 30-call window; generic repeat warns when 10 identical calls are already in the window
  (the 11th) and never blocks; a poll without progress warns at the 11th and is refused
  from the 21st; ping-pong warns at the 10th alternating call and is refused at the 20th
  when both sides' results are unchanged; the global breaker fires at the 31st identical
  call with identical results. Warnings are given at counts 10, 20, 30 of a key only;
  refused calls are not recorded (a refused ping-pong call still counts toward its
  alternation, so its refusals come in a row and the end of refusals stops it: call 30).
* ``GEMINI``: gemini-cli's loop detection: 5 identical consecutive calls with identical
  results (result-aware, unlike upstream: a repeat whose result changed is progress, capped
  at the 50th consecutive call), cycles of period 2..5 repeated 5 times in the last 25 calls
  (the 10th call of A,B…, the 15th of period 3), content chanting; strike 1 refuses the call
  (or cuts the stream) and injects gemini's recovery text, strike 2 stops the run.
* ``OPENCLAW_CURRENT``: OpenClaw's current release: ``OPENCLAW`` plus the generic repeat
  refused at the 21st identical call whose last 20 results were identical, and the
  unknown-tool detector (a missing tool's 11th attempt is refused).
* ``QWEN``: qwen-code's loop detection with its heuristics on: 5 consecutive identical
  calls with identical results stop the run (result-aware for every tool, where qwen-code
  is for its stateful read tool ``task_list`` only; a repeat whose result changed is
  progress: nudge at the 20th, stop at the 50th), 8 git-overview shell commands in a row, 8
  consecutive calls of one tool (a call whose result changed restarts it), 8 read-like calls
  in the last 15 (after a non-read call), the per-run cap (past 100 calls with a call made
  6 times, or past 1000), content chanting (qwen's thresholds, no distinct-periods rule).
* Every preset above also has issue #32's fuses: an error streak (failing calls in a row,
  any tool and arguments: a nudge quoting the errors after 3, a stop after 6; under gemini
  one strike after 5), unknown-tool storms (the run's unknown-tool results of any name: the
  same counts) and the end of refusals (``refusal_limit``: after 10 without progress in
  between, the next one stops the run). Under ``QWEN`` a call whose result made progress
  (new in the run, or changed for that call, and not an error) is counted by none of its
  stagnation rules.
* ``OFF``: every detector disabled (``loop_preset = "off"``): fuses off, for comparisons.
  It is not in ``PRESETS``, which holds the presets that detect something.

The deliberate differences are listed in ``docs/loop-detection.md``.
"""

from __future__ import annotations

from typing import Final

from actors.loop.config import (
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

# Issue #32's fuses, in every preset. Failing calls in a row: the nudge after 3 quotes the
# errors, the 7th call after 6 failures is not run. A real 135M model made 9–13 failing
# read_file calls in a row on invented paths (never recovering after the 3rd), while a run
# that recovers does so after one or two failures; 6 leaves a model that read the nudge
# three more tries. Unknown-tool results of any name (a model rotating invented names):
# nudge at 3, stop at 6, the same counts, so a storm is told as such (`loop.unknown_tool`).
_ERROR_STREAK: Final = ErrorStreakConfig(enabled=True, warn_at=3, break_at=6)
_STORM_WARN: Final = 3
_STORM_BREAK: Final = 6

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
    unknown_tool=UnknownToolConfig(
        enabled=True,
        warn_at=2,
        block_at=None,
        break_at=4,
        storm_warn_at=_STORM_WARN,
        storm_break_at=_STORM_BREAK,
    ),
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
    unknown_tool=UnknownToolConfig(
        enabled=True, block_at=None, storm_warn_at=_STORM_WARN, storm_break_at=_STORM_BREAK
    ),
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

_OPENCLAW_POLLS: Final = OPENCLAW.poll_tools

OPENCLAW_CURRENT: Final = LoopConfig(
    name="openclaw-current",
    history_size=30,
    poll_tools=_OPENCLAW_POLLS,
    warning_bucket=10,
    generic_repeat=GenericRepeatConfig(
        scope="window", warn_at=10, block_at=20, stop_needs_no_progress=True
    ),
    poll_no_progress=PollConfig(warn_at=10, block_at=20),
    ping_pong=PingPongConfig(warn_at=10, block_at=20),
    global_breaker=GlobalBreakerConfig(mode="streak", break_at=30),
    unknown_tool=UnknownToolConfig(
        enabled=True, block_at=10, storm_warn_at=_STORM_WARN, storm_break_at=_STORM_BREAK
    ),
    error_streak=_ERROR_STREAK,
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
    unknown_tool=UnknownToolConfig(
        enabled=True, block_at=None, storm_warn_at=_STORM_WARN, storm_break_at=_STORM_BREAK
    ),
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
    "strict": STRICT,
    "openclaw": OPENCLAW,
    "openclaw-current": OPENCLAW_CURRENT,
    "gemini": GEMINI,
    "qwen": QWEN,
}

OFF: Final = LoopConfig(
    name="off",
    generic_repeat=GenericRepeatConfig(enabled=False),
    poll_no_progress=_OFF_POLL,
    ping_pong=_OFF_PING_PONG,
    global_breaker=_OFF_GLOBAL,
    cycle=CycleConfig(enabled=False),
    content=ContentConfig(enabled=False),
)
"""Loop detection off: what ``loop_preset = "off"`` runs with (and a run with no config)."""
