"""What a replay shows: per run, where the new config stops against the recording, and
totals per cause across a corpus; as JSON for tooling or a Markdown table for people.

A row's ``change`` is one of:

* ``same``: the replay ends with the recorded reason, cause and number of requests;
* ``earlier``: it stops with fewer requests (the requests, tokens and cost it saves);
* ``later``: it goes on longer (what it adds);
* ``missed``: the recording was stopped by a fuse (any cause but ``model.*``) and the replay
  does not stop for that cause: the stop the new config would have missed;
* ``new``: a transcript with no recorded ending (only the replay's side is known).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import msgspec

from orchestrator.replay.player import Played
from orchestrator.replay.recording import Recording, cost_of, stopped_at

__all__ = ["Change", "ReplayRow", "Totals", "compare", "markdown", "totals"]

Change = Literal["same", "earlier", "later", "missed", "new"]


class ReplayRow(msgspec.Struct, frozen=True, kw_only=True):
    """One run under one config."""

    run: str
    config: str
    change: Change
    recorded_exit: str | None = None
    recorded_cause: str | None = None
    recorded_requests: int | None = None
    recorded_stop_call: int | None = None
    exit_reason: str
    cause: str
    requests: int
    stop_call: int | None
    requests_delta: int = 0
    tokens_delta: int = 0
    cost_delta: float = 0.0
    extrapolated: int
    """Model answers the replay needed past the end of the recording (repeated answers)."""
    verdicts_match: bool | None = None
    """Every call's verdict equals the recorded one, and so does every warning, refusal,
    nudge and the first stop, in order (``None``: nothing recorded)."""


class Totals(msgspec.Struct, frozen=True, kw_only=True):
    """Per config and replayed cause: runs, changes, and what they save (negative) or add."""

    config: str
    cause: str
    runs: int
    missed: int
    requests_delta: int
    tokens_delta: int
    cost_delta: float


def compare(recording: Recording, played: Played, config: str) -> ReplayRow:
    """The row of ``recording`` replayed as ``played`` under ``config`` (its label)."""
    result = played.result
    verdicts = tuple(entry.verdict for entry in result.call_log)
    ending = recording.ending
    common: dict[str, Any] = {
        "run": recording.name,
        "config": config,
        "exit_reason": result.exit_reason.value,
        "cause": result.cause,
        "requests": result.llm_requests,
        "stop_call": stopped_at(verdicts),
        "extrapolated": played.extrapolated,
    }
    if ending is None:
        return ReplayRow(**common, change="new")  # nothing recorded to compare with
    delta = result.llm_requests - ending.llm_requests
    fuse = not ending.cause.startswith("model.")
    if (ending.exit_reason, ending.cause, delta) == (result.exit_reason.value, result.cause, 0):
        change: Change = "same"
    elif fuse and result.cause != ending.cause:
        change = "missed" if delta >= 0 else "earlier"
    else:
        change = "earlier" if delta < 0 else "later"
    return ReplayRow(
        **common,
        change=change,
        recorded_exit=ending.exit_reason,
        recorded_cause=ending.cause,
        recorded_requests=ending.llm_requests,
        recorded_stop_call=ending.stopped_at_call,
        requests_delta=delta,
        tokens_delta=result.usage.total_tokens - ending.usage.total_tokens,
        cost_delta=cost_of(result.usage, played.input_price, played.output_price) - ending.cost,
        verdicts_match=verdicts == recording.verdicts and played.decisions == recording.decisions,
    )


def totals(rows: Sequence[ReplayRow]) -> list[Totals]:
    """The rows summed per config and replayed cause."""
    grouped: dict[tuple[str, str], list[ReplayRow]] = {}
    for row in rows:
        grouped.setdefault((row.config, row.cause), []).append(row)
    return [
        Totals(
            config=config,
            cause=cause,
            runs=len(group),
            missed=sum(row.change == "missed" for row in group),
            requests_delta=sum(row.requests_delta for row in group),
            tokens_delta=sum(row.tokens_delta for row in group),
            cost_delta=sum(row.cost_delta for row in group),
        )
        for (config, cause), group in sorted(grouped.items())
    ]


def markdown(rows: Sequence[ReplayRow]) -> str:
    """Two Markdown tables: every run, then the totals per config and cause."""
    lines = [
        "| run | config | recorded | replayed | stop call | change | requests | tokens | cost |",
        "| --- | --- | --- | --- | --- | --- | ---: | ---: | ---: |",
    ]
    for row in rows:
        recorded = (
            f"{row.recorded_cause} @ {row.recorded_requests}"
            if row.recorded_cause is not None
            else "-"
        )
        extra = f" (+{row.extrapolated} past the recording)" if row.extrapolated else ""
        lines.append(
            f"| {row.run} | {row.config} | {recorded} | {row.cause} @ {row.requests}{extra} "
            f"| {row.stop_call or '-'} | {row.change} | {row.requests_delta:+d} "
            f"| {row.tokens_delta:+d} | {row.cost_delta:+.4f} |"
        )
    lines += [
        "",
        "| config | cause | runs | missed stops | requests | tokens | cost |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for total in totals(rows):
        lines.append(
            f"| {total.config} | {total.cause} | {total.runs} | {total.missed} "
            f"| {total.requests_delta:+d} | {total.tokens_delta:+d} | {total.cost_delta:+.4f} |"
        )
    return "\n".join(lines) + "\n"
