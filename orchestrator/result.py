"""What a run leaves behind: a typed result that says how and why it ended.

``--json`` prints a :class:`RunResult` (without the transcript), and :func:`describe_ending`
is the text a person reads: that the run stopped, why, and what to do next.
"""

from __future__ import annotations

import enum
from typing import Final, Literal

import msgspec

from bus import ChatMessage, ExitReason, Outcome, RunFinished, Usage, cause_hint, outcome_of

__all__ = [
    "SIMULATOR_NOTE",
    "CallLogEntry",
    "ExitStatus",
    "RunResult",
    "TraceEntry",
    "describe_ending",
    "end_result",
    "exit_status",
    "finished_message",
    "finished_result",
    "result_summary",
    "simulator_answered",
]

RunPhase = Literal["PLAN", "ACT", "OBSERVE", "DONE", "FAILED"]
"""Where the conductor's state machine is (a trace entry's ``state``)."""


# Results are immutable data (no cycles), so they stay out of the cycle collector
# (``gc=False``), as the bus's messages do: thousands of runs in flight hold them.


class TraceEntry(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, gc=False):
    """A state transition or a stop, with the seconds since the run started."""

    at: float
    turn: int
    state: RunPhase
    event: str
    detail: str = ""


class CallLogEntry(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One proposed tool call and what became of it."""

    turn: int
    call_id: str
    tool: str
    arguments: str
    fingerprint: str
    verdict: Literal["allow", "warn", "block", "not_run"]
    cache: Literal["hit", "miss", "none"] = "none"
    is_error: bool = False
    error_kind: str | None = None
    duration_seconds: float = 0.0


class RunResult(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """How and why a run ended (built by :func:`end_result`), with everything it did (nothing,
    by default: a run that ended before it started)."""

    run_id: str
    trace_id: str
    exit_reason: ExitReason
    cause: str
    outcome: Outcome
    detail: str
    hint: str
    turns: int = 0
    llm_requests: int = 0
    tool_calls: int = 0
    usage: Usage = msgspec.field(default_factory=Usage)
    output: str = ""
    incomplete: bool = False
    degraded: bool = False
    nudges: int = 0
    trace: tuple[TraceEntry, ...] = ()
    call_log: tuple[CallLogEntry, ...] = ()
    transcript: tuple[ChatMessage, ...] = ()
    simulated: bool = False
    """No model was configured: the embedded simulator answered this run, which plays no
    scenario (a task or a folder of the caller's own). ``False`` for scenario runs."""
    note: str = ""
    """What a person should know about the result beside its ending (with ``simulated``:
    :data:`SIMULATOR_NOTE`)."""
    notes: tuple[str, ...] = ()
    """What the run's settings became beside what was asked: each loop threshold clamped,
    and to what (``loop config ping_pong.break_at = 5 is not above ping_pong.block_at (20):
    using 21``); each is also a ``Notice(kind="loop.config")`` event of the run."""


def end_result(
    run_id: str,
    trace_id: str,
    reason: ExitReason,
    cause: str,
    detail: str,
    *,
    shortened: bool | None = None,
) -> RunResult:
    """The one place a run's ending is decided: its outcome from ``reason``, its hint from
    the cause table (``shortened``: see :func:`bus.cause_hint`). What the run did is added
    with ``msgspec.structs.replace``; every stored or published result starts here (or, for
    a run that ended before a restart, at :func:`finished_result`)."""
    return RunResult(
        run_id=run_id,
        trace_id=trace_id,
        exit_reason=reason,
        cause=cause,
        outcome=outcome_of(reason),
        detail=detail,
        hint=cause_hint(cause, shortened=shortened),
    )


def finished_result(finished: RunFinished, trace_id: str) -> RunResult:
    """The result of a run known only by its ``RunFinished`` (it ended, but the daemon or
    node that ran it stopped before storing the result): the same shape, what it did not
    publish (output, trace, call log) empty."""
    return msgspec.convert({**msgspec.structs.asdict(finished), "trace_id": trace_id}, RunResult)


SIMULATOR_NOTE: Final = (
    "No model is configured: the embedded simulator answered this run, not a model; "
    "set [model] base_url and model, see docs/servers.md."
)
"""The note of a result the embedded simulator answered (``simulated``): the simulator
plays scripted scenarios, it reads neither the task nor the folder."""


def simulator_answered(result: RunResult) -> RunResult:
    """``result`` marked as answered by the embedded simulator (``simulated``, the note)."""
    return msgspec.structs.replace(result, simulated=True, note=SIMULATOR_NOTE)


class ExitStatus(enum.IntEnum):
    """The ``loopfuse`` command's exit status (docs/cli.md)."""

    COMPLETED = 0
    """The run completed (exit reason ``completed``)."""
    FAILED = 1
    """The run ended with any other exit reason; the output says which and why."""
    USAGE = 2
    """A usage or config error: nothing ran."""
    EXPECTATIONS = 3
    """``loopfuse run --scenario``: the run ended other than the scenario expects."""
    INTERRUPTED = 130
    """Ctrl-C: the run was aborted from the terminal (its result is still printed)."""


def exit_status(result: RunResult, *, interrupted: bool = False) -> ExitStatus:
    """The exit status of a command that ran ``result`` (``interrupted``: Ctrl-C was pressed;
    a run that completed all the same still exits 0)."""
    if result.outcome is Outcome.DONE:
        return ExitStatus.COMPLETED
    return ExitStatus.INTERRUPTED if interrupted else ExitStatus.FAILED


def finished_message(result: RunResult) -> RunFinished:
    """The ``RunFinished`` that announces ``result`` on the bus (a run's last message)."""
    return RunFinished(**{name: getattr(result, name) for name in RunFinished.__struct_fields__})


def result_summary(result: RunResult) -> dict[str, object]:
    """The result as JSON-ready builtins, without the transcript."""
    return {k: v for k, v in msgspec.to_builtins(result).items() if k != "transcript"}


def describe_ending(result: RunResult) -> str:
    """Three lines for a person: it stopped, why, and what to do next."""
    verb = "Finished" if result.outcome is Outcome.DONE else "Stopped"
    marks = [name for name in ("incomplete", "degraded") if getattr(result, name)]
    suffix = f" [{', '.join(marks)}]" if marks else ""
    note = f"\nNote: {result.note}" if result.note else ""
    return (
        f"{verb}: run {result.run_id} ended with {result.exit_reason.value}"
        f" (cause {result.cause}){suffix} after {result.turns} turns,"
        f" {result.llm_requests} model requests, {result.tool_calls} tool calls.\n"
        f"Why: {result.detail}\n"
        f"Next: {result.hint}{note}"
    )
