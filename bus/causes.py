"""The cause table: every way a run can end, declared once. A new stop reason starts here.

A *cause* says why a run stopped (``loop.cache_hits``). Its :class:`Cause` declaration holds
everything else anyone needs to know about it, so nobody reads meaning into the name:

* ``reasons``: the exit reason(s) it ends a run with (the first unless the publisher says
  otherwise: an abort is ``aborted_tools`` while tools run);
* ``hint``: the next step to suggest to the person reading the ending;
* ``answerable``: a limit (a budget, a loop), not a failure: with ``on_stop = "answer"`` the
  run asks the model for one last answer without tools;
* ``per_call``: decided on one proposed tool call: the calls approved before it still run
  and running calls are not cancelled (any other stop cancels them).

The name is also the cause's metric label, so the label set is closed: a cause is one of
:data:`CAUSE_TABLE` or ``hook.<name>`` (:data:`HOOK`, the one open family: ``<name>`` is a
hook named in the configuration). A monitor publishes a cause with :func:`stop_signal`;
metrics, recovery and the result read the declaration.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final, Literal

from bus import messages as m
from bus.exit import ExitReason
from bus.messages import Message, StopSignal

__all__ = [
    "CAUSES",
    "CAUSE_TABLE",
    "HOOK",
    "Cause",
    "abort_cause",
    "abort_reason_after",
    "cause_hint",
    "cause_of",
    "is_known_cause",
    "reason_of",
    "stop_signal",
]


@dataclass(frozen=True, slots=True)
class Cause:
    """One way a run can end (see the module docstring for each field)."""

    name: str
    hint: str
    reasons: tuple[ExitReason, ...]
    answerable: bool = False
    per_call: bool = False


def _family(
    reasons: tuple[ExitReason, ...],
    hints: dict[str, str],
    *,
    answerable: bool = False,
    per_call: Container[str] = (),
) -> tuple[Cause, ...]:
    """``hints``' causes, each ``per_call`` if named there."""
    return tuple(Cause(n, h, reasons, answerable, n in per_call) for n, h in hints.items())


# A hint states no fact the detail might contradict (the detail says what happened); where
# the next step depends on what happened, :func:`cause_hint` takes the fact and picks a variant.
_ENDED: Final = {
    "model.end_turn": "Nothing to do: the model finished its answer; read it in the output.",
    "truncation.gave_up": (
        "The output is incomplete; raise model.max_output_tokens (each reply's limit) or ask "
        "for a shorter answer."
    ),
}
_BUDGETS: Final = {
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
}
# ``aborted_tools`` when the run stops while its tools run
_ABORTS: Final = {
    "abort.caller": "The run was aborted on request; start it again if that was a mistake.",
    "abort.shutdown": "The service was shutting down; resubmit the run once it is back.",
    "abort.crash": (
        "The service stopped while this run was active and did not resume it; resubmit the "
        "run (with a valid value if the detail names one)."
    ),
}
_MODEL: Final = {
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
}
# a loop detector (a ``loop.<detector>`` metric label too)
_LOOPS: Final = {
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
}
_FAILED: Final = {
    "internal.error": "loopfuse failed inside this run; report it with the run's trace id.",
    "stage.output_rejected": (
        "A stage's output failed its checks after every retry; try a stronger model for it."
    ),
}
_BLOCKED: Final = {
    "context.blocking_limit": (
        "The prompt would not fit the model's window (no request was sent); use a model with "
        "a larger window (context.windows), or shorter inputs."
    ),
}
_TOO_LONG: Final = {
    "context.prompt_too_long": (
        "The endpoint refused the prompt as too long; check the detail for its limit, then "
        "use a larger window or shorter inputs."
    ),
}

_DECLARED: Final = (
    *_family((ExitReason.COMPLETED,), _ENDED),
    *_family(
        (ExitReason.MAX_TURNS,), _BUDGETS, answerable=True, per_call={"budget.max_tool_calls"}
    ),
    *_family((ExitReason.ABORTED_STREAMING, ExitReason.ABORTED_TOOLS), _ABORTS),
    *_family((ExitReason.ABORTED_STREAMING,), _MODEL),
    *_family((ExitReason.HOOK_STOPPED,), _LOOPS, answerable=True, per_call=_LOOPS),
    *_family((ExitReason.HOOK_STOPPED,), _FAILED),
    *_family((ExitReason.BLOCKING_LIMIT,), _BLOCKED),
    *_family((ExitReason.PROMPT_TOO_LONG,), _TOO_LONG),
)
CAUSE_TABLE: Final[Mapping[str, Cause]] = MappingProxyType({c.name: c for c in _DECLARED})
"""Every cause but ``hook.<name>``, by name."""

_HOOK_PREFIX: Final = "hook."

HOOK: Final = Cause(
    "hook.<name>",
    "The hook {name!r} stopped the run; read its message, fix the cause or the hook.",
    reasons=(ExitReason.HOOK_STOPPED,),
    per_call=True,
)
"""A configured hook's ``deny`` (its cause is ``hook.<name>``; ``{name}`` in the hint)."""

CAUSES: Final[Mapping[str, str]] = MappingProxyType({c.name: c.hint for c in _DECLARED})
"""Each cause of :data:`CAUSE_TABLE` with its hint."""


def cause_of(cause: str) -> Cause | None:
    """The declaration of ``cause`` (:data:`HOOK` for ``hook.<name>``); ``None`` if none."""
    if cause.startswith(_HOOK_PREFIX) and len(cause) > len(_HOOK_PREFIX):
        return HOOK
    return CAUSE_TABLE.get(cause)


def stop_signal(
    cause: str, *, run_id: str, source: str, detail: str = "", reason: ExitReason | None = None
) -> StopSignal:
    """The :class:`~bus.StopSignal` that ends ``run_id`` for ``cause``, with the reason
    (:func:`reason_of`) and flags its declaration gives."""
    declared = cause_of(cause)
    return StopSignal(
        run_id=run_id,
        reason=reason_of(cause, reason),
        cause=cause,
        source=source,
        detail=detail,
        answerable=declared is not None and declared.answerable,
        per_call=declared is not None and declared.per_call,
    )


def reason_of(cause: str, reason: ExitReason | None = None) -> ExitReason:
    """The exit reason ``cause`` ends a run with: its first, or ``reason`` if declared.

    :raises ValueError: ``cause`` is not declared, or does not end a run with ``reason``.
    """
    declared = cause_of(cause)
    if declared is None or (reason is not None and reason not in declared.reasons):
        raise ValueError(f"{cause!r} is not declared in bus/causes.py with reason {reason}")
    return reason or declared.reasons[0]


def abort_cause(source: Literal["caller", "api", "shutdown", "crash"]) -> str:
    """The cause of an abort asked for by ``source``."""
    return "abort.caller" if source in ("caller", "api") else f"abort.{source}"


# The steps of a turn, by whose they are: the model's from the run's or turn's start to its
# reply, the tools' from the reply to the turn's end (the conductor's PLAN / ACT, OBSERVE).
_MODEL_STEPS: Final = (m.RunStarted, m.TurnStarted, m.ModelRequest, m.ModelTextDelta)
_TOOL_STEPS: Final = (
    (m.ModelReplied, m.ToolCallProposed, m.ToolVerdict),
    (m.ToolExecute, m.ToolResult, m.TurnEnded),
)


def abort_reason_after(steps: Iterable[Message], cause: str = "abort.crash") -> ExitReason:
    """The exit reason of an abort (``cause``) that came after ``steps`` (newest first): the
    declaration's tools reason if the newest step of a turn is the tools', else its first
    (the model was being asked, or nothing had happened yet). Messages of neither kind
    (progress, nudges, notices) are passed over."""
    streaming, tools = CAUSE_TABLE[cause].reasons
    for step in steps:
        if isinstance(step, _TOOL_STEPS):
            return tools
        if isinstance(step, _MODEL_STEPS):
            return streaming
    return streaming


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


def is_known_cause(cause: str) -> bool:
    """True for a cause in :data:`CAUSE_TABLE` or of the form ``hook.<name>``."""
    return cause_of(cause) is not None


def cause_hint(cause: str, *, shortened: bool | None = None) -> str:
    """The next step to suggest for ``cause`` (a generic one for ``hook.<name>``).

    ``shortened`` (``context.prompt_too_long`` only): whether loopfuse folded or summarised
    the refused prompt before giving up; ``None`` when not known (a generic hint).
    """
    if cause == "context.prompt_too_long" and shortened is not None:
        return _PROMPT_TOO_LONG_AFTER_SHORTENING if shortened else _PROMPT_TOO_LONG_UNSHORTENED
    declared = CAUSE_TABLE.get(cause)
    if declared is not None:
        return declared.hint
    if cause.startswith(_HOOK_PREFIX):
        return HOOK.hint.format(name=cause[len(_HOOK_PREFIX) :])
    return "Read the detail above; no specific advice is known for this cause."
