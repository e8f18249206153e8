"""How a run ended: the seven exit reasons and the two outcomes.

Every ending tells the user three things: that it stopped, why (reason + cause + detail),
and what to do next (the cause's hint); the causes are declared in :mod:`bus.causes`.
"""

from __future__ import annotations

import enum

__all__ = [
    "ExitReason",
    "Outcome",
    "outcome_of",
]


class ExitReason(enum.StrEnum):
    """How a run ended. Exactly seven members; every later feature maps onto one of them."""

    COMPLETED = "completed"
    MAX_TURNS = "max_turns"
    ABORTED_STREAMING = "aborted_streaming"
    ABORTED_TOOLS = "aborted_tools"
    HOOK_STOPPED = "hook_stopped"
    BLOCKING_LIMIT = "blocking_limit"
    PROMPT_TOO_LONG = "prompt_too_long"


class Outcome(enum.StrEnum):
    """Whether the run did its job: only ``completed`` is ``done``."""

    DONE = "done"
    FAILED = "failed"


def outcome_of(reason: ExitReason) -> Outcome:
    """The outcome an exit reason maps to."""
    return Outcome.DONE if reason is ExitReason.COMPLETED else Outcome.FAILED
