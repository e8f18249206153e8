"""The loop detector's configuration: one frozen Struct per detector, thresholds per level.

Every threshold is compared with that detector's *count*; whether the count includes the
call being proposed is part of the detector's definition (``include_proposed``), because
that is where upstream systems differ by one. A threshold of ``None`` disables the level.

Levels: ``warn_at`` (a nudge, the call runs), ``block_at`` (the call is refused with a tool
error), ``break_at`` (the run stops before the call runs).
"""

from __future__ import annotations

import itertools
from typing import Annotated, Any, Final, Literal

import msgspec

__all__ = [
    "CHUNK_MAX",
    "CONTENT_HISTORY_MAX",
    "CONTENT_THRESHOLD_MAX",
    "CYCLE_WINDOW_MAX",
    "HISTORY_MAX",
    "PERIOD_MAX",
    "STRIKES_MAX",
    "THRESHOLD_MAX",
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


# Upper bounds, enforced when a config is decoded: each keeps a detector's work per call
# bounded (docs/security.md, "Bounded configuration"), far above any preset's value.
THRESHOLD_MAX: Final = 100_000
"""A level's count (``warn_at``, ``block_at``, ``break_at``) and ``warning_bucket``."""
HISTORY_MAX: Final = 10_000
"""``history_size``: calls the shared window keeps (scanned per call by some detectors)."""
PERIOD_MAX: Final = 100
"""``cycle.min_period`` / ``cycle.max_period``: every period up to it is tried per call."""
CYCLE_WINDOW_MAX: Final = 10_000
"""``cycle.window``: calls the cycle detector keeps."""
CHUNK_MAX: Final = 1_000
"""``content.chunk_size``: characters hashed per streamed character."""
CONTENT_HISTORY_MAX: Final = 20_000
"""``content.max_history`` and ``content.max_mean_distance``: characters of streamed text
kept; the text between a chunk's last occurrences (at most this) is compared per character."""
CONTENT_THRESHOLD_MAX: Final = 100
"""``content.threshold`` and ``content.max_distinct_periods``."""
STRIKES_MAX: Final = 100
"""``content.stop_at_offence`` and ``strikes.stop_at``."""

Threshold = Annotated[int, msgspec.Meta(ge=1, le=THRESHOLD_MAX)]
Period = Annotated[int, msgspec.Meta(ge=1, le=PERIOD_MAX)]
Strikes = Annotated[int, msgspec.Meta(ge=1, le=STRIKES_MAX)]
ContentLength = Annotated[int, msgspec.Meta(ge=1, le=CONTENT_HISTORY_MAX)]


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
    warn_at: Threshold | None = 10
    block_at: Threshold | None = None
    break_at: Threshold | None = None
    warn_text: str | None = None
    """Replaces the warning's nudge text (the strict breaker's "call finish_exploration")."""


class PollConfig(_Config, frozen=True, kw_only=True):
    """Detector 2: a poll tool called again with the same arguments and the same result.

    The count is the streak of identical results of this call, newest first; a different
    result ends it (a poll that reports progress is not a loop).
    """

    enabled: bool = True
    include_proposed: bool = False
    warn_at: Threshold | None = 10
    block_at: Threshold | None = 20
    break_at: Threshold | None = None


class PingPongConfig(_Config, frozen=True, kw_only=True):
    """Detector 3: two calls alternating A,B,A,B… (the proposed call counted).

    Blocking and breaking need no-progress evidence (every call of the tail has a result,
    all A results equal, all B results equal) when ``stop_needs_no_progress``; warnings
    need it too when ``warn_needs_no_progress``.
    """

    enabled: bool = True
    warn_at: Threshold | None = 10
    block_at: Threshold | None = 20
    break_at: Threshold | None = None
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
    warn_at: Threshold | None = None
    block_at: Threshold | None = None
    break_at: Threshold | None = 30


class CycleConfig(_Config, frozen=True, kw_only=True):
    """Detector 5: the last ``repeats × k`` calls (the proposed one included) repeat with a
    period ``k`` in ``min_period..max_period``, looked for in the last ``window`` calls.

    The count is the number of whole repetitions of the period at the end of the window.
    """

    enabled: bool = False
    min_period: Period = 2
    max_period: Period = 5
    window: Annotated[int, msgspec.Meta(ge=1, le=CYCLE_WINDOW_MAX)] = 25
    warn_at: Threshold | None = None
    block_at: Threshold | None = 5
    break_at: Threshold | None = None


class ContentConfig(_Config, frozen=True, kw_only=True):
    """Detector 6: streamed text repeating itself (gemini-cli's chunk algorithm).

    A ``chunk_size`` window slides over the last ``max_history`` characters; a chunk seen
    ``threshold`` times whose last occurrences are on average at most ``max_mean_distance``
    apart, with at most ``max_distinct_periods`` different texts between them (``None``:
    no such rule), is a loop. The first offence cuts the stream and nudges; offence number
    ``stop_at_offence`` stops the run.
    """

    enabled: bool = False
    chunk_size: Annotated[int, msgspec.Meta(ge=1, le=CHUNK_MAX)] = 50
    threshold: Annotated[int, msgspec.Meta(ge=2, le=CONTENT_THRESHOLD_MAX)] = 10
    max_history: ContentLength = 5000
    max_mean_distance: ContentLength = 250
    max_distinct_periods: Annotated[int, msgspec.Meta(ge=1, le=CONTENT_THRESHOLD_MAX)] | None = 5
    stop_at_offence: Strikes = 2


class StrikesConfig(_Config, frozen=True, kw_only=True):
    """gemini-cli's escalation: every detection is a strike, counted across detectors.

    A strike below ``stop_at`` refuses the call (or cuts the stream) and injects ``text``
    (``{detail}`` is replaced); strike ``stop_at`` stops the run.
    """

    stop_at: Strikes = 2
    text: str = "Potential loop detected. Details: {detail}."


class PollTool(_Config, frozen=True, kw_only=True):
    """A poll tool: ``name``, and when ``actions`` is not empty, only calls whose
    ``action`` argument is one of them."""

    name: str
    actions: tuple[str, ...] = ()


class LoopConfig(_Config, frozen=True, kw_only=True):
    """Everything the loop detector reads. Presets are instances (see ``presets``)."""

    name: str = "custom"
    history_size: Annotated[int, msgspec.Meta(ge=1, le=HISTORY_MAX)] = 30
    exempt_tools: tuple[str, ...] = ()
    poll_tools: tuple[PollTool, ...] = ()
    record_blocked: bool = False
    warning_bucket: Threshold | None = 10
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
