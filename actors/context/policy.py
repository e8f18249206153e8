"""The context limits of one run: its window and what is kept free of it."""

from __future__ import annotations

from typing import Final

import msgspec

__all__ = [
    "OUTPUT_SHARE",
    "RESERVE_MAX",
    "SAFETY_BUFFER",
    "SAFETY_SHARE",
    "WINDOW_MAX",
    "ContextPolicy",
    "policy_problems",
    "scaled_reserve",
]

SAFETY_BUFFER: Final = 3_000
"""Tokens kept free below the window for estimation error (Claude Code's figure)."""
SAFETY_SHARE: Final = 10
"""The safety buffer is at most one tenth of the window (``window // 10``)."""
OUTPUT_SHARE: Final = 4
"""The output reservation (and the ``max_tokens`` sent) is at most a quarter of the window."""
WINDOW_MAX: Final = 10_000_000
"""The largest context window a run may be given (tokens); the largest models' are ~1M."""
RESERVE_MAX: Final = 1_000_000
"""The most tokens a policy keeps free (safety buffer, output reservation) or asks for in
one summary."""


class ContextPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """What the context gatekeeper enforces for one run.

    A request goes out only if its estimated prompt is at most :attr:`limit`:
    ``window - safety_buffer - output_reserve``.
    """

    window: int
    """The model's context window (tokens)."""
    safety_buffer: int = SAFETY_BUFFER
    output_reserve: int = 0
    """Tokens reserved for the answer: the requests' ``max_tokens``."""
    collapse_at: float = 0.8
    """Fold old tool results once the estimate passes this share of the limit; 0: never
    before a refusal."""
    collapse_to: float = 0.6
    """…until the estimate is below this share of the limit (fewer, larger folds keep an
    endpoint's prompt cache valid longer)."""
    keep_recent_turns: int = 2
    """Turns a compaction keeps verbatim."""
    fold_min_chars: int = 400
    """Shorter tool results are never folded (a stub would save next to nothing)."""
    summary_max_tokens: int = 1_024
    """The compaction call's ``max_tokens``."""
    silent_truncation_ratio: float = 0.5
    """Reported prompt tokens below this share of the estimate are flagged."""
    tool_result_share: float = 0.5
    """The tool results of one turn the model has not answered yet may take together at
    most this share of the room the run's fixed prompt (system prompt, task, tool schemas)
    leaves under the limit; past it they are cut to fit, each with a note saying how to
    read the rest (0: never cut)."""
    window_configured: bool = False
    """The window was set by the operator (``[context.windows]``, a run's
    ``context_window``): a window the server reports does not replace it."""

    @property
    def limit(self) -> int:
        """The largest prompt estimate that may be sent."""
        return self.window - self.safety_buffer - self.output_reserve


def scaled_reserve(value: int, *, default: int, window: int, share: int) -> int:
    """What a ``window`` keeps free for a reserve set to ``value``: a default value is
    capped at its share of the window (``window // share``); any other value was chosen
    by the operator and is kept as set (a reserve too large for the window is refused).
    What the defaults keep for each window: ``docs/context.md``."""
    return min(value, window // share) if value == default else value


def policy_problems(policy: ContextPolicy) -> list[tuple[str, str]]:
    """``(field, reason)`` for each value that makes ``policy`` unusable; empty when fine."""
    problems: list[tuple[str, str]] = []
    if not 1 <= policy.window <= WINDOW_MAX:
        problems.append(("window", f"must be from 1 to {WINDOW_MAX:,}"))
    if not 0 <= policy.safety_buffer <= RESERVE_MAX:
        problems.append(("safety_buffer", f"must be from 0 to {RESERVE_MAX:,}"))
    if not 0 <= policy.output_reserve <= RESERVE_MAX:
        problems.append(("output_reserve", f"must be from 0 to {RESERVE_MAX:,}"))
    if not problems and policy.limit < 1:
        problems.append(
            (
                "safety_buffer",
                f"the safety buffer ({policy.safety_buffer:,}) and the output reservation "
                f"({policy.output_reserve:,}) leave no room in the {policy.window:,}-token "
                "context window",
            )
        )
    if not 0.0 <= policy.collapse_at <= 1.0:
        problems.append(("collapse_at", "must be between 0 (off) and 1"))
    if not 0.0 < policy.collapse_to <= 1.0:
        problems.append(("collapse_to", "must be above 0 and at most 1"))
    elif policy.collapse_at and policy.collapse_to > policy.collapse_at:
        problems.append(("collapse_to", "must not be above collapse_at"))
    if policy.keep_recent_turns < 1:
        problems.append(("keep_recent_turns", "must be at least 1"))
    if policy.fold_min_chars < 1:
        problems.append(("fold_min_chars", "must be at least 1"))
    if not 1 <= policy.summary_max_tokens <= RESERVE_MAX:
        problems.append(("summary_max_tokens", f"must be from 1 to {RESERVE_MAX:,}"))
    if not 0.0 < policy.silent_truncation_ratio < 1.0:
        problems.append(("silent_truncation_ratio", "must be between 0 and 1 (exclusive)"))
    if not 0.0 <= policy.tool_result_share <= 1.0:
        problems.append(("tool_result_share", "must be between 0 (off) and 1"))
    return problems
