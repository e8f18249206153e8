"""Why a run ended: the seven exit reasons, the closed set of causes, and a hint per cause.

Every ending tells the user three things: that it stopped, why (reason + cause + detail),
and what to do next (the cause's hint). Reason and cause are the only stop labels that
reach metrics, so both sets are closed: a cause is one of :data:`CAUSES`, or ``hook.<name>``
where ``<name>`` is a hook named in the configuration.
"""

from __future__ import annotations

import enum
from typing import Final

__all__ = [
    "CAUSES",
    "ExitReason",
    "Outcome",
    "cause_hint",
    "is_known_cause",
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


# cause -> one-line hint for the person reading the ending.
CAUSES: Final[dict[str, str]] = {
    # completed
    "model.end_turn": "Nothing to do: the model finished its answer.",
    "truncation.gave_up": (
        "The answer was cut off repeatedly; raise max_output_tokens or ask for a shorter answer."
    ),
    # max_turns: any budget
    "budget.max_turns": "Raise budget.max_turns or split the task into smaller runs.",
    "budget.max_tool_calls": "Raise budget.max_tool_calls or give the model fewer, larger tools.",
    "budget.deadline": "Raise budget.deadline_seconds or split the task; check model latency.",
    "budget.output_tokens": "Raise budget.max_output_tokens or ask for a shorter answer.",
    "budget.input_tokens": "Raise budget.max_input_tokens or shorten the prompt and tool results.",
    "budget.cost": "Raise budget.max_cost or use a cheaper model for this stage.",
    "budget.diminishing_returns": (
        "The model kept adding little; accept the output or rephrase the task more narrowly."
    ),
    # aborted_streaming / aborted_tools
    "abort.caller": "The run was aborted on request; start it again if that was a mistake.",
    "abort.shutdown": "The service was shutting down; resubmit the run.",
    "abort.crash": "The service stopped while this run was active; resubmit the run.",
    "model.unavailable": (
        "The model endpoint kept failing; check its status, base_url and key, then retry."
    ),
    "model.bad_request": (
        "The endpoint refused the request; check the model name, parameters and the detail."
    ),
    # hook_stopped
    "loop.generic_repeat": "The model repeated one call; improve the prompt or the tool's output.",
    "loop.poll_no_progress": "A polled status never changed; wait longer between polls or stop.",
    "loop.ping_pong": "Two calls alternated without progress; fix the tool or the instructions.",
    "loop.global_breaker": "Too many calls made no progress; check tool results and the prompt.",
    "loop.cycle": "A sequence of calls repeated; give the model a clearer way to finish.",
    "loop.content": "The model repeated its own text; lower temperature or change the prompt.",
    "loop.cache_hits": "The model re-asked for a result it already had; tell it the result.",
    "internal.error": "loopfuse failed inside this run; report it with the run's trace id.",
    "stage.output_rejected": (
        "A stage's output failed its checks after every retry; try a stronger model for it."
    ),
    # blocking_limit / prompt_too_long
    "context.blocking_limit": (
        "The prompt would not fit the context window; use a larger window or shorter inputs."
    ),
    "context.prompt_too_long": (
        "The endpoint refused the prompt as too long even after collapsing and compacting it."
    ),
}

_HOOK_PREFIX: Final = "hook."


def is_known_cause(cause: str) -> bool:
    """True for a cause in :data:`CAUSES` or of the form ``hook.<name>``."""
    return cause in CAUSES or (cause.startswith(_HOOK_PREFIX) and len(cause) > len(_HOOK_PREFIX))


def cause_hint(cause: str) -> str:
    """The next step to suggest for ``cause`` (a generic one for ``hook.<name>``)."""
    hint = CAUSES.get(cause)
    if hint is not None:
        return hint
    if cause.startswith(_HOOK_PREFIX):
        name = cause[len(_HOOK_PREFIX) :]
        return f"The hook {name!r} stopped the run; read its message, fix the cause or the hook."
    return "Read the detail above; no specific advice is known for this cause."
