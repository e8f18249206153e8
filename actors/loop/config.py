"""The loop detector's configuration: one frozen Struct per detector, thresholds per level.

Every threshold is compared with that detector's *count*; whether the count includes the
call being proposed is part of the detector's definition (``include_proposed``), because
that is where upstream systems differ by one. A threshold of ``None`` disables the level.

Levels: ``warn_at`` (a nudge, the call runs), ``block_at`` (the call is refused with a tool
error), ``break_at`` (the run stops before the call runs).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Annotated, Any, AnyStr, ClassVar, Final, Literal

import msgspec
import re2

__all__ = [
    "CHUNK_MAX",
    "CONTENT_HISTORY_MAX",
    "CONTENT_THRESHOLD_MAX",
    "CYCLE_WINDOW_MAX",
    "HISTORY_MAX",
    "LEVELLED",
    "PATTERNS_MAX",
    "PATTERN_CHARS_MAX",
    "PERIOD_MAX",
    "SECTIONS",
    "STRIKES_MAX",
    "THRESHOLD_MAX",
    "CallCapConfig",
    "ContentConfig",
    "CycleConfig",
    "ErrorStreakConfig",
    "GenericRepeatConfig",
    "GlobalBreakerConfig",
    "LlmCheckConfig",
    "LoopConfig",
    "LoopConfigError",
    "NoNewInformationConfig",
    "PingPongConfig",
    "PollConfig",
    "PollTool",
    "ReadLoopConfig",
    "ResultPattern",
    "Section",
    "ShellStagnationConfig",
    "StrikesConfig",
    "ToolStagnationConfig",
    "UnknownToolConfig",
    "check_config",
    "compile_pattern",
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
PATTERNS_MAX: Final = 32
"""``result_patterns``: extra normalisation patterns (each one is a pass over a result)."""
PATTERN_CHARS_MAX: Final = 200
"""A ``result_patterns`` pattern's length (its replacement: at most 40 characters)."""
NAMES_MAX: Final = 64
"""Tool names in one list (``read_loop.read_tools``, ``no_progress_tools``, ...)."""

if TYPE_CHECKING:
    from re2 import _Regexp

logger = logging.getLogger("loopfuse.loop")

Threshold = Annotated[int, msgspec.Meta(ge=1, le=THRESHOLD_MAX)]
Period = Annotated[int, msgspec.Meta(ge=1, le=PERIOD_MAX)]
Strikes = Annotated[int, msgspec.Meta(ge=1, le=STRIKES_MAX)]
ContentLength = Annotated[int, msgspec.Meta(ge=1, le=CONTENT_HISTORY_MAX)]
Names = Annotated[tuple[str, ...], msgspec.Meta(max_length=NAMES_MAX)]


class _Config(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Base of every config Struct."""


class Section(_Config, frozen=True, kw_only=True):
    """Base of a detector's section of :class:`LoopConfig` (the field is named after the
    detector in ``actors.loop.registry``). ``stops``: the fields a request may only lower
    (lower stops sooner: ``orchestrator.daemon.loop_floor``); every other field of an
    enabled section is the operator's."""

    stops: ClassVar[frozenset[str]] = frozenset({"break_at"})
    enabled: bool = False


class GenericRepeatConfig(Section, frozen=True, kw_only=True):
    """Detector 1: the same call fingerprint N times, whatever its results.

    ``scope``: ``window`` counts the last ``LoopConfig.history_size`` calls (OpenClaw),
    ``run`` counts the whole run (the strict breaker), ``consecutive`` counts an unbroken
    streak of the same call (gemini-cli).
    """

    stops: ClassVar[frozenset[str]] = frozenset({"break_at", "progress_break_at"})

    enabled: bool = True
    scope: Literal["window", "run", "consecutive"] = "window"
    include_proposed: bool = False
    skip_poll_tools: bool = True
    warn_at: Threshold | None = 10
    block_at: Threshold | None = None
    break_at: Threshold | None = None
    warn_text: str | None = None
    """Replaces the warning's nudge text (the strict breaker's "call finish_exploration")."""
    warn_needs_no_progress: bool = False
    """The warning counts only repeats with an unchanged result (see below)."""
    stop_needs_no_progress: bool = False
    """``block_at`` / ``break_at`` count only repeats with an unchanged result: the count is
    the call's streak of identical (normalised) results, calls still waiting for their result
    included (in ``window`` scope: OpenClaw's streak, which skips them). A call whose result
    changed is progress: it restarts the streak and counts only under ``progress_*``."""
    no_progress_tools: Names = ()
    """When not empty, the two ``*_needs_no_progress`` rules apply to these tools only
    (qwen-code's stateful read tools); other tools count every repeat."""
    progress_warn_at: Threshold | None = None
    """The ceiling on an identical call whose results keep changing (a poll that reports
    progress): every occurrence in the scope counts (``loop.progress_ceiling``)."""
    progress_block_at: Threshold | None = None
    progress_break_at: Threshold | None = None


class PollConfig(Section, frozen=True, kw_only=True):
    """Detector 2: a poll tool called again with the same arguments and the same result.

    The count is the streak of identical results of this call, newest first; a different
    result ends it (a poll that reports progress is not a loop).
    """

    enabled: bool = True
    include_proposed: bool = False
    warn_at: Threshold | None = 10
    block_at: Threshold | None = 20
    break_at: Threshold | None = None


class PingPongConfig(Section, frozen=True, kw_only=True):
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


class GlobalBreakerConfig(Section, frozen=True, kw_only=True):
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


class CycleConfig(Section, frozen=True, kw_only=True):
    """Detector 5: the last ``repeats × k`` calls (the proposed one included) repeat with a
    period ``k`` in ``min_period..max_period``, looked for in the last ``window`` calls.

    The count is the number of whole repetitions of the period at the end of the window.
    """

    min_period: Period = 2
    max_period: Period = 5
    window: Annotated[int, msgspec.Meta(ge=1, le=CYCLE_WINDOW_MAX)] = 25
    warn_at: Threshold | None = None
    block_at: Threshold | None = 5
    break_at: Threshold | None = None


class ContentConfig(Section, frozen=True, kw_only=True):
    """Detector 6: streamed text repeating itself (gemini-cli's chunk algorithm).

    A ``chunk_size`` window slides over the last ``max_history`` characters; a chunk seen
    ``threshold`` times whose last occurrences are on average at most ``max_mean_distance``
    apart, with at most ``max_distinct_periods`` different texts between them (``None``:
    no such rule), is a loop. The first offence cuts the stream and nudges; offence number
    ``stop_at_offence`` stops the run.
    """

    stops: ClassVar[frozenset[str]] = frozenset({"stop_at_offence"})

    chunk_size: Annotated[int, msgspec.Meta(ge=1, le=CHUNK_MAX)] = 50
    threshold: Annotated[int, msgspec.Meta(ge=2, le=CONTENT_THRESHOLD_MAX)] = 10
    max_history: ContentLength = 5000
    max_mean_distance: ContentLength = 250
    max_distinct_periods: Annotated[int, msgspec.Meta(ge=1, le=CONTENT_THRESHOLD_MAX)] | None = 5
    stop_at_offence: Strikes = 2


class NoNewInformationConfig(Section, frozen=True, kw_only=True):
    """Detector 7: the same (normalised) result coming back from different calls.

    The count is the streak of consecutive results (newest first) equal to the latest one,
    among calls of at least two different fingerprints (one call repeated is
    ``generic_repeat``'s). A result shorter than ``min_result_chars`` (``""``, ``ok``)
    neither counts nor ends the streak; a refusal by this detector counts (it brought
    nothing new either), so ``break_at`` stays reachable after a block.
    """

    min_result_chars: Annotated[int, msgspec.Meta(ge=0, le=CONTENT_HISTORY_MAX)] = 16
    warn_at: Threshold | None = 5
    block_at: Threshold | None = None
    break_at: Threshold | None = 10


class UnknownToolConfig(Section, frozen=True, kw_only=True):
    """Detector 8: calls of a tool that does not exist (OpenClaw's ``unknown_tool_repeat``).

    The count is the streak of the proposed tool's latest consecutive unknown-tool results
    (the proposed call not counted), refusals by this detector included.

    ``storm_*``: the same levels for unknown-tool results of the run, any name (a model
    rotating invented names never repeats one). They apply while the latest result was an
    unknown-tool answer (a model that went back to real tools is not stopped for its
    earlier mistakes; its next unknown tool is counted with them).
    """

    warn_at: Threshold | None = None
    block_at: Threshold | None = 10
    break_at: Threshold | None = None
    storm_warn_at: Threshold | None = None
    storm_block_at: Threshold | None = None
    storm_break_at: Threshold | None = None


class ErrorStreakConfig(Section, frozen=True, kw_only=True):
    """Detector 14: consecutive failing tool calls, any tool, any arguments.

    The count is the streak of the latest results that were errors (an unknown tool
    included; any result that is not an error ends it), the proposed call not counted. The
    warning nudges once per streak with the errors the model got; a refusal is given once
    per count (the next one needs another failure), so the model can try again.
    """

    warn_at: Threshold | None = 3
    block_at: Threshold | None = None
    break_at: Threshold | None = 6


class ToolStagnationConfig(Section, frozen=True, kw_only=True):
    """Detector 9: consecutive calls of one tool name, whatever the arguments (qwen-code's
    action stagnation). The proposed call is counted."""

    warn_at: Threshold | None = None
    block_at: Threshold | None = None
    break_at: Threshold | None = 8
    progress_resets: bool = False
    """Count only calls without progress (``actors.loop.progress``: a result that is new
    in the run, or differs from the same call's previous one, and is not an error): such a
    call restarts the streak, and a call is counted once its result is known. qwen-code
    restarts it for its stateful read tools; the ``qwen`` preset for every call."""


class ShellStagnationConfig(Section, frozen=True, kw_only=True):
    """Detector 10: consecutive shell calls that only inspect a git repository's overview
    (qwen-code's shell-command stagnation): every segment of the command chain is
    ``git status``, ``git ls-files`` or a ``git diff`` naming no path. The proposed call is
    counted; any other call ends the streak, whatever its text."""

    tools: Names = ("run_shell_command",)
    argument: str = "command"
    warn_at: Threshold | None = None
    block_at: Threshold | None = None
    break_at: Threshold | None = 8
    progress_resets: bool = False
    """As ``tool_stagnation.progress_resets``: an overview command whose output made
    progress restarts the streak."""


class ReadLoopConfig(Section, frozen=True, kw_only=True):
    """Detector 11: read-like calls filling the last ``window`` calls (qwen-code's
    read-file loop). The proposed call is counted; with ``cold_start`` nothing fires until
    a call that is not read-like has been proposed (a run that only ever read is
    exploring)."""

    window: Annotated[int, msgspec.Meta(ge=1, le=CYCLE_WINDOW_MAX)] = 15
    read_tools: Names = ("read_file", "read_many_files", "list_directory", "zoom_image")
    read_prefixes: Names = ("read_", "list_")
    cold_start: bool = True
    count_no_progress: bool = False
    """Count only reads whose result is known and made no progress
    (``actors.loop.progress``): reading 30 different files is not a loop."""
    warn_at: Threshold | None = None
    block_at: Threshold | None = None
    break_at: Threshold | None = 8


class CallCapConfig(Section, frozen=True, kw_only=True):
    """Detector 12: calls per run (qwen-code's per-turn cap; a qwen "turn" is one prompt).

    Past ``soft_cap`` calls the run stops when some call has been made ``stuck_repeats``
    times, and past ``hard_cap`` whatever the calls (``None``: no such cap). The count is
    the calls of the run, the proposed one included."""

    stops: ClassVar[frozenset[str]] = frozenset({"soft_cap", "stuck_repeats", "hard_cap"})

    soft_cap: Threshold | None = 100
    stuck_repeats: Threshold = 6
    hard_cap: Threshold | None = 1000
    count_no_progress: bool = False
    """Count only calls whose result is known and made no progress
    (``actors.loop.progress``), for the caps and for ``stuck_repeats``: a long run of
    calls that each bring something new is not stopped."""


class LlmCheckConfig(Section, frozen=True, kw_only=True):
    """Detector 13: a model asked whether the run is looping (gemini-cli's LLM check).

    From turn ``first_turn`` on, every ``interval`` turns, a model (``model``: operator
    config only; empty: the run's own) reads the last ``history`` entries of the run and
    the task, and answers with its confidence that the run is stuck. A confidence of at
    least ``confidence`` is a loop: the first one nudges, loop number ``stop_at_offence``
    stops the run. After a "no loop" answer the next check comes after
    round(``min_interval`` + (``max_interval`` − ``min_interval``) × (1 − confidence))
    turns, so a confident "no" checks less often.
    """

    stops: ClassVar[frozenset[str]] = frozenset(
        {"stop_at_offence", "confidence", "first_turn", "interval", "min_interval", "max_interval"}
    )

    model: str = ""
    first_turn: Annotated[int, msgspec.Meta(ge=1, le=HISTORY_MAX)] = 30
    interval: Annotated[int, msgspec.Meta(ge=1, le=1000)] = 10
    min_interval: Annotated[int, msgspec.Meta(ge=1, le=1000)] = 5
    max_interval: Annotated[int, msgspec.Meta(ge=1, le=1000)] = 15
    confidence: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] = 0.9
    history: Annotated[int, msgspec.Meta(ge=1, le=200)] = 20
    max_tokens: Annotated[int, msgspec.Meta(ge=1, le=100_000)] = 512
    stop_at_offence: Strikes = 2


class ResultPattern(_Config, frozen=True, kw_only=True):
    """A normalisation pattern: matches of ``pattern`` (a Python regular expression) are
    replaced by ``replacement`` before a result is fingerprinted."""

    pattern: Annotated[str, msgspec.Meta(min_length=1, max_length=PATTERN_CHARS_MAX)]
    replacement: Annotated[str, msgspec.Meta(max_length=40)] = "<volatile>"


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
    no_new_information: NoNewInformationConfig = NoNewInformationConfig()
    unknown_tool: UnknownToolConfig = UnknownToolConfig()
    error_streak: ErrorStreakConfig = ErrorStreakConfig()
    tool_stagnation: ToolStagnationConfig = ToolStagnationConfig()
    shell_stagnation: ShellStagnationConfig = ShellStagnationConfig()
    read_loop: ReadLoopConfig = ReadLoopConfig()
    call_cap: CallCapConfig = CallCapConfig()
    llm_check: LlmCheckConfig = LlmCheckConfig()
    strikes: StrikesConfig | None = None
    refusal_limit: Threshold | None = 10
    """After this many refusals (calls not run because of a ``critical`` finding) without
    progress in between (a call run whose result is new: ``actors.loop.progress``), the
    next call that would be refused stops the run instead, with the refusing detector's
    cause: no config burns a budget on refusals.
    ``None``: refuse forever (upstream OpenClaw)."""
    normalise_results: bool = True
    """Volatile parts of a result (ids, pids, UUIDs, digests, timestamps, durations, temp
    paths) are replaced before it is fingerprinted (``actors.loop.normalise``)."""
    result_patterns: Annotated[
        tuple[ResultPattern, ...], msgspec.Meta(max_length=PATTERNS_MAX)
    ] = ()
    """More normalisation patterns, applied after the built-in ones. Operator config only:
    a run's ``loop`` table may not set them (``[loop] result_patterns``)."""


class LoopConfigError(ValueError):
    """A loop config value is out of range; the message names the key and the reason."""


def _positive(key: str, value: int | None) -> None:
    if value is not None and value < 1:
        raise LoopConfigError(f"{key}: must be a positive integer or null, got {value!r}")


SECTIONS: Final = tuple(
    field.name for field in msgspec.structs.fields(LoopConfig) if isinstance(field.default, Section)
)
"""The detectors' sections of :class:`LoopConfig`, in its order."""

_LEVELS: Final = ("warn_at", "block_at", "break_at")
_LEVEL_GROUPS: Final = (
    _LEVELS,
    ("progress_warn_at", "progress_block_at", "progress_break_at"),
    ("storm_warn_at", "storm_block_at", "storm_break_at"),
)
"""Thresholds that must increase, each group where a section has it."""

LEVELLED: Final = tuple(
    name for name in SECTIONS if _LEVELS[0] in getattr(LoopConfig(), name).__struct_fields__
)
"""The sections with ``warn_at`` / ``block_at`` / ``break_at``."""


def _clamped(prefix: str, section: Any, names: tuple[str, ...], notes: list[str]) -> dict[str, int]:
    """OpenClaw's normalisation of thresholds: a level not above the one before it becomes
    that level + 1 (with a warning logged and a note appended to ``notes``), instead of
    being refused."""
    changes: dict[str, int] = {}
    low_name, low = "", 0
    for name in names:
        value: int | None = getattr(section, name)
        _positive(f"{prefix}.{name}", value)
        if value is None:
            continue
        if low and value <= low:
            notes.append(
                f"loop config {prefix}.{name} = {value} is not above {prefix}.{low_name} "
                f"({low}): using {low + 1}"
            )
            logger.warning("%s", notes[-1])
            value = changes[name] = low + 1
        low_name, low = name, value
    return changes


def compile_pattern(key: str, pattern: AnyStr) -> _Regexp[AnyStr]:
    """``pattern`` compiled by RE2 (linear time on any text: operator patterns run on
    tool results), or a :class:`LoopConfigError` naming ``key`` and RE2's reason (a
    look-around or a back-reference is not RE2 syntax)."""
    options = re2.Options()
    options.log_errors = False  # the error is raised, not printed by the C++ library
    try:
        return re2.compile(pattern, options)
    except re2.error as exc:
        reason = exc.args[0] if exc.args else exc
        if isinstance(reason, bytes):
            reason = reason.decode("utf-8", "replace")
        raise LoopConfigError(f"{key}: not a regular expression RE2 accepts ({reason})") from None


def check_config(config: LoopConfig, *, notes: list[str] | None = None) -> LoopConfig:
    """``config`` if every value is in range, with levels that do not increase clamped as
    OpenClaw does (``block_at`` ≤ ``warn_at`` becomes ``warn_at`` + 1, with a warning
    logged and, with ``notes``, a sentence per clamped threshold appended to it); else
    raise :class:`LoopConfigError`."""
    for key in ("history_size", "warning_bucket", "refusal_limit"):
        _positive(key, getattr(config, key))
    replaced: dict[str, Any] = {}
    for name in LEVELLED:
        section = getattr(config, name)
        changes: dict[str, int] = {}
        for group in _LEVEL_GROUPS:
            if group[0] in section.__struct_fields__:
                changes.update(_clamped(name, section, group, [] if notes is None else notes))
        if changes:
            replaced[name] = msgspec.structs.replace(section, **changes)
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
    llm = config.llm_check
    try:  # its ranges: msgspec checks them when decoding, which a config built in Python skips
        msgspec.convert(msgspec.structs.asdict(llm), LlmCheckConfig)
    except msgspec.ValidationError as exc:
        raise LoopConfigError(f"llm_check: {exc}") from None
    if llm.max_interval < llm.min_interval:
        raise LoopConfigError("llm_check.max_interval: must be at least llm_check.min_interval")
    if len(config.result_patterns) > PATTERNS_MAX:
        raise LoopConfigError(f"result_patterns: at most {PATTERNS_MAX} patterns")
    for index, item in enumerate(config.result_patterns):
        if len(item.pattern) > PATTERN_CHARS_MAX:
            raise LoopConfigError(
                f"result_patterns.{index}.pattern: at most {PATTERN_CHARS_MAX} characters"
            )
        compile_pattern(f"result_patterns.{index}.pattern", item.pattern)
    return msgspec.structs.replace(config, **replaced) if replaced else config


def load_config(data: Any) -> LoopConfig:
    """A checked :class:`LoopConfig` from a mapping (unknown keys are errors)."""
    try:
        config = msgspec.convert(data, LoopConfig)
    except msgspec.ValidationError as exc:
        raise LoopConfigError(str(exc)) from None
    return check_config(config)
