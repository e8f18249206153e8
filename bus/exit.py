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


# cause -> one-line hint for the person reading the ending: what to do next. A hint states
# no fact the detail might contradict (the detail says what happened); where the next step
# depends on what happened, :func:`cause_hint` takes the fact and picks a variant.
CAUSES: Final[dict[str, str]] = {
    # completed
    "model.end_turn": "Nothing to do: the model finished its answer; read it in the output.",
    "truncation.gave_up": (
        "The output is incomplete; raise model.max_output_tokens (each reply's limit) or ask "
        "for a shorter answer."
    ),
    # max_turns: any budget
    "budget.max_turns": "Raise budget.max_turns or split the task into smaller runs.",
    "budget.max_tool_calls": "Raise budget.max_tool_calls or give the model fewer, larger tools.",
    "budget.deadline": (
        "Raise budget.deadline_seconds or split the task; check the model's and tools' latency."
    ),
    "budget.output_tokens": "Raise budget.max_output_tokens or ask for a shorter answer.",
    "budget.input_tokens": (
        "Raise budget.max_input_tokens, or shorten the prompt and the tools' results."
    ),
    "budget.cost": "Raise budget.max_cost or use a cheaper model for this task.",
    "budget.diminishing_returns": (
        "The model added little per continuation; accept the output, lower the target "
        "(budget.max_output_tokens) or ask for the missing parts by name."
    ),
    # aborted_streaming / aborted_tools
    "abort.caller": "The run was aborted on request; start it again if that was a mistake.",
    "abort.shutdown": "The service was shutting down; resubmit the run once it is back.",
    "abort.crash": (
        "The service stopped while this run was active and did not resume it; resubmit the "
        "run (with a valid value if the detail names one)."
    ),
    "model.unavailable": (
        "The model endpoint kept failing; check its status, model.base_url and the key, then "
        "resubmit the run."
    ),
    "model.bad_request": (
        "The endpoint refused the request itself (not retried); fix what the detail names "
        "(model name, key, a parameter), then resubmit the run."
    ),
    "model.interrupted": (
        "The server ended a reply early without a finish reason (llama-cpp-python, by "
        "default, cuts a reply when another request arrives); start it with "
        "--interrupt_requests False or send it one request at a time, then resubmit the run."
    ),
    # hook_stopped
    "loop.generic_repeat": (
        "The model repeated one call with the same result; say in the task when to stop, or "
        "make the tool's result say what to do next."
    ),
    "loop.poll_no_progress": (
        "A polled status never changed; poll less often (or wait in the tool), or give the "
        "job more time before the run starts waiting on it."
    ),
    "loop.ping_pong": (
        "Two calls alternated without progress; fix the tool or the instructions that send "
        "the model back and forth."
    ),
    "loop.global_breaker": (
        "Many calls returned nothing new; check the tools' results and the task, then "
        "resubmit the run."
    ),
    "loop.cycle": (
        "A sequence of calls repeated with the same results; give the model a clear way to "
        "finish (a finishing tool or a stop condition in the task)."
    ),
    "loop.content": (
        "The model repeated its own text; lower the temperature or change the prompt."
    ),
    "loop.cache_hits": (
        "The model asked again for a result it already had; say in the task that results "
        "do not change, or raise tools.max_cache_hits."
    ),
    "loop.no_new_information": (
        "Different calls kept returning the same result; say in the task what that result "
        "means, or make the tools' results say what changed."
    ),
    "loop.unknown_tool": (
        "The model kept calling a tool this run does not offer; add it to the run's tools or "
        "name the tools it has in the task."
    ),
    "loop.error_streak": (
        "The model's tool calls kept failing, each one different; read the errors in the "
        "detail, then name the real paths or names in the task, or fix the tool."
    ),
    "loop.progress_ceiling": (
        "One call was repeated very often, its result changing each time; make the tool wait "
        "for the change (or report less often), or raise the ceiling in the run's loop config."
    ),
    "loop.shell_stagnation": (
        "The model kept running inspection commands without acting; say in the task what to "
        "change, or give it a tool that does."
    ),
    "loop.tool_stagnation": (
        "The model called one tool over and over; say in the task what to do with its "
        "results, or when to stop."
    ),
    "loop.read_loop": (
        "The model kept re-reading what it had read; put what it needs in the task, or give "
        "it a clear next step."
    ),
    "loop.call_cap": (
        "The run made more tool calls than its loop preset allows; split the task, or use a "
        "preset without a call cap."
    ),
    "loop.llm_check": (
        "A model asked to judge the run's history found it looping; read its reason in the "
        "detail, then change the task or the tools, or raise the check's confidence threshold."
    ),
    "internal.error": "loopfuse failed inside this run; report it with the run's trace id.",
    "stage.output_rejected": (
        "A stage's output failed its checks after every retry; try a stronger model for it."
    ),
    # blocking_limit / prompt_too_long
    "context.blocking_limit": (
        "The prompt would not fit the model's window (no request was sent); use a model with "
        "a larger window (context.windows), or shorter inputs."
    ),
    "context.prompt_too_long": (
        "The endpoint refused the prompt as too long; check the detail for its limit, then "
        "use a larger window or shorter inputs."
    ),
}

_PROMPT_TOO_LONG_AFTER_SHORTENING: Final = (
    "loopfuse folded or summarised earlier turns and the endpoint still refused the prompt; "
    "use a model with a larger window, or split the task or shorten its inputs."
)
_PROMPT_TOO_LONG_UNSHORTENED: Final = (
    "Nothing was folded or summarised before the refusal; if a proxy or the server limits "
    "the request's size (a 413), raise that limit; if the model's window is smaller than "
    "loopfuse assumed, set it in context.windows so prompts are shortened before they are "
    "sent."
)

_HOOK_PREFIX: Final = "hook."


def is_known_cause(cause: str) -> bool:
    """True for a cause in :data:`CAUSES` or of the form ``hook.<name>``."""
    return cause in CAUSES or (cause.startswith(_HOOK_PREFIX) and len(cause) > len(_HOOK_PREFIX))


def cause_hint(cause: str, *, shortened: bool | None = None) -> str:
    """The next step to suggest for ``cause`` (a generic one for ``hook.<name>``).

    ``shortened`` (``context.prompt_too_long`` only): whether loopfuse folded or summarised
    the refused prompt before giving up; ``None`` when not known (a generic hint).
    """
    if cause == "context.prompt_too_long" and shortened is not None:
        return _PROMPT_TOO_LONG_AFTER_SHORTENING if shortened else _PROMPT_TOO_LONG_UNSHORTENED
    hint = CAUSES.get(cause)
    if hint is not None:
        return hint
    if cause.startswith(_HOOK_PREFIX):
        name = cause[len(_HOOK_PREFIX) :]
        return f"The hook {name!r} stopped the run; read its message, fix the cause or the hook."
    return "Read the detail above; no specific advice is known for this cause."
