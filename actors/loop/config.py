"""The loop detector's configuration: one frozen Struct per detector, thresholds per level.

Every threshold is compared with that detector's *count*; whether the count includes the
call being proposed is part of the detector's definition (``include_proposed``), because
that is where upstream systems differ by one. A threshold of ``None`` disables the level.

Levels: ``warn_at`` (a nudge, the call runs), ``block_at`` (the call is refused with a tool
error), ``break_at`` (the run stops before the call runs).
"""

from __future__ import annotations

import itertools
from typing import Any, Literal

import msgspec

__all__ = [
    "ContentConfig",
    "CycleConfig",
    "GenericRepeatConfig",
    "GlobalBreakerConfig",
    "LoopConfig",
    "LoopConfigError",
    "PingPongConfig",
    "PollConfig",
    "PollTool",
    "StrikesConfig",
    "check_config",
    "load_config",
]


class _Config(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Base of every config Struct."""


class GenericRepeatConfig(_Config, frozen=True, kw_only=True):
    """Detector 1: the same call fingerprint N times, whatever its results.

    ``scope``: ``window`` counts the last ``LoopConfig.history_size`` calls (OpenClaw),
    ``run`` counts the whole run (the strict breaker), ``consecutive`` counts an unbroken
    streak of the same call (gemini-cli).
    """

    enabled: bool = True
    scope: Literal["window", "run", "consecutive"] = "window"
    include_proposed: bool = False
    skip_poll_tools: bool = True
    warn_at: int | None = 10
    block_at: int | None = None
    break_at: int | None = None
    warn_text: str | None = None
    """Replaces the warning's nudge text (the strict breaker's "call finish_exploration")."""


class PollConfig(_Config, frozen=True, kw_only=True):
    """Detector 2: a poll tool called again with the same arguments and the same result.

    The count is the streak of identical results of this call, newest first; a different
    result ends it (a poll that reports progress is not a loop).
    """

    enabled: bool = True
    include_proposed: bool = False
    warn_at: int | None = 10
    block_at: int | None = 20
    break_at: int | None = None


class PingPongConfig(_Config, frozen=True, kw_only=True):
    """Detector 3: two calls alternating A,B,A,B… (the proposed call counted).

    Blocking and breaking need no-progress evidence (every call of the tail has a result,
    all A results equal, all B results equal) when ``stop_needs_no_progress``; warnings
    need it too when ``warn_needs_no_progress``.
    """

    enabled: bool = True
    warn_at: int | None = 10
    block_at: int | None = 20
    break_at: int | None = None
    warn_needs_no_progress: bool = False
    stop_needs_no_progress: bool = True


class GlobalBreakerConfig(_Config, frozen=True, kw_only=True):
    """Detector 4: no-progress calls.

    ``mode``: ``streak`` is OpenClaw's (the proposed call's streak of identical results,
    any tool); ``total`` counts every call of the run whose result equalled the previous
    result of the same call.
    """

    enabled: bool = True
    mode: Literal["streak", "total"] = "streak"
    warn_at: int | None = None
    block_at: int | None = None
    break_at: int | None = 30


class CycleConfig(_Config, frozen=True, kw_only=True):
    """Detector 5: the last ``repeats × k`` calls (the proposed one included) repeat with a
    period ``k`` in ``min_period..max_period``, looked for in the last ``window`` calls.

    The count is the number of whole repetitions of the period at the end of the window.
    """

    enabled: bool = False
    min_period: int = 2
    max_period: int = 5
    window: int = 25
    warn_at: int | None = None
    block_at: int | None = 5
    break_at: int | None = None


class ContentConfig(_Config, frozen=True, kw_only=True):
    """Detector 6: streamed text repeating itself (gemini-cli's chunk algorithm).

    A ``chunk_size`` window slides over the last ``max_history`` characters; a chunk seen
    ``threshold`` times whose last occurrences are on average at most ``max_mean_distance``
    apart, with at most ``max_distinct_periods`` different texts between them (``None``:
    no such rule), is a loop. The first offence cuts the stream and nudges; offence number
    ``stop_at_offence`` stops the run.
    """

    enabled: bool = False
    chunk_size: int = 50
    threshold: int = 10
    max_history: int = 5000
    max_mean_distance: int = 250
    max_distinct_periods: int | None = 5
    stop_at_offence: int = 2


class StrikesConfig(_Config, frozen=True, kw_only=True):
    """gemini-cli's escalation: every detection is a strike, counted across detectors.

    A strike below ``stop_at`` refuses the call (or cuts the stream) and injects ``text``
    (``{detail}`` is replaced); strike ``stop_at`` stops the run.
    """

    stop_at: int = 2
    text: str = "Potential loop detected. Details: {detail}."


class PollTool(_Config, frozen=True, kw_only=True):
    """A poll tool: ``name``, and when ``actions`` is not empty, only calls whose
    ``action`` argument is one of them."""

    name: str
    actions: tuple[str, ...] = ()


class LoopConfig(_Config, frozen=True, kw_only=True):
    """Everything the loop detector reads. Presets are instances (see ``presets``)."""

    name: str = "custom"
    history_size: int = 30
    exempt_tools: tuple[str, ...] = ()
    poll_tools: tuple[PollTool, ...] = ()
    record_blocked: bool = False
    warning_bucket: int | None = 10
    nudge_once_per_kind: bool = False
    generic_repeat: GenericRepeatConfig = GenericRepeatConfig()
    poll_no_progress: PollConfig = PollConfig()
    ping_pong: PingPongConfig = PingPongConfig()
    global_breaker: GlobalBreakerConfig = GlobalBreakerConfig()
    cycle: CycleConfig = CycleConfig()
    content: ContentConfig = ContentConfig()
    strikes: StrikesConfig | None = None


class LoopConfigError(ValueError):
    """A loop config value is out of range; the message names the key and the reason."""


def _positive(key: str, value: int | None) -> None:
    if value is not None and value < 1:
        raise LoopConfigError(f"{key}: must be a positive integer or null, got {value!r}")


def _ordered(prefix: str, warn: int | None, block: int | None, brk: int | None) -> None:
    for level, value in (("warn_at", warn), ("block_at", block), ("break_at", brk)):
        _positive(f"{prefix}.{level}", value)
    present = [(n, v) for n, v in (("warn_at", warn), ("block_at", block), ("break_at", brk)) if v]
    for (low_name, low), (high_name, high) in itertools.pairwise(present):
        if high <= low:
            raise LoopConfigError(
                f"{prefix}.{high_name}: must be greater than {prefix}.{low_name} ({low}), "
                f"got {high}"
            )


def check_config(config: LoopConfig) -> LoopConfig:
    """Return ``config`` if every value is in range, else raise :class:`LoopConfigError`."""
    _positive("history_size", config.history_size)
    _positive("warning_bucket", config.warning_bucket)
    for name in ("generic_repeat", "poll_no_progress", "ping_pong", "global_breaker", "cycle"):
        section = getattr(config, name)
        _ordered(name, section.warn_at, section.block_at, section.break_at)
    cycle = config.cycle
    _positive("cycle.min_period", cycle.min_period)
    if cycle.max_period < cycle.min_period:
        raise LoopConfigError("cycle.max_period: must be at least cycle.min_period")
    _positive("cycle.window", cycle.window)
    content = config.content
    for key in ("chunk_size", "threshold", "max_history", "max_mean_distance", "stop_at_offence"):
        _positive(f"content.{key}", getattr(content, key))
    _positive("content.max_distinct_periods", content.max_distinct_periods)
    if content.threshold < 2:
        raise LoopConfigError("content.threshold: must be at least 2")
    if config.strikes is not None:
        _positive("strikes.stop_at", config.strikes.stop_at)
    return config


def load_config(data: Any) -> LoopConfig:
    """A checked :class:`LoopConfig` from a mapping (unknown keys are errors)."""
    try:
        config = msgspec.convert(data, LoopConfig)
    except msgspec.ValidationError as exc:
        raise LoopConfigError(str(exc)) from None
    return check_config(config)
