"""A recorded run as the replay needs it: the model's answers, the tools' results, the verdicts.

:func:`recording_from_events` reads a run's bus messages (the in-memory event log's, or a
stored log's read back through :class:`bus.LogReader`) into a :class:`Recording`:

* the model's **answers** in the order they were asked for, one list per request purpose
  (``turn``, ``compact``, ``loop_check``): each a :class:`~bus.ModelReply` or the final
  :class:`~bus.ModelError` of that request (retries inside the LLM caller are not answers);
* the tools' **results**, keyed by tool and canonical arguments, in the order they ran (a
  cache hit is not a run; a result that was never run, e.g. blocked, is not kept);
* the **verdict** of every proposed call (as the conductor's ``call_log`` has it) and how
  the run **ended** (reason, cause, requests, calls, tokens, cost);
* the **caller's abort**, if there was one: after which event of the run it came.

Nothing here runs anything; :mod:`orchestrator.replay.player` plays a recording.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final, Literal

import msgspec

from actors.fingerprint import canonical_arguments
from bus import (
    AbortRequested,
    Message,
    ModelError,
    ModelReply,
    ModelRequest,
    Nudge,
    RunFinished,
    RunStarted,
    StopSignal,
    ToolCallProposed,
    ToolResult,
    ToolSpec,
    ToolVerdict,
    Usage,
)
from orchestrator.sim.scenario import CallVerdict

__all__ = [
    "Answer",
    "Decision",
    "Ending",
    "Recording",
    "RecordingError",
    "ResultKey",
    "ToolOutcome",
    "cost_of",
    "decisions",
    "recording_from_events",
    "result_key",
]

ResultKey = str
"""``tool`` + NUL + the call's canonical arguments."""


Decision = tuple[str, int, str, str, str]
"""One decision of the fuses: ``("verdict", turn, call id, verdict, cause)`` for a warning
or a refusal of a call, ``("nudge", turn, kind, source, "")`` for a nudge (``turn``: the
last turn asked for before it), ``("stop", turn, reason, cause, source)`` for the run's
first stop signal."""


def decisions(events: Iterable[Message]) -> tuple[Decision, ...]:
    """The fuses' decisions in ``events``, in bus order (see :data:`Decision`): what an
    own-config replay must reproduce one by one."""
    found: list[Decision] = []
    turn = 0
    stopped = False
    for msg in events:
        match msg:
            case ModelRequest():
                turn = msg.turn
            case ToolVerdict() if msg.verdict != "allow":
                found.append(("verdict", msg.turn, msg.call_id, msg.verdict, msg.cause))
            case Nudge():
                found.append(("nudge", turn, msg.kind, msg.source, ""))
            case StopSignal() if not stopped:
                stopped = True
                found.append(("stop", turn, msg.reason.value, msg.cause, msg.source))
    return tuple(found)


LISTING_PREFIX: Final = "The folder's files (top level): "
"""How a nudge shows the run's folder (:func:`actors.loop.monitor.folder_listing`)."""


class RecordingError(ValueError):
    """The input is not a run that can be replayed; the message says why."""


def result_key(tool: str, arguments: str) -> ResultKey:
    """The key a call's recorded results are found under (key order and ``1.0``/``1``
    do not matter: the arguments are compared in canonical form)."""
    return f"{tool}\x00{canonical_arguments(arguments).decode('utf-8', 'replace')}"


class Answer(msgspec.Struct, frozen=True, kw_only=True):
    """What the model answered one request: a reply, or the request's final error."""

    reply: ModelReply | None = None
    error: ModelError | None = None


class ToolOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """One recorded run of a tool: the text the model read, and whether it was an error."""

    content: str
    is_error: bool = False
    error_kind: str | None = None
    aborted: bool = False
    """The call was still running when the caller aborted the run (it never finished)."""


class Ending(msgspec.Struct, frozen=True, kw_only=True):
    """How a run ended, in the figures a replay compares."""

    exit_reason: str
    cause: str
    llm_requests: int
    tool_calls: int
    usage: Usage
    cost: float = 0.0
    stopped_at_call: int | None = None
    """The 1-based proposed call the run stopped at (its first call blocked or not run);
    ``None`` when every proposed call ran."""


class AbortPoint(msgspec.Struct, frozen=True, kw_only=True):
    """The caller aborted the run after the ``count``-th event of type ``after`` of turn
    ``turn`` (streamed text: after the turn's first piece, a replay streams one)."""

    after: Literal["ModelTextDelta", "ToolResult", "ModelReply", "ModelRequest"]
    turn: int
    count: int
    detail: str = ""


class Recording(msgspec.Struct, frozen=True, kw_only=True):
    """One recorded run, ready to replay (see the module docstring)."""

    name: str
    task: str
    model: str = ""
    """The model the run asked (its window, tokenizer estimate and price are looked up by
    this name); empty: unknown (a transcript), the config's model stands in."""
    system: str | None = None
    tools: tuple[ToolSpec, ...] = ()
    idempotent: frozenset[str] = frozenset()
    """Tools the recording shows were cached (a cache hit or miss): idempotent."""
    answers: Mapping[str, tuple[Answer, ...]] = {}
    results: Mapping[ResultKey, tuple[ToolOutcome, ...]] = {}
    verdicts: tuple[CallVerdict, ...] = ()
    decisions: tuple[Decision, ...] = ()
    """Every warning, refusal, nudge and the first stop, in order (:func:`decisions`)."""
    ending: Ending | None = None
    """``None``: the recording has no end (a transcript from another system)."""
    folder_listing: str | None = None
    """The run's folder's top level as a nudge showed it (``a.txt, b/``; an error streak's
    nudge lists it); ``None``: no nudge did. A replay recreates those names (empty) in a
    folder of its own, so the same nudge says the same."""
    overrides: Mapping[str, Any] = {}
    """The run's own settings over the config (a daemon run's request, a scenario's table)."""
    abort: AbortPoint | None = None


def cost_of(usage: Usage, input_price: float, output_price: float) -> float:
    """Dollars for ``usage`` at the prices per million tokens."""
    return (usage.prompt_tokens * input_price + usage.completion_tokens * output_price) / 1e6


def stopped_at(verdicts: Iterable[CallVerdict]) -> int | None:
    """The 1-based index of the first call that did not run (blocked or not run)."""
    return next(
        (i for i, verdict in enumerate(verdicts, 1) if verdict in ("block", "not_run")), None
    )


def recording_from_events(
    name: str, events: Iterable[Message], *, overrides: Mapping[str, Any] | None = None
) -> Recording:
    """The recording of one run from its bus messages, in bus order (see the module
    docstring).

    :raises RecordingError: no ``RunStarted`` or no model request in ``events``.
    """
    started: RunStarted | None = None
    finished: RunFinished | None = None
    first_request: ModelRequest | None = None
    open_requests: list[ModelRequest] = []
    answers: dict[str, list[Answer]] = {"turn": [], "compact": [], "loop_check": []}
    arguments: dict[tuple[int, str], str] = {}
    results: dict[ResultKey, list[ToolOutcome]] = {}
    idempotent: set[str] = set()
    calls: list[tuple[int, str]] = []
    replies: dict[int, ModelReply] = {}
    proposed_turns: set[int] = set()
    severity: dict[tuple[int, str], CallVerdict] = {}
    executed: dict[tuple[int, str], bool] = {}
    counts: dict[tuple[str, int], int] = {}
    abort: AbortPoint | None = None
    last: tuple[str, int] | None = None
    events = tuple(events)
    listing: str | None = None
    for msg in events:
        kind = type(msg).__name__
        turn = getattr(msg, "turn", 0)
        counts[(kind, turn)] = counts.get((kind, turn), 0) + 1
        match msg:
            case RunStarted():
                started = started or msg
            case RunFinished():
                finished = msg
            case ModelRequest():
                first_request = first_request or (msg if msg.purpose == "turn" else None)
                open_requests.append(msg)
            case ModelReply():
                if _answered(open_requests, answers, msg.turn, Answer(reply=msg)) == "turn":
                    replies[msg.turn] = msg
            case ModelError() if msg.final:
                _answered(open_requests, answers, msg.turn, Answer(error=msg))
            case ToolCallProposed():
                # The call log holds every call of the reply once one is proposed: those
                # left unproposed by a stop are "not run".
                if msg.turn not in proposed_turns:
                    proposed_turns.add(msg.turn)
                    reply = replies.get(msg.turn)
                    for call in reply.tool_calls if reply is not None else (msg.call,):
                        arguments[(msg.turn, call.id)] = call.arguments
                        calls.append((msg.turn, call.id))
            case Nudge() if listing is None and LISTING_PREFIX in msg.text:
                listing = msg.text.split(LISTING_PREFIX, 1)[1].split("\n", 1)[0].removesuffix(".")
            case ToolVerdict():
                key = (msg.turn, msg.call_id)
                if _SEVERITY[msg.verdict] > _SEVERITY.get(severity.get(key, "allow"), 0):
                    severity[key] = msg.verdict
            case ToolResult():
                key = (msg.turn, msg.call_id)
                executed[key] = msg.executed
                if msg.cache != "none":
                    idempotent.add(msg.tool)
                aborted = msg.error_kind == "aborted" and not msg.executed
                if (msg.executed and msg.cache != "hit") or aborted:
                    outcome = ToolOutcome(
                        content=msg.content,
                        is_error=msg.is_error,
                        error_kind=msg.error_kind,
                        aborted=aborted,
                    )
                    call_key = result_key(msg.tool, arguments.get(key, ""))
                    results.setdefault(call_key, []).append(outcome)
            case AbortRequested() if msg.source in ("caller", "api") and abort is None:
                if last is not None:
                    abort = AbortPoint(
                        after=last[0],  # type: ignore[arg-type]
                        turn=last[1],
                        count=1 if last[0] == "ModelTextDelta" else counts[last],
                        detail=msg.detail,
                    )
        if kind in ("ModelTextDelta", "ToolResult", "ModelReply", "ModelRequest"):
            last = (kind, turn)
    if started is None:
        raise RecordingError(f"{name}: no RunStarted event: not a run's event log")
    if first_request is None:
        raise RecordingError(f"{name}: the run never asked the model")
    verdicts = tuple(_verdict(key, severity, executed) for key in calls)
    ending = None
    if finished is not None:
        ending = Ending(
            exit_reason=finished.exit_reason.value,
            cause=finished.cause,
            llm_requests=finished.llm_requests,
            tool_calls=finished.tool_calls,
            usage=finished.usage,
            cost=cost_of(
                finished.usage, started.input_price_per_million, started.output_price_per_million
            ),
            stopped_at_call=stopped_at(verdicts),
        )
    head = first_request.messages[:1]
    return Recording(
        name=name,
        task=started.task,
        model=started.model,
        system=head[0].content if head and head[0].role == "system" else None,
        tools=started.tool_specs,
        idempotent=frozenset(idempotent),
        answers={purpose: tuple(found) for purpose, found in answers.items()},
        results={key: tuple(found) for key, found in results.items()},
        verdicts=verdicts,
        decisions=decisions(events),
        ending=ending,
        folder_listing=listing,
        overrides=dict(overrides or {}),
        abort=abort,
    )


_SEVERITY: Final = {"allow": 0, "warn": 1, "block": 2}


def _answered(
    open_requests: list[ModelRequest],
    answers: dict[str, list[Answer]],
    turn: int,
    answer: Answer,
) -> str:
    """File ``answer`` under the purpose of the earliest open request of ``turn``; that
    purpose."""
    for index, request in enumerate(open_requests):
        if request.turn == turn:
            del open_requests[index]
            answers[request.purpose].append(answer)
            return request.purpose
    answers["turn"].append(answer)  # a reply without its request (a log cut short)
    return "turn"


def _verdict(
    key: tuple[int, str], severity: Mapping[Any, CallVerdict], executed: Mapping[Any, bool]
) -> CallVerdict:
    """A call's verdict as the conductor's call log states it."""
    worst = severity.get(key, "allow")
    return worst if worst == "block" or executed.get(key, False) else "not_run"
